//! The fold owner: the only issuer of credit for the key-windows of one shard (C2),
//! as a sans-IO state machine, one per (shard, owner epoch).
//!
//! It is handed node report batches (`handle_report_batch`), fast-path requests
//! (`handle_fast_path_request`), ticks (`handle_tick`) and policy versions
//! (`handle_policy`), each with the time it is to act at: it reads no clock. It hands
//! back grant batches through `poll_grant`, one in answer to every report batch (the
//! node's proof of contact, F2) plus those the hot lane and the exhausted-line retry
//! send, and fast-path replies as the return value of the request, which the caller
//! answers on its reply subject.
//!
//! Its one safety property: for every key-window, the credit outstanding (issued by it
//! and earlier owners, net of what nodes returned) never exceeds the allowance less the
//! unreleased reserve. `ledger::check_ledger` is that check. It runs on the issuing side
//! of every grant (`size_grant`), wherever a report line brings in credit this owner did
//! not issue (`merge`: a takeover's totals), and over the ledgers a step touched or all
//! of them through `check_key_windows` and `check_invariants`, which the worker calls
//! after every tick and the tests and the simulator after every step. An owner that
//! finds it broken halts rather than guess: it issues nothing more, not even a report's
//! empty answer, so its nodes see the shard's owner as gone and fall back on what they
//! hold (F1, F4).
//!
//! By concern: `merge` folds report lines into the ledgers (C3); `sizing` sizes grants
//! (C4, C5); `fencing` keeps track of nodes, epochs and the takeover fence (C8);
//! `ledger` holds the books and the invariant check; `lanes` sends the grants that
//! answer no one report (the hot lane, C10, and the exhausted-line retry, A48);
//! `options` counts the standing options nodes take unasked, and recalls them.

mod fencing;
mod lanes;
mod ledger;
mod merge;
mod options;
mod sizing;

use std::collections::VecDeque;

use bus_schemas::hashing::DetMap;
use bus_schemas::{
    FastPathOutcome, FastPathReply, FastPathRequest, GrantBatch, KeyWindow, NodeEpoch, NodeId, Now,
    OwnerEpoch, ReportBatch, ShardId,
};

use crate::hot::{HotKeyConfig, HotKeys};
use crate::policy::OwnerPolicy;
use fencing::{FullReportSeen, NodeSeen};
use ledger::{Ledger, carries_credit};

/// O1: leasing sizes grants from demand; fixed hands out only the reserve (the nodes take
/// fixed 1/fleet shares themselves).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OwnerMode {
    Leasing,
    Fixed,
}

