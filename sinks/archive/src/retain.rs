//! The retention roll-up (E3): a day older than the retention keeps only its counts per
//! key, window length, reason and day, in `rollup/day=D/rollup-g<N>.parquet`
//! (`encoder::rollup_schema`), and its raw files go.
//!
//! The day is compacted first (so its events are de-duplicated by event id and sit in one
//! file), then counted. The roll-up is written crash-safe and names in its footer the files
//! it counted (`compact::ABSORBED_KEY`): the compacted file and any earlier roll-up of the
//! same day. Only then are they removed. A crash in between leaves files that readers skip
//! and the next run removes, so each event is counted once; a second run finds no raw
//! file for the day and changes nothing. Raw events that arrive for a day already rolled up
//! (a late partition) are counted into a new generation together with the old one; their
//! event ids can no longer be checked against the day's, which were dropped with the raw
//! files.

use std::collections::HashMap;
use std::fs;
use std::path::PathBuf;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, Date32Array, RecordBatch, StringArray, UInt8Array, UInt32Array, UInt64Array,
};

use crate::ArchiveError;
use crate::compact::{
    ABSORBED_KEY, CompactReport, ROLLUP_PREFIX, compact_day, days_in, next_generation,
    open_checked, parquet_files, recover_day, relative,
};
use crate::config::ArchiveLayout;
use crate::encoder::{rollup_schema, schema};
use crate::service::{AtomicParquet, PARQUET_SUFFIX, sync_dir, writer_properties};

pub const RETENTION_DAYS_DEFAULT: u32 = 30;

/// What the roll-up did to one day.
#[derive(Debug, Default)]
pub struct RetainReport {
    pub day: i32,
    pub compaction: CompactReport,
    /// Raw events counted into the roll-up.
    pub events: u64,
    /// Roll-up rows written (all generations merged).
    pub rollup_rows: u64,
    pub output: Option<PathBuf>,
    pub warnings: Vec<String>,
}

/// The last day the raw events of which are kept on `today` with `retention_days`.
pub fn oldest_kept_day(today: i32, retention_days: u32) -> i32 {
    today - retention_days as i32
}

/// Rolls up every day of the archive before `oldest_kept_day(today, retention_days)`.
pub fn retain(
    layout: &ArchiveLayout,
    retention_days: u32,
    today: i32,
    progress: &mut dyn FnMut(i32, u64, u64),
) -> Result<Vec<RetainReport>, ArchiveError> {
    let cutoff = oldest_kept_day(today, retention_days);
    let mut reports = Vec::new();
    for day in days_in(&layout.rollup_dir()) {
        if day < cutoff {
            recover_day(layout, day)?;
        }
    }
    for day in days_in(&layout.events_dir()) {
        if day < cutoff {
            reports.push(roll_up_day(layout, day, &mut |d, t| progress(day, d, t))?);
        }
    }
    Ok(reports)
}

type Group = (String, u8, u32, String);

