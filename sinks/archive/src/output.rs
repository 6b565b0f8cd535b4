//! Query results as people and scripts read them: an aligned table, CSV with a header
//! row, or JSON lines (one object per row). Both history paths print through this, so the
//! lean scan and the SQL engine answer in the same form.

use std::io::Write;

use arrow::array::RecordBatch;

use crate::ArchiveError;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Table,
    Csv,
    Json,
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "table" => Ok(Self::Table),
            "csv" => Ok(Self::Csv),
            "json" => Ok(Self::Json),
            other => Err(format!("unknown format {other:?}: table, csv or json")),
        }
    }
}

pub fn write(
    out: &mut dyn Write,
    format: Format,
    batches: &[RecordBatch],
) -> Result<(), ArchiveError> {
    let io = |e| ArchiveError::io(std::path::Path::new("<stdout>"), e);
    match format {
        Format::Table => {
            let table = arrow::util::pretty::pretty_format_batches(batches)?;
            writeln!(out, "{table}").map_err(io)?;
        }
        Format::Csv => {
            let mut w = arrow::csv::WriterBuilder::new()
                .with_header(true)
                .build(&mut *out);
            for b in batches {
                w.write(b)?;
            }
        }
        Format::Json => {
            let mut w = arrow::json::LineDelimitedWriter::new(&mut *out);
            for b in batches {
                w.write(b)?;
            }
            w.finish()?;
        }
    }
    Ok(())
}
