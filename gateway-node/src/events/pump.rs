//! The one task between the node's event ring and its sink. It wakes every `flush_ms`,
//! takes what waited (at most the ring's capacity), and hands it to the sink: the Kafka
//! producer (`foldgate-kafka`), or the local archive written off the runtime's worker
//! threads. On shutdown it takes the rest and flushes once more. The 429 path never
//! waits for it: a sink that is slow or down only fills the ring, and a full ring drops
//! and counts (E2).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bus_schemas::{LimitEvent, NodeEpoch, NodeId};
use foldgate_archive::sink::{node_file_name, write_events};
use foldgate_archive::{ArchiveLayout, SinkConfig};
use foldgate_kafka::{EventSource, KafkaConfig, KafkaSink, KafkaSinkError};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::queue::EventQueue;
use super::settings::{EventsSettings, SinkChoice};

#[derive(Debug, thiserror::Error)]
pub enum EventsError {
    #[error("the Kafka sink: {0}")]
    Kafka(#[from] KafkaSinkError),
    #[error(
        "`events.queue_capacity`, `events.flush_ms` and `events.file_events_max` must be at least 1"
    )]
    Bounds,
}

/// The node's event ring, and the task that empties it into the sink.
pub type Running = (Arc<EventQueue>, JoinHandle<()>);

/// The node's event ring and the task that empties it, for the sink `settings` name;
/// `None` when they name none (the node then makes no events).
pub fn start(
    settings: &EventsSettings,
    node: NodeId,
    epoch: NodeEpoch,
    shutdown: watch::Receiver<bool>,
) -> Result<Option<Running>, EventsError> {
    if settings.queue_capacity == 0 || settings.flush_ms == 0 || settings.file_events_max == 0 {
        return Err(EventsError::Bounds);
    }
    let flush = Duration::from_millis(settings.flush_ms);
    let queue = Arc::new(EventQueue::new(node, epoch, settings.queue_capacity));
    let dir = match settings.sink() {
        SinkChoice::None => return Ok(None),
        SinkChoice::Kafka => {
            let mut config = KafkaConfig::new(&settings.brokers, &settings.topic);
            config.properties = settings.kafka.clone();
            // Built before the node serves: a bad property stops it at start.
            let sink = KafkaSink::new(&config)?;
            let batch_max = queue.capacity();
            let task = tokio::spawn(sink.run(Arc::clone(&queue), flush, batch_max, shutdown));
            return Ok(Some((queue, task)));
        }
        SinkChoice::Archive(dir) => dir,
    };
    let config = SinkConfig {
        layout: ArchiveLayout::new(dir),
        file_events_max: settings.file_events_max,
    };
    let task = tokio::spawn(run_archive_pump(
        Arc::clone(&queue),
        config,
        flush,
        shutdown,
    ));
    Ok(Some((queue, task)))
}

/// The Kafka sink takes events from the ring and books their fate on its counters.
impl EventSource for EventQueue {
    fn drain_into(&self, out: &mut Vec<LimitEvent>, max: usize) -> usize {
        EventQueue::drain_into(self, out, max)
    }

    fn delivered(&self, n: u64) {
        self.counters.delivered.fetch_add(n, Ordering::Relaxed);
    }

    fn dropped(&self, n: u64) {
        self.counters.dropped.fetch_add(n, Ordering::Relaxed);
    }
}

/// Empties `queue` into the local archive every `flush` until `shutdown`, then once more.
async fn run_archive_pump(
    queue: Arc<EventQueue>,
    config: SinkConfig,
    flush: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let config = Arc::new(config);
    loop {
        let stopping = tokio::select! {
            _ = tokio::time::sleep(flush) => false,
            _ = shutdown.wait_for(|s| *s) => true,
        };
        // Everything waiting now, but never more than one ring's worth per pass: events
        // that arrive while this pass writes wait for the next.
        let mut batch = Vec::with_capacity(queue.len());
        queue.drain_into(&mut batch, queue.capacity());
        if !batch.is_empty() {
            archive(&queue, &config, batch).await;
        }
        if stopping && queue.is_empty() {
            return;
        }
    }
}

/// Writes one pass's events; counts them delivered once their files are renamed, or
/// dropped if the archive refused them (the error says why, never which key).
async fn archive(queue: &EventQueue, config: &Arc<SinkConfig>, batch: Vec<LimitEvent>) {
    let n = batch.len() as u64;
    let config = Arc::clone(config);
    let written =
        tokio::task::spawn_blocking(move || write_events(&config, &batch, node_file_name)).await;
    let counters = &queue.counters;
    match written {
        Ok(Ok(w)) => {
            counters
                .delivered
                .fetch_add(w.events as u64, Ordering::Relaxed);
        }
        Ok(Err(e)) => {
            let kept = e.written.events as u64;
            counters.delivered.fetch_add(kept, Ordering::Relaxed);
            counters.dropped.fetch_add(n - kept, Ordering::Relaxed);
            tracing::error!(events = n - kept, error = %e, "limit events not archived; dropped");
        }
        Err(e) => {
            counters.dropped.fetch_add(n, Ordering::Relaxed);
            tracing::error!(events = n, error = %e, "archive writer failed; events dropped");
        }
    }
}
