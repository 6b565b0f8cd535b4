//! Messages that do not decode (garbage, an unknown schema version, an invalid field):
//! each is written whole to `ARCHIVE/quarantine/<topic>+<partition>+<offset>.json`, crash-safe
//! like every archive file, before any later offset of its partition is committed. The
//! name makes a re-read after a crash land on the same file, which is then left as it is
//! and not counted again.

use std::path::{Path, PathBuf};

use foldgate_archive::ArchiveError;
use foldgate_archive::ranges::partition_prefix;
use foldgate_archive::service::write_bytes_atomic;
use serde::Serialize;

/// What is kept of a quarantined message: where it was, why it was refused, and its bytes
/// (hex) for whoever diagnoses the producer.
#[derive(Debug, Serialize)]
pub struct Quarantined<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    /// The broker's timestamp of the message, ms; absent when it has none.
    pub timestamp_ms: Option<i64>,
    pub reason: String,
    pub key_hex: Option<String>,
    pub payload_hex: String,
}

pub fn file_name(topic: &str, partition: i32, offset: i64) -> String {
    format!("{}{offset:020}.json", partition_prefix(topic, partition))
}

pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// Writes `q` under `dir` unless a previous run did; `Ok(None)` when the file was already
/// there.
pub fn write(dir: &Path, q: &Quarantined<'_>) -> Result<Option<PathBuf>, ArchiveError> {
    let name = file_name(q.topic, q.partition, q.offset);
    if dir.join(&name).exists() {
        return Ok(None);
    }
    let mut body = serde_json::to_vec_pretty(q).expect("a quarantine record serialises");
    body.push(b'\n');
    write_bytes_atomic(dir, &name, &body).map(Some)
}
