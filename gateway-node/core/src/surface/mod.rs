//! The decision surface: the concurrent map of atomic buckets that every request task
//! reads (D4). It holds no reconciliation logic; `NodeLimiter` (the sans-IO reconciler)
//! fills and drains its credit words beside it.
//!
//! What the common path does: one shard read-lock of the map (an atomic increment that
//! never waits on another reader), one relaxed increment of the key's attempt counter,
//! and one compare-and-swap per window, all on one 64-byte line that holds the key too.
//! No allocation, no syscall, no await.
//!
//! * `bucket`: a key's bucket (the map's key and one cache line) and the map's hasher.
//! * `decide`: the request path, from `decide` to an admit, a fast path or a 429.
//! * `backstop`: D8's floor for fail-open admissions.
//! * `standing`: the standing option a node takes of a window unasked, and the
//!   windows it declined.
//!
//! This module keeps the surface's types, its shared state and what the reconciler
//! calls on it (rounds, iteration, bucket replacement and eviction).

mod backstop;
mod bucket;
mod decide;
mod standing;

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

use bus_schemas::{KeyId, LimitReason, WindowId};
use dashmap::DashMap;

use crate::policy::KeyPolicy;

pub use backstop::Backstop;
pub(crate) use bucket::{BucketRef, INLINE_WINDOWS};
pub use bucket::{KeyBucket, KeyIdHasher, KeyIdHasherBuilder};
pub use standing::{DECLINED_KEYS_MAX, StandingRule};

/// Why a request was turned away: an outcome, not an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Denial {
    /// The first window (in plan order) that had no credit: the body names it (D6).
    pub window: WindowId,
    /// Wait to the latest boundary among all windows that could deny (D6, ADR-6).
    pub wait_ms: u64,
    pub reason: LimitReason,
    pub degraded: bool,
}

/// The winner's hold on a key's fast path (D5). Its request may be dropped while it waits
/// on the owner (the client went away): dropping the claim unsettled clears the in-flight
/// flag and wakes the joiners, who would otherwise wait out their whole deadline on an
/// answer nobody is fetching. A settled claim does neither twice, so a flag that the next
/// round's winner has set since is left alone.
pub struct FastPathClaim<'a, F: FnMut()> {
    surface: &'a DecisionSurface,
    key: KeyId,
    wake: F,
    settled: bool,
}

impl<F: FnMut()> FastPathClaim<'_, F> {
    /// The answer is in (or the deadline passed): decide, then wake the joiners.
    pub fn settle(mut self, wall_ms: u64, policy: &KeyPolicy, deadline_missed: bool) -> Decision {
        self.settled = true;
        let d = self
            .surface
            .decide_after_fast_path(self.key, wall_ms, policy, deadline_missed);
        (self.wake)();
        d
    }
}

impl<F: FnMut()> Drop for FastPathClaim<'_, F> {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        if let Some(bucket) = self.surface.get(&self.key) {
            bucket.clear_fast_path_inflight();
        }
        (self.wake)();
    }
}

/// A request the node could not decide from held credit; the caller asks the owner(s)
/// with a hard 1 ms deadline, then calls `decide_after_fast_path` (D5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FastPathNeed {
    pub key: KeyId,
    /// Window slots (bit i = plan window i) that had no credit.
    pub short_windows: u8,
    /// Another request's fast path for this key is in flight this round: send nothing,
    /// wait (within the same deadline) until `fast_path_pending` clears, then re-decide.
    pub join: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Admit,
    /// Admitted because the limiter itself failed, within the backstop floor (D8).
    FailOpen,
    Deny(Denial),
    FastPath(FastPathNeed),
}

#[derive(Clone, Copy, Debug)]
pub struct SurfaceConfig {
    /// D7: LRU cap on buckets per node.
    pub bucket_cap: usize,
    pub round_ms: u32,
    /// D8: the backstop floor is this multiple of a key's peak plan rate, per second.
    pub backstop_multiple: u64,
    /// A reconciler that has not ticked for this long is a limiter-internal failure (D8).
    pub reconciler_stall_ms: u64,
    /// Size the bucket map for `bucket_cap` and a quarter more at construction, so a new
    /// key never grows it (a rehash under a shard's write lock would stall every decision
    /// on that shard). The map gives each shard an equal part; keys hash evenly, and the
    /// quarter covers a shard over its part and the cap check's race (a check, then an
    /// insert) many times over. A
    /// single-threaded simulator of many nodes turns it off: twenty tables sized for the
    /// cap but a few percent full would put each key on its own cache line far from the
    /// next, and the reconciler's scan of them would cost more than the state machines.
    pub presize: bool,
    /// What-if only (`foldgate sim --what-if fast-path-every-request`), never a
    /// production setting: D5's one fast path per key per round lifted, so every
    /// request that finds no credit may ask. It measures what the rule costs in accuracy
    /// (BENCHMARKS.md, "What the 60 s targets would take").
    pub what_if_fast_path_every_request: bool,
}

