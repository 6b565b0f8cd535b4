//! The simulated bus: a priority queue of deliveries on a microsecond virtual clock, with
//! seeded loss, duplication, reordering and cuts. Like core NATS it is at-most-once: a
//! message sent while the bus is cut, or arriving while it is cut, is gone.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use bus_schemas::{Envelope, FastPathReply, FastPathRequest, GrantBatch, ReportBatch};

use super::global_sync::{GsHits, GsRemaining};
use super::rng::Rng;

#[derive(Clone, Debug)]
pub enum Payload {
    Report(ReportBatch),
    Grant(GrantBatch),
    FastPathRequest(FastPathRequest),
    FastPathReply(FastPathReply),
    GsHits(GsHits),
    GsRemaining(GsRemaining),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Owner(u32),
    Node(u32),
}

#[derive(Clone, Copy, Debug)]
pub struct BusParams {
    pub loss_pct: f64,
    pub dup_pct: f64,
    pub reorder_pct: f64,
    /// One-way latency: a fixed part plus an exponential tail (loopback-class LAN).
    pub base_us: u64,
    pub jitter_mean_us: f64,
    /// A reordered message is held back by up to this long, past later messages.
    pub reorder_max_us: u64,
    /// Round-trip every Foldgate envelope through the real codec (bus-schemas).
    pub codec: bool,
}

struct Scheduled {
    at_us: u64,
    seq: u64,
    target: Target,
    payload: Payload,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at_us, self.seq) == (other.at_us, other.seq)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    // Reversed: BinaryHeap is a max-heap and the earliest delivery must come out first.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at_us, other.seq).cmp(&(self.at_us, self.seq))
    }
}

#[derive(Default, Debug, Clone, Copy)]
pub struct BusStats {
    pub sent: u64,
    pub delivered: u64,
    pub lost: u64,
    pub cut: u64,
    pub duplicated: u64,
    pub reordered: u64,
}

/// Queued deliveries are bounded: a run that piles up more than this is a driver bug.
const QUEUE_CAP: usize = 4_000_000;

pub struct Bus {
    params: BusParams,
    rng: Rng,
    queue: BinaryHeap<Scheduled>,
    seq: u64,
    cut: bool,
    pub stats: BusStats,
}

/// What became of a fast-path request (D5), decided when it is sent.
pub enum FastPathFate {
    /// Both legs arrive inside the 1 ms deadline: the owner answers now.
    OnTime,
    /// The request reaches the owner at `at_us`; its reply will be too late.
    Late {
        at_us: u64,
    },
    Lost,
}

/// D5's hard deadline.
pub const FAST_PATH_DEADLINE_US: u64 = 1_000;

impl Bus {
    pub fn new(params: BusParams, seed: u64) -> Self {
        Self {
            params,
            rng: Rng::stream(seed, 0xb05),
            queue: BinaryHeap::new(),
            seq: 0,
            cut: false,
            stats: BusStats::default(),
        }
    }

    pub fn set_cut(&mut self, cut: bool) {
        self.cut = cut;
    }

    pub fn is_cut(&self) -> bool {
        self.cut
    }

    fn latency_us(&mut self) -> u64 {
        self.params.base_us + self.rng.exp(self.params.jitter_mean_us) as u64
    }

    pub fn send(&mut self, now_us: u64, target: Target, payload: Payload) {
        self.stats.sent += 1;
        if self.cut {
            self.stats.cut += 1;
            return;
        }
        if self.rng.chance_pct(self.params.loss_pct) {
            self.stats.lost += 1;
            return;
        }
        let copies = if self.rng.chance_pct(self.params.dup_pct) {
            self.stats.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            let mut at_us = now_us + self.latency_us();
            if self.rng.chance_pct(self.params.reorder_pct) {
                self.stats.reordered += 1;
                at_us += self.rng.below(self.params.reorder_max_us.max(1));
            }
            self.schedule(at_us, target, payload.clone());
        }
    }

    /// Queues a message whose fate was already drawn (a late fast-path request).
    pub fn schedule(&mut self, at_us: u64, target: Target, payload: Payload) {
        assert!(self.queue.len() < QUEUE_CAP, "bus queue over its cap");
        self.seq += 1;
        self.queue.push(Scheduled {
            at_us,
            seq: self.seq,
            target,
            payload,
        });
    }

    /// The next delivery due at or before `now_us`, already through the codec if asked.
    pub fn pop_due(&mut self, now_us: u64) -> Option<(Target, Payload)> {
        loop {
            if self.queue.peek()?.at_us > now_us {
                return None;
            }
            let s = self.queue.pop()?;
            if self.cut {
                self.stats.cut += 1;
                continue;
            }
            self.stats.delivered += 1;
            let payload = if self.params.codec {
                through_codec(s.payload)
            } else {
                s.payload
            };
            return Some((s.target, payload));
        }
    }

    /// Samples both legs of a fast-path round trip (D5) when the request is sent.
    pub fn fast_path(&mut self, now_us: u64) -> FastPathFate {
        self.stats.sent += 1;
        if self.cut {
            self.stats.cut += 1;
            return FastPathFate::Lost;
        }
        if self.rng.chance_pct(self.params.loss_pct) {
            self.stats.lost += 1;
            return FastPathFate::Lost;
        }
        let there = self.latency_us();
        let back = self.latency_us();
        let reply_lost = self.rng.chance_pct(self.params.loss_pct);
        if !reply_lost && there + back <= FAST_PATH_DEADLINE_US {
            self.stats.delivered += 2;
            FastPathFate::OnTime
        } else {
            FastPathFate::Late {
                at_us: now_us + there,
            }
        }
    }
}

fn round_trip<E: Envelope>(value: E) -> E {
    E::decode(&value.encode()).expect("the simulator only sends valid envelopes")
}

/// Every Foldgate envelope crosses the real wire format, as it would on NATS. The
/// global-sync baseline is not Foldgate's protocol and has no envelope.
fn through_codec(payload: Payload) -> Payload {
    match payload {
        Payload::Report(r) => Payload::Report(round_trip(r)),
        Payload::Grant(g) => Payload::Grant(round_trip(g)),
        Payload::FastPathRequest(f) => Payload::FastPathRequest(round_trip(f)),
        Payload::FastPathReply(f) => Payload::FastPathReply(round_trip(f)),
        other => other,
    }
}
