//! Writing one archive file so that a crash leaves either the whole file or none of it,
//! as Kafka Connect's S3 sink does: the bytes go to a temporary name in the target
//! directory, are fsynced, the file is renamed to its final name, and the directory is
//! fsynced so the rename itself survives a power cut. Readers skip temporary names.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use arrow::array::RecordBatch;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

use crate::ArchiveError;

/// Files still being written end in this; no reader opens them, and a writer that
/// restarts removes its own leftovers (`remove_leftovers`).
pub const TEMP_SUFFIX: &str = ".tmp";
pub const PARQUET_SUFFIX: &str = ".parquet";

/// Rows per row group: small enough that a key lookup in a sorted day file can skip most
/// groups by their statistics, large enough that zstd sees repetition.
pub const ROW_GROUP_ROWS_MAX: usize = 128 * 1024;

pub fn writer_properties() -> WriterProperties {
    WriterProperties::builder()
        .set_compression(Compression::ZSTD(
            ZstdLevel::try_new(3).expect("3 is in range"),
        ))
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS_MAX))
        .build()
}

/// Writes `batches` (one schema) as the Parquet file `dir/name`, crash-safe. `name` must
/// end in `.parquet`. An existing file of that name is replaced whole.
pub fn write_atomic(
    dir: &Path,
    name: &str,
    batches: &[RecordBatch],
) -> Result<PathBuf, ArchiveError> {
    let Some(first) = batches.first() else {
        return Err(ArchiveError::Empty);
    };
    fs::create_dir_all(dir).map_err(|e| ArchiveError::io(dir, e))?;
    let target = dir.join(name);
    let temp = dir.join(format!("{name}{TEMP_SUFFIX}"));
    let file = File::create(&temp).map_err(|e| ArchiveError::io(&temp, e))?;
    let mut w = ArrowWriter::try_new(file, first.schema(), Some(writer_properties()))?;
    for b in batches {
        w.write(b)?;
    }
    let file = w.into_inner()?;
    file.sync_all().map_err(|e| ArchiveError::io(&temp, e))?;
    drop(file);
    fs::rename(&temp, &target).map_err(|e| ArchiveError::io(&target, e))?;
    sync_dir(dir)?;
    Ok(target)
}

/// Writes `bytes` as `dir/name` crash-safe (quarantine files, audit records).
pub fn write_bytes_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<PathBuf, ArchiveError> {
    fs::create_dir_all(dir).map_err(|e| ArchiveError::io(dir, e))?;
    let target = dir.join(name);
    let temp = dir.join(format!("{name}{TEMP_SUFFIX}"));
    let mut file = File::create(&temp).map_err(|e| ArchiveError::io(&temp, e))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| ArchiveError::io(&temp, e))?;
    drop(file);
    fs::rename(&temp, &target).map_err(|e| ArchiveError::io(&target, e))?;
    sync_dir(dir)?;
    Ok(target)
}

/// A rename is an entry in the directory: only the directory's own fsync makes it durable.
pub fn sync_dir(dir: &Path) -> Result<(), ArchiveError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| ArchiveError::io(dir, e))
}