#[derive(Clone, Debug)]
pub struct OwnerConfig {
    pub shard: ShardId,
    pub shards: u32,
    pub fleet_size: u32,
    pub round_ms: u32,
    pub mode: OwnerMode,
    /// C4/A47: headroom on advertised demand, in thousandths (1250 = h 1.25).
    pub headroom_permille: u64,
    /// Rounds of demand a grant covers ahead, at most (see `lead_rounds_for`).
    pub lead_rounds: u64,
    /// A node holds at most 1/this of a window's rounds of its demand ahead: credit held
    /// ahead is what strands on one node when the pool runs out on another (A2), so a 1 s
    /// window (40 rounds) gets 2 rounds of lead and a 60 s window the full `lead_rounds`.
    pub lead_window_divisor: u64,
    /// Demand is a rate; arrivals are not. On top of `h x demand x lead`, a node holds
    /// this many standard deviations of Poisson arrivals over the lead, so an ordinary
    /// burst does not cost a fast path (A48). One, not two: each term is rounded up, so
    /// at the small demands of a 1 s window's two-round lead a second sigma is a whole
    /// unit more on every line, and credit held ahead strands (A2). Seeds 1-4, one
    /// against two: fewer fast paths (pinned 0.424% against 0.459%, shift 0.456% against
    /// 0.494%), a lower under mean in every steady row (uniform 4.159% against 4.199%,
    /// zipf 1.104% against 1.148%, hot-key 0.152% against 0.163%, bursty 0.048% against
    /// 0.058%, pinned 0.0675% against 0.0686%) and a lower 60 s p99 for zipf and bursty
    /// (2.267% against 2.400%, 0.533% against 0.600%), for 2-6% more grants
    /// (BENCHMARKS.md).
    pub burst_sigmas: u64,
    /// C5: reserve, thousandths of the allowance.
    pub reserve_permille: u64,
    /// A key-window that at least this many node epochs report demand for is spread
    /// thin. There, a rise a line reports is taken in as the node's own smoothing takes
    /// a round's sample, an eighth of the step, not at once: a node reports its last
    /// round's count when that is above its smoothed rate, so the one request that a
    /// node of a key spread over the fleet sees every second or so reads as a request
    /// every round, and the grant sized from it sits on that node while the pool runs
    /// dry for the next one (C4, A2). A real rise shows within a few rounds; until then
    /// the fast path covers it. Every rise, not only those of a line under a quarter of
    /// a request a round to at most one a round: at seed 1, uniform's 1 s under p99 /
    /// mean 5.0% / 0.38% against 12.5% / 2.87% smoothing only those, zipf's 5.0% / 0.34%
    /// against 10.0% / 0.72% (with `thin_endgame_permille`, 2.5% in both;
    /// BENCHMARKS.md).
    pub spread_lines: u64,
    /// In the endgame (`FoldOwner::size_grant`), a line of a key-window spread thin is
    /// granted this share (thousandths) of a round of `h x demand`, rounded down; a node
    /// reads a request's chance as a whole one, and one round of it, rounded down, was
    /// a unit on every node that had seen two requests in a round, which the window's
    /// end mostly finds unspent. Half, chosen at seed 1 with the smoothing of
    /// `spread_lines`: uniform's and zipf's 1 s under p99 2.5% / 2.5%, against 5.0% /
    /// 5.0% for a whole round and 2.5% / 5.0% for a third (BENCHMARKS.md).
    pub thin_endgame_permille: u64,
    /// While at least half of a thin key-window's pool is unissued (and it is not in its
    /// endgame), each of its lines is topped up to this many units, at most its 1/fleet
    /// share. A node sees such a key once a second or less, so without it nearly every
    /// request there is a fast path, and 0.73% of fast paths miss the 1 ms deadline in
    /// the sim: in zipf, the 2 or 3 429s that put 1.1% of 1 s key-windows at 2 units
    /// under come almost all from windows the oracle never limits (BENCHMARKS.md). A
    /// window heading for its limit passes half its pool early, and from there its idle
    /// credit goes back as any other's. Seeds 1-8, zipf's 1 s under p99 2.5% against
    /// 5.0% without it, mean 0.24% against 0.30%, for 24% more grants (3 units at seeds
    /// 1-4: the same p99s; the whole 1/fleet share, 74 of a 1,500 window, at seed 1: zipf
    /// mean 0.28%).
    pub thin_slack_floor: u64,
    /// C8: rounds a reappearing or self-granting node is withheld.
    pub withhold_rounds: u64,
    /// A node unseen this many rounds counts as absent.
    pub absent_after_rounds: u64,
    /// After a takeover, grant nothing until every fleet node has acknowledged this owner
    /// epoch in a full report (from then on it refuses the old owner's grants, so its
    /// reported totals include every old grant it will ever apply). `Some(ms)` gives up
    /// waiting for silent nodes after `ms` and withholds them instead: liveness bought
    /// with a residual risk bounded by what those nodes hold that this owner has not
    /// heard of (the old owner's grants in flight to them, and credit in lines they have
    /// not re-sent since), until their full reports come in.
    pub takeover_ack_timeout_ms: Option<u64>,
    /// Key-windows tracked at once.
    pub ledgers_cap: usize,
    /// At most this many key-windows have their exhausted lines sized again in one step
    /// (a report batch or a tick, see `FoldOwner::retry_exhausted_lines`), so a round of
    /// mass idle returns costs a bounded step; the rest wait in order for the next ones.
    pub retry_ledgers_per_tick: usize,
    /// C10: which keys get the hot lane.
    pub hot: HotKeyConfig,
    /// Standing options: the share, in thousandths, of each window's leasable allowance
    /// the fleet's nodes may take unasked (`credit_sizing::standing_total`); 0 turns
    /// them off. Every node must use the same value (`NodeConfig::standing_permille`).
    pub standing_permille: u64,
    /// What-if only (`foldgate sim --what-if central-endgame`), never a production
    /// setting: in the endgame (`FoldOwner::size_grant`) the pool's last credit stays
    /// with the owner and goes one unit per fast path, as a central limiter would give
    /// it. It measures what credit held ahead on the nodes costs (BENCHMARKS.md, "What
    /// the 60 s targets would take").
    pub what_if_central_endgame: bool,
}

