//! This node's view of each shard's owner: when it last answered, as which owner epoch,
//! and whether it has taken a full report (C2, C8); from that, how the link looks
//! (`LinkHealth`, F1-F5) and what the surface may do (fast path on, degraded).
//!
//! Every message from an owner passes `accept_owner_epoch` first, so the fence on owner
//! epochs and the contact times live in one place.

use bus_schemas::{Now, OwnerEpoch, ShardId};

use super::NodeLimiter;

/// How a shard's owner looks from this node (F2-F5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkHealth {
    Healthy,
    /// F2: fast path off, no rebalancing expected; F4: self-grant at boundaries.
    Silent,
    /// F5: silent for longer than `degraded_after_ms`.
    Degraded,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct ShardLink {
    pub(super) owner_epoch_seen: OwnerEpoch,
    pub(super) last_contact_mono_ms: u64,
    /// This node's round at that contact: a round missed is one this node reported in
    /// and heard nothing back for, not wall time alone (see `link_health`).
    pub(super) last_contact_round: u64,
    /// C8 takeover fence: the owner of `owner_epoch_seen` has not yet answered that it
    /// took a full report of the shard from this node epoch (`GrantBatch::
    /// full_report_taken`). A new owner rebuilds its ledger from reports, and a line that
    /// had not changed would otherwise stay unreported for up to `refresh_rounds`, its
    /// credit unknown to it; so until the owner says so, a report of *every* line goes
    /// out again after `FULL_REPORT_RESEND_ROUNDS` rounds, then after twice as many, up
    /// to `FULL_REPORT_RESEND_ROUNDS_MAX` (a batch of it may be lost: the bus is at most
    /// once, and a takeover follows an outage).
    pub(super) full_report_owed: bool,
    /// The round the last full report for `owner_epoch_seen` went out (0: none yet).
    pub(super) full_report_round: u64,
    /// Full reports sent to `owner_epoch_seen` so far (the resend interval doubles).
    pub(super) full_reports_sent: u32,
    /// This round's report of the shard is a full one.
    pub(super) full_report_now: bool,
}

impl ShardLink {
    /// A link to an owner not heard from yet, as of `mono_ms`: contact counts from the
    /// start, so a new node is not silent before its first round.
    pub(super) fn new(mono_ms: u64) -> Self {
        Self {
            owner_epoch_seen: OwnerEpoch(0),
            last_contact_mono_ms: mono_ms,
            last_contact_round: 0,
            full_report_owed: false,
            full_report_round: 0,
            full_reports_sent: 0,
            full_report_now: false,
        }
    }

    /// Whether this round's report of the shard is a full one (`full_report_owed`):
    /// the first round it is owed, then after each resend wait. Sets `full_report_now`.
    pub(super) fn full_report_turn(&mut self, round: u64) -> bool {
        let wait = (FULL_REPORT_RESEND_ROUNDS << self.full_reports_sent.saturating_sub(1))
            .min(FULL_REPORT_RESEND_ROUNDS_MAX);
        self.full_report_now = self.full_report_owed
            && (self.full_reports_sent == 0 || round >= self.full_report_round + wait);
        if self.full_report_now {
            self.full_report_round = round;
            self.full_reports_sent = self.full_reports_sent.saturating_add(1);
        }
        self.full_report_now
    }
}

/// Rounds before a full report goes out again to an owner that has not said it took one
/// (`ShardLink::full_report_owed`): the answer to one is back within a round on a live
/// bus, so a second is sent only past a lost batch. The wait doubles with each resend up
/// to the max (6.4 s at 25 ms rounds): an owner that never says so (one that does not
/// know the field, or a halted one, which sends nothing) costs a full report of the shard that
/// often, not every 200 ms.
const FULL_REPORT_RESEND_ROUNDS: u64 = 8;
const FULL_REPORT_RESEND_ROUNDS_MAX: u64 = 256;

impl NodeLimiter {
    /// F1-F5. Silent (no fast path, self-grants at boundaries) takes both the time and
    /// this node's own rounds: a node whose round task ran late (CPU starved) sent no
    /// report to be answered, so the owner's quiet is not a missed round. Counting wall
    /// time alone would cut its fast path exactly when its credit runs short (false 429s,
    /// BENCHMARKS.md). Degraded is wall time alone: 30 s of silence is degraded whatever
    /// the cause.
    pub fn link_health(&self, shard: ShardId, now: Now) -> LinkHealth {
        let link = &self.links[shard.0 as usize];
        let silent_ms = now.mono_ms.saturating_sub(link.last_contact_mono_ms);
        let rounds_unanswered = self.round.saturating_sub(link.last_contact_round);
        let missed = u64::from(self.config.missed_rounds_limit);
        if silent_ms >= self.config.degraded_after_ms {
            LinkHealth::Degraded
        } else if silent_ms >= missed * u64::from(self.config.round_ms)
            && rounds_unanswered >= missed
        {
            LinkHealth::Silent
        } else {
            LinkHealth::Healthy
        }
    }

    /// C8: shards whose owner has not yet said it took a full report from this node.
    pub fn full_reports_owed(&self) -> usize {
        self.links.iter().filter(|l| l.full_report_owed).count()
    }

    /// F7's view of one shard from this node: how long since its owner last answered (ms)
    /// and the owner epoch it answers as.
    pub fn shard_contact(&self, shard: ShardId, now: Now) -> (u64, OwnerEpoch) {
        let link = &self.links[shard.0 as usize];
        (
            now.mono_ms.saturating_sub(link.last_contact_mono_ms),
            link.owner_epoch_seen,
        )
    }

    /// F7: the node's fold age for a shard in its own rounds, i.e. how many of this node's
    /// rounds have begun since the shard's owner last answered. 0 or 1 is a healthy link
    /// (the current round's answer may still be on its way); each further round is a
    /// report the owner has not answered.
    pub fn shard_fold_age_rounds(&self, shard: ShardId) -> u64 {
        self.round
            .saturating_sub(self.links[shard.0 as usize].last_contact_round)
    }

    pub(super) fn publish_health(&self, now: Now) {
        let mut any_healthy = false;
        let mut any_degraded = false;
        for s in 0..self.config.shards {
            match self.link_health(ShardId(s), now) {
                LinkHealth::Healthy => any_healthy = true,
                LinkHealth::Degraded => any_degraded = true,
                LinkHealth::Silent => {}
            }
        }
        self.surface.set_fast_path(any_healthy);
        self.surface.set_degraded(any_degraded);
    }

    /// C2: grants and replies from an older owner epoch than one already seen for the
    /// shard are refused whole.
    pub(super) fn accept_owner_epoch(
        &mut self,
        now: Now,
        shard: ShardId,
        epoch: OwnerEpoch,
    ) -> bool {
        let link = &mut self.links[shard.0 as usize];
        if epoch < link.owner_epoch_seen {
            self.stats.grant_batches_stale_owner += 1;
            return false;
        }
        if epoch > link.owner_epoch_seen {
            link.full_report_owed = true;
            link.full_reports_sent = 0;
        }
        link.owner_epoch_seen = epoch;
        link.last_contact_mono_ms = now.mono_ms;
        link.last_contact_round = self.round;
        true
    }
}
