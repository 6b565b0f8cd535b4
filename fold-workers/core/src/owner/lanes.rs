//! The grants that answer no one report: the hot lane, folded once per round at the
//! tick (C10), and the retry of lines told exhausted once credit comes back to their
//! pool (A48). Each gathers its entries by node and sends one grant batch per node.

use bus_schemas::{GrantBatch, GrantEntry, KeyWindow, NodeEpoch, NodeId, Now};

use super::{FoldOwner, OwnerMode};

/// A step's grant entries grouped by node: at most one group per fleet node, searched
/// in order.
#[derive(Default)]
pub(super) struct PerNode(Vec<(NodeId, Vec<GrantEntry>)>);

impl PerNode {
    pub(super) fn add(&mut self, node: NodeId, entry: GrantEntry) {
        match self.0.iter_mut().find(|(n, _)| *n == node) {
            Some((_, entries)) => entries.push(entry),
            None => self.0.push((node, vec![entry])),
        }
    }
}

impl FoldOwner {
    /// C10: the hot lane, folded once per round: one grant decision per (node epoch,
    /// key-window) however many reports arrived, in a fixed order.
    pub(super) fn fold_hot_lane(&mut self, now: Now) {
        if self.hot_pending.is_empty() {
            return;
        }
        let mut pending: Vec<((NodeId, NodeEpoch, KeyWindow), u64)> =
            self.hot_pending.drain().collect();
        pending.sort_unstable_by_key(|(k, _)| *k);
        let mut per_node = PerNode::default();
        for ((node, epoch, kw), sent_at_ms) in pending {
            let age = self.age_bucket(now, sent_at_ms);
            self.stats.fold_age_rounds_hot[age] += 1;
            if self.withheld(node, now) || self.config.mode != OwnerMode::Leasing {
                continue;
            }
            let Some(g) = self
                .size_grant(now, node, epoch, kw, false)
                .or_else(|| self.pool_notice(now, node, epoch, kw, true))
            else {
                continue;
            };
            per_node.add(node, g);
        }
        self.send_batches(per_node);
    }

    /// C4/A48: a node told its window is exhausted stops asking the fast path until the
    /// window ends, so credit another node hands back later (its idle return) could
    /// only reach it through its own next report, which it sends when the line is next
    /// due (a demand-band move, a refresh), rounds later, by when that credit has gone
    /// to whichever line reported next. So right after the report that handed it back
    /// (and at each tick, for what the bound below left queued), the starved lines (told
    /// exhausted while wanting more, `Line::starved`) in key-windows whose pool grew
    /// since are sized again, in the order the returns arrived; a line that wants nothing
    /// now is told the pool is open again (a grant of nothing more with exhausted false),
    /// so its fast path can ask when it runs dry.
    ///
    /// Lines not told exhausted are left alone: their fast path already takes pooled
    /// credit at the moment they need it, which placing it ahead can only guess at
    /// (retrying lines the fair split cut short too measures no better: bursty 1 s under
    /// mean 0.0685% against 0.0680% at seeds 2-4). In a key-window spread thin nothing
    /// is placed: a node's next request is as likely on any of a dozen nodes, and credit
    /// placed ahead strands on the wrong one. Its starved lines are only told the pool is
    /// open again, so the node a request comes to asks for it, as the endgame there has
    /// every node do (`size_grant`). Left closed, the credit the others handed back would
    /// sit in the pool while their 429s went on (in uniform's first 30 s at seed 1, 1.7
    /// of a 1 s window's 40 units unissued at its close, of 4.4 unspent in all). Seeds
    /// 1-4, under 1 s p99 / mean, 60 s p99, reopened against left closed: zipf 12.5 /
    /// 1.183% / 2.467% against 15.0 / 1.588% / 2.667%, uniform 15.0 / 4.403% against
    /// 20.0 / 6.857%, every other row within 0.001 point; fast paths zipf 28.8% against
    /// 26.0%, uniform 50.0% against 42.3%. With the thin endgame rounded up instead
    /// (`lean_want`), reopening costs more than it gains (zipf at seed 1, 1 s mean 2.17%
    /// against 2.13%).
    ///
    /// Only credit in the pool is placed, nothing placed is recalled (C6), and every
    /// grant passes `size_grant`'s allowance check (halting on a breach). At most
    /// `retry_ledgers_per_tick` key-windows a step; the rest wait their turn.
    ///
    /// Right after the report rather than at the next tick: until its notice lands, a
    /// node told exhausted denies what the pool could now admit, and at the tick that
    /// wait is up to a round. In uniform's first 30 s at seed 1, such 429s (1 s window,
    /// pool not empty, no fast path because told exhausted) number 1,215 against 4,612
    /// at the tick. Seed 1, under 1 s mean (60 s p99), after the report against at the
    /// tick: uniform 4.214% against 4.399%, zipf 1.126% (2.467%) against 1.143% (2.533%),
    /// pinned 0.0634% against 0.0685%, hot-key 0.149% against 0.157%; bursty 60 s mean
    /// 0.041% against 0.035% (BENCHMARKS.md).
    pub(super) fn retry_exhausted_lines(&mut self, now: Now) {
        if self.config.mode != OwnerMode::Leasing {
            self.retry_queue.clear();
            return;
        }
        let mut per_node = PerNode::default();
        let mut lines: Vec<(NodeId, NodeEpoch)> = Vec::new();
        for _ in 0..self.config.retry_ledgers_per_tick {
            let Some(kw) = self.retry_queue.pop_front() else {
                break;
            };
            let Some(ledger) = self.ledgers.get_mut(&kw) else {
                continue; // reaped since it was queued
            };
            ledger.retry_queued = false;
            let thin = ledger.spread_thin(&self.config);
            lines.clear();
            lines.extend(
                ledger
                    .lines
                    .0
                    .iter()
                    .filter(|(_, l)| l.starved)
                    .map(|(id, _)| *id),
            );
            for &(node, epoch) in &lines {
                if self.withheld(node, now) {
                    continue;
                }
                let placed = if thin {
                    None
                } else {
                    self.size_grant(now, node, epoch, kw, false)
                };
                let Some(g) = placed.or_else(|| self.pool_notice(now, node, epoch, kw, false))
                else {
                    continue;
                };
                per_node.add(node, g);
            }
        }
        self.send_batches(per_node);
    }

    /// One grant batch per node, in the order the nodes first got an entry.
    pub(super) fn send_batches(&mut self, per_node: PerNode) {
        for (node, entries) in per_node.0 {
            let full_report_taken = self.full_report_taken(node);
            self.outbox.push_back(GrantBatch {
                owner_epoch: self.epoch,
                shard: self.config.shard,
                node,
                entries,
                full_report_taken,
            });
        }
    }
}
