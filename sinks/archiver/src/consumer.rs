//! The consume loop: one thread, one librdkafka consumer in the group, one
//! [`PartitionWriter`] per assigned partition. A file is renamed (and its directory
//! fsynced) before its offsets are committed, by hand; nothing else ever commits.
//!
//! Rebalances are noted by the consumer's context while `poll` runs and acted on as soon
//! as it returns, before any file is written: a revoked partition's unwritten batch is
//! dropped (its new owner reads it again from the committed offset), and an assigned one
//! is opened from what the archive holds.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use foldgate_archive::ArchiveLayout;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tracing::{debug, info, warn};

use crate::ArchiverError;
use crate::config::ArchiverConfig;
use crate::erasure::{ErasedKeys, NothingErased};
use crate::metrics::Metrics;
use crate::writer::{Bounds, Incoming, PartitionWriter};

#[derive(Debug)]
enum Note {
    Assigned(Vec<i32>),
    Revoked(Vec<i32>),
}

/// Collects rebalances while librdkafka runs them inside `poll`.
#[derive(Default)]
struct NotingContext {
    topic: String,
    notes: Mutex<Vec<Note>>,
}

impl NotingContext {
    fn partitions(&self, tpl: &TopicPartitionList) -> Vec<i32> {
        tpl.elements()
            .iter()
            .filter(|e| e.topic() == self.topic)
            .map(|e| e.partition())
            .collect()
    }

    fn note(&self, n: Note) {
        self.notes.lock().unwrap_or_else(|p| p.into_inner()).push(n);
    }
}

impl ClientContext for NotingContext {}

impl ConsumerContext for NotingContext {
    fn pre_rebalance(&self, _c: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            self.note(Note::Revoked(self.partitions(tpl)));
        }
    }

    fn post_rebalance(&self, _c: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => self.note(Note::Assigned(self.partitions(tpl))),
            Rebalance::Revoke(_) => {}
            Rebalance::Error(e) => warn!(error = %e, "rebalance failed"),
        }
    }
}

/// How a run ends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StopWhen {
    /// Only on the stop flag (SIGTERM, SIGINT).
    #[default]
    Stopped,
    /// Also once every assigned partition has been read to its end and written: a
    /// backfill, a drill, a test.
    CaughtUp,
}

pub struct Archiver {
    config: ArchiverConfig,
    layout: ArchiveLayout,
    metrics: Arc<Metrics>,
    erased: Box<dyn ErasedKeys>,
    stop: Arc<AtomicBool>,
    stop_when: StopWhen,
    pace: Duration,
}

impl Archiver {
    pub fn new(config: ArchiverConfig) -> Result<Self, ArchiverError> {
        config.validate()?;
        Ok(Self {
            layout: ArchiveLayout::new(config.archive_dir.clone()),
            config,
            metrics: Arc::new(Metrics::default()),
            erased: Box::new(NothingErased),
            stop: Arc::new(AtomicBool::new(false)),
            stop_when: StopWhen::Stopped,
            pace: Duration::ZERO,
        })
    }

    /// The erased-key set events are filtered through (default: nothing erased).
    pub fn with_erased(mut self, erased: Box<dyn ErasedKeys>) -> Self {
        self.erased = erased;
        self
    }

    pub fn stop_when(mut self, when: StopWhen) -> Self {
        self.stop_when = when;
        self
    }

    /// Drills and tests only: sleep this long after a flush's files are renamed and before
    /// its offsets are committed, widening the window a crash test aims its kill -9 at.
    pub fn pace(mut self, pace: Duration) -> Self {
        self.pace = pace;
        self
    }