impl Default for SurfaceConfig {
    fn default() -> Self {
        Self {
            bucket_cap: 50_000,
            round_ms: 25,
            backstop_multiple: 4,
            reconciler_stall_ms: 1_000,
            presize: true,
            what_if_fast_path_every_request: false,
        }
    }
}

const FLAG_FAST_PATH: u32 = 1;
const FLAG_DEGRADED: u32 = 2;
const FLAG_FAULT: u32 = 4;

/// Counters of the rare outcomes; admits are not counted here so the common path touches
/// no shared cache line (attempts per key give the admit count).
#[derive(Default, Debug)]
pub struct SurfaceStats {
    pub denied: AtomicU64,
    pub fail_open: AtomicU64,
    pub backstop_denied: AtomicU64,
    pub fast_path_triggered: AtomicU64,
    /// Requests that waited on another request's fast path instead of being denied.
    pub fast_path_joined: AtomicU64,
    /// New keys refused a bucket because the map was full of credit-holding buckets.
    pub inserts_refused: AtomicU64,
    pub evictions: AtomicU64,
    /// Windows a request opened with this node's standing option.
    pub standing_opened: AtomicU64,
    /// Requests admitted on a deadline loan (`DecisionSurface::lend`).
    pub loans: AtomicU64,
}

pub struct DecisionSurface {
    /// Keys are the buckets themselves (see `KeyBucket`), looked up by digest.
    buckets: DashMap<KeyBucket, (), KeyIdHasherBuilder>,
    config: SurfaceConfig,
    round: AtomicU64,
    next_round_wall_ms: AtomicU64,
    heartbeat_wall_ms: AtomicU64,
    flags: AtomicU32,
    backstop: Backstop,
    /// Set once by the node limiter (`standing`).
    standing: OnceLock<StandingRule>,
    declined: standing::DeclinedMap,
    declined_keys: AtomicUsize,
    pub stats: SurfaceStats,
}

impl DecisionSurface {
    pub fn new(config: SurfaceConfig) -> Self {
        assert!(config.bucket_cap > 0 && config.round_ms > 0);
        Self {
            // Pre-size past the cap so the map never grows (and allocates) under load.
            buckets: DashMap::with_capacity_and_hasher(
                if config.presize {
                    config.bucket_cap + config.bucket_cap / 4
                } else {
                    0
                },
                KeyIdHasherBuilder,
            ),
            config,
            round: AtomicU64::new(0),
            next_round_wall_ms: AtomicU64::new(0),
            heartbeat_wall_ms: AtomicU64::new(0),
            flags: AtomicU32::new(0),
            backstop: Backstop::new(),
            standing: OnceLock::new(),
            declined: standing::DeclinedMap::with_hasher(KeyIdHasherBuilder),
            declined_keys: AtomicUsize::new(0),
            stats: SurfaceStats::default(),
        }
    }

    pub fn config(&self) -> &SurfaceConfig {
        &self.config
    }

