//! Folding what nodes report into the ledgers (C3): max-sequence-wins within a node
//! epoch, lines of different epochs kept apart and summed. A line can bring in credit
//! this owner did not issue (a takeover's totals); that is checked as it lands.

use std::collections::hash_map::Entry;

use bus_schemas::limits::WINDOW_LIMIT_MAX;
use bus_schemas::{FastPathRequest, KeyWindow, NodeEpoch, NodeId, Now, ReportEntry};
use credit_sizing::smoothed_rise;

use super::ledger::{Ledger, Line, check_ledger};
use super::sizing::line_demand;
use super::{FoldOwner, OwnerMode, bus_window_end};

/// What folding one report line into its [`Line`] changed.
struct Folded {
    returned_more: bool,
    self_granted_more: bool,
    /// The line reports more applied than this owner granted: a previous owner's grants.
    took_over: bool,
}

impl Line {
    /// Takes in a report line newer than the one held: every total only grows, and the
    /// demand as `line_demand` takes it (`thin`: the key-window is spread thin).
    fn fold(&mut self, seq: u64, entry: &ReportEntry, thin: bool) -> Folded {
        let self_granted_more = entry.self_granted > self.self_granted;
        self.seq = seq;
        self.spend = self.spend.max(entry.cumulative_spend);
        self.demand = line_demand(thin, self.demand, entry.demand);
        self.applied = self.applied.max(entry.applied_grant);
        let returned_more = entry.returned > self.returned;
        self.returned = self.returned.max(entry.returned);
        self.self_granted = self.self_granted.max(entry.self_granted);
        // An option settled is credit the pool counted as out and may not be: like a
        // return, it can reopen a window (an option given up is all back).
        let settled_now = entry.standing_option && !self.standing_option;
        self.standing_option |= entry.standing_option;
        let took_over = self.granted < self.applied;
        if took_over {
            // A previous owner's credit (takeover): continue its totals.
            self.granted = self.applied;
        }
        Folded {
            returned_more: returned_more || settled_now,
            self_granted_more,
            took_over,
        }
    }
}