    /// Set it to stop the run: open files are written and committed, then `run` returns.
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }

    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    fn bounds(&self) -> Bounds {
        Bounds {
            events: self.config.file_events_max,
            bytes: self.config.file_bytes_max,
            age_ms: self.config.file_age_max_ms,
        }
    }

    /// Consumes until stopped (or caught up); an archive write that fails ends the run
    /// with that error and without committing what it did not write.
    pub fn run(&self) -> Result<(), ArchiverError> {
        let topic = self.config.topic.clone();
        let context = NotingContext {
            topic: topic.clone(),
            notes: Mutex::default(),
        };
        let consumer: BaseConsumer<NotingContext> = self
            .config
            .client_config()
            .create_with_context(context)
            .map_err(ArchiverError::Kafka)?;
        consumer
            .subscribe(&[&topic])
            .map_err(ArchiverError::Kafka)?;
        info!(
            topic,
            group = self.config.group_id,
            archive = %self.config.archive_dir.display(),
            "archiver started"
        );
        let mut owned: BTreeMap<i32, PartitionWriter> = BTreeMap::new();
        let mut at_end: BTreeSet<i32> = BTreeSet::new();
        let mut last_stats = Instant::now();
        let stats_every = Duration::from_millis(self.config.stats_interval_ms.max(1));
        let bounds = self.bounds();
        let mut first_message: Option<Instant> = None;
        let result = loop {
            if self.stop.load(Ordering::Relaxed) {
                break Ok(());
            }
            let polled = consumer.poll(Duration::from_millis(100));
            if let Err(e) = self.apply_notes(&consumer, &mut owned, &mut at_end) {
                break Err(e);
            }
            let step = match polled {
                None => Ok(()),
                Some(Err(KafkaError::PartitionEOF(p))) => {
                    at_end.insert(p);
                    Ok(())
                }
                Some(Err(e)) => {
                    warn!(error = %e, "consumer error");
                    Ok(())
                }
                Some(Ok(m)) => {
                    first_message.get_or_insert_with(Instant::now);
                    let p = m.partition();
                    at_end.remove(&p);
                    let w = match owned.entry(p) {
                        std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
                        std::collections::btree_map::Entry::Vacant(v) => match self.open(p) {
                            Ok(w) => v.insert(w),
                            Err(e) => break Err(e),
                        },
                    };
                    let incoming = Incoming {
                        offset: m.offset(),
                        payload: m.payload(),
                        key: m.key(),
                        timestamp_ms: m.timestamp().to_millis(),
                    };
                    w.push(incoming, self.erased.as_ref(), &self.metrics)
                        .map_err(ArchiverError::Archive)
                }
            };
            if let Err(e) = step {
                break Err(e);
            }
            // Bounds, including age, are checked every pass, so an idle partition's file
            // still closes on time. Reaching a partition's end does not close its file
            // (a consumer that keeps up is at the end all the time, and would write a
            // file per message); it only commits past offsets skipped as already archived.
            let caught_up = self.stop_when == StopWhen::CaughtUp
                && !owned.is_empty()
                && owned.keys().all(|p| at_end.contains(p));
            let due: Vec<i32> = owned
                .values()
                .filter(|w| {
                    caught_up
                        || w.full(bounds)
                        || (w.pending() == 0 && at_end.contains(&w.partition()))
                })
                .map(|w| w.partition())
                .collect();
            if let Err(e) = self.flush(&consumer, &mut owned, &due) {
                break Err(e);
            }
            if last_stats.elapsed() >= stats_every {
                self.report_stats();
                last_stats = Instant::now();
            }
            if caught_up {
                info!("every assigned partition read to its end and written");
                break Ok(());
            }
        };
        if result.is_ok() {
            // A clean stop still owns its partitions: write what is open and commit it.
            let all: Vec<i32> = owned.keys().copied().collect();
            self.flush(&consumer, &mut owned, &all)?;
        }
        self.report_stats();
        let seconds = first_message.map_or(0.0, |t| t.elapsed().as_secs_f64());
        let events = self.metrics.archived.load(Ordering::Relaxed);
        // The backfill rate: from the first message to the last commit, group join left out.
        info!(
            "run summary: events={events} seconds={seconds:.3} events_per_s={:.0}",
            events as f64 / seconds.max(1e-9)
        );
        result
    }

    fn open(&self, partition: i32) -> Result<PartitionWriter, ArchiverError> {
        PartitionWriter::open(
            &self.layout,
            &self.config.topic,
            partition,
            self.config.dedupe_window,
            &self.metrics,
        )
        .map_err(ArchiverError::Archive)
    }

    fn apply_notes(
        &self,
        consumer: &BaseConsumer<NotingContext>,
        owned: &mut BTreeMap<i32, PartitionWriter>,
        at_end: &mut BTreeSet<i32>,
    ) -> Result<(), ArchiverError> {
        let notes = std::mem::take(
            &mut *consumer
                .context()
                .notes
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        );
        for note in notes {
            debug!(?note, "rebalance");
            match note {
                Note::Revoked(ps) => {
                    for p in ps {
                        at_end.remove(&p);
                        if let Some(w) = owned.remove(&p) {
                            Metrics::add(&self.metrics.revoked_dropped, w.pending());
                            info!(partition = p, dropped = w.pending(), "partition revoked");
                        }
                    }
                }
                Note::Assigned(ps) => {
                    for p in ps {
                        if let Entry::Vacant(e) = owned.entry(p) {
                            e.insert(self.open(p)?);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn flush(
        &self,
        consumer: &BaseConsumer<NotingContext>,
        owned: &mut BTreeMap<i32, PartitionWriter>,
        partitions: &[i32],
    ) -> Result<(), ArchiverError> {
        let mut commit = TopicPartitionList::new();
        for p in partitions {
            let Some(w) = owned.get_mut(p) else { continue };
            let flushed = w.flush(&self.metrics).map_err(ArchiverError::Archive)?;
            if !flushed.files.is_empty() {
                debug!(
                    partition = p,
                    files = flushed.files.len(),
                    events = flushed.events,
                    "files renamed"
                );
            }
            if let Some(next) = flushed.commit {
                commit
                    .add_partition_offset(&self.config.topic, *p, Offset::Offset(next))
                    .map_err(ArchiverError::Kafka)?;
            }
        }
        if commit.count() == 0 {
            return Ok(());
        }
        if !self.pace.is_zero() {
            std::thread::sleep(self.pace);
        }
        // Synchronous: the next file of a partition is only started once the broker holds
        // the previous one's offsets, so a crash re-reads at most one file's worth.
        match consumer.commit(&commit, CommitMode::Sync) {
            Ok(()) => Metrics::add(&self.metrics.commits, 1),
            Err(e) => {
                // The files are renamed; a restart skips their offsets by name, and the
                // next commit covers these.
                Metrics::add(&self.metrics.commit_failures, 1);
                warn!(error = %e, "offset commit failed");
            }
        }
        Ok(())
    }

    fn report_stats(&self) {
        info!(stats = %self.metrics.stats_line(), "archiver stats");
        if let Some(path) = &self.config.metrics_file
            && let Err(e) = self.metrics.write_file(path)
        {
            warn!(error = %e, "metrics file not written");
        }
    }
}