impl OwnerConfig {
    pub fn reference(shard: ShardId) -> Self {
        Self {
            shard,
            shards: 20,
            fleet_size: 20,
            round_ms: 25,
            mode: OwnerMode::Leasing,
            headroom_permille: 1_250,
            lead_rounds: 8,
            lead_window_divisor: 20,
            burst_sigmas: 1,
            reserve_permille: 20,
            spread_lines: 6,
            thin_endgame_permille: 500,
            thin_slack_floor: 2,
            withhold_rounds: 1,
            absent_after_rounds: 2,
            takeover_ack_timeout_ms: None,
            ledgers_cap: 1_000_000,
            retry_ledgers_per_tick: 1_024,
            hot: HotKeyConfig::reference(),
            standing_permille: 500,
            what_if_central_endgame: false,
        }
    }

    pub fn lead_rounds_for(&self, window_length_ms: u32) -> u64 {
        let window_rounds = u64::from(window_length_ms) / u64::from(self.round_ms.max(1));
        (window_rounds / self.lead_window_divisor.max(1)).clamp(1, self.lead_rounds.max(1))
    }

    fn reserve(&self, allowance: u64) -> u64 {
        allowance * self.reserve_permille / 1_000
    }

    /// A node's 1/fleet share of what may be leased (the allowance less the reserve),
    /// rounded up.
    fn lease_share(&self, allowance: u64) -> u64 {
        allowance
            .saturating_sub(self.reserve(allowance))
            .div_ceil(u64::from(self.fleet_size.max(1)))
    }

    /// A-fixed: the share each node takes unasked in fixed mode, as the node computes it.
    fn fixed_share(&self, allowance: u64) -> u64 {
        credit_sizing::fixed_share(allowance, self.reserve_permille, self.fleet_size)
    }
}

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum OwnerInvariantError {
    #[error(
        "{kw:?}: issued credit {issued} net of returns exceeds allowance {allowance} less unreleased reserve {reserve}"
    )]
    OverIssued {
        kw: KeyWindow,
        issued: u64,
        allowance: u64,
        reserve: u64,
    },
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OwnerStats {
    pub batches: u64,
    pub entries: u64,
    pub entries_stale: u64,
    /// Batches and fast paths for another shard, or from a node id outside the fleet
    /// (`0..fleet_size`, as every node's configuration requires).
    pub batches_misrouted: u64,
    pub grants: u64,
    pub credit_granted: u64,
    pub fast_path_requests: u64,
    pub fast_path_granted: u64,
    pub reserve_released: u64,
    pub withheld: u64,
    pub ledgers_refused: u64,
    pub reaped: u64,
    /// C10: report entries of hot keys folded at the next tick instead of at once.
    pub hot_deferred: u64,
    /// Fold age (report sent to grant decided) in whole rounds, 0..=7 (7 = 7 or more),
    /// for keys outside the hot set and for hot keys: A57's "p99 fold age of the other
    /// keys under 2 rounds" is read off `fold_age_rounds_cold`.
    pub fold_age_rounds_cold: [u64; FOLD_AGE_BUCKETS],
    pub fold_age_rounds_hot: [u64; FOLD_AGE_BUCKETS],
    /// Grants of nothing sent to recall unsettled standing options (`options`).
    pub recalls: u64,
}

pub const FOLD_AGE_BUCKETS: usize = 8;

/// One shard's fold owner for one owner epoch (see the module doc).
pub struct FoldOwner {
    config: OwnerConfig,
    epoch: OwnerEpoch,
    started_mono_ms: u64,
    takeover: bool,
    /// Nodes that have acknowledged this owner epoch (the takeover fence), each with the
    /// node epoch whose full report carried it (`take_full_report_chunk`).
    acked: std::collections::BTreeMap<NodeId, NodeEpoch>,
    /// Per node, the full report being gathered; at most one per fleet node.
    full_reports: DetMap<NodeId, FullReportSeen>,
    ledgers: DetMap<KeyWindow, Ledger>,
    /// Every ledger by the time it is reaped (C7), soonest first: one entry per ledger
    /// (a ledger is made once and only reaping removes it), so at most `ledgers_cap`.
    /// A tick pops what is due instead of walking every ledger, which would cost a cache
    /// miss per ledger per round (BENCHMARKS.md, simulator).
    reap_queue: std::collections::BinaryHeap<std::cmp::Reverse<(u64, KeyWindow)>>,
    nodes: DetMap<NodeId, NodeSeen>,
    outbox: VecDeque<GrantBatch>,
    halted: Option<OwnerInvariantError>,
    stats: OwnerStats,
    hot: HotKeys,
    /// Hot-lane work: (node, node epoch, key-window) -> when the newest report was sent.
    hot_pending: DetMap<(NodeId, NodeEpoch, KeyWindow), u64>,
    /// Key-windows with a starved line (`Line::starved`) whose pool grew since, in the order the
    /// returns arrived; at most one entry per ledger (`Ledger::retry_queued`), so bounded
    /// by `ledgers_cap`.
    retry_queue: VecDeque<KeyWindow>,
    /// P1: caps a new ledger's allowance; none until the worker has read one.
    policy: Option<std::sync::Arc<OwnerPolicy>>,
    /// Key-windows to recall options of at the end of the step (`options`), at most
    /// `options::RECALL_QUEUE_MAX`.
    recall_queue: Vec<(KeyWindow, u32)>,
}

