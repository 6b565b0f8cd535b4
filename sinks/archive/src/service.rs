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