impl FoldOwner {
    /// Merge one report line (C3). Returns false if the line was refused (no room for its
    /// ledger, a window too far ahead, or past the lines cap).
    pub(super) fn merge(
        &mut self,
        node: NodeId,
        epoch: NodeEpoch,
        seq: u64,
        entry: &ReportEntry,
        now: Now,
    ) -> bool {
        let kw = entry.key_window;
        let ledgers_len = self.ledgers.len();
        // A node that gave its option up before it had the key's plan reports the
        // largest allowance the wire takes: it knows none (`standing`). Such a line
        // carries no credit; it settles an option, and says nothing of the allowance.
        let known = (entry.allowance < WINDOW_LIMIT_MAX).then_some(entry.allowance);
        let ledger = match self.ledgers.entry(kw) {
            Entry::Occupied(o) => o.into_mut(),
            Entry::Vacant(v) => {
                if ledgers_len >= self.config.ledgers_cap
                    || too_far_ahead(kw, now)
                    || known.is_none()
                {
                    self.stats.ledgers_refused += 1;
                    return false;
                }
                let cap = self.policy.as_ref().and_then(|p| p.limit(&kw));
                self.reap_queue
                    .push(std::cmp::Reverse((bus_window_end(kw), kw)));
                let rotation = self.config.option_rotation(&kw);
                v.insert(Ledger::new(entry.allowance, cap, rotation))
            }
        };
        if ledger.lines.0.is_empty() && self.recalled_last_window(&kw) {
            // The key concentrated in the window before (a node holding two units
            // wanted more than the pool had): all its options are asked back before
            // most nodes would take them (`options`).
            self.want_recall(now, kw, true);
        }
        let ledger = self.ledgers.get_mut(&kw).expect("made above");
        if let Some(allowance) = known {
            ledger.tighten_allowance(&self.config, allowance);
            ledger.option_allowance = ledger.option_allowance.max(allowance);
        }
        let thin = ledger.spread_thin(&self.config);
        if !ledger.has_room_for(&self.config, &(node, epoch), entry) {
            self.stats.ledgers_refused += 1;
            return false;
        }
        let (line, is_new_line) = ledger.lines.get_or_insert((node, epoch));
        if is_new_line && self.config.mode == OwnerMode::Fixed {
            ledger.fixed_nodes_seen += 1;
        }
        if !is_new_line && seq <= line.seq {
            self.stats.entries_stale += 1;
            return true;
        }
        let folded = line.fold(seq, entry, thin);
        if ledger.issued_net() + self.config.reserve(ledger.allowance) > ledger.allowance {
            // Only a previous owner releasing the reserve explains this much credit out.
            ledger.reserve_released = true;
        }
        // Credit this owner did not issue is the one thing a line brings in that can
        // break the ledger (a lower allowance stops at what is issued, and a return only
        // lowers it): checked here, before anything is sized from it, a breach halts the
        // owner with nothing of this step sent (`poll_grant`).
        let breach = if folded.took_over {
            check_ledger(&self.config, &kw, ledger).err()
        } else {
            None
        };
        // A return (or an option settled) is the only thing that raises a ledger's
        // available credit (grants, self-grants and a lower allowance only lower it), so
        // it is what can reopen a window its lines were told is exhausted.
        if folded.returned_more
            && !ledger.retry_queued
            && self.config.mode == OwnerMode::Leasing
            && ledger.lines.values().any(|l| l.starved)
        {
            ledger.retry_queued = true;
            self.retry_queue.push_back(kw);
        }
        // A standing option taken is no F4 self-grant: only credit beyond it is.
        let ledger = self.ledgers.get(&kw).expect("merged above");
        let option = if entry.standing_option {
            self.config
                .option_of(ledger.option_allowance, ledger.option_rotation, node)
        } else {
            0
        };
        // Below the fleet size F4 gives a node nothing (allowance / fleet rounds to 0),
        // so a self-grant beyond the option there is a loan (one unit, node-core's
        // `arm_loan`): counted as committed like any, but no sign the node lost this
        // owner. Withholding the node for it would refuse all its fast paths for
        // `withhold_rounds`, which at 10^5 keys turned loans into 2% of requests denied.
        let loan_only = ledger.allowance < u64::from(self.config.fleet_size)
            && entry.self_granted <= option + 1;
        if folded.self_granted_more
            && entry.self_granted > option
            && !loan_only
            && self.config.mode == OwnerMode::Leasing
        {
            self.withhold_self_granter(node, now);
        }
        if let Some(e) = breach {
            self.halted.get_or_insert(e);
        }
        true
    }

    /// D5: the line a fast-path request carries, a consistent snapshot, merged as the
    /// newest this owner has: at the sequence of the last report, so the next report
    /// still supersedes it. No `see_node` here: a fast-path request carries no round,
    /// and merging its line shows a self-grant on this key-window (F4) before any
    /// credit for it is sized.
    pub(super) fn merge_fast_path_line(&mut self, req: &FastPathRequest, now: Now) {
        let id = (req.node, req.node_epoch);
        let seq = self
            .ledgers
            .get(&req.entry.key_window)
            .and_then(|l| l.lines.get(&id))
            .map(|l| l.seq);
        self.merge(req.node, req.node_epoch, seq.unwrap_or(0), &req.entry, now);
        if let Some(ledger) = self.ledgers.get_mut(&req.entry.key_window) {
            let thin = ledger.spread_thin(&self.config);
            if let Some(line) = ledger.lines.get_mut(&id) {
                line.spend = line.spend.max(req.entry.cumulative_spend);
                line.applied = line.applied.max(req.entry.applied_grant);
                // The request advertises the key's busiest demand and its recent peak
                // (a burst's first sign); for a line of a key spread thin that is the
                // same one-round reading `line_demand` smooths: the grant goes to the
                // requester's request, not ahead of it.
                line.demand = if thin {
                    smoothed_rise(line.demand, req.entry.demand)
                } else {
                    line.demand.max(req.entry.demand)
                };
            }
        }
    }
}

/// A node reports its current window and, near its end, the next: a window further
/// ahead than that (and clock skew) is a bad line, whose ledger would hold a place in
/// the cap until that far-off end.
fn too_far_ahead(kw: KeyWindow, now: Now) -> bool {
    let length_ms = u64::from(kw.window.length_ms);
    let starts_ms = bus_window_end(kw) - length_ms;
    starts_ms > now.wall_ms + 2 * length_ms + 1_000
}
