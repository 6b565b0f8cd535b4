//! One partition's open file: messages in, Parquet files out, each holding one contiguous
//! offset range of the partition (Kafka Connect's S3 sink's rule).
//!
//! A batch's events may fall on different UTC days. They are cut, in offset order, into
//! runs of consecutive events of one day, and each run is a file in its own
//! `day=YYYY-MM-DD/` directory. The runs' ranges tile the batch: a run's range starts at
//! its first event's offset (the first run at the batch's first offset) and ends just
//! before the next run's first event (the last run at the batch's last offset), so a
//! quarantined, duplicate or erased message is accounted for by the file around it. Files
//! are renamed in offset order, so after a crash the files present always cover a prefix
//! of what was read. Day boundaries within a batch are rare (events are produced in time
//! order per node; only the minutes around midnight interleave), so this costs a few small
//! files a day, which compaction merges.

use std::path::{Path, PathBuf};
use std::time::Instant;

use bus_schemas::{Envelope, LimitEvent};
use foldgate_archive::encoder::{day_of, encode, key_id_text};
use foldgate_archive::ranges::{list_range_files, range_file_name, remove_partition_leftovers};
use foldgate_archive::service::write_atomic;
use foldgate_archive::{ArchiveError, ArchiveLayout};
use tracing::{info, warn};

use crate::erasure::ErasedKeys;
use crate::metrics::Metrics;
use crate::offsets::{RecentIds, archived_to, newest_ids};
use crate::quarantine::{self, Quarantined, hex};

/// One Kafka message, as the writer needs it.
#[derive(Clone, Copy, Debug)]
pub struct Incoming<'a> {
    pub offset: i64,
    pub payload: Option<&'a [u8]>,
    pub key: Option<&'a [u8]>,
    pub timestamp_ms: Option<i64>,
}

/// When a partition's file is closed.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    pub events: usize,
    pub bytes: usize,
    pub age_ms: u64,
}

/// What one flush left on disk.
#[derive(Debug, Default)]
pub struct Flushed {
    pub files: Vec<PathBuf>,
    pub events: usize,
    /// The offset to commit (one past the last accounted for); `None` when nothing was
    /// read since the last flush.
    pub commit: Option<i64>,
}

#[derive(Debug, Default)]
struct Batch {
    /// First and last offset read into this batch.
    range: Option<(i64, i64)>,
    events: Vec<LimitEvent>,
    /// The offset of each of `events`.
    offsets: Vec<i64>,
    bytes: usize,
    opened: Option<Instant>,
}

/// A partition this archiver owns, from assignment to revocation.
pub struct PartitionWriter {
    topic: String,
    partition: i32,
    layout: ArchiveLayout,
    /// The highest offset a finished file accounts for.
    archived_to: Option<i64>,
    /// Set when messages at or below `archived_to` were skipped and the committed offset
    /// may still be behind them.
    commit_behind: bool,
    recent: RecentIds,
    batch: Batch,
}

impl PartitionWriter {
    /// Takes a partition over: removes its writer's leftover temporary files, finds the
    /// highest archived offset in the file names and seeds de-duplication from the newest
    /// file.
    pub fn open(
        layout: &ArchiveLayout,
        topic: &str,
        partition: i32,
        dedupe_window: usize,
        metrics: &Metrics,
    ) -> Result<Self, ArchiveError> {
        let events_dir = layout.events_dir();
        let removed = remove_partition_leftovers(&events_dir, topic, partition)?
            + remove_partition_leftovers(&layout.quarantine_dir(), topic, partition)?;
        Metrics::add(&metrics.leftovers_removed, removed as u64);
        let archived_to = archived_to(&events_dir, topic, partition)?;
        let mut recent = RecentIds::new(dedupe_window);
        match newest_ids(&events_dir, topic, partition) {
            Ok(ids) => ids.into_iter().for_each(|id| {
                recent.insert(id);
            }),
            Err(e) => warn!(partition, error = %e, "newest file unreadable; no ids seeded"),
        }
        info!(
            topic,
            partition,
            archived_to,
            leftovers_removed = removed,
            ids_seeded = recent.len(),
            "partition assigned"
        );
        Ok(Self {
            topic: topic.to_string(),
            partition,
            layout: layout.clone(),
            archived_to,
            commit_behind: false,
            recent,
            batch: Batch::default(),
        })
    }

    pub fn partition(&self) -> i32 {
        self.partition
    }

    pub fn archived_to(&self) -> Option<i64> {
        self.archived_to
    }

    /// Messages read since the last flush (including those that will not become rows).
    pub fn pending(&self) -> u64 {
        self.batch
            .range
            .map_or(0, |(first, last)| (last - first + 1) as u64)
    }

