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
    /// `WhatIf::NoFastPathMisses`: a delivered fast path is always on time.
    pub no_fast_path_misses: bool,
}

/// Envelopes per batch handed to the codec check, and batches queued at most: the sender
/// waits past that, so at most 32,768 envelope copies are in flight.
const CODEC_BATCH: usize = 512;
const CODEC_BATCHES_QUEUED: usize = 64;

/// Every Foldgate envelope delivered is encoded and decoded on a second thread, which
/// checks that the round trip gives back exactly what was sent. The run delivers what was
/// sent, so its output is the same whether or not the check runs, and a codec that
/// changed an envelope fails the run (`Bus::finish`) rather than quietly steering it. The
/// round trip was a fifth of a single-threaded run's time.
type CodecCheck = super::offload::Offload<Payload, Option<String>>;

fn start_codec_check() -> CodecCheck {
    CodecCheck::start(
        "sim-codec-check",
        CODEC_BATCH,
        CODEC_BATCHES_QUEUED,
        |batches| {
            let mut first = None;
            for batch in batches {
                // Keep draining after a fault so the run never waits on it.
                if first.is_none() {
                    first = batch.iter().find_map(round_trip_fault);
                }
            }
            first
        },
    )
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
    codec: Option<CodecCheck>,
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
            codec: params.codec.then(start_codec_check),
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
        // The last copy takes the payload itself: a report batch is a vector of lines.
        let mut payload = Some(payload);
        for copy in 1..=copies {
            let mut at_us = now_us + self.latency_us();
            if self.rng.chance_pct(self.params.reorder_pct) {
                self.stats.reordered += 1;
                at_us += self.rng.below(self.params.reorder_max_us.max(1));
            }
            let this = if copy == copies {
                payload.take()
            } else {
                payload.clone()
            };
            self.schedule(at_us, target, this.expect("one payload per copy"));
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

    /// The next delivery due at or before `now_us`. Once delivered, its envelope goes to
    /// `checked`.
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
            return Some((s.target, s.payload));
        }
    }

    /// An envelope `pop_due` gave out, now delivered: queued for the codec check if
    /// asked. Moved rather than copied, since the run is done with it.
    pub fn checked(&mut self, payload: Payload) {
        if let Some(codec) = self.codec.as_mut()
            && !matches!(payload, Payload::GsHits(_) | Payload::GsRemaining(_))
        {
            // The global-sync baseline is not Foldgate's protocol and has no envelope.
            codec.push(payload);
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
        if !reply_lost && (self.params.no_fast_path_misses || there + back <= FAST_PATH_DEADLINE_US)
        {
            self.stats.delivered += 2;
            FastPathFate::OnTime
        } else {
            FastPathFate::Late {
                at_us: now_us + there,
            }
        }
    }
}

impl Bus {
    /// Ends the codec check: `Some` describes the first envelope the wire format did not
    /// give back exactly (the run then has a violation).
    pub fn finish(&mut self) -> Option<String> {
        let check = self.codec.take()?;
        check
            .finish()
            .unwrap_or_else(|_| Some("codec: the check thread panicked".into()))
    }
}

fn round_trip<E: Envelope + PartialEq + std::fmt::Debug>(value: &E) -> Option<String> {
    match E::decode(&value.encode()) {
        Ok(back) if back == *value => None,
        Ok(back) => Some(format!(
            "codec: a {} came back changed: sent {value:?}, decoded {back:?}",
            E::KIND
        )),
        Err(e) => Some(format!("codec: a {} did not decode: {e}", E::KIND)),
    }
}

/// Every Foldgate envelope crosses the real wire format, as it would on NATS.
fn round_trip_fault(payload: &Payload) -> Option<String> {
    match payload {
        Payload::Report(r) => round_trip(r),
        Payload::Grant(g) => round_trip(g),
        Payload::FastPathRequest(f) => round_trip(f),
        Payload::FastPathReply(f) => round_trip(f),
        Payload::GsHits(_) | Payload::GsRemaining(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use bus_schemas::{
        KeyId, KeyWindow, NodeEpoch, NodeId, OwnerEpoch, ReportBatch, ReportEntry, ShardId,
        WindowId,
    };

    use super::*;

    fn report(entries: usize) -> Payload {
        let entry = ReportEntry {
            key_window: KeyWindow {
                key: KeyId {
                    version: 1,
                    digest: 7,
                },
                window: WindowId {
                    length_ms: 1_000,
                    number: 42,
                },
            },
            allowance: 40,
            cumulative_spend: 3,
            demand: 1_500,
            held_credit: 2,
            applied_grant: 5,
            returned: 0,
            self_granted: 0,
            standing_option: false,
        };
        Payload::Report(ReportBatch {
            node: NodeId(3),
            node_epoch: NodeEpoch(1),
            seq: 9,
            shard: ShardId(0),
            sent_at_ms: 1_000,
            full_report: None,
            owner_epoch_seen: OwnerEpoch(1),
            // The same line twice is a batch the wire format refuses (B2).
            entries: vec![entry; entries],
        })
    }

    fn params() -> BusParams {
        BusParams {
            loss_pct: 0.0,
            dup_pct: 0.0,
            reorder_pct: 0.0,
            base_us: 150,
            jitter_mean_us: 100.0,
            reorder_max_us: 0,
            codec: true,
            no_fast_path_misses: false,
        }
    }

    #[test]
    fn the_codec_check_passes_what_round_trips_and_names_what_does_not() {
        let mut bus = Bus::new(params(), 1);
        for _ in 0..3 * CODEC_BATCH {
            bus.send(0, Target::Owner(0), report(1));
        }
        // Three batches' worth, so spent batches come back to this thread and are reused.
        while let Some((_, payload)) = bus.pop_due(u64::MAX) {
            bus.checked(payload);
        }
        assert_eq!(bus.finish(), None);

        let mut bus = Bus::new(params(), 1);
        bus.send(0, Target::Owner(0), report(1));
        bus.send(0, Target::Owner(0), report(2));
        // What is delivered is what was sent; the check reports the fault at the end.
        let mut sizes = Vec::new();
        while let Some((_, payload)) = bus.pop_due(u64::MAX) {
            if let Payload::Report(r) = &payload {
                sizes.push(r.entries.len());
            }
            bus.checked(payload);
        }
        sizes.sort_unstable();
        assert_eq!(sizes, [1, 2]);
        let fault = bus
            .finish()
            .expect("a batch the wire format refuses is a fault");
        assert!(fault.contains("report_batch"), "{fault}");
    }
}
