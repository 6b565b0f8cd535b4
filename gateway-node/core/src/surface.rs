//! The decision surface: the concurrent map of atomic buckets that every request task
//! reads (D4). It holds no reconciliation logic; `NodeLimiter` (the sans-IO reconciler)
//! fills and drains its credit words beside it.
//!
//! What the common path does: one shard read-lock of the map (an atomic increment that
//! never waits on another reader), one relaxed increment of the key's attempt counter,
//! and one compare-and-swap per window, all on one 64-byte line that holds the key too.
//! No allocation, no syscall, no await.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, Ordering};

use bus_schemas::limits::PLAN_WINDOWS_MAX;
use bus_schemas::{KeyId, LimitReason, WindowId};
use dashmap::DashMap;
use dashmap::mapref::one::Ref;

use crate::credit::{self, EMPTY_WORD};
use crate::policy::KeyPolicy;
use crate::window::{window_at, window_end_ms};

/// How many windows keep their credit words in the bucket's line. The reference plan has
/// two (1 s and 60 s); a plan with more keeps the rest in the cold box.
pub(crate) const INLINE_WINDOWS: usize = 2;

/// One key's state on one node, and its own map key: exactly one aligned cache line. The
/// map stores it as the key of a `DashMap<KeyBucket, ()>`, so the table's slots are the
/// lines themselves (64-byte aligned, no separate key copy) and a decision on a plan of up
/// to two windows touches this line, the map's control bytes and its shard's lock word (the
/// read lock: an atomic add, and a sub on release), nothing else. The
/// earlier layout (a 32-byte `KeyId` beside a 64-byte bucket, 96 bytes a slot, across two
/// or three lines) cost about twice as much per lookup at 10^5 keys (BENCHMARKS.md).
/// Everything the request path does not touch lives behind `cold`.
#[repr(C, align(64))]
pub struct KeyBucket {
    /// The key's digest: the bucket's identity in the map (`Hash`, `Eq`, `Borrow<u128>`).
    /// Its version byte lives in the cold box; two versions of one raw key have
    /// different digests, and two keys sharing 128 digest bits would only share credit.
    digest: u128,
    /// Requests seen, admitted or not, wrapping: the reconciler turns the per-round
    /// difference into demand (C4) and recency for eviction (D7). 16 bits are exact while
    /// a key sees fewer than 65,536 requests on one node in one round (2.6 M/s at 25 ms);
    /// a reconciler stalled long enough to miss that is a limiter failure (D8) anyway.
    pub(crate) attempts: AtomicU16,
    /// D5's once-per-round fast path: the low 15 bits of the round in which this key last
    /// took it, shifted left one, and in bit 0 whether that fast path is still in flight
    /// (set by the request that won the round, cleared when it re-decides). A request
    /// that finds the key short while it is set waits for that answer instead of drawing a
    /// 429. A key whose last fast path was exactly 32,768 rounds (13.7 min) ago is refused
    /// one: a harmless, rare false positive that buys the line its room.
    fast_path: AtomicU16,
    /// The bucket's window lengths in `KeyPolicy::signature` form: a caller whose policy
    /// has the same non-zero signature names the same windows, so its precomputed
    /// reciprocals serve; any other caller (a plan switch in flight, P1) or a plan that
    /// has none takes the general path over the bucket's own policy.
    signature: u32,
    /// Credit words of the inline windows, by window-number parity (`credit`).
    words: [[AtomicU64; 2]; INLINE_WINDOWS],
    cold: Box<ColdBucket>,
}

/// The part of a bucket that only the reconciler, the short path and plans of more than
/// two windows read. Laid out so that what a reconciler's visit reads of it, the short
/// counters and a two-window plan's specs, shares the first cache line: with the compiler's
/// order the counters came last, a line of their own, and a visit missed on two lines.
#[repr(C, align(64))]
struct ColdBucket {
    /// Wrapping counts of decisions that found a window short: one per plan window, and
    /// last, one for any window. Demand per window (C4) is the decisions that passed
    /// every window plus those this window stopped: a hot key that its 1 s window holds
    /// to 40/s wants no more than 40/s of its 60 s window however much it is offered,
    /// and a node the 60 s pool has run dry on wants no 1 s credit (the sim's zipf and
    /// hot-key scenarios, where demand counted every attempt for every window). Only
    /// the short path touches them.
    shorts: [AtomicU32; PLAN_WINDOWS_MAX + 1],
    version: u8,
    policy: KeyPolicy,
    words: [[AtomicU64; 2]; PLAN_WINDOWS_MAX - INLINE_WINDOWS],
}

