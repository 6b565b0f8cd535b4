//! Where the archive lives and how it is laid out on disk.

use std::path::{Path, PathBuf};

use crate::encoder::day_text;

/// The archive's layout under its root:
///
/// * `events/day=YYYY-MM-DD/*.parquet` — raw limit events, one partition per UTC day;
/// * `rollup/day=YYYY-MM-DD/*.parquet` — per key, window, reason and day, once a day's
///   raw events pass the retention (E3);
/// * `quarantine/` — messages the archiver could not decode, with their offsets;
/// * `audit/` — the append-only audit trail;
/// * `erasure/` — the erased-key set (salted digests of erased key ids) and its salt.
#[derive(Clone, Debug)]
pub struct ArchiveLayout {
    pub root: PathBuf,
}

impl ArchiveLayout {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    pub fn events_dir(&self) -> PathBuf {
        self.root.join("events")
    }

    pub fn rollup_dir(&self) -> PathBuf {
        self.root.join("rollup")
    }

    pub fn quarantine_dir(&self) -> PathBuf {
        self.root.join("quarantine")
    }

    /// The append-only, hash-chained audit trail (`audit/records.jsonl`).
    pub fn audit_dir(&self) -> PathBuf {
        self.root.join("audit")
    }

    /// The erased-key set and its salt (`erasure/`), which the archiver loads.
    pub fn erasure_dir(&self) -> PathBuf {
        self.root.join("erasure")
    }

    /// Scratch space of a compaction at work: outside `events/` and `rollup/`, so no
    /// reader and no other writer ever lists it.
    pub fn scratch_dir(&self) -> PathBuf {
        self.root.join(".scratch")
    }

    /// The partition of day `day` (days since the Unix epoch) under `table`.
    pub fn day_dir(table: &Path, day: i32) -> PathBuf {
        table.join(format!("day={}", day_text(day)))
    }
}

/// How the local sink batches events into files.
#[derive(Clone, Debug)]
pub struct SinkConfig {
    pub layout: ArchiveLayout,
    /// A file is closed at this many events even inside one flush.
    pub file_events_max: usize,
}
