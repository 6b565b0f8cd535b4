//! The loop between an event source (the node's ring) and the producer. Every `every` it
//! takes what waited, at most `batch_max`, encodes it and hands it to librdkafka; each
//! acknowledgement counts one event delivered, and each message librdkafka gives up on
//! (past `message.timeout.ms`, a fatal producer error) counts one dropped. While the
//! producer's queue is full the loop keeps its batch and takes nothing more, so the ring
//! fills and drops, counted; nothing is lost without a count. It never blocks a thread:
//! the source's pushes (the 429 path) never wait for it.

use std::collections::VecDeque;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use bus_schemas::LimitEvent;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use rdkafka::producer::DeliveryFuture;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::KafkaSinkError;
use crate::config::KafkaConfig;
use crate::encoder::{Encoded, encode};
use crate::service::{KafkaService, Refused};

/// Where the sink takes events from, and whom it tells what became of each.
pub trait EventSource: Send + Sync + 'static {
    /// Moves up to `max` waiting events into `out`, oldest first; returns how many.
    fn drain_into(&self, out: &mut Vec<LimitEvent>, max: usize) -> usize;
    /// `n` events were acknowledged by Kafka.
    fn delivered(&self, n: u64);
    /// `n` events will never reach Kafka.
    fn dropped(&self, n: u64);
}

/// How soon a batch the producer's full queue refused is offered again.
const RETRY: Duration = Duration::from_millis(20);
/// Messages handed to librdkafka between two yields, so a large batch does not hold a
/// runtime worker that the gateway's requests share.
const SEND_SLICE: usize = 1_024;

pub struct KafkaSink {
    service: KafkaService,
    shutdown_flush: Duration,
}

impl KafkaSink {
    pub fn new(config: &KafkaConfig) -> Result<Self, KafkaSinkError> {
        Ok(Self {
            service: KafkaService::new(config)?,
            shutdown_flush: config.shutdown_flush,
        })
    }

    pub fn service(&self) -> &KafkaService {
        &self.service
    }

    /// Carries events from `source` to Kafka every `every` until `shutdown` turns true;
    /// then takes what is left and waits up to the configured `shutdown_flush` for its
    /// acknowledgements, counting whatever is still unacknowledged as dropped.
    pub async fn run<S: EventSource + ?Sized>(
        self,
        source: Arc<S>,
        every: Duration,
        batch_max: usize,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut run = Run {
            service: &self.service,
            source: &*source,
            pending: VecDeque::new(),
            inflight: FuturesUnordered::new(),
            scratch: Vec::new(),
            batch_max: batch_max.max(1),
            failures: Failures::default(),
        };
        let mut tick = pin!(tokio::time::sleep(every));
        loop {
            let stopping = tokio::select! {
                Some(r) = run.inflight.next(), if !run.inflight.is_empty() => {
                    run.book(r);
                    continue;
                }
                () = &mut tick => false,
                _ = shutdown.wait_for(|s| *s) => true,
            };
            run.refill();
            run.send_pending().await;
            run.failures.report(run.pending.len());
            if stopping {
                break;
            }
            let wait = if run.pending.is_empty() { every } else { RETRY };
            tick.as_mut().reset(Instant::now() + wait);
        }
        run.finish(Instant::now() + self.shutdown_flush).await;
    }
}

/// One run's state: what was taken but not yet accepted by librdkafka (`pending`), and
/// what librdkafka holds awaiting its report (`inflight`). Each event is in exactly one of
/// them until it is counted.
struct Run<'a, S: ?Sized> {
    service: &'a KafkaService,
    source: &'a S,
    pending: VecDeque<Encoded>,
    inflight: FuturesUnordered<DeliveryFuture>,
    scratch: Vec<LimitEvent>,
    batch_max: usize,
    failures: Failures,
}

impl<S: EventSource + ?Sized> Run<'_, S> {
    /// Takes the next batch, only once the last one is all with librdkafka: while its
    /// queue is full the events wait in the source, whose bound is the one that drops.
    fn refill(&mut self) -> usize {
        if !self.pending.is_empty() {
            return 0;
        }
        self.scratch.clear();
        let n = self.source.drain_into(&mut self.scratch, self.batch_max);
        self.pending.extend(self.scratch.iter().map(encode));
        n
    }

    async fn send_pending(&mut self) {
        let mut sent = 0;
        while let Some(m) = self.pending.front() {
            match self.service.send(m) {
                Ok(f) => self.inflight.push(f),
                Err(Refused::QueueFull) => {
                    self.failures.queue_full = true;
                    return;
                }
                Err(Refused::Failed(e)) => {
                    self.source.dropped(1);
                    self.failures.note(&e);
                }
            }
            self.pending.pop_front();
            sent += 1;
            if sent % SEND_SLICE == 0 {
                tokio::task::yield_now().await;
            }
        }
    }

    fn book(&mut self, r: <DeliveryFuture as std::future::Future>::Output) {
        match r {
            Ok(Ok(_)) => self.source.delivered(1),
            Ok(Err((e, _message))) => {
                self.source.dropped(1);
                self.failures.note(&e);
            }
            Err(_canceled) => {
                self.source.dropped(1);
                self.failures
                    .note(&"the producer went away before reporting");
            }
        }
    }

    /// Sends everything left (the source no longer grows: the node stopped serving) and
    /// books reports until `by`; what has no report then is counted dropped.
    async fn finish(mut self, by: Instant) {
        while Instant::now() < by {
            let took = self.refill();
            self.send_pending().await;
            if took == 0 && self.pending.is_empty() && self.inflight.is_empty() {
                break;
            }
            let wake = by.min(Instant::now() + RETRY);
            if self.inflight.is_empty() {
                tokio::time::sleep_until(wake).await;
            } else if let Ok(Some(r)) = tokio::time::timeout_at(wake, self.inflight.next()).await {
                self.book(r);
            }
        }
        let mut rest = Vec::new();
        while self.source.drain_into(&mut rest, self.batch_max) > 0 {}
        let unsent = (self.pending.len() + self.inflight.len() + rest.len()) as u64;
        if unsent > 0 {
            self.source.dropped(unsent);
            tracing::error!(
                events = unsent,
                "limit events not acknowledged by Kafka when the node stopped; dropped"
            );
        }
        self.failures.report(0);
    }
}

/// Failures since the last report, logged once a pass instead of once an event: an
/// outage past `message.timeout.ms` fails thousands at once.
#[derive(Default)]
struct Failures {
    events: u64,
    last: Option<String>,
    queue_full: bool,
    was_full: bool,
}

impl Failures {
    fn note(&mut self, e: &dyn std::fmt::Display) {
        self.events += 1;
        self.last = Some(e.to_string());
    }

    /// Logs what failed since the last call; `waiting` events are held back by a full
    /// producer queue (logged when that starts and when it ends, not every pass).
    fn report(&mut self, waiting: usize) {
        if self.events > 0 {
            tracing::error!(
                events = self.events,
                error = self.last.as_deref().unwrap_or(""),
                "limit events not delivered to Kafka; dropped"
            );
            self.events = 0;
        }
        let full = std::mem::take(&mut self.queue_full) && waiting > 0;
        if full && !self.was_full {
            tracing::warn!(
                waiting,
                "the Kafka producer's queue is full; limit events wait in the node's ring"
            );
        } else if !full && self.was_full {
            tracing::info!("the Kafka producer's queue has room again");
        }
        self.was_full = full;
    }
}