    /// Takes one message in offset order. A message that does not decode is quarantined
    /// here, before any later offset can be committed.
    pub fn push(
        &mut self,
        m: Incoming<'_>,
        erased: &dyn ErasedKeys,
        metrics: &Metrics,
    ) -> Result<(), ArchiveError> {
        Metrics::add(&metrics.messages, 1);
        if self.archived_to.is_some_and(|to| m.offset <= to) {
            Metrics::add(&metrics.already_archived, 1);
            self.commit_behind = true;
            return Ok(());
        }
        let b = &mut self.batch;
        b.range = Some(match b.range {
            Some((first, _)) => (first, m.offset),
            None => (m.offset, m.offset),
        });
        b.opened.get_or_insert_with(Instant::now);
        let payload = m.payload.unwrap_or_default();
        b.bytes += payload.len();
        let event = match LimitEvent::decode(payload) {
            Ok(e) => e,
            Err(e) => {
                let q = Quarantined {
                    topic: &self.topic,
                    partition: self.partition,
                    offset: m.offset,
                    timestamp_ms: m.timestamp_ms,
                    reason: e.to_string(),
                    key_hex: m.key.map(hex),
                    payload_hex: hex(payload),
                };
                if let Some(path) = quarantine::write(&self.layout.quarantine_dir(), &q)? {
                    Metrics::add(&metrics.quarantined, 1);
                    warn!(
                        topic = self.topic,
                        partition = self.partition,
                        offset = m.offset,
                        reason = e.reason(),
                        file = %path.display(),
                        "message quarantined"
                    );
                }
                return Ok(());
            }
        };
        if !erased.erases_nothing() && erased.erased(&key_id_text(event.key)) {
            Metrics::add(&metrics.erased, 1);
            return Ok(());
        }
        if !self.recent.insert(event.id) {
            Metrics::add(&metrics.duplicates, 1);
            return Ok(());
        }
        b.events.push(event);
        b.offsets.push(m.offset);
        Ok(())
    }

    /// Whether the open file reached a bound.
    pub fn full(&self, bounds: Bounds) -> bool {
        let b = &self.batch;
        b.events.len() >= bounds.events
            || b.bytes >= bounds.bytes
            || b.opened
                .is_some_and(|t| t.elapsed().as_millis() >= u128::from(bounds.age_ms))
    }

    /// Writes the open file's runs, each crash-safe, in offset order, and returns the
    /// offset that may now be committed. On an error the runs already renamed stay (each
    /// whole) and the batch is dropped: the caller stops without committing, and a
    /// restart resumes after the last renamed run.
    pub fn flush(&mut self, metrics: &Metrics) -> Result<Flushed, ArchiveError> {
        let b = std::mem::take(&mut self.batch);
        let Some((first, last)) = b.range else {
            let commit = self
                .commit_behind
                .then(|| self.archived_to.map(|to| to + 1));
            self.commit_behind = false;
            return Ok(Flushed {
                commit: commit.flatten(),
                ..Flushed::default()
            });
        };
        // Another writer of this partition (a member the group had given up on, still
        // running) may have renamed a file since the assignment; never write its offsets
        // twice.
        let on_disk = archived_to(&self.layout.events_dir(), &self.topic, self.partition)?;
        let start = match on_disk {
            Some(to) if to >= first && self.archived_to.is_none_or(|mine| to > mine) => {
                warn!(
                    partition = self.partition,
                    on_disk = to,
                    first,
                    "offsets already written by another writer; skipping them"
                );
                self.archived_to = Some(to);
                if to >= last {
                    return Ok(Flushed {
                        commit: Some(to + 1),
                        ..Flushed::default()
                    });
                }
                to + 1
            }
            _ => first,
        };
        let keep = b.offsets.partition_point(|o| *o < start);
        let (events, offsets) = (&b.events[keep..], &b.offsets[keep..]);
        let mut out = Flushed {
            commit: Some(last + 1),
            ..Flushed::default()
        };
        let table = self.layout.events_dir();
        for (i, run) in day_runs(events).iter().enumerate() {
            let run_first = if i == 0 { start } else { offsets[run.start] };
            let run_last = offsets
                .get(run.end)
                .map_or(last, |next_run_first| next_run_first - 1);
            let dir = ArchiveLayout::day_dir(&table, day_of(events[run.start].at_ms));
            let name = range_file_name(&self.topic, self.partition, run_first, run_last);
            let path = write_atomic(&dir, &name, &[encode(&events[run.clone()])])?;
            self.archived_to = Some(run_last);
            out.files.push(path);
            out.events += run.len();
        }
        Metrics::add(&metrics.files, out.files.len() as u64);
        Metrics::add(&metrics.archived, out.events as u64);
        self.commit_behind = false;
        Ok(out)
    }
}

/// `events` cut into runs of consecutive events of one UTC day, as index ranges.
pub fn day_runs(events: &[LimitEvent]) -> Vec<std::ops::Range<usize>> {
    let mut runs = Vec::new();
    let mut start = 0;
    for i in 1..=events.len() {
        if i == events.len() || day_of(events[i].at_ms) != day_of(events[start].at_ms) {
            if start < i {
                runs.push(start..i);
            }
            start = i;
        }
    }
    runs
}

/// The files of `topic` this archive holds, by partition: for operators and tests.
pub fn archived_ranges(
    events_dir: &Path,
    topic: &str,
) -> Result<Vec<(i32, i64, i64)>, ArchiveError> {
    Ok(list_range_files(events_dir, topic, None)?
        .into_iter()
        .map(|f| (f.partition, f.first, f.last))
        .collect())
}
