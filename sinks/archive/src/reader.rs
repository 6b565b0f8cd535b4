//! Reading the archive back. A file that does not open as Parquet of the archive's schema
//! (corrupt, truncated, foreign) is named in a warning and skipped: one bad file must not
//! hide every other day's history.

use std::fs::{self, File};
use std::path::{Path, PathBuf};

use std::collections::BTreeSet;

use arrow::array::{Array, BooleanArray, RecordBatch, StringArray};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ArrowPredicateFn, ParquetRecordBatchReaderBuilder, RowFilter};

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
/// name order; temporary files of a writer at work are left out, and so are files whose
/// rows a compacted or rolled-up file of the same day already holds (what a merge
/// interrupted by a crash leaves until the next run removes it: `compact`).
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
    let root = table.parent().unwrap_or(table);
    for dir in day_dirs {
        let day_name = dir.file_name().unwrap_or_default().to_string_lossy();
        let absorbed = crate::compact::absorbed_in_day(root, &day_name);
        let mut files: Vec<PathBuf> = fs::read_dir(&dir)
            .map_err(|e| ArchiveError::io(&dir, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.to_string_lossy().ends_with(PARQUET_SUFFIX))
            .filter(|p| !absorbed.contains(&crate::compact::relative(root, p)))
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
    scan_with(table, days, |path| {
        let batches = read_file(path)?;
        Ok(batches
            .iter()
            .all(|b| b.schema().fields() == expected.fields())
            .then_some(batches))
    })
}

/// Every file of `table` in `days` through `read`, which answers `None` for a file not of
/// the archive's schema; such files and unreadable ones are named and skipped.
fn scan_with(
    table: &Path,
    days: DayRange,
    read: impl Fn(&Path) -> Result<Option<Vec<RecordBatch>>, ArchiveError>,
) -> Result<Scan, ArchiveError> {
    let mut scan = Scan::default();
    for path in list_files(table, days)? {
        match read(&path) {
            Ok(Some(batches)) => {
                scan.batches.extend(batches);
                scan.files_read += 1;
            }
            Ok(None) => scan.warnings.push(format!(
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

/// The row groups of a file whose `key_id` min/max statistics may hold one of `keys`
/// (every group whose statistics are missing). In a compacted, key-sorted day file that is
/// one or two groups of hundreds.
pub fn row_groups_for_keys(
    meta: &parquet::file::metadata::ParquetMetaData,
    keys: &BTreeSet<String>,
) -> Vec<usize> {
    let Some(col) = meta
        .file_metadata()
        .schema_descr()
        .columns()
        .iter()
        .position(|c| c.name() == "key_id")
    else {
        return (0..meta.num_row_groups()).collect();
    };
    (0..meta.num_row_groups())
        .filter(|&rg| {
            let stats = meta.row_group(rg).column(col).statistics();
            let bounds = stats.and_then(|s| {
                let min = std::str::from_utf8(s.min_bytes_opt()?).ok()?;
                let max = std::str::from_utf8(s.max_bytes_opt()?).ok()?;
                // Truncated statistics are not exact bounds: read the group.
                (s.min_is_exact() && s.max_is_exact()).then(|| (min.to_string(), max.to_string()))
            });
            match bounds {
                Some((min, max)) => keys.range(min..=max).next().is_some(),
                None => true,
            }
        })
        .collect()
}

/// The rows of `keys` in every readable file of `table` in `days`, reading only the row
/// groups whose statistics may hold them and, in those, decoding the other columns only
/// for matching rows. Files that do not read are named and skipped, as by [`scan`].
pub fn scan_keys(
    table: &Path,
    days: DayRange,
    expected: &arrow::datatypes::Schema,
    keys: &BTreeSet<String>,
) -> Result<Scan, ArchiveError> {
    scan_with(table, days, |path| read_keys(path, expected, keys))
}

/// `keys`' rows of one file; `None` when its schema is not `expected`.
pub fn read_keys(
    path: &Path,
    expected: &arrow::datatypes::Schema,
    keys: &BTreeSet<String>,
) -> Result<Option<Vec<RecordBatch>>, ArchiveError> {
    let file = File::open(path).map_err(|e| ArchiveError::io(path, e))?;
    let b = ParquetRecordBatchReaderBuilder::try_new(file)?;
    if b.schema().fields() != expected.fields() {
        return Ok(None);
    }
    let groups = row_groups_for_keys(b.metadata(), keys);
    if groups.is_empty() {
        return Ok(Some(Vec::new()));
    }
    let mask = ProjectionMask::columns(b.parquet_schema(), ["key_id"]);
    let wanted = keys.clone();
    let predicate = ArrowPredicateFn::new(mask, move |batch: RecordBatch| {
        let ids = batch
            .column(0)
            .as_any()
            .downcast_ref::<StringArray>()
            .ok_or_else(|| arrow::error::ArrowError::SchemaError("key_id".into()))?;
        Ok((0..ids.len())
            .map(|i| Some(wanted.contains(ids.value(i))))
            .collect::<BooleanArray>())
    });
    let reader = b
        .with_row_groups(groups)
        .with_row_filter(RowFilter::new(vec![Box::new(predicate)]))
        .build()?;
    Ok(Some(reader.collect::<Result<Vec<_>, _>>()?))
}
