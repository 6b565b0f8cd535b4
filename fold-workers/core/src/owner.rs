use std::collections::VecDeque;

use bus_schemas::{
    FastPathOutcome, FastPathReply, FastPathRequest, GrantBatch, GrantEntry, KeyWindow, NodeEpoch,
    NodeId, Now, OwnerEpoch, ReportBatch, ReportEntry, ShardId,
};

use bus_schemas::hashing::DetMap;

use crate::hot::{HotKeyConfig, HotKeys};
use crate::policy::OwnerPolicy;
use credit_sizing::{held_target, round_of_pace};

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
    /// at the small demands of a 1 s window's two-round lead the second sigma was a
    /// whole unit more on every line, and credit held ahead strands (A2). Seeds 1-4,
    /// two -> one: fast paths fell too (pinned 0.459% -> 0.424%, shift 0.494% ->
    /// 0.456%), every steady row's under mean fell (uniform 4.199% -> 4.159%, zipf 1.148%
    /// -> 1.104%, hot-key 0.163% -> 0.152%, bursty 0.058% -> 0.048%, pinned 0.0686% ->
    /// 0.0675%) and zipf's and bursty's 60 s p99 too (2.400% -> 2.267%, 0.600% ->
    /// 0.533%), for 2-6% more grants (BENCHMARKS.md).
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
    /// a request a round to at most one a round (the rule before): uniform's 1 s under
    /// p99 / mean at seed 1 12.5% / 2.87% -> 5.0% / 0.38%, zipf's 10.0% / 0.72% ->
    /// 5.0% / 0.34% (with `thin_endgame_permille`, 2.5% in both; BENCHMARKS.md).
    pub spread_lines: u64,
    /// In the endgame (`FoldOwner::size_grant`), a line of a key-window spread thin is
    /// granted this share (thousandths) of a round of `h x demand`, rounded down; a node
    /// reads a request's chance as a whole one, and one round of it, rounded down, was
    /// a unit on every node that had seen two requests in a round, which the window's
    /// end mostly found unspent. Half, chosen at seed 1 with the smoothing of
    /// `spread_lines`: uniform's and zipf's 1 s under p99 2.5% / 2.5%, against 5.0% /
    /// 5.0% for a whole round and 2.5% / 5.0% for a third (BENCHMARKS.md).
    pub thin_endgame_permille: u64,
    /// While at least half of a thin key-window's pool is unissued (and it is not in its
    /// endgame), each of its lines is topped up to this many units, at most its 1/fleet
    /// share. A node sees such a key once a second or less, so without it nearly every
    /// request there was a fast path, and 0.73% of fast paths miss the 1 ms deadline in
    /// the sim: in zipf, the 2 or 3 429s that put 1.1% of 1 s key-windows at 2 units
    /// under came almost all from windows the oracle never limited (BENCHMARKS.md). A
    /// window heading for its limit passes half its pool early, and from there idle
    /// credit goes back as before. Seeds 1-8, zipf's 1 s under p99 5.0% -> 2.5%, mean
    /// 0.30% -> 0.24%, for 24% more grants (3 units at seeds 1-4: the same p99s; the
    /// whole 1/fleet share, 74 of a 1,500 window, at seed 1: zipf mean 0.28%).
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

    fn fixed_share(&self, allowance: u64) -> u64 {
        allowance * (1_000 - self.reserve_permille) / 1_000 / u64::from(self.fleet_size)
    }
}

/// A line's demand after a report of `reported`, from `held` (see
/// `OwnerConfig::spread_lines`); `thin`: its key-window is spread thin.
fn line_demand(thin: bool, held: u64, reported: u64) -> u64 {
    if thin && reported > held {
        smoothed_rise(held, reported)
    } else {
        reported
    }
}

/// A rise from `held` to `reported` taken in as the node's own smoothing takes a round's
/// sample: an eighth of the step, rounded up (never a fall).
fn smoothed_rise(held: u64, reported: u64) -> u64 {
    held + reported.saturating_sub(held).div_ceil(8)
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
}

pub const FOLD_AGE_BUCKETS: usize = 8;