const _: () = assert!(
    std::mem::offset_of!(ColdBucket, policy) + crate::policy::POLICY_INLINE_WINDOWS_END <= 64
        && std::mem::offset_of!(ColdBucket, shorts) == 0
);
const _: () = assert!(std::mem::size_of::<KeyBucket>() == 64);
const _: () = assert!(std::mem::align_of::<KeyBucket>() == 64);

impl PartialEq for KeyBucket {
    fn eq(&self, other: &Self) -> bool {
        self.digest == other.digest
    }
}

impl Eq for KeyBucket {}

/// Hashes exactly as its `u128` digest does, which `Borrow` requires: lookups pass the
/// digest.
impl Hash for KeyBucket {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.digest.hash(state);
    }
}

impl Borrow<u128> for KeyBucket {
    fn borrow(&self) -> &u128 {
        &self.digest
    }
}

fn empty_words() -> [AtomicU64; 2] {
    [AtomicU64::new(EMPTY_WORD), AtomicU64::new(EMPTY_WORD)]
}

/// Round numbers as the bucket stores them (see `KeyBucket::fast_path`).
#[inline]
pub(crate) fn round_tag(round: u64) -> u16 {
    (round as u16) & 0x7fff
}

const FAST_PATH_INFLIGHT: u16 = 1;

/// Whether a bucket's fast-path word has its in-flight flag set, of whatever round.
fn flagged(fast_path: u16) -> bool {
    fast_path & FAST_PATH_INFLIGHT != 0
}

impl KeyBucket {
    /// A request is asking the owner for this key (D5): the flag set in round `round` or
    /// the one before (an ask takes at most 1 ms, which can span a round's turn). A flag
    /// older than that was left by a request dropped mid-flight.
    pub(crate) fn fast_path_in_flight(&self, round: u64) -> bool {
        let seen = self.fast_path.load(Ordering::Acquire);
        flagged(seen)
            && [round, round.wrapping_sub(1)]
                .iter()
                .any(|r| seen >> 1 == round_tag(*r))
    }

    /// Allocates the cold box: a new key's first request is the one decision that may
    /// allocate (D4's "common path" is every later one; `tests/no_alloc.rs`).
    fn new(key: KeyId, policy: KeyPolicy) -> Self {
        Self {
            digest: key.digest,
            attempts: AtomicU16::new(0),
            // One tag short of round 0, so the first round's fast path is never refused.
            fast_path: AtomicU16::new(round_tag(u64::MAX) << 1),
            signature: policy.signature(),
            words: std::array::from_fn(|_| empty_words()),
            cold: Box::new(ColdBucket {
                version: key.version,
                policy,
                words: std::array::from_fn(|_| empty_words()),
                shorts: std::array::from_fn(|_| AtomicU32::new(0)),
            }),
        }
    }

    pub(crate) fn key(&self) -> KeyId {
        KeyId {
            version: self.cold.version,
            digest: self.digest,
        }
    }

    #[inline]
    fn words(&self, slot: usize) -> &[AtomicU64; 2] {
        if slot < INLINE_WINDOWS {
            &self.words[slot]
        } else {
            &self.cold.words[slot - INLINE_WINDOWS]
        }
    }

    /// Every credit word of the bucket, in use or not.
    pub(crate) fn all_words(&self) -> impl Iterator<Item = &AtomicU64> {
        self.words.iter().chain(self.cold.words.iter()).flatten()
    }

    #[inline]
    pub(crate) fn word(&self, slot: usize, window: WindowId) -> &AtomicU64 {
        &self.words(slot)[credit::parity(window.number)]
    }

    /// Credit held in the named window (0 if the word holds another window).
    pub(crate) fn credit_in(&self, slot: usize, window: WindowId) -> u64 {
        let w = self.word(slot, window).load(Ordering::Acquire);
        if credit::word_tag(w) == credit::tag_of(window.number) {
            credit::word_credit(w)
        } else {
            0
        }
    }

    pub fn policy(&self) -> &KeyPolicy {
        &self.cold.policy
    }

