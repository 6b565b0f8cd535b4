//! Credit this node hands back to the pool (C4, A2): all of it once a key is idle or a
//! shorter window of its plan blocks a longer one, and at every visit what the rest of a
//! window cannot spend. The owner recalls nothing; the node gives back on its own, so
//! the credit reaches whichever node asks next.
//!
//! The waits are functions of the key's own rate and plan (`idle_return_after`,
//! `idle_cap_for`, `blocked_return_rounds`); `return_credit` drains the word.

use bus_schemas::{KeyWindow, Now};

use super::links::LinkHealth;
use super::tick::Visit;
use super::track::Place;
use super::{Mode, NodeLimiter};
use crate::credit;
use crate::surface::KeyBucket;

/// What a return of a window's held credit leaves on the node (`return_credit`).
#[derive(Clone, Copy, Debug)]
pub(super) enum Keep {
    /// C4: the key is idle (or a shorter window blocks this one): everything goes back.
    Nothing,
    /// C4/A2: the rest of the window (`NodeLimiter::rest_of_window`), `mean_milli`
    /// thousandths of a request expected before its end: the node keeps h x that plus
    /// `rest_return_sigmas` standard deviations of Poisson arrivals, or once the owner
    /// has said the pool is exhausted, that alone.
    RestOfWindow { mean_milli: u64 },
}

impl NodeLimiter {
    /// C4: quiet rounds after which a key's credit is idle. A node that saw `rate_milli`
    /// thousandths of a request a round sees a quiet spell of n rounds by chance with
    /// probability about e^(-rate n); past e^(-6) (0.25%) the traffic has most likely moved
    /// (the sim's shift scenario: a key's traffic leaves for another node mid-window, and
    /// its credit here is what that node lacks). A slow key keeps the configured wait, so
    /// a pause does not strand its next request on the fast path.
    pub(super) fn idle_return_after(min: u32, cap: u32, rate_milli: u64) -> u32 {
        const QUIET_ODDS_MILLI: u64 = 6_000;
        if rate_milli == 0 {
            return cap;
        }
        u32::try_from(QUIET_ODDS_MILLI.div_ceil(rate_milli))
            .unwrap_or(u32::MAX)
            .clamp(min.min(cap), cap)
    }

    /// C4: the idle wait for a key whose rate here, `rate_milli` thousandths of a request
    /// a round when its quiet spell began, is under half the pace of its slowest window
    /// (its allowance spread evenly over the window's rounds): `thin` rounds, at most
    /// `cap`; any other key's is `cap`. Such a node is one of several the key's traffic
    /// is spread over, so the idle credit it keeps through a gap of `cap` rounds is
    /// credit the others ask the owner for, and the window's pool runs dry while it sits
    /// here (A2). One seeing half the pace or more (a key pinned to one or two nodes)
    /// keeps its credit through an ordinary gap, which its next request would otherwise
    /// spend on a fast path: one short wait for every key would put pinned's fast path
    /// over its 0.5% (BENCHMARKS.md).
    pub(super) fn idle_cap_for(
        rate_milli: u64,
        windows: &[bus_schemas::WindowSpec],
        round_ms: u32,
        cap: u32,
        thin: u32,
    ) -> u32 {
        const THIN_SHARE_DIVISOR: u64 = 2;
        let slowest_pace_milli = windows
            .iter()
            .map(|w| w.limit * u64::from(round_ms) * 1_000 / u64::from(w.length_ms.max(1)))
            .min();
        match slowest_pace_milli {
            Some(pace) if rate_milli * THIN_SHARE_DIVISOR < pace => thin.min(cap),
            _ => cap,
        }
    }

