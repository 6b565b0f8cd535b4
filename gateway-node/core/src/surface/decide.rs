//! The request path: `decide` and everything it calls, from the bucket lookup to an
//! admit, a fast path or a 429 (D4-D6), and the fail-open path with its backstop (D8).
//!
//! Kept together so the hot path reads top to bottom in one file. The common case is
//! `decide` -> `decide_in` -> `charge_inline`, all inlined into the caller; a short
//! window leaves it for the cold `deny_or_fast_path`, whose steps are inlined back into
//! it so it stays one function in the binary.

use std::sync::atomic::{AtomicU64, Ordering};

use bus_schemas::limits::PLAN_WINDOWS_MAX;
use bus_schemas::{KeyId, LimitReason, WindowId};

use super::bucket::{FastPathTurn, INLINE_WINDOWS, KeyBucket, round_tag};
use super::{
    Decision, DecisionSurface, Denial, FLAG_DEGRADED, FLAG_FAST_PATH, FLAG_FAULT, FastPathNeed,
};
use crate::credit;
use crate::policy::KeyPolicy;
use crate::window::{window_at, window_end_ms};

/// What a decision that found a window short sees of every window of the plan
/// (`DecisionSurface::look_at_windows`).
struct Shortfall {
    /// Window slots (bit i = plan window i) with no credit here.
    short_windows: u8,
    /// The longest short window's length, and whether the owner declared it exhausted.
    longest_short: (u32, bool),
    /// Per window: its length and the time left to its boundary, if its pool is spent.
    /// A window not exhausted is (0, 0) there, longer than no window.
    exhausted_ends_ms: [(u32, u64); PLAN_WINDOWS_MAX],
    /// How long a retry waits: the latest boundary among the windows that could deny it.
    wait_ms: u64,
    /// The window the 429 names: the one whose wait is `wait_ms`.
    denying: Option<WindowId>,
}