    /// Taken by the request that won `key`'s fast path (a `FastPathNeed` with `join`
    /// false) before it waits on the owner. `wake` tells joiners the answer is in.
    pub fn claim_fast_path<F: FnMut()>(&self, key: KeyId, wake: F) -> FastPathClaim<'_, F> {
        FastPathClaim {
            surface: self,
            key,
            wake,
            settled: false,
        }
    }

    /// Whether a fast path for `key` is still in flight (see `FastPathNeed::join`).
    pub fn fast_path_pending(&self, key: KeyId) -> bool {
        self.get(&key).is_some_and(|b| b.fast_path_flagged())
    }

    /// Whether `bucket`'s fast path is in flight at `wall_ms` (`KeyBucket::fast_path_in_flight`).
    pub(crate) fn fast_path_in_flight(&self, bucket: &KeyBucket, wall_ms: u64) -> bool {
        bucket.fast_path_in_flight(self.fast_path_round_at(wall_ms))
    }

    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    pub fn degraded(&self) -> bool {
        self.flags.load(Ordering::Relaxed) & FLAG_DEGRADED != 0
    }

    pub fn fast_path_enabled(&self) -> bool {
        self.flags.load(Ordering::Relaxed) & FLAG_FAST_PATH != 0
    }

    /// Set by the runtime when the limiter is known broken (D8): decisions fail open,
    /// bounded by the backstop floor.
    pub fn set_fault(&self, fault: bool) {
        self.set_flag(FLAG_FAULT, fault);
    }

    pub(crate) fn set_flag(&self, flag: u32, on: bool) {
        if on {
            self.flags.fetch_or(flag, Ordering::Relaxed);
        } else {
            self.flags.fetch_and(!flag, Ordering::Relaxed);
        }
    }

    pub(crate) fn set_fast_path(&self, on: bool) {
        self.set_flag(FLAG_FAST_PATH, on);
    }

    pub(crate) fn set_degraded(&self, on: bool) {
        self.set_flag(FLAG_DEGRADED, on);
    }

    pub(crate) fn publish_round(&self, round: u64, wall_ms: u64, next_round_wall_ms: u64) {
        self.round.store(round, Ordering::Relaxed);
        self.next_round_wall_ms
            .store(next_round_wall_ms, Ordering::Relaxed);
        self.heartbeat_wall_ms.store(wall_ms, Ordering::Relaxed);
    }

    #[inline]
    pub(crate) fn get(&self, key: &KeyId) -> Option<BucketRef<'_>> {
        self.buckets.get(&key.digest).map(BucketRef)
    }

    /// Drops every bucket: what a process restart does to the surface (C9). Only a
    /// restart drill calls it; a decision in flight holds its shard's read lock, so it
    /// finishes against the old bucket first.
    pub fn clear(&self) {
        self.buckets.clear();
    }

    /// Every bucket with its digest and attempt counter, read from its own line: the
    /// reconciler's per-round look for keys with new decisions reads the cold box
    /// (`KeyBucket::key`) only of those it then visits.
    pub(crate) fn for_each_attempts_if(
        &self,
        scan: bool,
        mut f: impl FnMut(&KeyBucket, u128, u16),
    ) {
        if !scan {
            return;
        }
        for entry in self.buckets.iter() {
            let bucket = entry.key();
            f(
                bucket,
                bucket.digest,
                bucket.attempts.load(Ordering::Relaxed),
            );
        }
    }

    pub(crate) fn for_each(&self, mut f: impl FnMut(KeyId, &KeyBucket)) {
        for entry in self.buckets.iter() {
            let bucket = entry.key();
            f(bucket.key(), bucket);
        }
    }

    /// P1: give `key` a bucket built for `policy`. The swap happens under the shard's
    /// write lock, so no decision is inside the old bucket when it leaves the map, and
    /// `carry(old, new)` then moves credit with the old bucket out of everyone's reach.
    /// A decision between the two finds the new bucket empty (short: a fast path or a
    /// 429), never credit counted twice. The attempt and short counters carry over, so
    /// demand is continuous. Returns false if the key has no bucket (its next request
    /// builds one).
    pub(crate) fn replace_bucket(
        &self,
        key: KeyId,
        policy: KeyPolicy,
        carry: impl FnOnce(&KeyBucket, &KeyBucket),
    ) -> bool {
        let dashmap::Entry::Occupied(entry) = self.buckets.entry(KeyBucket::new(key, policy))
        else {
            return false;
        };
        let (old, ()) = entry.replace_entry(());
        let Some(new) = self.get(&key) else {
            // Only the reconciler (our caller) removes buckets, and `clear` (a restart
            // drill) drops all credit anyway.
            return false;
        };
        new.carry_counters(&old);
        carry(&old, &new);
        true
    }

    /// Remove `key` only if `still_evictable` holds under the shard's write lock, so a
    /// grant that raced in is never thrown away (D7).
    pub(crate) fn evict_if(
        &self,
        key: &KeyId,
        still_evictable: impl FnOnce(&KeyBucket) -> bool,
    ) -> bool {
        let removed = self
            .buckets
            .remove_if(&key.digest, |b, _| still_evictable(b))
            .is_some();
        if removed {
            self.stats.evictions.fetch_add(1, Ordering::Relaxed);
        }
        removed
    }
}
