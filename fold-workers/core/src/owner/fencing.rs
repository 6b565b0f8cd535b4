//! Who may be granted to (C8): the nodes this owner has seen and their epochs, the
//! takeover fence that holds every grant until each node has acknowledged this owner
//! epoch in a full report, and the gathering of those full reports chunk by chunk.

use bus_schemas::{NodeEpoch, NodeId, Now, ReportBatch};

use super::FoldOwner;

/// What the owner knows of one node's reports, across its epochs.
#[derive(Clone, Copy, Debug)]
pub(super) struct NodeSeen {
    last_seen_mono_ms: u64,
    pub(super) withheld_until_mono_ms: u64,
    /// The node epoch and round (`ReportBatch::seq`) of its last report here.
    last_epoch: NodeEpoch,
    last_round: u64,
}

/// A full report of one node epoch being gathered (`FoldOwner::take_full_report_chunk`).
#[derive(Clone, Copy, Debug)]
pub(super) struct FullReportSeen {
    epoch: NodeEpoch,
    seq: u64,
    count: u32,
    chunks_mask: u64,
}

impl FoldOwner {
    /// The takeover fence: until every node has acknowledged this epoch, a grant could
    /// double credit the previous owner still has in flight.
    fn fenced(&self, node: NodeId, now: Now) -> bool {
        if !self.takeover {
            return false;
        }
        let all_acked = self.acked.len() as u32 >= self.config.fleet_size;
        let gave_up = self
            .config
            .takeover_ack_timeout_ms
            .is_some_and(|t| now.mono_ms >= self.started_mono_ms + t);
        !(all_acked || gave_up && self.acked.contains_key(&node))
    }

    /// C8: one batch of a report. A node's acknowledgement of this epoch counts once
    /// every chunk of one of its full reports is in, each saying it accepts this epoch.
    /// Not from a partial report: that leaves out lines that had not changed, whose
    /// credit this owner would count as still in the pool, and a lost chunk of a full
    /// report would too (the bus is at most once, and a takeover follows an outage).
    pub(super) fn take_full_report_chunk(&mut self, batch: &ReportBatch) {
        let Some(chunk) = batch.full_report else {
            return;
        };
        // A node epoch is the node's start in wall ms (C9), so a later life has a larger
        // one: a delayed chunk of an earlier life must not undo a later one's report.
        if batch.owner_epoch_seen < self.epoch
            || self
                .acked
                .get(&batch.node)
                .is_some_and(|e| *e >= batch.node_epoch)
        {
            return;
        }
        let fresh = FullReportSeen {
            epoch: batch.node_epoch,
            seq: batch.seq,
            count: chunk.count,
            chunks_mask: 0,
        };
        let seen = self.full_reports.entry(batch.node).or_insert(fresh);
        if (seen.epoch, seen.seq) != (fresh.epoch, fresh.seq) {
            if (fresh.epoch, fresh.seq) < (seen.epoch, seen.seq) {
                // A chunk of an older full report, reordered behind a newer one.
                return;
            }
            *seen = fresh;
        }
        if chunk.count != seen.count {
            // The chunks of one report agree on their count; one that does not is not
            // part of it.
            return;
        }
        // The codec keeps `index < count <= 64`.
        seen.chunks_mask |= 1 << chunk.index;
        if seen.chunks_mask.count_ones() == seen.count {
            self.full_reports.remove(&batch.node);
            self.acked.insert(batch.node, batch.node_epoch);
        }
    }

    /// What a grant batch to `node` says of its full report (`GrantBatch::
    /// full_report_taken`). An owner that took over waits for one (the fence); any other
    /// needs none, and says so to the node epoch it last heard from.
    pub(super) fn full_report_taken(&self, node: NodeId) -> Option<NodeEpoch> {
        if self.takeover {
            self.acked.get(&node).copied()
        } else {
            self.nodes.get(&node).map(|n| n.last_epoch)
        }
    }

    /// Nothing is granted to `node` now: the owner halted, the takeover fence holds, or
    /// the node is withheld (C8, F4).
    pub(super) fn withheld(&self, node: NodeId, now: Now) -> bool {
        self.halted.is_some()
            || self.fenced(node, now)
            || self
                .nodes
                .get(&node)
                .is_some_and(|n| now.mono_ms < n.withheld_until_mono_ms)
    }

    /// C8, on every report batch. Absent means the owner missed rounds of the node's
    /// reports: a silence here *and* a jump in the node's own round counter (or a new
    /// node epoch). A node whose rounds ran late (a stalled process, a starved task, or
    /// this owner stalled itself) sends its next round in sequence: it ran no round in
    /// between, so it cannot have self-granted (F4 self-grants happen in a round and are
    /// reported in that round's batch, which `merge` checks). Withholding it anyway would
    /// cost false 429s under CPU load on a healthy node (BENCHMARKS.md).
    pub(super) fn see_node(&mut self, node: NodeId, epoch: NodeEpoch, round: u64, now: Now) {
        let absent_ms = self.config.absent_after_rounds * self.round_ms();
        let withhold_ms = self.config.withhold_rounds * self.round_ms();
        let seen = self.nodes.entry(node).or_insert(NodeSeen {
            last_seen_mono_ms: now.mono_ms,
            withheld_until_mono_ms: 0,
            last_epoch: epoch,
            last_round: round,
        });
        let silent = now.mono_ms.saturating_sub(seen.last_seen_mono_ms) > absent_ms;
        let rounds_missed = seen.last_epoch != epoch
            || round.saturating_sub(seen.last_round) > self.config.absent_after_rounds;
        if silent && rounds_missed {
            // C8: it may have self-granted while away; grant nothing until a full round of
            // its reports has shown what it holds.
            seen.withheld_until_mono_ms = now.mono_ms + withhold_ms;
        }
        if seen.last_epoch != epoch || round >= seen.last_round {
            seen.last_seen_mono_ms = now.mono_ms;
            seen.last_epoch = epoch;
            seen.last_round = round;
        }
    }

    /// The node epoch of `node`'s last report here, if it has reported.
    pub(super) fn node_epoch(&self, node: NodeId) -> Option<NodeEpoch> {
        self.nodes.get(&node).map(|s| s.last_epoch)
    }

    /// F4: the node gave itself credit while this owner was away; grant it nothing for
    /// `withhold_rounds`, as for a reappearing node.
    pub(super) fn withhold_self_granter(&mut self, node: NodeId, now: Now) {
        let withhold_ms = self.config.withhold_rounds * self.round_ms();
        if let Some(n) = self.nodes.get_mut(&node) {
            n.withheld_until_mono_ms = n.withheld_until_mono_ms.max(now.mono_ms + withhold_ms);
        }
    }
}
