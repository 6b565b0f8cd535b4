//! `foldgate archive compact|retain|synth-day`: the archive's maintenance (E3) with a
//! progress bar on long runs, and a synthetic day for the size and lookup benchmark.

use std::path::Path;
use std::time::Instant;

use anyhow::{Result, bail};
use bus_schemas::{EventId, LimitEvent, LimitReason, NodeEpoch, NodeId, WindowId};
use foldgate_archive::compact::{self, CompactReport};
use foldgate_archive::retain::{self, RetainReport};
use foldgate_archive::service::write_atomic;
use foldgate_archive::{ArchiveLayout, encoder};
use indicatif::{ProgressBar, ProgressStyle};

/// A bar that appears only on a terminal (indicatif hides itself otherwise) once a run
/// has rows to show.
fn bar(label: String) -> ProgressBar {
    let pb = ProgressBar::new(0);
    pb.set_style(
        ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} rows ({eta} left)")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    pb.set_message(label);
    pb
}

fn compact_line(r: &CompactReport) -> String {
    match &r.output {
        Some(out) => format!(
            "{}: {} files, {} rows -> {} rows ({} duplicate event ids dropped) in {}",
            encoder::day_text(r.day),
            r.inputs,
            r.rows_in,
            r.rows_out,
            r.rows_in - r.rows_out,
            out.display()
        ),
        None => format!("{}: nothing to compact", encoder::day_text(r.day)),
    }
}

/// `foldgate archive compact`: one closed day, or every closed day not compacted yet.
pub fn compact(archive: &Path, day: Option<&str>) -> Result<Vec<CompactReport>> {
    let layout = ArchiveLayout::new(archive);
    let today = compact::today();
    let days: Vec<i32> = match day {
        Some(text) => {
            let d = parse_day(text)?;
            if d >= today {
                bail!(
                    "{text} is not closed yet (today UTC or later): other writers still add to it"
                );
            }
            vec![d]
        }
        None => compact::days_in(&layout.events_dir())
            .into_iter()
            .filter(|d| *d < today)
            .collect(),
    };
    let mut reports = Vec::new();
    for d in days {
        let pb = bar(format!("compacting {}", encoder::day_text(d)));
        let r = compact::compact_day(&layout, d, &mut |done, total| {
            pb.set_length(total);
            pb.set_position(done);
        })?;
        pb.finish_and_clear();
        for w in &r.warnings {
            eprintln!("warning: {w}");
        }
        println!("{}", compact_line(&r));
        reports.push(r);
    }
    Ok(reports)
}

/// `foldgate archive retain`: days past the retention into `rollup/`.
pub fn retain(archive: &Path, retention_days: u32) -> Result<Vec<RetainReport>> {
    let layout = ArchiveLayout::new(archive);
    let pb = bar("rolling up".into());
    let reports = retain::retain(
        &layout,
        retention_days,
        compact::today(),
        &mut |day, done, total| {
            pb.set_message(format!("rolling up {}", encoder::day_text(day)));
            pb.set_length(total);
            pb.set_position(done);
        },
    )?;
    pb.finish_and_clear();
    for r in &reports {
        for w in &r.warnings {
            eprintln!("warning: {w}");
        }
        match &r.output {
            Some(out) => println!(
                "{}: {} events -> {} roll-up rows in {}",
                encoder::day_text(r.day),
                r.events,
                r.rollup_rows,
                out.display()
            ),
            None => println!("{}: nothing to roll up", encoder::day_text(r.day)),
        }
    }
    if reports.is_empty() {
        println!("no day older than {retention_days} days");
    }
    Ok(reports)
}

/// `YYYY-MM-DD` as days since the Unix epoch.
pub fn parse_day(text: &str) -> Result<i32> {
    compact::parse_day_dir(&format!("day={text}"))
        .ok_or_else(|| anyhow::anyhow!("{text:?} is not a day (YYYY-MM-DD)"))
}

/// The synthetic day's shape.
#[derive(Clone, Debug)]
pub struct SynthDay {
    pub day: i32,
    pub events: u64,
    pub keys: u64,
    pub key_seed: u64,
    pub nodes: u32,
    /// Events per raw file, as an archiver's flushes would cut them.
    pub file_events: u64,
}

/// `foldgate archive synth-day`: `events` limit events spread evenly over one day (500/s
/// all day is 43.2 M), for `keys` seeded bench keys (`foldgate bench-key`) hashed under
/// the keyring's newest version, written as raw files the way an archiver writes them.
/// Returns the seconds it took.
pub fn synth_day(archive: &Path, keyring: &Path, s: &SynthDay) -> Result<f64> {
    crate::keyring::check_outside(keyring, archive)?;
    let (hashers, _) = crate::keyring::retained_hashers(keyring)?;
    let hasher = &hashers[0];
    let key_ids: Vec<bus_schemas::KeyId> = (0..s.keys)
        .map(|i| hasher.key_id(crate::keys::bench_key(s.key_seed, i).as_bytes()))
        .collect();
    let layout = ArchiveLayout::new(archive);
    let dir = ArchiveLayout::day_dir(&layout.events_dir(), s.day);
    let start = Instant::now();
    let day_ms = u64::try_from(s.day).unwrap_or(0) * 86_400_000;
    let pb = bar(format!("writing {}", encoder::day_text(s.day)));
    pb.set_length(s.events);
    // A fixed-seed xorshift: the same command writes the same day.
    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ s.key_seed;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut first = 0u64;
    while first < s.events {
        let last = (first + s.file_events).min(s.events);
        let chunk: Vec<LimitEvent> = (first..last)
            .map(|i| {
                let at_ms = day_ms + i * 86_400_000 / s.events;
                let r = next();
                let node = (r % u64::from(s.nodes.max(1))) as u32;
                LimitEvent {
                    id: EventId {
                        node: NodeId(node),
                        node_epoch: NodeEpoch(1_764_000_000_000 + u64::from(node)),
                        seq: i,
                    },
                    key: key_ids[((r >> 16) % s.keys.max(1)) as usize],
                    plan_id: 1 + ((r >> 40) % 4) as u32,
                    window: WindowId {
                        length_ms: if r & (1 << 50) == 0 { 1_000 } else { 60_000 },
                        number: at_ms / 1_000,
                    },
                    at_ms,
                    correlation_id: format!("{:016x}", next()),
                    reason: if (r >> 52) % 50 == 0 {
                        LimitReason::FastPathDeadline
                    } else {
                        LimitReason::Exhausted
                    },
                    degraded: false,
                    retry_after_ms: 1 + (r >> 56) % 1_000,
                }
            })
            .collect();
        let name = format!("limit-events+0+{first}-{}.parquet", last - 1);
        write_atomic(&dir, &name, &[encoder::encode(&chunk)])?;
        pb.set_position(last);
        first = last;
    }
    pb.finish_and_clear();
    Ok(start.elapsed().as_secs_f64())
}

/// Bytes of every file under `dir`.
pub fn du(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .map(|e| {
            let p = e.path();
            if p.is_dir() {
                du(&p)
            } else {
                e.metadata().map(|m| m.len()).unwrap_or(0)
            }
        })
        .sum()
}
