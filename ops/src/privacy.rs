//! Subject access, erasure, the audit trail and the hash-key keyring's commands (E5, P3,
//! ADR-7). Raw keys arrive on a file or standard input (`--keys-from`), never the command
//! line, are hashed under every retained version of the keyring, and are dropped: no
//! output, audit record or message of these commands holds one.

use std::collections::{BTreeSet, HashSet};
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use arrow::array::{
    Array, ArrayRef, RecordBatch, StringArray, UInt8Array, UInt64Array, new_null_array,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use foldgate_archive::ArchiveLayout;
use foldgate_archive::audit;
use foldgate_archive::compact::{days_in, parquet_files};
use foldgate_archive::encoder::{rollup_schema, schema};
use foldgate_archive::erasure;
use foldgate_archive::output::{self, Format};
use foldgate_archive::reader::{DayRange, scan_keys};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde_json::{Map, Value, json};

use crate::keyring::{Keyring, check_outside, now_text, retained_hashers};

/// Raw keys from `path` (`-`: standard input), one a line, as key ids under `hashers`.
pub fn key_ids_from(
    path: &Path,
    hashers: &[gateway_node::http::auth::KeyHasher],
) -> Result<HashSet<String>> {
    let input: Box<dyn BufRead> = if path.as_os_str() == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        // The error names the file, never a line of it.
        Box::new(BufReader::new(
            File::open(path).with_context(|| format!("opening {}", path.display()))?,
        ))
    };
    let ids = crate::history::key_ids_of(input, hashers)?;
    if ids.is_empty() {
        bail!("no keys in {}", path.display());
    }
    Ok(ids)
}

/// The columns of a subject-access export: the roll-up's, then the raw events' own,
/// empty on roll-up rows; `table` says which a row is, `events` is 1 for a raw event.
fn export_schema() -> SchemaRef {
    let mut fields = vec![Field::new("table", DataType::Utf8, false)];
    let up = rollup_schema();
    for f in up.fields().iter() {
        fields.push(f.as_ref().clone());
    }
    let ev = schema();
    for f in ev.fields().iter() {
        if up.field_with_name(f.name()).is_err() {
            fields.push(f.as_ref().clone().with_nullable(true));
        }
    }
    Arc::new(Schema::new(fields))
}

fn to_export(b: &RecordBatch, table: &str, out: &SchemaRef) -> Result<RecordBatch> {
    let n = b.num_rows();
    let mut cols: Vec<ArrayRef> = Vec::new();
    for f in out.fields().iter() {
        let c: ArrayRef = match f.name().as_str() {
            "table" => Arc::new(StringArray::from_iter_values(std::iter::repeat_n(table, n))),
            "events" if table == "events" => {
                Arc::new(UInt64Array::from_iter_values(std::iter::repeat_n(1, n)))
            }
            name => match b.column_by_name(name) {
                Some(c) => c.clone(),
                None => new_null_array(f.data_type(), n),
            },
        };
        cols.push(c);
    }
    Ok(RecordBatch::try_new(out.clone(), cols)?)
}

/// What a subject-access export held.
#[derive(Debug)]
pub struct Export {
    pub key_ids: usize,
    pub versions: Vec<u8>,
    pub events: usize,
    pub rollup_rows: usize,
}

/// `foldgate subject-access`: the subject's raw events and roll-up rows, under every
/// retained hash version, into `out` (mode 0600: it is personal data).
pub fn subject_access(
    archive: &Path,
    keyring: &Path,
    keys_from: &Path,
    out: &Path,
    format: Format,
) -> Result<Export> {
    check_outside(keyring, archive)?;
    let (hashers, versions) = retained_hashers(keyring)?;
    let ids: BTreeSet<String> = key_ids_from(keys_from, &hashers)?.into_iter().collect();
    let layout = ArchiveLayout::new(archive);
    let ev = scan_keys(&layout.events_dir(), DayRange::default(), &schema(), &ids)?;
    let up = scan_keys(
        &layout.rollup_dir(),
        DayRange::default(),
        &rollup_schema(),
        &ids,
    )?;
    for w in ev.warnings.iter().chain(&up.warnings) {
        eprintln!("warning: {w}");
    }
    let target = export_schema();
    let mut batches = Vec::new();
    for b in &ev.batches {
        batches.push(to_export(b, "events", &target)?);
    }
    for b in &up.batches {
        batches.push(to_export(b, "rollup", &target)?);
    }
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode_0600()
        .open(out)
        .with_context(|| format!("writing {}", out.display()))?;
    if batches.is_empty() {
        batches.push(RecordBatch::new_empty(target));
    }
    output::write(&mut file, format, &batches)?;
    file.sync_all()?;
    Ok(Export {
        key_ids: ids.len(),
        versions,
        events: ev.batches.iter().map(|b| b.num_rows()).sum(),
        rollup_rows: up.batches.iter().map(|b| b.num_rows()).sum(),
    })
}