/// What the owner knows of one node epoch in one key-window.
#[derive(Clone, Copy, Debug, Default)]
struct Line {
    seq: u64,
    spend: u64,
    demand: u64,
    applied: u64,
    returned: u64,
    self_granted: u64,
    /// Credit total this owner (or, after a takeover, the reports) says was issued.
    granted: u64,
    grant_seq: u64,
    /// This owner told the node the window is exhausted, so it stops asking (A48).
    told_exhausted: bool,
    /// Told exhausted, and no sizing since found the line holding all it wants: credit
    /// that comes back to the pool is offered to it at the next tick
    /// (`FoldOwner::retry_exhausted_lines`). A node whose demand has since fallen away
    /// is left out, so returned credit is not parked where nothing asks for it (offering
    /// it to every line told exhausted: zipf 1 s under mean 2.13% -> 2.14% at seed 1),
    /// except in a key-window spread thin, where it is only told the pool reopened.
    starved: bool,
}

impl Line {
    /// Owner-issued credit as the node could hold it: a previous owner's grant may have
    /// been applied without this owner issuing it, so take the larger.
    fn issued(&self) -> u64 {
        self.granted.max(self.applied)
    }

    fn outstanding(&self) -> u64 {
        (self.issued() + self.self_granted).saturating_sub(self.spend + self.returned)
    }

    /// Every grant entry this owner sends for a line (a grant, an exhaustion notice, an
    /// "open again" notice): `grant` more credit, and whether the pool is exhausted for
    /// it, which is also whether the line is starved (`Line::starved`).
    fn issue(
        &mut self,
        kw: KeyWindow,
        epoch: NodeEpoch,
        grant: u64,
        exhausted: bool,
    ) -> GrantEntry {
        self.granted = self.issued() + grant;
        self.grant_seq += 1;
        self.told_exhausted = exhausted;
        self.starved = exhausted;
        GrantEntry {
            key_window: kw,
            node_epoch: epoch,
            grant_seq: self.grant_seq,
            credit_total: self.granted,
            exhausted,
        }
    }
}

/// A ledger's lines, one per node epoch that reported the key-window. A key-window is
/// held by one or two nodes in most traffic and by every node at most (plus restarted
/// epochs), so a short vector searched in order beats a hash map per ledger: no hashing,
/// the first two lines inline in the ledger (no pointer to chase per report line), and
/// the full check walks it in sequence. Only sums are ever taken over it, so its order is
/// never observable.
#[derive(Clone, Debug, Default)]
struct Lines(smallvec::SmallVec<[((NodeId, NodeEpoch), Line); 2]>);

impl Lines {
    fn get(&self, id: &(NodeId, NodeEpoch)) -> Option<&Line> {
        self.0.iter().find(|(k, _)| k == id).map(|(_, l)| l)
    }

    fn get_mut(&mut self, id: &(NodeId, NodeEpoch)) -> Option<&mut Line> {
        self.0.iter_mut().find(|(k, _)| k == id).map(|(_, l)| l)
    }

    /// The line for `id`, added empty if absent; true when it was added.
    fn get_or_insert(&mut self, id: (NodeId, NodeEpoch)) -> (&mut Line, bool) {
        match self.0.iter().position(|(k, _)| *k == id) {
            Some(i) => (&mut self.0[i].1, false),
            None => {
                self.0.push((id, Line::default()));
                (&mut self.0.last_mut().expect("just pushed").1, true)
            }
        }
    }

    fn values(&self) -> impl Iterator<Item = &Line> {
        self.0.iter().map(|(_, l)| l)
    }

    fn len(&self) -> usize {
        self.0.len()
    }
}

#[derive(Clone, Debug)]
struct Ledger {
    /// The smallest allowance any node reported: a policy switch mid-window only tightens.
    allowance: u64,
    reserve_released: bool,
    lines: Lines,
    /// Fixed mode: nodes that took their share this window.
    fixed_nodes_seen: u32,
    /// On `FoldOwner::retry_queue`: a line is starved and credit came back since.
    retry_queued: bool,
}

impl Ledger {
    fn reserve_held(&self, config: &OwnerConfig) -> u64 {
        if self.reserve_released {
            0
        } else {
            config.reserve(self.allowance)
        }
    }

    /// About the least allowance that still holds what is issued net of returns plus,
    /// while it is held, the reserve (a share of the allowance itself). `c = ceil(issued
    /// x 1000 / (1000 - reserve_permille))` holds it (`c - reserve(c) >= issued`), and so
    /// does `issued + reserve(c)`, which is no larger and no rounding unit above it.
    fn least_allowance(&self, config: &OwnerConfig) -> u64 {
        let issued = self.issued_net();
        if self.reserve_released {
            return issued;
        }
        let kept_permille = 1_000 - config.reserve_permille.min(999);
        let c = (u128::from(issued) * 1_000).div_ceil(u128::from(kept_permille)) as u64;
        let least = issued + config.reserve(c);
        debug_assert!(issued + config.reserve(least) <= least);
        least
    }