    /// The short counters (see `ColdBucket::shorts`): per plan window, then any window.
    pub(crate) fn shorts(&self) -> [u32; PLAN_WINDOWS_MAX + 1] {
        std::array::from_fn(|i| self.cold.shorts[i].load(Ordering::Relaxed))
    }

    fn count_short(&self, short_windows: u8) {
        for (i, counter) in self.cold.shorts[..PLAN_WINDOWS_MAX].iter().enumerate() {
            if short_windows & (1 << i) != 0 {
                counter.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.cold.shorts[PLAN_WINDOWS_MAX].fetch_add(1, Ordering::Relaxed);
    }

    fn clear_fast_path_inflight(&self) {
        self.fast_path
            .fetch_and(!FAST_PATH_INFLIGHT, Ordering::AcqRel);
    }
}

/// A bucket, read under its map shard's read lock: the lock is held while this lives.
pub(crate) struct BucketRef<'a>(Ref<'a, KeyBucket, ()>);

impl std::ops::Deref for BucketRef<'_> {
    type Target = KeyBucket;
    #[inline]
    fn deref(&self) -> &KeyBucket {
        self.0.key()
    }
}

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
    /// cap but a few percent full put each key on its own cache line far from the next,
    /// and the reconciler's scan of them cost more than the state machines themselves.
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
}

/// Identity-style hasher: a `KeyId` digest is already an HMAC output, so mixing it again
/// through SipHash would only cost time on every decision.
#[derive(Clone, Copy, Default)]
pub struct KeyIdHasherBuilder;

#[derive(Default)]
pub struct KeyIdHasher(u64);

impl Hasher for KeyIdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u8(&mut self, v: u8) {
        self.0 ^= u64::from(v);
    }
    fn write_u128(&mut self, v: u128) {
        self.0 ^= (v as u64) ^ ((v >> 64) as u64);
    }
    fn finish(&self) -> u64 {
        self.0.wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }
}

impl BuildHasher for KeyIdHasherBuilder {
    type Hasher = KeyIdHasher;
    fn build_hasher(&self) -> KeyIdHasher {
        KeyIdHasher::default()
    }
}

/// D8's per-key backstop floor for fail-open admissions: per-second counters indexed by
/// key hash, in two rows indexed by different bits of it (a count-min sketch of depth 2).
/// Every admission of a hash is counted in both of its slots, and a hash is turned away
/// only when both are full: one slot of 65,536 was shared by ~78% of 10^5 keys, so one
/// key flooding its slot 429'd every key beside it for the rest of each second. A key's
/// own admissions still stay within its floor (its row-1 slot counts every one of them;
/// concurrent deciders may pass it by their number), so collisions make the bound stricter,
/// never looser. Allocated once, at construction. The edge guard (`http::edge`) keeps its
/// per-key floor and its fleet ceiling in one too.
pub struct Backstop {
    rows: [Box<[AtomicU64]>; 2],
}

const BACKSTOP_SLOTS: usize = 1 << 16;
/// A slot is its second (the high 32 bits) and the count admitted in it (the low 32).
const SECOND_SHIFT: u32 = 32;
const COUNT_MAX: u64 = u32::MAX as u64;

impl Default for Backstop {
    fn default() -> Self {
        Self::new()
    }
}

impl Backstop {
    pub fn new() -> Self {
        let row = || (0..BACKSTOP_SLOTS).map(|_| AtomicU64::new(0)).collect();
        Self {
            rows: [row(), row()],
        }
    }

    fn try_admit(&self, key: KeyId, wall_ms: u64, floor_per_s: u64) -> bool {
        self.try_admit_hash(key.hash64(), wall_ms, floor_per_s)
    }

    /// One admission for whatever hashes to `hash` in the second `wall_ms` falls in, if
    /// either of its slots admitted fewer than `floor_per_s` in it.
    pub fn try_admit_hash(&self, hash: u64, wall_ms: u64, floor_per_s: u64) -> bool {
        // Whole seconds since the epoch fit the slot's 32 bits until 2106.
        let second = (wall_ms / 1_000).min(u64::from(u32::MAX));
        let first = &self.rows[0][(hash as usize) & (BACKSTOP_SLOTS - 1)];
        let other = &self.rows[1][((hash >> 32) as usize) & (BACKSTOP_SLOTS - 1)];
        if Self::count(first, second, floor_per_s) {
            // Counted past the floor if need be: this slot must know every admission of
            // the hash for the bound to hold once the first is full.
            Self::count(other, second, u64::MAX);
            return true;
        }
        Self::count(other, second, floor_per_s)
    }