impl FoldOwner {
    /// `takeover`: another owner held this shard before (its grants may be in flight).
    pub fn new(config: OwnerConfig, epoch: OwnerEpoch, now: Now, takeover: bool) -> Self {
        assert!(epoch > OwnerEpoch(0) && config.fleet_size > 0 && config.shard.0 < config.shards);
        let hot = HotKeys::new(config.hot);
        Self {
            config,
            epoch,
            started_mono_ms: now.mono_ms,
            takeover,
            acked: Default::default(),
            full_reports: DetMap::default(),
            ledgers: DetMap::default(),
            reap_queue: Default::default(),
            nodes: DetMap::default(),
            outbox: VecDeque::new(),
            halted: None,
            stats: OwnerStats::default(),
            hot,
            hot_pending: DetMap::default(),
            retry_queue: VecDeque::new(),
            policy: None,
            recall_queue: Vec::new(),
        }
    }

    /// P1: the policy in force from now on, for ledgers created from here (see
    /// `policy`). A version no newer than the one held is refused.
    pub fn handle_policy(&mut self, policy: std::sync::Arc<OwnerPolicy>) -> bool {
        if self
            .policy
            .as_ref()
            .is_some_and(|p| p.version >= policy.version)
        {
            return false;
        }
        self.policy = Some(policy);
        true
    }

    pub fn policy_version(&self) -> Option<u64> {
        self.policy.as_ref().map(|p| p.version)
    }

    pub fn epoch(&self) -> OwnerEpoch {
        self.epoch
    }

    pub fn shard(&self) -> ShardId {
        self.config.shard
    }

    pub fn stats(&self) -> &OwnerStats {
        &self.stats
    }

    pub fn halted(&self) -> Option<&OwnerInvariantError> {
        self.halted.as_ref()
    }

    fn round_ms(&self) -> u64 {
        u64::from(self.config.round_ms)
    }

    /// C1/B1: one node's report batch for this shard. Every batch gets a grant batch back
    /// (possibly empty), which is also the node's proof of contact (F2), until the owner
    /// halts (`poll_grant`).
    pub fn handle_report_batch(&mut self, now: Now, batch: &ReportBatch) {
        // A node id outside the fleet would take a place in the node and fence maps,
        // which are bounded by the fleet's size only through this.
        if batch.shard != self.config.shard || batch.node.0 >= self.config.fleet_size {
            self.stats.batches_misrouted += 1;
            return;
        }
        self.stats.batches += 1;
        self.stats.entries += batch.entries.len() as u64;
        self.see_node(batch.node, batch.node_epoch, batch.seq, now);
        // A line with credit this owner refused to take in (a full ledger map) is credit
        // it does not know of: the report it came in is no acknowledgement then.
        let mut refused_credit = false;
        for entry in &batch.entries {
            self.hot.record(entry.key_window.key, 1);
            let taken = self.merge(batch.node, batch.node_epoch, batch.seq, entry, now);
            refused_credit |= !taken && carries_credit(entry);
        }
        if !refused_credit {
            self.take_full_report_chunk(batch);
        }
        let mut grants = Vec::new();
        if self.withheld(batch.node, now) {
            self.stats.withheld += 1;
        } else if self.config.mode == OwnerMode::Leasing {
            let age = self.age_bucket(now, batch.sent_at_ms);
            for entry in &batch.entries {
                let kw = entry.key_window;
                if self.hot.is_hot(&kw.key) && self.hot_pending.len() < self.config.ledgers_cap {
                    // C10: a hot key's arbitration waits for the tick, once per node per
                    // round, so its report storm cannot queue the other keys' grants.
                    self.hot_pending
                        .insert((batch.node, batch.node_epoch, kw), batch.sent_at_ms);
                    self.stats.hot_deferred += 1;
                    continue;
                }
                self.stats.fold_age_rounds_cold[age] += 1;
                if let Some(g) = self
                    .size_grant(now, batch.node, batch.node_epoch, kw, false)
                    .or_else(|| self.pool_notice(now, batch.node, batch.node_epoch, kw, true))
                {
                    grants.push(g);
                }
            }
        }
        self.outbox.push_back(GrantBatch {
            owner_epoch: self.epoch,
            shard: self.config.shard,
            node: batch.node,
            entries: grants,
            full_report_taken: self.full_report_taken(batch.node),
        });
        // Credit this batch handed back reopens the windows of lines told exhausted now,
        // not a round later (`retry_exhausted_lines`).
        self.retry_exhausted_lines(now);
        self.send_recalls(now);
    }