    fn issued_net(&self) -> u64 {
        let (issued, returned) = self.lines.values().fold((0u64, 0u64), |(i, r), l| {
            (
                i + l.issued(),
                r + l.returned.min(l.issued() + l.self_granted),
            )
        });
        issued.saturating_sub(returned)
    }

    /// Everything that may still be or has been spent: owner credit, self-grants, and in
    /// fixed mode the shares of nodes not yet heard from.
    fn committed(&self, config: &OwnerConfig) -> u64 {
        let lines: u64 = self
            .lines
            .values()
            .map(|l| (l.issued() + l.self_granted).saturating_sub(l.returned))
            .sum();
        let unseen_shares = match config.mode {
            OwnerMode::Fixed => {
                u64::from(config.fleet_size.saturating_sub(self.fixed_nodes_seen))
                    * config.fixed_share(self.allowance)
            }
            OwnerMode::Leasing => 0,
        };
        lines + unseen_shares
    }

    /// See `OwnerConfig::spread_lines`.
    fn spread_thin(&self, config: &OwnerConfig) -> bool {
        config.mode == OwnerMode::Leasing
            && self.lines.values().filter(|l| l.demand > 0).count() as u64 >= config.spread_lines
    }

    fn available(&self, config: &OwnerConfig) -> u64 {
        self.allowance
            .saturating_sub(self.reserve_held(config) + self.committed(config))
    }
}

/// A tick's grant entries grouped by node (the hot lane and the exhausted-line retry):
/// at most one group per fleet node, searched in order.
#[derive(Default)]
struct PerNode(Vec<(NodeId, Vec<GrantEntry>)>);