trait Mode0600 {
    fn mode_0600(&mut self) -> &mut Self;
}

impl Mode0600 for std::fs::OpenOptions {
    fn mode_0600(&mut self) -> &mut Self {
        std::os::unix::fs::OpenOptionsExt::mode(self, 0o600)
    }
}

/// `foldgate erase`: the subject's rows out of every file, the key ids into the erased-key
/// set (so the archiver drops them if they come again), and an audit record. Returns it.
pub fn erase(
    archive: &Path,
    keyring: &Path,
    keys_from: &Path,
    principal: &str,
    reason: &str,
) -> Result<audit::Record> {
    check_outside(keyring, archive)?;
    check_who_why(principal, reason)?;
    let (hashers, versions) = retained_hashers(keyring)?;
    let ids = key_ids_from(keys_from, &hashers)?;
    let layout = ArchiveLayout::new(archive);
    // An erasure must end in its audit record: refuse before touching a file if the
    // chain is torn or tampered with.
    audit::check_appendable(&layout).context("the audit trail does not verify; erasure refused")?;
    // First the set, so an archiver that reloads it stops writing the subject's events
    // before the files are rewritten.
    erasure::record_erased(&layout, ids.iter().map(String::as_str))?;
    let done = erasure::erase_rows(&layout, &ids)?;
    for w in &done.warnings {
        eprintln!("warning: {w}");
    }
    let files: Vec<Value> = done
        .files
        .iter()
        .map(|f| {
            json!({
                "file": f.file,
                "rows_before": f.rows_before,
                "rows_removed": f.rows_removed,
                "file_removed": f.removed,
            })
        })
        .collect();
    let record = record_of(
        "erase",
        principal,
        reason,
        [
            ("hash_versions", json!(versions)),
            // How many key ids were looked for (keys x versions): never which.
            ("key_ids", json!(ids.len())),
            (
                "rows_removed",
                json!(done.files.iter().map(|f| f.rows_removed).sum::<u64>()),
            ),
            ("files", Value::Array(files)),
            ("files_unchecked", json!(done.warnings.len())),
        ],
    );
    Ok(audit::append(&layout, record)?)
}

fn check_who_why(principal: &str, reason: &str) -> Result<()> {
    if principal.trim().is_empty() || reason.trim().is_empty() {
        bail!("--principal and --reason must not be empty: the audit record names who and why");
    }
    Ok(())
}

fn record_of<const N: usize>(
    action: &str,
    principal: &str,
    reason: &str,
    extra: [(&str, Value); N],
) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("action".into(), json!(action));
    m.insert("at".into(), json!(now_text()));
    m.insert("principal".into(), json!(principal));
    m.insert("reason".into(), json!(reason));
    for (k, v) in extra {
        m.insert(k.into(), v);
    }
    m
}