    /// C4: quiet rounds after which a window's credit goes back although its key is busy,
    /// because a shorter window of the plan stops every request first: two of the
    /// shortest such window's lengths (80 rounds for a 60 s window under a 1 s one), so
    /// an ordinary spell of the shorter window's 429s (its last stretch, until it turns
    /// over) keeps it. In the sim's hot-key run every node holds some of the hot key's
    /// 60 s credit while the 1 s credit, 40 a second fleet-wide, goes to a few of them; a
    /// node with no 1 s credit never spends its 60 s credit, and the key never goes quiet
    /// there, so the idle return alone would never move it: what it strands at the 60 s
    /// window's end is the key's whole under-admission (A2).
    /// Never fewer than `idle_cap` rounds, the key's own idle wait (a very short shorter
    /// window would otherwise hand credit back over an ordinary gap; a configuration that
    /// keeps idle credit, `u32::MAX`, keeps this too). `None`: no shorter window, so only
    /// the key's own idleness counts.
    pub(super) fn blocked_return_rounds(
        windows: &[bus_schemas::WindowSpec],
        slot: usize,
        round_ms: u32,
        idle_cap: u32,
    ) -> Option<u64> {
        let length_ms = windows.get(slot)?.length_ms;
        let shorter_ms = windows
            .iter()
            .map(|w| w.length_ms)
            .filter(|l| *l < length_ms)
            .min()?;
        Some((2 * u64::from(shorter_ms) / u64::from(round_ms.max(1))).max(u64::from(idle_cap)))
    }

    /// C4/A2: at every visit, what a window holds above what its demand may spend in the
    /// `left_ms` to its end goes back (see `Keep::RestOfWindow`). Credit placed ahead for
    /// rounds that no longer exist strands at the boundary while another node of the key
    /// runs dry: the sim's pinned pairs, hot-key and zipf keys lost 2-3 of a 1 s
    /// window's 40 that way, with the owner's pool empty and nothing to recall (C6).
    /// Back in the pool, it reaches the node that asks next, by its report or its fast
    /// path. The node initiates this as it does the idle return; the owner recalls
    /// nothing.
    ///
    /// Every visit, not only the window's last rounds: a grant sized from a burst (two
    /// requests in one round read as two a round) can hold far more than the window's
    /// rest will spend once the burst has passed, and in the sim's hot-key keys (two
    /// nodes, offered about the 40 a second) it would sit on the quiet node for twenty
    /// rounds while the busy one is told the pool is spent and denied. BENCHMARKS.md has
    /// what a return at every visit does to each scenario's accuracy and fast path.
    pub(super) fn rest_of_window(&self, left_ms: u64, demand_milli: u64) -> Option<Keep> {
        let round_ms = u64::from(self.config.round_ms.max(1));
        (self.config.rest_return && left_ms > 0).then(|| Keep::RestOfWindow {
            mean_milli: demand_milli * left_ms.div_ceil(round_ms),
        })
    }

    /// Hand back what `kw`'s word holds above what `keep` leaves, so the owner can give
    /// it to a node that is using it. Only while the owner is there to re-grant it.
    pub(super) fn return_credit(
        &mut self,
        now: Now,
        bucket: &KeyBucket,
        kw: KeyWindow,
        keep: Keep,
    ) {
        const HEADROOM_PERMILLE: u64 = 1_250; // C4's h
        if self.link_health(kw.shard(self.config.shards), now) != LinkHealth::Healthy {
            return;
        }
        let sigmas = self.config.rest_return_sigmas;
        let Some(rec) = self.record_mut(&kw) else {
            return;
        };
        if rec.place != Place::Live || (rec.standing > 0 && rec.grant_seq == 0) {
            // Standing credit stays until the owner addresses the key-window: handed
            // back, it would be a report line per request and a grant to undo it.
            return;
        }
        let keep = match keep {
            Keep::Nothing => 0,
            // The pool is empty: what this node keeps above its expected need is the
            // window's last credit, and a node that runs short here can still get what
            // the others hand back (the owner reopens its fast path). Keeping the margin
            // too costs the zipf and hot-key scenarios accuracy (BENCHMARKS.md).
            Keep::RestOfWindow { mean_milli } if rec.exhausted => mean_milli.div_ceil(1_000),
            Keep::RestOfWindow { mean_milli } => {
                credit_sizing::held_target(mean_milli, HEADROOM_PERMILLE, sigmas)
            }
        };
        let taken = credit::drain_to(
            bucket.word(usize::from(rec.slot), kw.window),
            kw.window.number,
            keep,
        )
        .unwrap_or(0);
        rec.returned += taken;
        self.stats.credit_returned += taken;
        if taken > 0 {
            self.log.note(kw);
        }
    }

