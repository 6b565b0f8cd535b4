//! One key's bucket on the surface, its map-key identity and its hasher.
//!
//! The bucket is the map's key itself, one aligned cache line, so a decision touches that
//! line and nothing else of the key. This module owns the line's layout and the fast-path
//! word in it; the credit words in it are read and written only through `credit`.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, Ordering};

use bus_schemas::limits::PLAN_WINDOWS_MAX;
use bus_schemas::{KeyId, WindowId};
use dashmap::mapref::one::Ref;

use crate::credit;
use crate::policy::KeyPolicy;

/// How many windows keep their credit words in the bucket's line. The reference plan has
/// two (1 s and 60 s); a plan with more keeps the rest in the cold box.
pub(crate) const INLINE_WINDOWS: usize = 2;

/// One key's state on one node, and its own map key: exactly one aligned cache line. The
/// map stores it as the key of a `DashMap<KeyBucket, ()>`, so the table's slots are the
/// lines themselves (64-byte aligned, no separate key copy) and a decision on a plan of up
/// to two windows touches this line, the map's control bytes and its shard's lock word (the
/// read lock: an atomic add, and a sub on release), nothing else. A key stored beside its
/// bucket would spread a slot over two or three lines and double the cost of a lookup at
/// 10^5 keys (BENCHMARKS.md). Everything the request path does not touch lives behind
/// `cold`.
#[repr(C, align(64))]
pub struct KeyBucket {
    /// The key's digest: the bucket's identity in the map (`Hash`, `Eq`, `Borrow<u128>`).
    /// Its version byte lives in the cold box; two versions of one raw key have
    /// different digests, and two keys sharing 128 digest bits would only share credit.
    pub(super) digest: u128,
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
    pub(super) signature: u32,
    /// Credit words of the inline windows, by window-number parity (`credit`).
    pub(super) words: [[AtomicU64; 2]; INLINE_WINDOWS],
    cold: Box<ColdBucket>,
}

/// The part of a bucket that only the reconciler, the short path and plans of more than
/// two windows read. Laid out so that what a reconciler's visit reads of it, the short
/// counters and a two-window plan's specs, shares the first cache line: a visit then
/// misses on one line, not two.
#[repr(C, align(64))]
struct ColdBucket {
    /// Wrapping counts of decisions that found a window short: one per plan window, and
    /// last, one for any window. Demand per window (C4) is the decisions that passed
    /// every window plus those this window stopped: a hot key that its 1 s window holds
    /// to 40/s wants no more than 40/s of its 60 s window however much it is offered,
    /// and a node the 60 s pool has run dry on wants no 1 s credit (the sim's zipf and
    /// hot-key scenarios). Only the short path touches them.
    shorts: [AtomicU32; PLAN_WINDOWS_MAX + 1],
    version: u8,
    policy: KeyPolicy,
    words: [[AtomicU64; 2]; PLAN_WINDOWS_MAX - INLINE_WINDOWS],
    /// Per plan window, the loan cell (`DecisionSurface::lend`): 0, or 1 + a window
    /// number shifted left two, with bit 1 set if a missed deadline may take the loan and
    /// bit 0 once it is taken. The reconciler
    /// arms it for a window when it sends a fast path for it; the short path or the
    /// reconciler takes it; the reconciler books it.
    loans: [AtomicU64; PLAN_WINDOWS_MAX],
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

/// What a short request gets of its key's fast path this round (`KeyBucket::take_fast_path`).
pub(super) enum FastPathTurn {
    /// It won the round's ask.
    Won,
    /// Another request's ask of this round is in flight: wait for its answer.
    Join,
    /// Neither: the round's ask is spent and answered.
    Spent,
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

    /// Whether any request's fast path for this key is in flight, of whatever round.
    pub(super) fn fast_path_flagged(&self) -> bool {
        flagged(self.fast_path.load(Ordering::Acquire))
    }

    /// D5's one ask per key per round: the first short request of round `round` (a
    /// `round_tag`) wins it; one that finds it taken and still in flight in this round
    /// joins it. A flag left set by a request dropped mid-flight stops being joined at
    /// the next round. `every_request` (a what-if, never production) lets a request ask
    /// again once the round's ask is answered.
    #[inline(always)]
    pub(super) fn take_fast_path(&self, round: u16, every_request: bool) -> FastPathTurn {
        let seen = self.fast_path.load(Ordering::Acquire);
        let lifted = every_request && seen & FAST_PATH_INFLIGHT == 0;
        if (seen >> 1 != round || lifted)
            && self
                .fast_path
                .compare_exchange(
                    seen,
                    round << 1 | FAST_PATH_INFLIGHT,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            return FastPathTurn::Won;
        }
        if self.fast_path.load(Ordering::Acquire) == round << 1 | FAST_PATH_INFLIGHT {
            return FastPathTurn::Join;
        }
        FastPathTurn::Spent
    }