    /// D5: answered at once, on the request's reply subject.
    pub fn handle_fast_path_request(&mut self, now: Now, req: &FastPathRequest) -> FastPathReply {
        self.stats.fast_path_requests += 1;
        self.hot.record(req.entry.key_window.key, 1);
        let (owner_epoch, shard, request_id) = (self.epoch, self.config.shard, req.request_id);
        let reply = |outcome| FastPathReply {
            owner_epoch,
            shard,
            request_id,
            outcome,
        };
        if req.shard != self.config.shard
            || req.entry.key_window.shard(self.config.shards) != self.config.shard
            || req.node.0 >= self.config.fleet_size
        {
            self.stats.batches_misrouted += 1;
            return reply(FastPathOutcome::Withheld);
        }
        self.merge_fast_path_line(req, now);
        if self.withheld(req.node, now) {
            self.stats.withheld += 1;
            return reply(FastPathOutcome::Withheld);
        }
        let answer =
            match self.size_grant(now, req.node, req.node_epoch, req.entry.key_window, true) {
                Some(g) => {
                    self.stats.fast_path_granted += 1;
                    reply(FastPathOutcome::Granted(g))
                }
                None => {
                    self.want_recall(now, req.entry.key_window, false);
                    let exhausted = self.pool_exhausted(&req.entry.key_window);
                    reply(FastPathOutcome::Refused { exhausted })
                }
            };
        self.send_recalls(now);
        answer
    }

    /// C7: a key-window's ledger (its node epochs with it) goes two rounds after the window
    /// closes; orphaned credit of dead epochs thus returns to the pool at rollover, never
    /// mid-window.
    pub fn handle_tick(&mut self, now: Now) {
        self.fold_hot_lane(now);
        self.retry_exhausted_lines(now);
        self.send_recalls(now);
        self.hot.end_round();
        let keep_ms = 2 * self.round_ms();
        while let Some(std::cmp::Reverse((end_ms, kw))) = self.reap_queue.peek().copied()
            && end_ms + keep_ms <= now.wall_ms
        {
            self.reap_queue.pop();
            let reaped = self.ledgers.remove(&kw);
            assert!(reaped.is_some(), "a queued ledger is reaped once");
            self.stats.reaped += 1;
        }
        debug_assert_eq!(self.reap_queue.len(), self.ledgers.len());
    }

    fn age_bucket(&self, now: Now, sent_at_ms: u64) -> usize {
        let rounds = now.wall_ms.saturating_sub(sent_at_ms) / self.round_ms().max(1);
        (rounds as usize).min(FOLD_AGE_BUCKETS - 1)
    }

    /// The keys in the hot lane now (C10), heaviest first.
    pub fn hot_keys(&self) -> &[bus_schemas::KeyId] {
        self.hot.hot()
    }

    /// The next grant batch to send. A halted owner sends nothing, not even the empty
    /// batch that answers a report: batches queued before the breach was found are
    /// dropped, and without a proof of contact its nodes see the shard's owner as gone
    /// (F1), enforce with what they hold, self-grant at boundaries (F4) and degrade
    /// visibly (F5). Answering on, it would keep them "healthy" and denying every key of
    /// the shard until the worker restarts.
    pub fn poll_grant(&mut self) -> Option<GrantBatch> {
        if self.halted.is_some() {
            self.outbox.clear();
            return None;
        }
        self.outbox.pop_front()
    }

    /// What this owner has issued to a node epoch for a key-window (tests).
    pub fn issued_to(&self, kw: &KeyWindow, node: NodeId, epoch: NodeEpoch) -> Option<u64> {
        self.ledgers
            .get(kw)?
            .lines
            .get(&(node, epoch))
            .map(|l| l.granted)
    }

    /// The merged spend of a key-window across every node epoch (C3).
    pub fn merged_spend(&self, kw: &KeyWindow) -> Option<u64> {
        self.ledgers
            .get(kw)
            .map(|l| l.lines.values().map(|x| x.spend).sum())
    }
}

/// Window end in wall time; the owner needs it only to stop granting and to reap.
fn bus_window_end(kw: KeyWindow) -> u64 {
    let len = u64::from(kw.window.length_ms);
    kw.window.number * len + kw.key.phase_offset_ms(kw.window.length_ms) + len
}