impl PerNode {
    fn add(&mut self, node: NodeId, entry: GrantEntry) {
        match self.0.iter_mut().find(|(n, _)| *n == node) {
            Some((_, entries)) => entries.push(entry),
            None => self.0.push((node, vec![entry])),
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct NodeSeen {
    last_seen_mono_ms: u64,
    withheld_until_mono_ms: u64,
    /// The node epoch and round (`ReportBatch::seq`) of its last report here.
    last_epoch: NodeEpoch,
    last_round: u64,
}

/// Whether a line holds or has spent credit, which the owner must count wherever it came
/// from (a line the node's own book keeps has spend <= applied + self-granted).
fn carries_credit(entry: &ReportEntry) -> bool {
    entry.applied_grant > 0 || entry.self_granted > 0 || entry.cumulative_spend > 0
}

/// A full report of one node epoch being gathered (`FoldOwner::take_full_report_chunk`).
#[derive(Clone, Copy, Debug)]
struct FullReportSeen {
    epoch: NodeEpoch,
    seq: u64,
    count: u32,
    chunks_mask: u64,
}

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
    /// A tick pops what is due instead of walking every ledger, which cost a cache miss
    /// per ledger per round (BENCHMARKS.md, simulator).
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
    fn take_full_report_chunk(&mut self, batch: &ReportBatch) {
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
    fn full_report_taken(&self, node: NodeId) -> Option<NodeEpoch> {
        if self.takeover {
            self.acked.get(&node).copied()
        } else {
            self.nodes.get(&node).map(|n| n.last_epoch)
        }
    }

    fn withheld(&self, node: NodeId, now: Now) -> bool {
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
    /// reported in that round's batch, which `merge` checks). Withholding it anyway cost
    /// false 429s under CPU load on a healthy node (BENCHMARKS.md, issue 5).
    fn see_node(&mut self, node: NodeId, epoch: NodeEpoch, round: u64, now: Now) {
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

    /// Merge one report line (C3): max-sequence-wins within a node epoch, lines of
    /// different epochs are kept apart and summed. Returns false if the line was refused
    /// (no room for its ledger, a window too far ahead, or past the lines cap).
    fn merge(
        &mut self,
        node: NodeId,
        epoch: NodeEpoch,
        seq: u64,
        entry: &ReportEntry,
        now: Now,
    ) -> bool {
        let kw = entry.key_window;
        let withhold_ms = self.config.withhold_rounds * self.round_ms();
        let ledgers_len = self.ledgers.len();
        let ledger = match self.ledgers.entry(kw) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                // A node reports its current window and, near its end, the next: a window
                // further ahead than that (and clock skew) is a bad line, whose ledger
                // would hold a place in the cap until that far-off end.
                let length_ms = u64::from(kw.window.length_ms);
                let starts_ms = bus_window_end(kw) - length_ms;
                let too_far = starts_ms > now.wall_ms + 2 * length_ms + 1_000;
                if ledgers_len >= self.config.ledgers_cap || too_far {
                    self.stats.ledgers_refused += 1;
                    return false;
                }
                let cap = self.policy.as_ref().and_then(|p| p.limit(&kw));
                self.reap_queue
                    .push(std::cmp::Reverse((bus_window_end(kw), kw)));
                v.insert(Ledger {
                    allowance: cap.map_or(entry.allowance, |c| c.min(entry.allowance)),
                    reserve_released: false,
                    lines: Lines::default(),
                    fixed_nodes_seen: 0,
                    retry_queued: false,
                })
            }
        };
        // P1: a node on a tightened policy reports a lower allowance. A live ledger takes
        // it only as far as the credit already out allows (issued net of returns, and
        // the reserve it still holds): lower, its invariant would read broken and halt
        // the owner for the whole shard. The rest of the window is bounded by it; the
        // nodes themselves switch at their next window.
        if entry.allowance < ledger.allowance {
            let floor = ledger.least_allowance(&self.config);
            ledger.allowance = ledger.allowance.min(entry.allowance.max(floor));
        }
        let thin = ledger.spread_thin(&self.config);
        if ledger.lines.len() >= LINES_PER_NODE * self.config.fleet_size as usize
            && ledger.lines.get(&(node, epoch)).is_none()
            && !carries_credit(entry)
        {
            // A restart storm's new epochs: each is a line of every key-window it reports.
            // Past the cap a new line is taken in only if it carries credit, which must be
            // counted whatever it costs (the allowance bounds how many can).
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
        let new_self_grant =
            entry.self_granted > line.self_granted && self.config.mode == OwnerMode::Leasing;
        line.seq = seq;
        line.spend = line.spend.max(entry.cumulative_spend);
        line.demand = line_demand(thin, line.demand, entry.demand);
        line.applied = line.applied.max(entry.applied_grant);
        let returned_more = entry.returned > line.returned;
        line.returned = line.returned.max(entry.returned);
        line.self_granted = line.self_granted.max(entry.self_granted);
        let took_over = line.granted < line.applied;
        if took_over {
            // A previous owner's credit (takeover): continue its totals.
            line.granted = line.applied;
        }
        if ledger.issued_net() + config_reserve(&self.config, ledger.allowance) > ledger.allowance {
            // Only a previous owner releasing the reserve explains this much credit out.
            ledger.reserve_released = true;
        }
        // Credit this owner did not issue is the one thing a line brings in that can
        // break the ledger (a lower allowance stops at what is issued, and a return only
        // lowers it): checked here, before anything is sized from it, a breach halts the
        // owner with nothing of this step sent (`poll_grant`).
        let breach = if took_over {
            check_ledger(&self.config, &kw, ledger).err()
        } else {
            None
        };
        // A return is the only thing that raises a ledger's available credit (grants,
        // self-grants and a lower allowance only lower it), so it is what can reopen a
        // window its lines were told is exhausted.
        if returned_more
            && !ledger.retry_queued
            && self.config.mode == OwnerMode::Leasing
            && ledger.lines.values().any(|l| l.starved)
        {
            ledger.retry_queued = true;
            self.retry_queue.push_back(kw);
        }
        if new_self_grant && let Some(n) = self.nodes.get_mut(&node) {
            // F4: the node gave itself credit while we were away.
            n.withheld_until_mono_ms = n.withheld_until_mono_ms.max(now.mono_ms + withhold_ms);
        }
        if let Some(e) = breach {
            self.halted.get_or_insert(e);
        }
        true
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
    }

    /// C4: top a node up to `h x demand x lead` of outstanding credit, from what is left
    /// of the allowance; when the wants of all nodes exceed it, split it in proportion.
    fn size_grant(
        &mut self,
        now: Now,
        node: NodeId,
        epoch: NodeEpoch,
        kw: KeyWindow,
        fast: bool,
    ) -> Option<GrantEntry> {
        let window_end = bus_window_end(kw);
        if now.wall_ms >= window_end {
            return None;
        }
        let config = &self.config;
        let lead_rounds = config.lead_rounds_for(kw.window.length_ms);
        let ledger = self.ledgers.get_mut(&kw)?;
        // Endgame: once what is left of the pool would not cover every node's full want
        // twice over, grant one round of demand at a time. Credit held ahead is what
        // strands on one node while another runs dry at the end of the pool (A2).
        let available_before = ledger.available(config);
        let full_want = |l: &Line| -> u64 {
            let target = held_target(
                l.demand * lead_rounds,
                config.headroom_permille,
                config.burst_sigmas,
            );
            target.saturating_sub(l.outstanding())
        };
        // In the endgame, a key-window spread thin grants only whole requests of part
        // of a round's demand (`thin_endgame_permille`), rounded down: a node that
        // expects less than that holds nothing and asks the fast path when one comes,
        // so the pool's last credit stays with the owner for whichever node that is,
        // instead of a unit on each of twenty nodes of which most see no further
        // request before the window turns over (A2). Rounded up as elsewhere (a whole
        // round), seeds 1-4 under 1 s mean / p99 (60 s p99): zipf 2.08% / 20.0%
        // (3.80%), uniform 9.07% / 22.5%; rounded down, zipf 1.59% / 15.0% (2.67%),
        // uniform 6.86% / 20.0%. Pinned and every other row within 0.01 point. The
        // price is fast paths: zipf 17% -> 26% of requests, uniform 19% -> 42%
        // (BENCHMARKS.md).
        let thin = ledger.spread_thin(config);
        let lean_want = |l: &Line| -> u64 {
            let lean = l.demand * config.headroom_permille;
            let lean = if thin {
                lean * config.thin_endgame_permille / 1_000_000_000
            } else {
                lean.div_ceil(1_000_000)
            };
            lean.saturating_sub(l.outstanding())
        };
        let full_wants: u64 = ledger.lines.values().map(full_want).sum();
        let endgame = full_wants * 2 > available_before;
        let want_of = |l: &Line| if endgame { lean_want(l) } else { full_want(l) };
        let line = *ledger.lines.get(&(node, epoch))?;
        // Half the pool unissued and not in the endgame: the window is far from its
        // limit, and a unit held ahead costs no other node a request.
        let slack = !endgame && available_before.saturating_mul(2) >= ledger.allowance;
        let pool = PoolLeft {
            allowance: ledger.allowance,
            available: available_before,
            slack,
        };
        let central = endgame && config.what_if_central_endgame;
        if central && !fast {
            return None;
        }
        let want = if central {
            1
        } else {
            want_of(&line).max(least_want(config, kw, &line, pool, thin, fast))
        };
        if want == 0 {
            // Spread thin, wanting nothing is how the endgame leaves every node (above),
            // not a sign its demand fell away: it stays starved, to be told when credit
            // comes back (`retry_exhausted_lines`).
            if !thin && let Some(l) = ledger.lines.get_mut(&(node, epoch)) {
                l.starved = false;
            }
            return None;
        }
        let mut available = available_before;
        if fast
            && available < want
            && !ledger.reserve_released
            && config.reserve(ledger.allowance) > 0
        {
            // C5: the reserve goes once per key-window, only through the fast path.
            ledger.reserve_released = true;
            self.stats.reserve_released += 1;
            available = ledger.available(config);
        }
        // The lines are as they were when `full_wants` was summed (only `want` moved).
        let total_want = if endgame {
            ledger.lines.values().map(lean_want).sum::<u64>()
        } else {
            full_wants
        }
        .max(want);
        let grant = if total_want > available {
            ((u128::from(available) * u128::from(want) / u128::from(total_want)) as u64)
                .max(u64::from(available > 0))
        } else {
            want
        }
        .min(available);
        if grant == 0 {
            return None;
        }
        let reserve_left = !ledger.reserve_released && config.reserve(ledger.allowance) > 0;
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
    fn pool_notice(
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
        let reserve_left = !ledger.reserve_released && config.reserve(ledger.allowance) > 0;
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
        // No `see_node` here: a fast-path request carries no round, and the line it
        // carries is merged below, so a self-grant on this key-window is seen (F4) before
        // any credit for it is sized.
        // The request's line is a consistent snapshot; merge it as the newest we have, at
        // the same sequence as the last report so the next report still supersedes it.
        let seq = self
            .ledgers
            .get(&req.entry.key_window)
            .and_then(|l| l.lines.get(&(req.node, req.node_epoch)))
            .map(|l| l.seq);
        self.merge(req.node, req.node_epoch, seq.unwrap_or(0), &req.entry, now);
        if let Some(ledger) = self.ledgers.get_mut(&req.entry.key_window) {
            let thin = ledger.spread_thin(&self.config);
            if let Some(line) = ledger.lines.get_mut(&(req.node, req.node_epoch)) {
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
        if self.withheld(req.node, now) {
            self.stats.withheld += 1;
            return reply(FastPathOutcome::Withheld);
        }
        match self.size_grant(now, req.node, req.node_epoch, req.entry.key_window, true) {
            Some(g) => {
                self.stats.fast_path_granted += 1;
                reply(FastPathOutcome::Granted(g))
            }
            None => {
                let exhausted = self.ledgers.get(&req.entry.key_window).is_some_and(|l| {
                    l.available(&self.config) == 0
                        && (l.reserve_released || self.config.reserve(l.allowance) == 0)
                });
                reply(FastPathOutcome::Refused { exhausted })
            }
        }
    }

    /// C7: a key-window's ledger (its node epochs with it) goes two rounds after the window
    /// closes; orphaned credit of dead epochs thus returns to the pool at rollover, never
    /// mid-window.
    pub fn handle_tick(&mut self, now: Now) {
        self.fold_hot_lane(now);
        self.retry_exhausted_lines(now);
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

    /// C10: the hot lane, folded once per round: one grant decision per (node epoch,
    /// key-window) however many reports arrived, in a fixed order.
    fn fold_hot_lane(&mut self, now: Now) {
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
    /// due (a demand-band move, a refresh), rounds later; meanwhile that credit went to
    /// whichever line reported next. So right after the report that handed it back
    /// (and at each tick, for what the bound below left queued), the starved lines (told exhausted
    /// while wanting more, `Line::starved`) in key-windows whose pool grew since are
    /// sized again, in the order the returns arrived; a line that wants nothing now is
    /// told the pool is open again (a grant of nothing more with exhausted false), so its
    /// fast path can ask when it runs dry.
    ///
    /// Lines not told exhausted are left alone: their fast path already takes pooled
    /// credit at the moment they need it, which placing it ahead can only guess at
    /// (retrying lines the fair split cut short too: bursty 1 s under mean 0.0680% ->
    /// 0.0685% at seeds 2-4). In a key-window spread thin nothing is placed: a node's
    /// next request is as likely on any of a dozen nodes, and credit placed ahead
    /// strands on the wrong one. Its starved lines are only told the pool is open
    /// again, so the node a request comes to asks for it, as the endgame there has
    /// every node do (`size_grant`). Left closed, the credit the others handed back sat
    /// in the pool while their 429s went on: in uniform's first 30 s at seed 1, 1.7 of
    /// a 1 s window's 40 units were still unissued when it closed, of 4.4 unspent in
    /// all. Reopened, seeds 1-4 (under 1 s p99 / mean, 60 s p99): zipf
    /// 15.0 / 1.588% / 2.667% -> 12.5 / 1.183% / 2.467%, uniform 20.0 / 6.857% -> 15.0 /
    /// 4.403%, every other row within 0.001 point; fast paths zipf 26.0% -> 28.8%,
    /// uniform 42.3% -> 50.0% (before the endgame rounded down, reopening cost more than
    /// it gained: zipf at seed 1, 1 s mean 2.13% -> 2.17%).
    ///
    /// Only credit in the pool is placed, nothing placed is recalled (C6), and every
    /// grant passes `size_grant`'s allowance check (halting on a breach). At most
    /// `retry_ledgers_per_tick` key-windows a step; the rest wait their turn.
    ///
    /// Right after the report rather than at the next tick: until its notice lands, a
    /// node told exhausted denies what the pool could now admit, and at the tick that
    /// wait was up to a round. In uniform's first 30 s at seed 1, such 429s (1 s window,
    /// pool not empty, no fast path because told exhausted) fell from 4,612 to 1,215.
    /// Seed 1, under 1 s mean (60 s p99): uniform 4.399% -> 4.214%, zipf 1.143% ->
    /// 1.126% (2.533% -> 2.467%), pinned 0.0685% -> 0.0634%, hot-key 0.157% -> 0.149%;
    /// bursty 60 s mean 0.035% -> 0.041% (BENCHMARKS.md).
    fn retry_exhausted_lines(&mut self, now: Now) {
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
    fn send_batches(&mut self, per_node: PerNode) {
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

    /// The keys in the hot lane now (C10), heaviest first.
    pub fn hot_keys(&self) -> &[bus_schemas::KeyId] {
        self.hot.hot()
    }

    /// The next grant batch to send. A halted owner sends nothing, not even the empty
    /// batch that answers a report: batches queued before the breach was found are
    /// dropped, and without a proof of contact its nodes see the shard's owner as gone
    /// (F1), enforce with what they hold, self-grant at boundaries (F4) and degrade
    /// visibly (F5). Answering on, it kept them "healthy" and denying every key of the
    /// shard until the worker restarted.
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

    pub fn check_invariants(&mut self) -> Result<(), OwnerInvariantError> {
        for (kw, ledger) in &self.ledgers {
            if let Err(e) = check_ledger(&self.config, kw, ledger) {
                self.halted = Some(e.clone());
                return Err(e);
            }
        }
        Ok(())
    }

    /// The same check for the named key-windows only (those a message just touched). A
    /// breach halts the owner exactly as a full check would.
    pub fn check_key_windows<'a>(
        &mut self,
        kws: impl IntoIterator<Item = &'a KeyWindow>,
    ) -> Result<(), OwnerInvariantError> {
        for kw in kws {
            if let Some(ledger) = self.ledgers.get(kw)
                && let Err(e) = check_ledger(&self.config, kw, ledger)
            {
                self.halted = Some(e.clone());
                return Err(e);
            }
        }
        Ok(())
    }
}

fn config_reserve(config: &OwnerConfig, allowance: u64) -> u64 {
    config.reserve(allowance)
}

fn check_ledger(
    config: &OwnerConfig,
    kw: &KeyWindow,
    ledger: &Ledger,
) -> Result<(), OwnerInvariantError> {
    let issued = ledger.issued_net();
    let reserve = ledger.reserve_held(config);
    if issued + reserve > ledger.allowance {
        return Err(OwnerInvariantError::OverIssued {
            kw: *kw,
            issued,
            allowance: ledger.allowance,
            reserve,
        });
    }
    Ok(())
}

/// Lines (node epochs) a ledger takes per fleet node before it refuses a new one that
/// carries no credit.
const LINES_PER_NODE: usize = 4;

/// What is left of a key-window's pool when a line is sized (`FoldOwner::size_grant`).
#[derive(Clone, Copy)]
struct PoolLeft {
    allowance: u64,
    available: u64,
    /// At least half the pool unissued and not in the endgame.
    slack: bool,
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
    // D5 allows one fast path a round, and in a key-window spread thin that was the
    // largest cause of 429s with credit still in the pool (uniform, seed 1, 30 s: 4,318
    // of 6,297): a second request in the same round found the one unit spent. While a
    // quarter of the pool is unissued the answer covers it too; a unit the node does
    // not spend goes back within its thin idle wait (`NodeConfig::idle_return_rounds_thin`).
    // Later in the pool a unit held ahead is one another node's request will miss (two
    // at any time: uniform's 1 s mean 3.04% -> 3.18% at seed 1). BENCHMARKS.md has the
    // figures.
    if thin && pool.available.saturating_mul(4) >= pool.allowance {
        least = least.max(2);
    }
    // A node that holds nothing of this window yet asks for at least its 1/fleet share
    // (what fixed mode and an F4 self-grant would give it unasked). One round of pace is
    // a single unit for any plan under 40 per second per node, so a client's quick run
    // of requests at a fresh key would earn a 429 on its second request, with most of
    // the allowance untouched, until the next round. Only while the pool is slack: later
    // in a window (a restarted node's new epoch, a key that moved) a share would strand
    // on a node whose demand is unknown, which the sim's restarts scenario showed as
    // under-admission. The fair split in `size_grant` still cuts it when short.
    if config.mode == OwnerMode::Leasing && line.issued() == 0 && pool.slack {
        least = least.max(config.lease_share(pool.allowance));
    }
    least
}

/// Window end in wall time; the owner needs it only to stop granting and to reap.
fn bus_window_end(kw: KeyWindow) -> u64 {
    let len = u64::from(kw.window.length_ms);
    kw.window.number * len + kw.key.phase_offset_ms(kw.window.length_ms) + len
}
