//! Grant sizing (C4, C5): how much of a key-window's pool a line is granted, or whether
//! it is told the pool is spent or open again. Demand x h x lead rounds plus a Poisson
//! burst allowance while the pool is plentiful, one round at a time in its endgame, a
//! split in proportion when the wants exceed what is left, and a floor for the cases in
//! which reported demand is known to read low.

use bus_schemas::{GrantEntry, KeyWindow, NodeEpoch, NodeId, Now};
use credit_sizing::{held_target, round_of_pace, smoothed_rise};

use super::ledger::{Ledger, Line, check_ledger};
use super::{FoldOwner, OwnerConfig, OwnerMode, bus_window_end};

/// A line's demand after a report of `reported`, from `held` (see
/// `OwnerConfig::spread_lines`); `thin`: its key-window is spread thin.
pub(super) fn line_demand(thin: bool, held: u64, reported: u64) -> u64 {
    if thin && reported > held {
        smoothed_rise(held, reported)
    } else {
        reported
    }
}

/// What is left of a key-window's pool when a line is sized (`FoldOwner::size_grant`).
#[derive(Clone, Copy)]
struct PoolLeft {
    allowance: u64,
    available: u64,
    /// At least half the pool unissued and not in the endgame.
    slack: bool,
}

impl PoolLeft {
    fn of(config: &OwnerConfig, ledger: &Ledger, available: u64, endgame: bool) -> Self {
        // Half the pool unissued and not in the endgame: the window is far from its
        // limit, and a unit held ahead costs no other node a request. The pool is what
        // the standing options leave (`Ledger::pool_base`).
        let slack = !endgame && available.saturating_mul(2) >= ledger.pool_base(config);
        Self {
            allowance: ledger.allowance,
            available,
            slack,
        }
    }
}

/// How the lines of a key-window want credit at the moment one of them is sized.
#[derive(Clone, Copy)]
struct Wants {
    lead_rounds: u64,
    thin: bool,
    /// Once what is left of the pool would not cover every line's full want twice over,
    /// each is granted one round of demand at a time (`lean_want`): credit held ahead is
    /// what strands on one node while another runs dry at the end of the pool (A2).
    endgame: bool,
    /// Every line's `full_want`, summed.
    full_total: u64,
}

impl Wants {
    fn of(config: &OwnerConfig, kw: KeyWindow, ledger: &Ledger, available: u64) -> Self {
        let lead_rounds = config.lead_rounds_for(kw.window.length_ms);
        let full_total = ledger
            .lines
            .values()
            .map(|l| full_want(config, lead_rounds, l))
            .sum::<u64>();
        Self {
            lead_rounds,
            thin: ledger.spread_thin(config),
            endgame: full_total * 2 > available,
            full_total,
        }
    }

    fn of_line(&self, config: &OwnerConfig, line: &Line) -> u64 {
        if self.endgame {
            lean_want(config, self.thin, line)
        } else {
            full_want(config, self.lead_rounds, line)
        }
    }

    /// Every line's want, summed, with the lines as they were when `of` took them.
    fn total(&self, config: &OwnerConfig, ledger: &Ledger) -> u64 {
        if self.endgame {
            ledger
                .lines
                .values()
                .map(|l| lean_want(config, self.thin, l))
                .sum::<u64>()
        } else {
            self.full_total
        }
    }
}

/// C4: what tops a line up to `h x demand x lead` plus the burst allowance.
fn full_want(config: &OwnerConfig, lead_rounds: u64, line: &Line) -> u64 {
    let target = held_target(
        line.demand * lead_rounds,
        config.headroom_permille,
        config.burst_sigmas,
    );
    target.saturating_sub(line.outstanding())
}

/// The endgame's want: one round of `h x demand`. A key-window spread thin (`thin`)
/// grants only whole requests of part of a round's demand (`thin_endgame_permille`),
/// rounded down: a node that expects less than that holds nothing and asks the fast
/// path when one comes, so the pool's last credit stays with the owner for whichever
/// node that is, instead of a unit on each of twenty nodes of which most see no further
/// request before the window turns over (A2). Seeds 1-4, under 1 s mean / p99 (60 s
/// p99): rounded down, zipf 1.59% / 15.0% (2.67%) and uniform 6.86% / 20.0%, against
/// 2.08% / 20.0% (3.80%) and 9.07% / 22.5% rounded up as elsewhere (a whole round);
/// pinned and every other row within 0.01 point. The price is fast paths: zipf 26% of
/// requests against 17%, uniform 42% against 19% (BENCHMARKS.md).
fn lean_want(config: &OwnerConfig, thin: bool, line: &Line) -> u64 {
    let lean = line.demand * config.headroom_permille;
    let lean = if thin {
        lean * config.thin_endgame_permille / 1_000_000_000
    } else {
        lean.div_ceil(1_000_000)
    };
    lean.saturating_sub(line.outstanding())
}

