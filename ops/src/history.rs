//! `foldgate history`: throttling history from the local archive (E4).
//!
//! The shortcuts (`--keys-from`, `--since`, `--until`, `--top`) are answered here by a
//! plain scan of the Parquet files: no SQL engine, so the `foldgate` binary (and the
//! README's main job) stay small. `--sql` hands the whole command line to
//! `foldgate-history`, the DataFusion binary built on its own (`cargo build -p
//! foldgate-history`), which serves the same archive as tables `events` and `rollup`.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use arrow::array::{
    Array, ArrayRef, BooleanArray, RecordBatch, StringArray, TimestampMillisecondArray, UInt64Array,
};
use arrow::compute::{concat_batches, filter_record_batch, sort_to_indices, take_record_batch};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use foldgate_archive::ArchiveLayout;
use foldgate_archive::encoder::{self, key_id_text};
use foldgate_archive::output;
pub use foldgate_archive::output::Format;
use foldgate_archive::reader::{DayRange, scan, scan_keys};
use gateway_node::http::auth::KeyHasher;

/// What to show from the archive.
#[derive(Clone, Debug, Default)]
pub struct HistoryQuery {
    /// Key ids (`v<version>:<hex>`) to keep; empty keeps every key.
    pub key_ids: HashSet<String>,
    /// Wall time in ms since the epoch, inclusive.
    pub since_ms: Option<u64>,
    /// Wall time in ms since the epoch, exclusive.
    pub until_ms: Option<u64>,
    /// The `n` keys with the most events instead of the events themselves.
    pub top: Option<usize>,
}

/// The rows `q` selects from the archive at `root`, and a warning per file skipped.
pub fn query(root: &Path, q: &HistoryQuery) -> Result<(Vec<RecordBatch>, Vec<String>)> {
    let days = DayRange {
        first: q.since_ms.map(encoder::day_of),
        last: q.until_ms.map(|ms| encoder::day_of(ms.saturating_sub(1))),
    };
    let schema = encoder::schema();
    let table = ArchiveLayout::new(root).events_dir();
    // A key lookup reads only the row groups whose key-id statistics may hold the keys:
    // in a compacted, key-sorted day that is one or two of hundreds.
    let s = if q.key_ids.is_empty() {
        scan(&table, days, &schema)?
    } else {
        let keys: BTreeSet<String> = q.key_ids.iter().cloned().collect();
        scan_keys(&table, days, &schema, &keys)?
    };
    let mut kept = Vec::new();
    for b in &s.batches {
        let keep = mask(b, q)?;
        let b = filter_record_batch(b, &keep)?;
        if b.num_rows() > 0 {
            kept.push(b);
        }
    }
    let all = concat_batches(&schema, &kept)?;
    let rows = match q.top {
        Some(n) => top_keys(&all, n)?,
        None => {
            let at = all.column_by_name("at").context("archive has no `at`")?;
            take_record_batch(&all, &sort_to_indices(at, None, None)?)?
        }
    };
    Ok((vec![rows], s.warnings))
}

fn mask(b: &RecordBatch, q: &HistoryQuery) -> Result<BooleanArray> {
    let keys = encoder::key_ids(b)?;
    let at = b
        .column_by_name("at")
        .and_then(|c| c.as_any().downcast_ref::<TimestampMillisecondArray>())
        .context("archive has no `at`")?;
    Ok((0..b.num_rows())
        .map(|i| {
            let ms = at.value(i).max(0) as u64;
            Some(
                (q.key_ids.is_empty() || q.key_ids.contains(keys.value(i)))
                    && q.since_ms.is_none_or(|s| ms >= s)
                    && q.until_ms.is_none_or(|u| ms < u),
            )
        })
        .collect())
}

/// `key_id, events, first, last` for the `n` keys with the most events, most first.
fn top_keys(b: &RecordBatch, n: usize) -> Result<RecordBatch> {
    let keys = encoder::key_ids(b)?;
    let at = b
        .column_by_name("at")
        .and_then(|c| c.as_any().downcast_ref::<TimestampMillisecondArray>())
        .context("archive has no `at`")?;
    let mut per_key: HashMap<&str, (u64, i64, i64)> = HashMap::new();
    for i in 0..b.num_rows() {
        let t = at.value(i);
        let e = per_key.entry(keys.value(i)).or_insert((0, t, t));
        *e = (e.0 + 1, e.1.min(t), e.2.max(t));
    }
    let mut rows: Vec<_> = per_key.into_iter().collect();
    rows.sort_by(|a, b| b.1.0.cmp(&a.1.0).then(a.0.cmp(b.0)));
    rows.truncate(n);
    let ts = DataType::Timestamp(TimeUnit::Millisecond, Some("+00:00".into()));
    let schema = Schema::new(vec![
        Field::new("key_id", DataType::Utf8, false),
        Field::new("events", DataType::UInt64, false),
        Field::new("first", ts.clone(), false),
        Field::new("last", ts, false),
    ]);
    let stamp = |f: fn(&(u64, i64, i64)) -> i64| -> ArrayRef {
        Arc::new(
            TimestampMillisecondArray::from_iter_values(rows.iter().map(|r| f(&r.1)))
                .with_timezone("+00:00"),
        )
    };
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0))),
        Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.1.0))),
        stamp(|r| r.1),
        stamp(|r| r.2),
    ];
    Ok(RecordBatch::try_new(Arc::new(schema), columns)?)
}

/// The key ids of the raw keys in `input` (one a line), under every hasher: a subject's
/// events may be under any retained hash version (ADR-7). The keys are dropped here.
pub fn key_ids_of(input: impl BufRead, hashers: &[KeyHasher]) -> Result<HashSet<String>> {
    let mut ids = HashSet::new();
    for line in input.lines() {
        let line = line.context("reading keys")?;
        let raw = line.trim();
        if raw.is_empty() {
            continue;
        }
        for h in hashers {
            ids.insert(key_id_text(h.key_id(raw.as_bytes())));
        }
    }
    Ok(ids)
}

/// `YYYY-MM-DD` (midnight UTC) or RFC 3339, as ms since the epoch.
pub fn parse_time_ms(text: &str) -> Result<u64> {
    if let Ok(d) = chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        let t = d.and_hms_opt(0, 0, 0).context("midnight")?.and_utc();
        return Ok(t.timestamp_millis().max(0) as u64);
    }
    let t = chrono::DateTime::parse_from_rfc3339(text)
        .with_context(|| format!("{text:?} is neither YYYY-MM-DD nor RFC 3339"))?;
    Ok(t.timestamp_millis().max(0) as u64)
}

/// Prints `q`'s rows in `format`, and each skipped file's warning on stderr.
pub fn print(root: &Path, q: &HistoryQuery, format: Format) -> Result<()> {
    let (rows, warnings) = query(root, q)?;
    for w in &warnings {
        eprintln!("warning: {w}");
    }
    output::write(&mut std::io::stdout().lock(), format, &rows)?;
    Ok(())
}

/// `foldgate-history`, next to this binary: the SQL engine lives there alone.
pub fn sql_binary() -> Result<PathBuf> {
    let me = std::env::current_exe()?;
    let bin = me.with_file_name("foldgate-history");
    if !bin.exists() {
        bail!(
            "--sql needs {} (the DataFusion binary, kept out of this one): \
             cargo build --release -p foldgate-history",
            bin.display()
        );
    }
    Ok(bin)
}
