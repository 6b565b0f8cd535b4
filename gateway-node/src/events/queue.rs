//! The hand-off between the 429 path and whatever delivers limit events (E1, E2).
//!
//! A 429 writes one fixed-size [`PendingEvent`] into a fixed-capacity lock-free ring and
//! returns: no lock, no allocation, no await, nothing that can wait on Kafka or a disk.
//! A full ring refuses the push and the event is counted as dropped, so what was lost is
//! exactly what `foldgate_limit_events_dropped_total` says.

use std::sync::atomic::{AtomicU64, Ordering};

use bus_schemas::limits::CORRELATION_ID_BYTES_MAX;
use bus_schemas::{EventId, KeyId, LimitEvent, LimitReason, NodeEpoch, NodeId, WindowId};
use crossbeam_queue::ArrayQueue;

/// What a 429 tells the queue about itself; the queue adds the event id.
#[derive(Clone, Copy, Debug)]
pub struct Limited<'a> {
    pub key: KeyId,
    pub plan_id: u32,
    pub window: WindowId,
    pub at_ms: u64,
    pub reason: LimitReason,
    pub degraded: bool,
    pub retry_after_ms: u64,
    pub correlation_id: &'a str,
}

/// One 429 waiting in the ring: its facts, with the correlation id copied inline so
/// building it allocates nothing.
#[derive(Clone, Copy, Debug)]
struct PendingEvent {
    seq: u64,
    facts: Limited<'static>,
    correlation_id: [u8; CORRELATION_ID_BYTES_MAX],
    correlation_id_len: u8,
}

/// Every event is counted once as emitted, then once as delivered or dropped; the
/// difference is what is still on its way.
#[derive(Debug, Default)]
pub struct EventCounters {
    /// Events the node produced (one per 429).
    pub emitted: AtomicU64,
    /// Events a sink confirmed: a Kafka acknowledgement, or a renamed archive file.
    pub delivered: AtomicU64,
    /// Events lost: a full ring, or a sink that gave up on them.
    pub dropped: AtomicU64,
}

/// The node's limit-event ring and its identity (E1: the event id is node, epoch, seq).
pub struct EventQueue {
    ring: ArrayQueue<PendingEvent>,
    node: NodeId,
    epoch: NodeEpoch,
    next_seq: AtomicU64,
    pub counters: EventCounters,
}

impl EventQueue {
    /// `capacity` events at most wait for the sink (at least one).
    pub fn new(node: NodeId, epoch: NodeEpoch, capacity: usize) -> Self {
        Self {
            ring: ArrayQueue::new(capacity.max(1)),
            node,
            epoch,
            next_seq: AtomicU64::new(1),
            counters: EventCounters::default(),
        }
    }

    /// Hands one 429's event to the sink's side and returns at once. `false`: the ring was
    /// full and the event is dropped (and counted).
    pub fn emit(&self, e: &Limited<'_>) -> bool {
        // An id longer than the wire allows cannot come from `CorrelationIds`; cut rather
        // than lose the event.
        let cid = e.correlation_id.as_bytes();
        let len = cid.len().min(CORRELATION_ID_BYTES_MAX);
        let mut correlation_id = [0u8; CORRELATION_ID_BYTES_MAX];
        correlation_id[..len].copy_from_slice(&cid[..len]);
        let pending = PendingEvent {
            seq: self.next_seq.fetch_add(1, Ordering::Relaxed),
            facts: Limited {
                correlation_id: "",
                ..*e
            },
            correlation_id,
            correlation_id_len: len as u8,
        };
        self.counters.emitted.fetch_add(1, Ordering::Relaxed);
        if self.ring.push(pending).is_ok() {
            true
        } else {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            false
        }
    }

    /// Moves up to `max` waiting events into `out`, oldest first; returns how many.
    pub fn drain_into(&self, out: &mut Vec<LimitEvent>, max: usize) -> usize {
        let mut n = 0;
        while n < max {
            let Some(p) = self.ring.pop() else { break };
            out.push(self.event(&p));
            n += 1;
        }
        n
    }

    /// Events waiting for the sink.
    pub fn len(&self) -> usize {
        self.ring.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.ring.capacity()
    }

    fn event(&self, p: &PendingEvent) -> LimitEvent {
        let cid = &p.correlation_id[..usize::from(p.correlation_id_len)];
        let f = &p.facts;
        LimitEvent {
            id: EventId {
                node: self.node,
                node_epoch: self.epoch,
                seq: p.seq,
            },
            key: f.key,
            plan_id: f.plan_id,
            window: f.window,
            at_ms: f.at_ms,
            // Correlation ids are checked ASCII (`CorrelationIds`), so nothing is lost.
            correlation_id: String::from_utf8_lossy(cid).into_owned(),
            reason: f.reason,
            degraded: f.degraded,
            retry_after_ms: f.retry_after_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limited(cid: &str) -> Limited<'_> {
        Limited {
            key: KeyId {
                version: 1,
                digest: 7,
            },
            plan_id: 3,
            window: WindowId {
                length_ms: 1_000,
                number: 9,
            },
            at_ms: 9_500,
            reason: LimitReason::Exhausted,
            degraded: true,
            retry_after_ms: 500,
            correlation_id: cid,
        }
    }

    #[test]
    fn a_full_ring_drops_and_counts_and_ids_stay_unique() {
        let q = EventQueue::new(NodeId(4), NodeEpoch(77), 2);
        assert!(q.emit(&limited("a")));
        assert!(q.emit(&limited("b")));
        assert!(!q.emit(&limited("c")), "a full ring refuses");
        let mut out = Vec::new();
        assert_eq!(q.drain_into(&mut out, 10), 2);
        assert!(q.emit(&limited("d")));
        assert_eq!(q.drain_into(&mut out, 10), 1);
        let ids: Vec<String> = out.iter().map(|e| e.id.to_string()).collect();
        // The dropped event used seq 3: a gap in a node epoch's sequence marks a drop.
        assert_eq!(ids, ["n4-e77-s1", "n4-e77-s2", "n4-e77-s4"]);
        assert_eq!(out[2].correlation_id, "d");
        assert!(out[0].degraded);
        assert_eq!(q.counters.emitted.load(Ordering::Relaxed), 4);
        assert_eq!(q.counters.dropped.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_long_correlation_id_is_cut_to_the_wire_limit() {
        let q = EventQueue::new(NodeId(0), NodeEpoch(1), 4);
        let long = "x".repeat(CORRELATION_ID_BYTES_MAX + 9);
        q.emit(&limited(&long));
        let mut out = Vec::new();
        q.drain_into(&mut out, 1);
        assert_eq!(out[0].correlation_id.len(), CORRELATION_ID_BYTES_MAX);
    }
}
