//! The archiver's counters: fixed atomics, rendered as Prometheus text when read. The
//! archiver serves no HTTP; it rewrites a metrics file (node_exporter's textfile
//! collector reads it) and logs the same figures as a stats line.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use foldgate_archive::ArchiveError;
use foldgate_archive::service::write_bytes_atomic;

#[derive(Debug, Default)]
pub struct Metrics {
    /// Kafka messages read (every offset, whatever became of it).
    pub messages: AtomicU64,
    /// Events written into renamed files.
    pub archived: AtomicU64,
    pub files: AtomicU64,
    /// Messages that did not decode, written to `quarantine/`.
    pub quarantined: AtomicU64,
    /// Events dropped because their event id was archived moments before.
    pub duplicates: AtomicU64,
    /// Events dropped because their key is erased.
    pub erased: AtomicU64,
    /// Messages read again after a restart or rebalance whose offsets a file already holds.
    pub already_archived: AtomicU64,
    /// Buffered messages dropped because their partition was taken away before the file
    /// was written; the new owner reads them again from the committed offset.
    pub revoked_dropped: AtomicU64,
    pub commits: AtomicU64,
    pub commit_failures: AtomicU64,
    /// Temporary files a crashed writer left, removed.
    pub leftovers_removed: AtomicU64,
}

impl Metrics {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    fn rows(&self) -> [(&'static str, &'static str, &AtomicU64); 11] {
        [
            ("messages_total", "Kafka messages read", &self.messages),
            (
                "events_archived_total",
                "events written into renamed Parquet files",
                &self.archived,
            ),
            (
                "files_written_total",
                "Parquet files renamed into place",
                &self.files,
            ),
            (
                "quarantined_total",
                "messages that did not decode, quarantined",
                &self.quarantined,
            ),
            (
                "duplicates_dropped_total",
                "events dropped as a repeated event id",
                &self.duplicates,
            ),
            (
                "erased_dropped_total",
                "events of an erased key dropped",
                &self.erased,
            ),
            (
                "already_archived_total",
                "messages read again whose offsets a file already holds",
                &self.already_archived,
            ),
            (
                "revoked_dropped_total",
                "buffered messages dropped when their partition was revoked",
                &self.revoked_dropped,
            ),
            (
                "commits_total",
                "offset commits after a rename",
                &self.commits,
            ),
            (
                "commit_failures_total",
                "offset commits that failed (the next one covers them)",
                &self.commit_failures,
            ),
            (
                "leftovers_removed_total",
                "temporary files of a crashed writer removed",
                &self.leftovers_removed,
            ),
        ]
    }

    /// Prometheus text exposition, every name prefixed `foldgate_archiver_`.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for (name, help, v) in self.rows() {
            let _ = writeln!(out, "# HELP foldgate_archiver_{name} {help}");
            let _ = writeln!(out, "# TYPE foldgate_archiver_{name} counter");
            let _ = writeln!(
                out,
                "foldgate_archiver_{name} {}",
                v.load(Ordering::Relaxed)
            );
        }
        out
    }

    /// `name=value` pairs for the stats log line.
    pub fn stats_line(&self) -> String {
        self.rows()
            .iter()
            .map(|(name, _, v)| {
                format!(
                    "{}={}",
                    name.trim_end_matches("_total"),
                    v.load(Ordering::Relaxed)
                )
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Rewrites `path` whole, so the collector never reads half a file.
    pub fn write_file(&self, path: &Path) -> Result<(), ArchiveError> {
        let dir = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("foldgate-archiver.prom");
        write_bytes_atomic(dir, name, self.render().as_bytes()).map(|_| ())
    }
}