/// Removes temporary files a crashed writer left under `dir` (recursively); returns how
/// many. Only a writer that owns the directory may call this.
pub fn remove_leftovers(dir: &Path) -> Result<usize, ArchiveError> {
    let mut removed = 0;
    let Ok(entries) = fs::read_dir(dir) else {
        return Ok(0);
    };
    for entry in entries {
        let path = entry.map_err(|e| ArchiveError::io(dir, e))?.path();
        if path.is_dir() {
            removed += remove_leftovers(&path)?;
        } else if path.to_string_lossy().ends_with(TEMP_SUFFIX) {
            fs::remove_file(&path).map_err(|e| ArchiveError::io(&path, e))?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// Rows per row group of a compacted day file. The file is sorted by key id, so a key's
/// rows fall in one or two groups: at the design's peak (43.2 M events a day) 64 Ki rows
/// make ~660 groups, whose key-id min/max let a subject lookup read ~1/660 of the day,
/// while each group still holds enough rows (~1-2 MB of zstd) to compress well.
pub const COMPACTED_ROW_GROUP_ROWS: usize = 64 * 1024;
/// Rows per data page in a compacted file: the page index then narrows a lookup further,
/// inside the group, to pages of 8 Ki rows.
pub const COMPACTED_PAGE_ROWS: usize = 8 * 1024;

/// Properties of a compacted (key-sorted) day file: small row groups and pages, with the
/// statistics and page index a key lookup prunes on. Sorting by key breaks the time order
/// the raw files compress on; within a key `at` and `window_id` still rise, so they are
/// delta-encoded rather than dictionary-encoded (a day's timestamps barely repeat).
pub fn compacted_properties() -> WriterProperties {
    use parquet::basic::Encoding;
    use parquet::schema::types::ColumnPath;
    let delta = ["at", "window_id"];
    delta
        .iter()
        .fold(WriterProperties::builder(), |b, col| {
            let path = ColumnPath::from(*col);
            b.set_column_dictionary_enabled(path.clone(), false)
                .set_column_encoding(path, Encoding::DELTA_BINARY_PACKED)
        })
        .set_compression(Compression::ZSTD(
            ZstdLevel::try_new(3).expect("3 is in range"),
        ))
        .set_max_row_group_row_count(Some(COMPACTED_ROW_GROUP_ROWS))
        .set_data_page_row_count_limit(COMPACTED_PAGE_ROWS)
        .set_statistics_enabled(parquet::file::properties::EnabledStatistics::Page)
        .build()
}

/// A Parquet file written a batch at a time under a temporary name, made durable and
/// visible by [`AtomicParquet::commit`] alone (the same protocol as [`write_atomic`], for
/// files too big to hold in memory). Dropped uncommitted, it removes its temporary file.
pub struct AtomicParquet {
    dir: PathBuf,
    target: PathBuf,
    temp: PathBuf,
    writer: Option<ArrowWriter<File>>,
    rows: u64,
}

impl AtomicParquet {
    /// Starts `dir/name` (which must end in `.parquet`) with `metadata` as key-value pairs
    /// in its footer.
    pub fn create(
        dir: &Path,
        name: &str,
        schema: arrow::datatypes::SchemaRef,
        properties: WriterProperties,
        metadata: &[(&str, String)],
    ) -> Result<Self, ArchiveError> {
        fs::create_dir_all(dir).map_err(|e| ArchiveError::io(dir, e))?;
        let target = dir.join(name);
        let temp = dir.join(format!("{name}{TEMP_SUFFIX}"));
        let file = File::create(&temp).map_err(|e| ArchiveError::io(&temp, e))?;
        let mut writer = ArrowWriter::try_new(file, schema, Some(properties))?;
        for (k, v) in metadata {
            writer.append_key_value_metadata(parquet::file::metadata::KeyValue::new(
                (*k).to_string(),
                v.clone(),
            ));
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            target,
            temp,
            writer: Some(writer),
            rows: 0,
        })
    }

    pub fn write(&mut self, batch: &RecordBatch) -> Result<(), ArchiveError> {
        if let Some(w) = self.writer.as_mut() {
            w.write(batch)?;
            self.rows += batch.num_rows() as u64;
        }
        Ok(())
    }

    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Finishes the file, fsyncs it, renames it to its name and fsyncs the directory.
    pub fn commit(mut self) -> Result<PathBuf, ArchiveError> {
        let w = self.writer.take().expect("committed once");
        let file = w.into_inner()?;
        file.sync_all()
            .map_err(|e| ArchiveError::io(&self.temp, e))?;
        drop(file);
        fs::rename(&self.temp, &self.target).map_err(|e| ArchiveError::io(&self.target, e))?;
        sync_dir(&self.dir)?;
        Ok(self.target.clone())
    }
}

impl Drop for AtomicParquet {
    fn drop(&mut self) {
        if self.writer.take().is_some() {
            let _ = fs::remove_file(&self.temp);
        }
    }
}

/// Removes `path` and makes the removal durable.
pub fn remove_durably(path: &Path) -> Result<(), ArchiveError> {
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(ArchiveError::io(path, e)),
    }
    match path.parent() {
        Some(dir) => sync_dir(dir),
        None => Ok(()),
    }
}