/// C4: a line's grant of `available` when it wants `want` and its key-window's lines
/// want `total_want` together: all it wants while the pool covers every want, else its
/// share in proportion, at least a unit while any is left.
fn fair_split(want: u64, total_want: u64, available: u64) -> u64 {
    if total_want > available {
        ((u128::from(available) * u128::from(want) / u128::from(total_want)) as u64)
            .max(u64::from(available > 0))
    } else {
        want
    }
    .min(available)
}

/// The least a line is sized to whatever its demand says, by what asked and how much of
/// the pool is left (0: no floor). Each answer covers a case in which the reported
/// demand is known to read low:
///
/// | asked by | key-window | pool left | least |
/// | --- | --- | --- | --- |
/// | any sizing | spread thin | half, not endgame | `thin_slack_floor` held (at most a share) |
/// | fast path | any | any | one round of pace, at least 1 |
/// | fast path | spread thin | a quarter | 2 |
/// | fast path, nothing issued yet | any (leasing) | half, not endgame | a 1/fleet share |
fn least_want(
    config: &OwnerConfig,
    kw: KeyWindow,
    line: &Line,
    pool: PoolLeft,
    thin: bool,
    fast: bool,
) -> u64 {
    let mut least = 0;
    if thin && pool.slack {
        // `OwnerConfig::thin_slack_floor`: a quiet node of a key spread thin keeps a
        // little while the window is far from its limit, so its next request does not
        // wait on a fast path, which can miss its deadline.
        let floor = config
            .thin_slack_floor
            .min(config.lease_share(pool.allowance));
        least = floor.saturating_sub(line.outstanding());
    }
    if !fast {
        return least;
    }
    // A node that ran dry asks once a round; what it reported as demand may be stale
    // or, for a key first seen this round, nothing. One round of the window's average
    // pace, split across the fleet, is the least that keeps a cold key's first burst
    // from costing a 429 per request until the next round.
    let pace = round_of_pace(
        pool.allowance,
        kw.window.length_ms,
        config.round_ms,
        config.fleet_size,
    );
    least = least.max(pace).max(1);
    // D5 allows one fast path a round, and in a key-window spread thin that is the
    // largest cause of 429s with credit still in the pool (uniform, seed 1, 30 s: 4,318
    // of 6,297, with one unit): a second request in the same round finds the one unit
    // spent. While a quarter of the pool is unissued the answer covers it too; a unit the
    // node does not spend goes back within its thin idle wait
    // (`NodeConfig::idle_return_rounds_thin`). Later in the pool a unit held ahead is one
    // another node's request will miss (two at any time: uniform's 1 s mean 3.18%
    // against 3.04% at seed 1). BENCHMARKS.md has the figures.
    if thin && pool.available.saturating_mul(4) >= pool.allowance {
        least = least.max(2);
    }
    // A node that holds nothing of this window yet asks for at least its 1/fleet share
    // (what fixed mode and an F4 self-grant would give it unasked). One round of pace is
    // a single unit for any plan under 40 per second per node, so a client's quick run
    // of requests at a fresh key would earn a 429 on its second request, with most of
    // the allowance untouched, until the next round. Only while the pool is slack: later
    // in a window (a restarted node's new epoch, a key that moved) a share would strand
    // on a node whose demand is unknown, which the sim's restarts scenario shows as
    // under-admission. The fair split in `size_grant` still cuts it when short.
    if config.mode == OwnerMode::Leasing && line.issued() == 0 && pool.slack {
        least = least.max(config.lease_share(pool.allowance));
    }
    least
}