    /// Allocates the cold box: a new key's first request is the one decision that may
    /// allocate (D4's "common path" is every later one; `tests/no_alloc.rs`).
    pub(super) fn new(key: KeyId, policy: KeyPolicy) -> Self {
        Self {
            digest: key.digest,
            attempts: AtomicU16::new(0),
            // One tag short of round 0, so the first round's fast path is never refused.
            fast_path: AtomicU16::new(round_tag(u64::MAX) << 1),
            signature: policy.signature(),
            words: std::array::from_fn(|_| credit::empty_pair()),
            cold: Box::new(ColdBucket {
                version: key.version,
                policy,
                words: std::array::from_fn(|_| credit::empty_pair()),
                shorts: std::array::from_fn(|_| AtomicU32::new(0)),
                loans: std::array::from_fn(|_| AtomicU64::new(0)),
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
    pub(crate) fn words(&self, slot: usize) -> &[AtomicU64; 2] {
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

    /// Whether no word of the bucket holds credit (D7 evicts only such a bucket).
    pub(crate) fn holds_no_credit(&self) -> bool {
        self.all_words().all(credit::holds_no_credit)
    }

    /// The credit word plan window `slot` uses for `window`.
    #[inline]
    /// Reconciler: window `number` of plan slot `slot` may take one loan, on a missed
    /// deadline too with `on_deadline`, unless it took it already. Whatever the cell held
    /// for another window is replaced (the caller booked it).
    pub(crate) fn arm_loan(&self, slot: usize, number: u64, on_deadline: bool) {
        let cell = &self.cold.loans[slot];
        let armed = ((number + 1) << 2) | (u64::from(on_deadline) << 1);
        let mut seen = cell.load(Ordering::Acquire);
        while !(seen >> 2 == number + 1 && seen & 1 == 1) {
            match cell.compare_exchange(seen, armed, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return,
                Err(now) => seen = now,
            }
        }
    }

    /// Take the loan armed for window `number` of plan slot `slot` (`on_deadline`: for
    /// a missed deadline); false when none is armed for it or it was taken.
    pub(crate) fn take_loan(&self, slot: usize, number: u64, on_deadline: bool) -> bool {
        let cell = &self.cold.loans[slot];
        let seen = cell.load(Ordering::Acquire);
        seen >> 2 == number + 1
            && seen & 1 == 0
            && (!on_deadline || seen & 2 != 0)
            && cell
                .compare_exchange(seen, seen | 1, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
    }

    /// The window of plan slot `slot` whose loan was taken, if the cell says so.
    pub(crate) fn loan_taken(&self, slot: usize) -> Option<u64> {
        let cell = self.cold.loans[slot].load(Ordering::Acquire);
        (cell & 1 == 1).then(|| (cell >> 2) - 1)
    }

    pub(crate) fn word(&self, slot: usize, window: WindowId) -> &AtomicU64 {
        credit::word_of(self.words(slot), window.number)
    }

    /// Credit held in the named window (0 if the word holds another window).
    pub(crate) fn credit_in(&self, slot: usize, window: WindowId) -> u64 {
        credit::held(self.word(slot, window), window.number)
    }

    pub fn policy(&self) -> &KeyPolicy {
        &self.cold.policy
    }

    /// The short counters (see `ColdBucket::shorts`): per plan window, then any window.
    pub(crate) fn shorts(&self) -> [u32; PLAN_WINDOWS_MAX + 1] {
        std::array::from_fn(|i| self.cold.shorts[i].load(Ordering::Relaxed))
    }

    /// Adds `from`'s attempt and short counters to this bucket's, so demand stays
    /// continuous across a bucket replaced for a policy switch (P1).
    pub(super) fn carry_counters(&self, from: &KeyBucket) {
        self.attempts
            .fetch_add(from.attempts.load(Ordering::Relaxed), Ordering::Relaxed);
        for (to, from) in self.cold.shorts.iter().zip(&from.cold.shorts) {
            to.fetch_add(from.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }

    pub(super) fn count_short(&self, short_windows: u8) {
        for (i, counter) in self.cold.shorts[..PLAN_WINDOWS_MAX].iter().enumerate() {
            if short_windows & (1 << i) != 0 {
                counter.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.cold.shorts[PLAN_WINDOWS_MAX].fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn clear_fast_path_inflight(&self) {
        self.fast_path
            .fetch_and(!FAST_PATH_INFLIGHT, Ordering::AcqRel);
    }
}

/// A bucket, read under its map shard's read lock: the lock is held while this lives.
pub(crate) struct BucketRef<'a>(pub(super) Ref<'a, KeyBucket, ()>);

impl std::ops::Deref for BucketRef<'_> {
    type Target = KeyBucket;
    #[inline]
    fn deref(&self) -> &KeyBucket {
        self.0.key()
    }
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

#[cfg(test)]
mod tests {
    use bus_schemas::WindowSpec;

    use super::*;

    fn bucket() -> KeyBucket {
        let windows = [WindowSpec {
            length_ms: 1_000,
            limit: 10,
        }];
        let policy = KeyPolicy::new(&windows, 25).expect("valid plan");
        KeyBucket::new(
            KeyId {
                version: 1,
                digest: 7,
            },
            policy,
        )
    }

    #[test]
    fn a_loan_is_taken_once_per_window_and_only_as_armed() {
        let b = bucket();
        assert!(!b.take_loan(0, 5, false), "nothing armed");
        b.arm_loan(0, 5, false);
        assert!(!b.take_loan(0, 5, true), "armed for refusals only");
        assert!(!b.take_loan(0, 4, false), "armed for another window");
        assert_eq!(b.loan_taken(0), None);
        assert!(b.take_loan(0, 5, false));
        assert!(!b.take_loan(0, 5, false), "one loan per window");
        assert_eq!(b.loan_taken(0), Some(5));
        b.arm_loan(0, 5, true);
        assert!(
            !b.take_loan(0, 5, true),
            "re-arming a taken window gives no second loan"
        );
        b.arm_loan(0, 6, true);
        assert_eq!(
            b.loan_taken(0),
            None,
            "the next window's arming replaces it"
        );
        assert!(b.take_loan(0, 6, true));
        assert_eq!(b.loan_taken(0), Some(6));
    }
}