/// Counts day `day`'s raw events into its roll-up and removes them.
pub fn roll_up_day(
    layout: &ArchiveLayout,
    day: i32,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<RetainReport, ArchiveError> {
    let compaction = compact_day(layout, day, progress)?;
    let mut report = RetainReport {
        day,
        warnings: compaction.warnings.clone(),
        compaction,
        ..RetainReport::default()
    };
    recover_day(layout, day)?;
    let events_dir = ArchiveLayout::day_dir(&layout.events_dir(), day);
    let rollup_dir = ArchiveLayout::day_dir(&layout.rollup_dir(), day);
    let (raw_schema, up_schema) = (schema(), rollup_schema());
    let raw: Vec<_> = parquet_files(&events_dir)
        .into_iter()
        .filter_map(|p| open_checked(&p, &raw_schema).ok().map(|b| (p, b)))
        .collect();
    if raw.is_empty() {
        remove_dir_if_empty(&events_dir)?;
        return Ok(report);
    }
    let earlier: Vec<_> = parquet_files(&rollup_dir)
        .into_iter()
        .filter_map(|p| open_checked(&p, &up_schema).ok().map(|b| (p, b)))
        .collect();
    let absorbed: Vec<String> = raw
        .iter()
        .chain(&earlier)
        .map(|(p, _)| relative(&layout.root, p))
        .collect();
    let total: u64 = raw
        .iter()
        .map(|(_, b)| b.metadata().file_metadata().num_rows().max(0) as u64)
        .sum();
    let mut counts: HashMap<Group, u64> = HashMap::new();
    for (_, b) in raw {
        for batch in b.build()? {
            report.events += count_into(&mut counts, &batch?, false)?;
            progress(report.events, total);
        }
    }
    for (_, b) in earlier {
        for batch in b.build()? {
            count_into(&mut counts, &batch?, true)?;
        }
    }
    let mut rows: Vec<(Group, u64)> = counts.into_iter().collect();
    rows.sort_unstable();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Date32Array::from_iter_values(rows.iter().map(|_| day))),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| r.0.0.as_str()),
        )),
        Arc::new(UInt8Array::from_iter_values(rows.iter().map(|r| r.0.1))),
        Arc::new(UInt32Array::from_iter_values(rows.iter().map(|r| r.0.2))),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| r.0.3.as_str()),
        )),
        Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.1))),
    ];
    let batch = RecordBatch::try_new(up_schema.clone(), columns)?;
    let name = format!(
        "{ROLLUP_PREFIX}{:06}{PARQUET_SUFFIX}",
        next_generation(&layout.root, &rollup_dir, ROLLUP_PREFIX)
    );
    let mut out = AtomicParquet::create(
        &rollup_dir,
        &name,
        up_schema,
        writer_properties(),
        &[(
            ABSORBED_KEY,
            serde_json::to_string(&absorbed).expect("strings serialise"),
        )],
    )?;
    out.write(&batch)?;
    report.rollup_rows = batch.num_rows() as u64;
    report.output = Some(out.commit()?);
    // The roll-up is durable and names what it counted: the raw files can go.
    for rel in &absorbed {
        let p = layout.root.join(rel);
        fs::remove_file(&p).map_err(|e| ArchiveError::io(&p, e))?;
    }
    sync_dir(&rollup_dir)?;
    if events_dir.is_dir() {
        sync_dir(&events_dir)?;
    }
    remove_dir_if_empty(&events_dir)?;
    Ok(report)
}

/// Adds a batch's rows to `counts`: one each for raw events, their `events` for roll-up
/// rows. Returns the rows' weight.
fn count_into(
    counts: &mut HashMap<Group, u64>,
    batch: &RecordBatch,
    rollup: bool,
) -> Result<u64, ArchiveError> {
    let key = text_col(batch, "key_id")?;
    let version = batch
        .column_by_name("hash_version")
        .and_then(|c| c.as_any().downcast_ref::<UInt8Array>())
        .ok_or(ArchiveError::Schema("hash_version"))?;
    let window = batch
        .column_by_name("window_ms")
        .and_then(|c| c.as_any().downcast_ref::<UInt32Array>())
        .ok_or(ArchiveError::Schema("window_ms"))?;
    let reason = text_col(batch, "reason")?;
    let weight = if rollup {
        Some(
            batch
                .column_by_name("events")
                .and_then(|c| c.as_any().downcast_ref::<UInt64Array>())
                .ok_or(ArchiveError::Schema("events"))?,
        )
    } else {
        None
    };
    let mut total = 0;
    for i in 0..batch.num_rows() {
        let g = (
            key.value(i).to_string(),
            version.value(i),
            window.value(i),
            reason.value(i).to_string(),
        );
        let n = weight.map_or(1, |w| w.value(i));
        *counts.entry(g).or_default() += n;
        total += n;
    }
    Ok(total)
}

fn text_col<'a>(b: &'a RecordBatch, name: &'static str) -> Result<&'a StringArray, ArchiveError> {
    b.column_by_name(name)
        .and_then(|c| c.as_any().downcast_ref::<StringArray>())
        .ok_or(ArchiveError::Schema(name))
}

/// A day partition with nothing left in it goes, so the day no longer lists as raw.
fn remove_dir_if_empty(dir: &std::path::Path) -> Result<(), ArchiveError> {
    let empty = fs::read_dir(dir).is_ok_and(|mut d| d.next().is_none());
    if empty {
        fs::remove_dir(dir).map_err(|e| ArchiveError::io(dir, e))?;
        if let Some(parent) = dir.parent() {
            sync_dir(parent)?;
        }
    }
    Ok(())
}
