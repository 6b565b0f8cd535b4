//! The audit trail (E5, ADR-7): `ARCHIVE/audit/records.jsonl`, append-only and
//! tamper-evident. Each line is `<sha256 hex> <JSON object>`: the hash is SHA-256 of the
//! JSON text exactly as written, and the object carries `seq` (1, 2, ...) and `prev`, the
//! hash of the line before (64 zeros for the first). Changing any byte of a record breaks
//! its own hash; removing or reordering records breaks the next `prev`. Rewriting the
//! whole tail consistently is only caught against a head hash kept elsewhere: `foldgate
//! audit verify` prints the head so an operator can record it outside the archive.
//!
//! An append is one `write` of one line, then fsync (and the directory's, when the file
//! is new), under an exclusive lock on the file. A crash mid-append leaves a last line
//! without its newline or with a bad hash: a torn tail, which `verify` reports and which
//! makes the next append refuse, rather than chaining onto a record nobody can check.

use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::ArchiveError;
use crate::config::ArchiveLayout;
use crate::service::sync_dir;

pub const AUDIT_FILE: &str = "records.jsonl";
/// `prev` of the first record.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

pub fn audit_path(layout: &ArchiveLayout) -> PathBuf {
    layout.audit_dir().join(AUDIT_FILE)
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A checked record.
#[derive(Clone, Debug)]
pub struct Record {
    pub seq: u64,
    pub hash: String,
    pub body: Map<String, Value>,
}

/// A whole chain checked: how many records, and the last one's hash (the head).
#[derive(Clone, Debug)]
pub struct Verified {
    pub records: u64,
    pub head: String,
    pub entries: Vec<Record>,
}

fn fault(path: &Path, why: String) -> ArchiveError {
    ArchiveError::Audit {
        path: path.to_path_buf(),
        why,
    }
}

/// Checks line `n` (1-based) against the hash before it; returns the record.
fn check_line(path: &Path, n: u64, line: &str, prev: &str) -> Result<Record, ArchiveError> {
    let bad = |why: &str| fault(path, format!("record {n} (line {n}): {why}"));
    let (hash, body_text) = line
        .split_once(' ')
        .ok_or_else(|| bad("not `<hash> <json>`"))?;
    if sha256_hex(body_text.as_bytes()) != hash {
        return Err(bad("its hash does not match its contents (edited or torn)"));
    }
    let body: Map<String, Value> =
        serde_json::from_str(body_text).map_err(|_| bad("not a JSON object"))?;
    if body.get("prev").and_then(Value::as_str) != Some(prev) {
        return Err(bad(
            "`prev` is not the hash of the record before (a record removed, reordered or edited)",
        ));
    }
    if body.get("seq").and_then(Value::as_u64) != Some(n) {
        return Err(bad("`seq` out of order"));
    }
    Ok(Record {
        seq: n,
        hash: hash.to_string(),
        body,
    })
}

fn check_text(path: &Path, text: &str) -> Result<Verified, ArchiveError> {
    let mut prev = GENESIS.to_string();
    let mut entries = Vec::new();
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    for (i, raw) in lines.iter().enumerate() {
        let n = i as u64 + 1;
        let Some(line) = raw.strip_suffix('\n') else {
            return Err(fault(
                path,
                format!(
                    "record {n} (line {n}): torn tail, no end of line (a crash during an append?)"
                ),
            ));
        };
        let r = check_line(path, n, line, &prev)?;
        prev = r.hash.clone();
        entries.push(r);
    }
    Ok(Verified {
        records: entries.len() as u64,
        head: prev,
        entries,
    })
}

/// Checks the whole chain; the error names the first bad record.
pub fn verify(layout: &ArchiveLayout) -> Result<Verified, ArchiveError> {
    let path = audit_path(layout);
    match fs::read(&path) {
        Ok(bytes) => {
            let text = String::from_utf8(bytes)
                .map_err(|_| fault(&path, "not UTF-8 text (edited?)".into()))?;
            check_text(&path, &text)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Verified {
            records: 0,
            head: GENESIS.into(),
            entries: Vec::new(),
        }),
        Err(e) => Err(ArchiveError::io(&path, e)),
    }
}

/// Appends `record` (an object without `seq` and `prev`, which this adds) and returns it
/// as written. Refuses on a chain that does not check: a record must never be chained to
/// one that cannot be verified.
pub fn append(
    layout: &ArchiveLayout,
    mut record: Map<String, Value>,
) -> Result<Record, ArchiveError> {
    let dir = layout.audit_dir();
    fs::create_dir_all(&dir).map_err(|e| ArchiveError::io(&dir, e))?;
    let path = audit_path(layout);
    let created = !path.exists();
    let mut file = OpenOptions::new()
        .create(true)
        .read(true)
        .append(true)
        .open(&path)
        .map_err(|e| ArchiveError::io(&path, e))?;
    // Two appenders at once would chain onto the same record.
    file.lock().map_err(|e| ArchiveError::io(&path, e))?;
    let mut text = String::new();
    file.read_to_string(&mut text)
        .map_err(|_| fault(&path, "not UTF-8 text (edited?)".into()))?;
    let chain = check_text(&path, &text)?;
    let seq = chain.records + 1;
    record.insert("seq".into(), Value::from(seq));
    record.insert("prev".into(), Value::from(chain.head));
    let body = serde_json::to_string(&record).expect("a JSON object serialises");
    let hash = sha256_hex(body.as_bytes());
    file.write_all(format!("{hash} {body}\n").as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| ArchiveError::io(&path, e))?;
    drop(file);
    if created {
        sync_dir(&dir)?;
    }
    Ok(Record {
        seq,
        hash,
        body: record,
    })
}

/// The chain's text, for a caller that checks it was not torn before doing work that
/// must end in an append (an erasure).
pub fn check_appendable(layout: &ArchiveLayout) -> Result<(), ArchiveError> {
    verify(layout).map(|_| ())
}