    /// Counts one in `slot` for `second` if it holds fewer than `below`.
    fn count(slot: &AtomicU64, second: u64, below: u64) -> bool {
        let mut cur = slot.load(Ordering::Acquire);
        loop {
            let (sec, count) = (cur >> SECOND_SHIFT, cur & COUNT_MAX);
            // Only a later second starts the count again. A call with an earlier one (a
            // clock read before a wait) counts against the slot's second: resetting on it
            // gave the second's keys their floor twice over.
            let next = if second > sec {
                (second << SECOND_SHIFT) | 1
            } else if count < below.min(COUNT_MAX) {
                cur + 1
            } else {
                return false;
            };
            match slot.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return true,
                Err(seen) => cur = seen,
            }
        }
    }
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
            stats: SurfaceStats::default(),
        }
    }

    pub fn config(&self) -> &SurfaceConfig {
        &self.config
    }

    /// The admission decision (D4). `policy` is used only when the key has no bucket yet;
    /// the caller resolved it while authenticating the key (D1).
    #[inline]
    pub fn decide(&self, key: KeyId, wall_ms: u64, policy: &KeyPolicy) -> Decision {
        let flags = self.flags.load(Ordering::Relaxed);
        if self.limiter_failed(flags, wall_ms) {
            return self.fail_open(key, wall_ms, policy);
        }
        match self.get(&key) {
            Some(bucket) => self.decide_in(&bucket, key, wall_ms, policy, flags, true, false),
            None => self.decide_new(key, wall_ms, policy, flags),
        }
    }

    /// Re-evaluate after the fast path answered or its deadline passed (D5). A miss is a
    /// real 429, not a fail-open case: the local limiter is working.
    pub fn decide_after_fast_path(
        &self,
        key: KeyId,
        wall_ms: u64,
        policy: &KeyPolicy,
        deadline_missed: bool,
    ) -> Decision {
        let flags = self.flags.load(Ordering::Relaxed);
        if self.limiter_failed(flags, wall_ms) {
            return self.fail_open(key, wall_ms, policy);
        }
        match self.get(&key) {
            Some(bucket) => {
                // The answer (or its deadline) is in; joiners may re-decide too.
                bucket.clear_fast_path_inflight();
                self.decide_in(&bucket, key, wall_ms, policy, flags, false, deadline_missed)
            }
            None => self.fail_open(key, wall_ms, policy),
        }
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
        self.get(&key)
            .is_some_and(|b| flagged(b.fast_path.load(Ordering::Acquire)))
    }

    /// Whether `bucket`'s fast path is in flight at `wall_ms` (`KeyBucket::fast_path_in_flight`).
    pub(crate) fn fast_path_in_flight(&self, bucket: &KeyBucket, wall_ms: u64) -> bool {
        bucket.fast_path_in_flight(self.fast_path_round_at(wall_ms))
    }

    #[inline]
    fn limiter_failed(&self, flags: u32, wall_ms: u64) -> bool {
        flags & FLAG_FAULT != 0
            || wall_ms.saturating_sub(self.heartbeat_wall_ms.load(Ordering::Relaxed))
                > self.config.reconciler_stall_ms
    }

    #[cold]
    fn decide_new(&self, key: KeyId, wall_ms: u64, policy: &KeyPolicy, flags: u32) -> Decision {
        if self.buckets.len() >= self.config.bucket_cap {
            // D7 evicts only zero-credit buckets; when none can go, a new key has nowhere
            // to live, which is a limiter-internal failure (D8).
            self.stats.inserts_refused.fetch_add(1, Ordering::Relaxed);
            return self.fail_open(key, wall_ms, policy);
        }
        let entry = self
            .buckets
            .entry(KeyBucket::new(key, *policy))
            .or_insert(())
            .downgrade();
        self.decide_in(entry.key(), key, wall_ms, policy, flags, true, false)
    }

    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn decide_in(
        &self,
        bucket: &KeyBucket,
        key: KeyId,
        wall_ms: u64,
        policy: &KeyPolicy,
        flags: u32,
        fast_path_allowed: bool,
        deadline_missed: bool,
    ) -> Decision {
        bucket.attempts.fetch_add(1, Ordering::Relaxed);
        let charged = if bucket.signature != 0 && bucket.signature == policy.signature() {
            Self::charge_inline(bucket, key, wall_ms, policy)
        } else {
            Self::charge_general(bucket, key, wall_ms)
        };
        match charged {
            Ok(()) => Decision::Admit,
            Err(first_short) => self.deny_or_fast_path(
                bucket,
                key,
                wall_ms,
                flags,
                first_short,
                fast_path_allowed,
                deadline_missed,
            ),
        }
    }

    /// The common path: the caller's policy names the bucket's one or two windows
    /// (equal signatures), so its reciprocals give each window's number and the key's
    /// phase offset in it without a divide, and every word is in the bucket's line.
    /// One unit in every window or in none (D4): a short window refunds the ones taken.
    #[inline]
    fn charge_inline(
        bucket: &KeyBucket,
        key: KeyId,
        wall_ms: u64,
        policy: &KeyPolicy,
    ) -> Result<(), usize> {
        let hash = key.hash64();
        let count = policy.window_count();
        debug_assert!(count <= INLINE_WINDOWS);
        Self::charge_all(
            count,
            |i| {
                let length = policy.length(i);
                length.quotient(wall_ms.saturating_sub(length.remainder(hash)))
            },
            |i| &bucket.words[i],
        )
    }

    /// Any other case: a plan of more than two windows, a length without a compact code,
    /// or a caller whose policy is not the bucket's (a plan switch in flight, P1). The
    /// bucket's own policy names its windows, by division.
    #[cold]
    #[inline(never)]
    fn charge_general(bucket: &KeyBucket, key: KeyId, wall_ms: u64) -> Result<(), usize> {
        let windows = bucket.policy().windows();
        Self::charge_all(
            windows.len(),
            |i| window_at(key, windows[i].length_ms, wall_ms).number,
            |i| bucket.words(i),
        )
    }

    /// D4's all or none: one unit of window `i`'s credit (numbered `number(i)`, in the
    /// words `words(i)`) for every `i < count`, or, at the first window short, the units
    /// already taken refunded and `Err(i)`. Both paths share it; each inlines its own
    /// closures, so the common one keeps its words in the bucket's line.
    #[inline(always)]
    fn charge_all<'b>(
        count: usize,
        number: impl Fn(usize) -> u64,
        words: impl Fn(usize) -> &'b [AtomicU64; 2],
    ) -> Result<(), usize> {
        let mut numbers = [0u64; PLAN_WINDOWS_MAX];
        for i in 0..count {
            let n = number(i);
            numbers[i] = n;
            if credit::try_charge(&words(i)[credit::parity(n)], credit::tag_of(n)).is_err() {
                for (j, &n) in numbers[..i].iter().enumerate() {
                    credit::refund(&words(j)[credit::parity(n)], credit::tag_of(n));
                }
                return Err(i);
            }
        }
        Ok(())
    }

    #[cold]
    #[allow(clippy::too_many_arguments)]
    fn deny_or_fast_path(
        &self,
        bucket: &KeyBucket,
        key: KeyId,
        wall_ms: u64,
        flags: u32,
        first_short: usize,
        fast_path_allowed: bool,
        deadline_missed: bool,
    ) -> Decision {
        // Every window without credit here could deny the retry, not only the one that
        // did (ADR-6). One that the owner has declared exhausted frees up only at its
        // boundary; one that is merely short here may get credit at the next round.
        let next_round_wait_ms = self
            .next_round_wall_ms
            .load(Ordering::Relaxed)
            .saturating_sub(wall_ms)
            .max(1);
        let mut short_windows = 0u8;
        // The longest short window, and whether the owner declared it exhausted.
        let mut longest_short = (0u32, false);
        // Per window: its length and the time left to its boundary, if its pool is spent.
        let mut exhausted_ends_ms = [(0u32, 0u64); PLAN_WINDOWS_MAX];
        let mut wait_ms = 0u64;
        let mut denying = None;
        for (i, spec) in bucket.policy().windows().iter().enumerate() {
            let w = window_at(key, spec.length_ms, wall_ms);
            let word = bucket.word(i, w).load(Ordering::Acquire);
            let ours = credit::word_tag(word) == credit::tag_of(w.number);
            if ours && credit::word_credit(word) > 0 {
                continue;
            }
            short_windows |= 1 << i;
            let to_boundary_ms = window_end_ms(key, w).saturating_sub(wall_ms);
            let exhausted = ours && credit::word_exhausted(word);
            if spec.length_ms > longest_short.0 {
                longest_short = (spec.length_ms, exhausted);
            }
            if exhausted {
                exhausted_ends_ms[i] = (spec.length_ms, to_boundary_ms);
            }
            let wait = if exhausted {
                to_boundary_ms
            } else {
                to_boundary_ms.min(next_round_wait_ms)
            };
            // The body names the window the client waits for (ADR-6): a window spent
            // to its boundary, not a shorter one merely empty here until the next round.
            if denying.is_none() || wait > wait_ms {
                denying = Some(w);
            }
            wait_ms = wait_ms.max(wait);
        }
        // Every window found short here counts this decision as its demand. So does a
        // window shorter than one whose pool the owner declared spent, in that one's
        // last stretch of the shorter length: the shorter window's credit must be in
        // place when the spent one turns over. Before that stretch it is not asked for:
        // the spent window stops this node whatever it holds, and credit parked here is
        // credit a node still holding the spent window's credit could have used (the
        // sim's hot-key scenario). A longer window is never asked for on behalf of a
        // spent shorter one: what passes the shorter after it turns over is what the
        // longer will see. A word refilled between the failed charge and the look above
        // still stopped this decision.
        let mut counted = if short_windows == 0 {
            1 << first_short
        } else {
            short_windows
        };
        for (i, spec) in bucket.policy().windows().iter().enumerate() {
            // A window not exhausted is (0, 0) there, longer than no window.
            if exhausted_ends_ms
                .iter()
                .any(|&(len, left)| spec.length_ms < len && left <= u64::from(spec.length_ms))
            {
                counted |= 1 << i;
            }
        }
        bucket.count_short(counted);
        // When the longest short window is one the owner declared exhausted, it denies
        // until its boundary, the last of them, whatever the shorter windows' owners
        // could give: asking again each round would only spend the fast-path budget
        // (A48). (A shorter exhausted window turns over first, and its owner may have
        // had credit returned since, so a fast path there is not wasted.)
        if fast_path_allowed && flags & FLAG_FAST_PATH != 0 && !longest_short.1 {
            let round = round_tag(self.fast_path_round_at(wall_ms));
            let seen = bucket.fast_path.load(Ordering::Acquire);
            // The what-if lift lets a request ask again once the round's ask is answered;
            // one still in flight is joined, as always.
            let lifted =
                self.config.what_if_fast_path_every_request && seen & FAST_PATH_INFLIGHT == 0;
            if (seen >> 1 != round || lifted)
                && bucket
                    .fast_path
                    .compare_exchange(
                        seen,
                        round << 1 | FAST_PATH_INFLIGHT,
                        Ordering::AcqRel,
                        Ordering::Relaxed,
                    )
                    .is_ok()
            {
                self.stats
                    .fast_path_triggered
                    .fetch_add(1, Ordering::Relaxed);
                return Decision::FastPath(FastPathNeed {
                    key,
                    short_windows,
                    join: false,
                });
            }
            // Only within the round the fast path was taken: a flag left set by a request
            // that was dropped mid-flight stops being joined at the next round.
            if bucket.fast_path.load(Ordering::Acquire) == round << 1 | FAST_PATH_INFLIGHT {
                self.stats.fast_path_joined.fetch_add(1, Ordering::Relaxed);
                return Decision::FastPath(FastPathNeed {
                    key,
                    short_windows,
                    join: true,
                });
            }
        }
        self.stats.denied.fetch_add(1, Ordering::Relaxed);
        let window = denying.unwrap_or_else(|| {
            // The word was refilled between the failed charge and this look; name the
            // window that failed anyway.
            let spec = bucket.policy().windows()[first_short];
            window_at(key, spec.length_ms, wall_ms)
        });
        Decision::Deny(Denial {
            window,
            wait_ms: wait_ms.max(1),
            reason: if deadline_missed {
                LimitReason::FastPathDeadline
            } else {
                LimitReason::Exhausted
            },
            degraded: flags & FLAG_DEGRADED != 0,
        })
    }

    #[cold]
    fn fail_open(&self, key: KeyId, wall_ms: u64, policy: &KeyPolicy) -> Decision {
        let floor_per_s = policy
            .peak_rate_per_s()
            .saturating_mul(self.config.backstop_multiple)
            .max(1);
        if self.backstop.try_admit(key, wall_ms, floor_per_s) {
            self.stats.fail_open.fetch_add(1, Ordering::Relaxed);
            return Decision::FailOpen;
        }
        self.stats.backstop_denied.fetch_add(1, Ordering::Relaxed);
        let spec = policy.windows()[0];
        Decision::Deny(Denial {
            window: window_at(key, spec.length_ms, wall_ms),
            wait_ms: 1_000 - wall_ms % 1_000,
            reason: LimitReason::Backstop,
            degraded: true,
        })
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

    /// D5's round for the once-per-round fast path: the reconciler's round, advanced by
    /// whole rounds of wall time since it began. A round task that runs late (a starved
    /// CPU) would otherwise stretch one round's single ask over the whole stall, and a
    /// window boundary inside it would start the new window with no credit and no way
    /// to ask: false 429s until the late tick (BENCHMARKS.md, issue 5).
    #[cold]
    fn fast_path_round_at(&self, wall_ms: u64) -> u64 {
        let round = self.round.load(Ordering::Relaxed);
        let began_ms = self.heartbeat_wall_ms.load(Ordering::Relaxed);
        round + wall_ms.saturating_sub(began_ms) / u64::from(self.config.round_ms)
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
    pub(crate) fn for_each_attempts(&self, mut f: impl FnMut(&KeyBucket, u128, u16)) {
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
        new.attempts
            .fetch_add(old.attempts.load(Ordering::Relaxed), Ordering::Relaxed);
        for (to, from) in new.cold.shorts.iter().zip(&old.cold.shorts) {
            to.fetch_add(from.load(Ordering::Relaxed), Ordering::Relaxed);
        }
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

#[cfg(test)]
mod tests {
    use super::Backstop;

    const FLOOR: u64 = 5;
    const T: u64 = 1_000_000;

    fn admitted(b: &Backstop, hash: u64, tries: u64) -> u64 {
        (0..tries)
            .filter(|_| b.try_admit_hash(hash, T, FLOOR))
            .count() as u64
    }

    #[test]
    fn a_hash_alone_gets_its_floor_a_second_and_again_the_next() {
        let b = Backstop::new();
        assert_eq!(admitted(&b, 42, 100), FLOOR);
        assert!(b.try_admit_hash(42, T + 1_000, FLOOR), "a new second");
    }

    /// A flood in one slot used to 429 every key sharing it for the rest of the second.
    #[test]
    fn a_flood_sharing_one_slot_leaves_its_neighbour_its_floor() {
        let b = Backstop::new();
        let flood = 0x0000_0001_0000_0007;
        let neighbour = 0x0000_0002_0000_0007; // same first slot, another second slot
        assert_eq!(admitted(&b, flood, 1_000), FLOOR);
        assert_eq!(admitted(&b, neighbour, 1_000), FLOOR);
    }

    /// Whatever its neighbours did first, a hash never gets more than its floor.
    #[test]
    fn a_hash_whose_first_slot_is_full_stays_within_its_floor() {
        let b = Backstop::new();
        let (x, y) = (0x0000_0001_0000_0007, 0x0000_0002_0000_0007);
        assert_eq!(admitted(&b, x, 3), 3);
        assert_eq!(admitted(&b, y, 1_000), FLOOR);
        assert_eq!(admitted(&b, x, 1_000), FLOOR - 3);
    }

    /// A call with an earlier second (a clock read before a wait) used to start the slot
    /// over, and the second's keys got their floor twice.
    #[test]
    fn a_late_call_with_an_earlier_second_does_not_reset_the_count() {
        let b = Backstop::new();
        assert_eq!(admitted(&b, 42, 100), FLOOR);
        assert!(
            !b.try_admit_hash(42, T - 1_000, FLOOR),
            "counted against the newer second"
        );
        assert_eq!(admitted(&b, 42, 100), 0);
        assert!(
            b.try_admit_hash(42, T + 1_000, FLOOR),
            "a later second starts over"
        );
    }

    /// What is left: a key sharing both slots with full ones is turned away.
    #[test]
    fn both_slots_full_turn_a_hash_away() {
        let b = Backstop::new();
        let (p, q) = (0x0000_0001_0000_0007, 0x0000_0002_0000_0009);
        assert_eq!(admitted(&b, p, 1_000), FLOOR);
        assert_eq!(admitted(&b, q, 1_000), FLOOR);
        assert_eq!(admitted(&b, 0x0000_0002_0000_0007, 10), 0);
    }
}