/// `foldgate hash-key add`: a new version (random, or `import`'s hex, e.g. the node's
/// current `hash_key_file`), audited. Returns the version.
pub fn hash_key_add(
    keyring: &Path,
    archive: &Path,
    principal: &str,
    reason: &str,
    import: Option<&Path>,
) -> Result<u8> {
    check_outside(keyring, archive)?;
    check_who_why(principal, reason)?;
    let layout = ArchiveLayout::new(archive);
    audit::check_appendable(&layout).context("the audit trail does not verify")?;
    let mut ring = Keyring::load_or_empty(keyring)?;
    let secret = match import {
        Some(p) => {
            let hex =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            Some(
                erasure::decode_hex(hex.trim())
                    .with_context(|| format!("{} is not hex", p.display()))?,
            )
        }
        None => None,
    };
    let version = ring.add(secret)?;
    ring.save(keyring)?;
    audit::append(
        &layout,
        record_of(
            "hash-key-add",
            principal,
            reason,
            [
                ("version", json!(version)),
                ("imported", json!(import.is_some())),
            ],
        ),
    )?;
    Ok(version)
}

/// Rows under hash version `version` that keep it from being destroyed: raw events of
/// any day (retention rolls them up first), and roll-up rows of days still within the
/// retention.
pub fn rows_under_version(
    layout: &ArchiveLayout,
    version: u8,
    oldest_kept_day: i32,
) -> Result<(u64, u64)> {
    let mut counts = [0u64; 2];
    for (i, table) in [layout.events_dir(), layout.rollup_dir()]
        .iter()
        .enumerate()
    {
        for day in days_in(table) {
            if i == 1 && day < oldest_kept_day {
                continue;
            }
            for path in parquet_files(&ArchiveLayout::day_dir(table, day)) {
                let Ok(file) = File::open(&path) else {
                    continue;
                };
                let Ok(b) = ParquetRecordBatchReaderBuilder::try_new(file) else {
                    eprintln!("warning: {}: unreadable; not checked", path.display());
                    continue;
                };
                if b.schema().field_with_name("hash_version").is_err() {
                    continue;
                }
                let mask = ProjectionMask::columns(b.parquet_schema(), ["hash_version"]);
                for batch in b.with_projection(mask).build()? {
                    let batch = batch?;
                    let v = batch
                        .column(0)
                        .as_any()
                        .downcast_ref::<UInt8Array>()
                        .context("hash_version is not u8")?;
                    counts[i] += (0..v.len()).filter(|&r| v.value(r) == version).count() as u64;
                }
            }
        }
    }
    Ok((counts[0], counts[1]))
}

/// `foldgate hash-key destroy`: refused while the archive holds events under the version
/// within retention; audited.
pub fn hash_key_destroy(
    keyring: &Path,
    archive: &Path,
    principal: &str,
    reason: &str,
    version: u8,
    retention_days: u32,
) -> Result<()> {
    check_outside(keyring, archive)?;
    check_who_why(principal, reason)?;
    let layout = ArchiveLayout::new(archive);
    audit::check_appendable(&layout).context("the audit trail does not verify")?;
    let mut ring = Keyring::load(keyring)?;
    let today = foldgate_archive::compact::today();
    let oldest = foldgate_archive::retain::oldest_kept_day(today, retention_days);
    let (raw, rollup) = rows_under_version(&layout, version, oldest)?;
    if raw + rollup > 0 {
        bail!(
            "refused: the archive still holds {raw} raw events and {rollup} roll-up rows within \
             retention under hash key version {version}; without the key they could no longer \
             be found for subject access or erasure (wait for `foldgate archive retain`)"
        );
    }
    ring.destroy(version)?;
    ring.save(keyring)?;
    audit::append(
        &layout,
        record_of(
            "hash-key-destroy",
            principal,
            reason,
            [("version", json!(version))],
        ),
    )?;
    Ok(())
}

/// `foldgate hash-key list`: versions and dates, never key bytes.
pub fn hash_key_list(keyring: &Path) -> Result<String> {
    let ring = Keyring::load(keyring)?;
    let mut out = String::from("version  created               state\n");
    for k in &ring.keys {
        let state = match &k.destroyed {
            Some(at) => format!("destroyed {at}"),
            None => "retained".into(),
        };
        out.push_str(&format!("{:<8} {:<21} {state}\n", k.version, k.created));
    }
    Ok(out)
}

/// `foldgate audit verify`: the chain's length and head, or the first bad record.
pub fn audit_verify(archive: &Path) -> Result<audit::Verified> {
    Ok(audit::verify(&ArchiveLayout::new(archive))?)
}