impl FoldOwner {
    /// C4: top a node up to `h x demand x lead` of outstanding credit, from what is left
    /// of the allowance; when the wants of all nodes exceed it, split it in proportion.
    /// `fast`: a fast path asks (D5), which may take the reserve (C5).
    pub(super) fn size_grant(
        &mut self,
        now: Now,
        node: NodeId,
        epoch: NodeEpoch,
        kw: KeyWindow,
        fast: bool,
    ) -> Option<GrantEntry> {
        if now.wall_ms >= bus_window_end(kw) {
            return None;
        }
        let config = &self.config;
        let ledger = self.ledgers.get_mut(&kw)?;
        let available_before = ledger.available(config);
        let wants = Wants::of(config, kw, ledger, available_before);
        let line = *ledger.lines.get(&(node, epoch))?;
        let pool = PoolLeft::of(config, ledger, available_before, wants.endgame);
        let central = wants.endgame && config.what_if_central_endgame;
        if central && !fast {
            return None;
        }
        let want = if central {
            1
        } else {
            let least = least_want(config, kw, &line, pool, wants.thin, fast);
            wants.of_line(config, &line).max(least)
        };
        if want == 0 {
            // Spread thin, wanting nothing is how the endgame leaves every node (above),
            // not a sign its demand fell away: it stays starved, to be told when credit
            // comes back (`retry_exhausted_lines`).
            if !wants.thin
                && let Some(l) = ledger.lines.get_mut(&(node, epoch))
            {
                l.starved = false;
            }
            return None;
        }
        let mut available = available_before;
        if fast && available < want && ledger.reserve_left(config) {
            // C5: the reserve goes once per key-window, only through the fast path.
            ledger.reserve_released = true;
            self.stats.reserve_released += 1;
            available = ledger.available(config);
        }
        // The lines are as they were when `wants` was taken (only `want` moved).
        let grant = fair_split(want, wants.total(config, ledger).max(want), available);
        if grant < want {
            // Short while nodes may hold options they do not use: ask for them back.
            if line.issued() + line.self_granted >= 2 {
                ledger.concentrated = true;
            }
            self.want_recall(now, kw, false);
        } else if grant == available {
            // The pool's last unit goes: the next miss would find nothing while options
            // may lie unused, so a few are asked back now, not at that miss.
            self.want_recall(now, kw, false);
        }
        if grant == 0 {
            return None;
        }
        let config = &self.config;
        let ledger = self.ledgers.get_mut(&kw).expect("sized above");
        let reserve_left = ledger.may_refill(config);
        let line = ledger.lines.get_mut(&(node, epoch)).expect("read above");
        // Exhausted means nothing is left even for a fast path: while the reserve is
        // still held, a node that runs dry must be able to ask for it (C5), so its 429s
        // wait for the next round, not the window boundary (D6).
        let entry = line.issue(kw, epoch, grant, available == grant && !reserve_left);
        self.stats.grants += 1;
        self.stats.credit_granted += grant;
        // Assert on the issuing side of the boundary too: a breach halts before it leaves.
        if let Err(e) = check_ledger(config, &kw, ledger) {
            self.halted = Some(e);
            return None;
        }
        Some(entry)
    }

    /// A grant that adds nothing and says whether the pool is spent: with `exhausted`,
    /// sent once to every node that holds a line when the last credit (reserve
    /// included) is gone, so none spends a fast path learning it from its first 429
    /// (A48); without, to a line told so once credit is back in the pool, so its fast
    /// path can ask again (`retry_exhausted_lines`). None when the line was already
    /// told, the pool does not say so, or the window has ended.
    pub(super) fn pool_notice(
        &mut self,
        now: Now,
        node: NodeId,
        epoch: NodeEpoch,
        kw: KeyWindow,
        exhausted: bool,
    ) -> Option<GrantEntry> {
        if now.wall_ms >= bus_window_end(kw) {
            return None;
        }
        let config = &self.config;
        let ledger = self.ledgers.get_mut(&kw)?;
        let available = ledger.available(config);
        let reserve_left = ledger.may_refill(config);
        let pool_says = if exhausted {
            available == 0 && !reserve_left
        } else {
            available > 0
        };
        if !pool_says {
            return None;
        }
        let line = ledger.lines.get_mut(&(node, epoch))?;
        // A line that never held credit has nothing to stop spending.
        if line.told_exhausted == exhausted || (exhausted && line.issued() == 0) {
            return None;
        }
        Some(line.issue(kw, epoch, 0, exhausted))
    }

    /// Whether the pool of `kw` is spent, the reserve included: what a refused fast
    /// path tells the node.
    pub(super) fn pool_exhausted(&self, kw: &KeyWindow) -> bool {
        self.ledgers
            .get(kw)
            .is_some_and(|l| l.available(&self.config) == 0 && !l.may_refill(&self.config))
    }
}
