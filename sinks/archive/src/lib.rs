//! The limit-event archive (E3, E4): Parquet files under `ARCHIVE/events/day=YYYY-MM-DD/`,
//! zstd-compressed, each written crash-safe, and read back by `foldgate history` and any
//! Parquet tool. Shared by the node's embedded sink and `foldgate-archiver`.
//!
//! Laid out as every sink is: [`config`] (the layout on disk), [`encoder`] (events as
//! Arrow columns and back), [`service`] (one crash-safe file write), [`sink`] (events into
//! day files), plus [`reader`] (scans that skip bad files) and [`output`] (table, CSV and
//! JSON for the history commands). Maintenance of the archive: [`compact`] (a closed day
//! into one key-sorted file), [`retain`] (days past the retention into `rollup/`),
//! [`erasure`] (a subject's rows out of every file, and the erased-key set) and [`audit`]
//! (the hash-chained trail of who erased or changed hash keys, and why).

pub mod audit;
pub mod compact;
pub mod config;
pub mod encoder;
pub mod erasure;
pub mod output;
pub mod ranges;
pub mod reader;
pub mod retain;
pub mod service;
pub mod sink;

pub use config::{ArchiveLayout, SinkConfig};

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("parquet: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    #[error("arrow: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
    #[error("column `{0}` is missing or not of the archive's type")]
    Schema(&'static str),
    #[error("nothing to write")]
    Empty,
    #[error("day {0} is not closed yet (today UTC or later): other writers still add to it")]
    OpenDay(String),
    #[error("audit trail {path}: {why}")]
    Audit { path: PathBuf, why: String },
}

impl ArchiveError {
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        Self::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}