impl DecisionSurface {
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
            if !credit::charge(words(i), n) {
                for (j, &n) in numbers[..i].iter().enumerate() {
                    credit::uncharge(words(j), n);
                }
                return Err(i);
            }
        }
        Ok(())
    }

    /// A window was short: open a standing option, ask the owner (D5's one fast path per
    /// key per round), join a fast path already in flight, or deny with the wait to the
    /// latest boundary that could deny a retry (D6).
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
        // The first request of a window here: open the windows this node holds a
        // standing option for, and charge again (`standing`).
        let first_short = if self.open_standing(bucket, key, wall_ms) {
            match Self::charge_general(bucket, key, wall_ms) {
                Ok(()) => return Decision::Admit,
                Err(i) => i,
            }
        } else {
            first_short
        };
        let shortfall = self.look_at_windows(bucket, key, wall_ms);
        Self::count_demand(bucket, &shortfall, first_short);
        // When the longest short window is one the owner declared exhausted, it denies
        // until its boundary, the last of them, whatever the shorter windows' owners
        // could give: asking again each round would only spend the fast-path budget
        // (A48). (A shorter exhausted window turns over first, and its owner may have
        // had credit returned since, so a fast path there is not wasted.)
        if fast_path_allowed
            && flags & FLAG_FAST_PATH != 0
            && !shortfall.longest_short.1
            && let Some(decision) = self.try_fast_path(bucket, key, wall_ms, &shortfall)
        {
            return decision;
        }
        if deadline_missed
            && !shortfall.longest_short.1
            && self.lend(bucket, key, wall_ms, &shortfall)
        {
            return Decision::Admit;
        }
        self.deny(
            bucket,
            key,
            wall_ms,
            flags,
            first_short,
            &shortfall,
            deadline_missed,
        )
    }

    /// Every window without credit here could deny the retry, not only the one that did
    /// (ADR-6). One that the owner has declared exhausted frees up only at its boundary;
    /// one that is merely short here may get credit at the next round.
    #[inline(always)]
    fn look_at_windows(&self, bucket: &KeyBucket, key: KeyId, wall_ms: u64) -> Shortfall {
        let next_round_wait_ms = self
            .next_round_wall_ms
            .load(Ordering::Relaxed)
            .saturating_sub(wall_ms)
            .max(1);
        let mut s = Shortfall {
            short_windows: 0,
            longest_short: (0, false),
            exhausted_ends_ms: [(0, 0); PLAN_WINDOWS_MAX],
            wait_ms: 0,
            denying: None,
        };
        for (i, spec) in bucket.policy().windows().iter().enumerate() {
            let w = window_at(key, spec.length_ms, wall_ms);
            let seen = credit::read(bucket.word(i, w), w.number);
            if seen.is_some_and(|c| c.credit > 0) {
                continue;
            }
            s.short_windows |= 1 << i;
            let to_boundary_ms = window_end_ms(key, w).saturating_sub(wall_ms);
            let exhausted = seen.is_some_and(|c| c.exhausted);
            if spec.length_ms > s.longest_short.0 {
                s.longest_short = (spec.length_ms, exhausted);
            }
            if exhausted {
                s.exhausted_ends_ms[i] = (spec.length_ms, to_boundary_ms);
            }
            let wait = if exhausted {
                to_boundary_ms
            } else {
                to_boundary_ms.min(next_round_wait_ms)
            };
            // The body names the window the client waits for (ADR-6): a window spent
            // to its boundary, not a shorter one merely empty here until the next round.
            if s.denying.is_none() || wait > s.wait_ms {
                s.denying = Some(w);
            }
            s.wait_ms = s.wait_ms.max(wait);
        }
        s
    }

    /// Every window found short here counts this decision as its demand. So does a
    /// window shorter than one whose pool the owner declared spent, in that one's last
    /// stretch of the shorter length: the shorter window's credit must be in place when
    /// the spent one turns over. Before that stretch it is not asked for: the spent
    /// window stops this node whatever it holds, and credit parked here is credit a node
    /// still holding the spent window's credit could have used (the sim's hot-key
    /// scenario). A longer window is never asked for on behalf of a spent shorter one:
    /// what passes the shorter after it turns over is what the longer will see. A word
    /// refilled between the failed charge and the look still stopped this decision.
    #[inline(always)]
    fn count_demand(bucket: &KeyBucket, s: &Shortfall, first_short: usize) {
        let mut counted = if s.short_windows == 0 {
            1 << first_short
        } else {
            s.short_windows
        };
        for (i, spec) in bucket.policy().windows().iter().enumerate() {
            if s.exhausted_ends_ms
                .iter()
                .any(|&(len, left)| spec.length_ms < len && left <= u64::from(spec.length_ms))
            {
                counted |= 1 << i;
            }
        }
        bucket.count_short(counted);
    }

    /// D5: this round's fast path for the key, won or joined; `None` when the round's
    /// one ask is spent and answered.
    #[inline(always)]
    fn try_fast_path(
        &self,
        bucket: &KeyBucket,
        key: KeyId,
        wall_ms: u64,
        s: &Shortfall,
    ) -> Option<Decision> {
        let round = round_tag(self.fast_path_round_at(wall_ms));
        let join = match bucket.take_fast_path(round, self.config.what_if_fast_path_every_request) {
            FastPathTurn::Won => {
                self.stats
                    .fast_path_triggered
                    .fetch_add(1, Ordering::Relaxed);
                false
            }
            FastPathTurn::Join => {
                self.stats.fast_path_joined.fetch_add(1, Ordering::Relaxed);
                true
            }
            FastPathTurn::Spent => return None,
        };
        Some(Decision::FastPath(FastPathNeed {
            key,
            short_windows: s.short_windows,
            join,
        }))
    }

    /// The deadline loan: the fast path missed D5's 1 ms deadline for a key whose short
    /// windows the owner has not declared spent, so the node lends itself one unit of
    /// each, once per window per node, and charges again. The reconciler armed the loan
    /// for a missed deadline when it sent the fast path, only for a key far below its
    /// limit, at L < N, with the owner heard from lately (`NodeLimiter::arm_loan`). A
    /// missed deadline is then the bus's latency, not the key's limit: nearly always the
    /// owner granted and the answer is late (it lands on the same word). The reconciler
    /// books the unit as a self-grant (`NodeLimiter::book_loans`), reported like F4's, so
    /// the owner counts it: at most one unit per node per key-window more than the
    /// allowance, and only when the owner really had nothing left.
    #[cold]
    fn lend(&self, bucket: &KeyBucket, key: KeyId, wall_ms: u64, s: &Shortfall) -> bool {
        // Windows given a unit here: (slot, window number).
        let mut placed = [(0usize, 0u64); PLAN_WINDOWS_MAX];
        let mut placed_len = 0;
        let mut lent = true;
        for (i, spec) in bucket.policy().windows().iter().enumerate() {
            if s.short_windows & (1 << i) == 0 {
                continue;
            }
            let w = window_at(key, spec.length_ms, wall_ms);
            let word = bucket.word(i, w);
            // Only a word this window's record holds live (the fast path installed it):
            // the reconciler books the loan on that record.
            if credit::read(word, w.number).is_none_or(|c| c.exhausted)
                || !bucket.take_loan(i, w.number, true)
            {
                lent = false;
                break;
            }
            credit::grant(word, w.number, 1, false);
            placed[placed_len] = (i, w.number);
            placed_len += 1;
        }
        lent = lent && Self::charge_general(bucket, key, wall_ms).is_ok();
        if lent {
            self.stats.loans.fetch_add(1, Ordering::Relaxed);
        } else {
            // Not admitted: take back the units placed, so a word never holds a loaned
            // unit that no admission spent. The taken loan is still booked (a unit
            // counted as spent that was not: the safe side), and one another request
            // spent first is spent.
            for &(i, number) in &placed[..placed_len] {
                let _ = credit::charge(bucket.words(i), number);
            }
        }
        lent
    }

    /// The 429: the window the client waits for and the wait (D6).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn deny(
        &self,
        bucket: &KeyBucket,
        key: KeyId,
        wall_ms: u64,
        flags: u32,
        first_short: usize,
        s: &Shortfall,
        deadline_missed: bool,
    ) -> Decision {
        self.stats.denied.fetch_add(1, Ordering::Relaxed);
        let window = s.denying.unwrap_or_else(|| {
            // The word was refilled between the failed charge and the look; name the
            // window that failed anyway.
            let spec = bucket.policy().windows()[first_short];
            window_at(key, spec.length_ms, wall_ms)
        });
        Decision::Deny(Denial {
            window,
            wait_ms: s.wait_ms.max(1),
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

    /// D5's round for the once-per-round fast path: the reconciler's round, advanced by
    /// whole rounds of wall time since it began. A round task that runs late (a starved
    /// CPU) would otherwise stretch one round's single ask over the whole stall, and a
    /// window boundary inside it would start the new window with no credit and no way
    /// to ask: false 429s until the late tick (BENCHMARKS.md).
    #[cold]
    pub(super) fn fast_path_round_at(&self, wall_ms: u64) -> u64 {
        let round = self.round.load(Ordering::Relaxed);
        let began_ms = self.heartbeat_wall_ms.load(Ordering::Relaxed);
        round + wall_ms.saturating_sub(began_ms) / u64::from(self.config.round_ms)
    }
}