    /// C4/A2: after a visit placed window `slot`'s record `kw`, hand back what it holds and
    /// will not spend: everything when the key is idle or a shorter window blocks this one
    /// (`blocked_return_rounds`), else what the rest of the window cannot use. Leasing
    /// only: a fixed share is the node's to keep.
    pub(super) fn return_unneeded(
        &mut self,
        now: Now,
        bucket: &KeyBucket,
        kw: KeyWindow,
        left_ms: u64,
        visit: &Visit,
    ) {
        let slot = visit.slot;
        let blocked = visit.delta > 0
            && Self::blocked_return_rounds(
                bucket.policy().windows(),
                slot,
                self.config.round_ms,
                visit.idle_cap,
            )
            .is_some_and(|r| self.round.saturating_sub(visit.wanted_round[slot]) >= r);
        if self.config.mode == Mode::Leasing {
            let keep = if visit.idle[slot] || blocked {
                Some(Keep::Nothing)
            } else {
                self.rest_of_window(left_ms, visit.demands[slot])
            };
            if let Some(keep) = keep {
                self.return_credit(now, bucket, kw, keep);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::NodeLimiter;

    /// A window's credit goes back while its key is busy only when a shorter window has
    /// stopped every request for two of its lengths; the shortest window never does.
    #[test]
    fn blocked_return_waits_two_shorter_windows() {
        // The fleet drill's plan (`foldgate_harness::fleet::drill_plan`): 40 a second and
        // 1,500 a minute. Written out so this crate's tests need nothing above it.
        let plan = [
            bus_schemas::WindowSpec {
                length_ms: 1_000,
                limit: 40,
            },
            bus_schemas::WindowSpec {
                length_ms: 60_000,
                limit: 1_500,
            },
        ];
        let after = |slot, cap| NodeLimiter::blocked_return_rounds(&plan, slot, 25, cap);
        assert_eq!(after(0, 8), None);
        assert_eq!(after(1, 8), Some(80));
        assert_eq!(after(1, 200), Some(200));
        assert_eq!(after(1, u32::MAX), Some(u64::from(u32::MAX)));
        assert_eq!(after(2, 8), None);
    }

    /// A busy key's credit goes back after a quiet spell its own rate makes unlikely; a
    /// slow one waits the configured rounds; never fewer than three, never more than the
    /// configured cap.
    #[test]
    fn idle_return_waits_longer_for_slower_keys() {
        let after = |cap, rate| NodeLimiter::idle_return_after(3, cap, rate);
        assert_eq!(after(8, 0), 8);
        assert_eq!(after(8, 600), 8);
        assert_eq!(after(8, 1_250), 5);
        assert_eq!(after(8, 2_000), 3);
        assert_eq!(after(8, 50_000), 3);
        assert_eq!(after(2, 50_000), 2);
        // Idle return off: never, however busy the key was.
        assert_eq!(
            NodeLimiter::idle_return_after(u32::MAX, u32::MAX, 50_000),
            u32::MAX
        );
        for rate in [1u64, 10, 700, 999, 1_001, 3_000, u64::MAX] {
            let n = after(8, rate);
            assert!((3..=8).contains(&n), "{rate}: {n}");
            assert!(
                after(8, rate.saturating_add(rate / 2)) <= n,
                "monotone at {rate}"
            );
        }
    }
}
