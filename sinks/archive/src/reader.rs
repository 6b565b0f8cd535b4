//! Reading the archive back. A file that does not open as Parquet of the archive's schema
//! (corrupt, truncated, foreign) is named in a warning and skipped: one bad file must not
//! hide every other day's history.

use std::fs::{self, File};
use std::path::{Path, PathBuf};

use arrow::array::RecordBatch;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use crate::ArchiveError;
use crate::encoder::day_text;
use crate::service::PARQUET_SUFFIX;

/// Days since the Unix epoch, both ends included; `None` for open.
#[derive(Clone, Copy, Debug, Default)]
pub struct DayRange {
    pub first: Option<i32>,
    pub last: Option<i32>,
}

impl DayRange {
    fn holds(&self, day_dir_name: &str) -> bool {
        let Some(text) = day_dir_name.strip_prefix("day=") else {
            return false;
        };
        // `YYYY-MM-DD` sorts as text the way the days sort.
        self.first.is_none_or(|d| text >= day_text(d).as_str())
            && self.last.is_none_or(|d| text <= day_text(d).as_str())
    }
}

/// The finished Parquet files of `table` (`events/` or `rollup/`) in `days`, in day and
/// name order; temporary files of a writer at work are left out.
pub fn list_files(table: &Path, days: DayRange) -> Result<Vec<PathBuf>, ArchiveError> {
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir(table) else {
        return Ok(out);
    };
    let mut day_dirs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .filter(|p| days.holds(&p.file_name().unwrap_or_default().to_string_lossy()))
        .collect();
    day_dirs.sort();
    for dir in day_dirs {
        let mut files: Vec<PathBuf> = fs::read_dir(&dir)
            .map_err(|e| ArchiveError::io(&dir, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.to_string_lossy().ends_with(PARQUET_SUFFIX))
            .collect();
        files.sort();
        out.extend(files);
    }
    Ok(out)
}

/// Every record batch of one file, or why it could not be read.
pub fn read_file(path: &Path) -> Result<Vec<RecordBatch>, ArchiveError> {
    let file = File::open(path).map_err(|e| ArchiveError::io(path, e))?;
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)?.build()?;
    reader
        .collect::<Result<Vec<_>, _>>()
        .map_err(ArchiveError::from)
}

/// What a scan found: the batches of every readable file, and a warning per file skipped.
#[derive(Debug, Default)]
pub struct Scan {
    pub batches: Vec<RecordBatch>,
    pub files_read: usize,
    pub warnings: Vec<String>,
}

/// Reads every file of `table` in `days` whose schema is `expected`'s, skipping (and
/// naming) those that do not read.
pub fn scan(
    table: &Path,
    days: DayRange,
    expected: &arrow::datatypes::Schema,
) -> Result<Scan, ArchiveError> {
    let mut scan = Scan::default();
    for path in list_files(table, days)? {
        match read_file(&path) {
            Ok(batches)
                if batches
                    .iter()
                    .all(|b| b.schema().fields() == expected.fields()) =>
            {
                scan.batches.extend(batches);
                scan.files_read += 1;
            }
            Ok(_) => scan.warnings.push(format!(
                "{}: not the archive's schema; skipped",
                path.display()
            )),
            Err(e) => scan
                .warnings
                .push(format!("{}: unreadable ({e}); skipped", path.display())),
        }
    }
    Ok(scan)
}
