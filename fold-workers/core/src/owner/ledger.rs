//! The owner's books: one [`Ledger`] per key-window, one [`Line`] in it per node epoch
//! that reported the key-window, and the check of the one safety property on them
//! (issued net of returns plus the unreleased reserve within the allowance).

use bus_schemas::{GrantEntry, KeyWindow, NodeEpoch, NodeId, ReportEntry};

use super::{FoldOwner, OwnerConfig, OwnerInvariantError, OwnerMode};

/// Lines (node epochs) a ledger takes per fleet node before it refuses a new one that
/// carries no credit.
const LINES_PER_NODE: usize = 4;

/// What the owner knows of one node epoch in one key-window.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Line {
    pub(super) seq: u64,
    pub(super) spend: u64,
    pub(super) demand: u64,
    pub(super) applied: u64,
    pub(super) returned: u64,
    pub(super) self_granted: u64,
    /// The node's standing option is settled by this line: `self_granted` is all the
    /// node took unasked (`options`).
    pub(super) standing_option: bool,
    /// Credit total this owner (or, after a takeover, the reports) says was issued.
    pub(super) granted: u64,
    grant_seq: u64,
    /// This owner told the node the window is exhausted, so it stops asking (A48).
    pub(super) told_exhausted: bool,
    /// Told exhausted, and no sizing since found the line holding all it wants: credit
    /// that comes back to the pool is offered to it at the next tick
    /// (`FoldOwner::retry_exhausted_lines`). A node whose demand has since fallen away
    /// is left out, so returned credit is not parked where nothing asks for it (offering
    /// it to every line told exhausted measures no better: zipf's 1 s under mean 2.14%
    /// against 2.13% at seed 1), except in a key-window spread thin, where it is only
    /// told the pool reopened.
    pub(super) starved: bool,
}

impl Line {
    /// Owner-issued credit as the node could hold it: a previous owner's grant may have
    /// been applied without this owner issuing it, so take the larger.
    pub(super) fn issued(&self) -> u64 {
        self.granted.max(self.applied)
    }

    pub(super) fn outstanding(&self) -> u64 {
        (self.issued() + self.self_granted).saturating_sub(self.spend + self.returned)
    }

    /// Every grant entry this owner sends for a line (a grant, an exhaustion notice, an
    /// "open again" notice): `grant` more credit, and whether the pool is exhausted for
    /// it, which is also whether the line is starved (`Line::starved`).
    pub(super) fn issue(
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
pub(super) struct Lines(pub(super) smallvec::SmallVec<[((NodeId, NodeEpoch), Line); 2]>);

impl Lines {
    pub(super) fn get(&self, id: &(NodeId, NodeEpoch)) -> Option<&Line> {
        self.0.iter().find(|(k, _)| k == id).map(|(_, l)| l)
    }

    pub(super) fn get_mut(&mut self, id: &(NodeId, NodeEpoch)) -> Option<&mut Line> {
        self.0.iter_mut().find(|(k, _)| k == id).map(|(_, l)| l)
    }

    /// The line for `id`, added empty if absent; true when it was added.
    pub(super) fn get_or_insert(&mut self, id: (NodeId, NodeEpoch)) -> (&mut Line, bool) {
        match self.0.iter().position(|(k, _)| *k == id) {
            Some(i) => (&mut self.0[i].1, false),
            None => {
                self.0.push((id, Line::default()));
                (&mut self.0.last_mut().expect("just pushed").1, true)
            }
        }
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &Line> {
        self.0.iter().map(|(_, l)| l)
    }

    fn len(&self) -> usize {
        self.0.len()
    }
}

#[derive(Clone, Debug)]
pub(super) struct Ledger {
    /// The smallest allowance any node reported: a policy switch mid-window only tightens.
    pub(super) allowance: u64,
    pub(super) reserve_released: bool,
    pub(super) lines: Lines,
    /// Fixed mode: nodes that took their share this window.
    pub(super) fixed_nodes_seen: u32,
    /// On `FoldOwner::retry_queue`: a line is starved and credit came back since.
    pub(super) retry_queued: bool,
    /// The largest allowance any line reported: what the nodes size their standing
    /// options from (a node on an older, looser policy takes more).
    pub(super) option_allowance: u64,
    /// `OwnerConfig::option_rotation` of this key-window.
    pub(super) option_rotation: u32,
    /// When the owner last recalled this key-window's unsettled options (`options`).
    pub(super) recalled_at_ms: Option<u64>,
    /// A node that already held two units or more of this key-window wanted more than
    /// the pool had while options were out: the key concentrates, and its next window's
    /// options are asked back before most nodes would take them (`options`).
    pub(super) concentrated: bool,
}

impl Ledger {
    /// A new key-window's ledger, at the allowance its first line reports, capped by the
    /// policy's limit for it (P1) when there is one.
    pub(super) fn new(reported_allowance: u64, policy_cap: Option<u64>, rotation: u32) -> Self {
        Self {
            allowance: policy_cap.map_or(reported_allowance, |c| c.min(reported_allowance)),
            reserve_released: false,
            lines: Lines::default(),
            fixed_nodes_seen: 0,
            retry_queued: false,
            option_allowance: reported_allowance,
            option_rotation: rotation,
            recalled_at_ms: None,
            concentrated: false,
        }
    }

    /// Room for a recall's line (`FoldOwner::send_recalls`): never past what a report
    /// line with no credit could take.
    pub(super) fn has_room_for_recall(&self, config: &OwnerConfig) -> bool {
        self.lines.len() < LINES_PER_NODE * config.fleet_size as usize
    }

    /// What may be leased beyond the standing options: the pool a window far from its
    /// limit is measured against (`sizing`).
    pub(super) fn pool_base(&self, config: &OwnerConfig) -> u64 {
        self.allowance
            .saturating_sub(config.options_total(self.option_allowance))
    }

    pub(super) fn reserve_held(&self, config: &OwnerConfig) -> u64 {
        if self.reserve_released {
            0
        } else {
            config.reserve(self.allowance)
        }
    }

    /// The reserve is still there for a fast path to take (C5): nothing is exhausted
    /// while it is.
    pub(super) fn reserve_left(&self, config: &OwnerConfig) -> bool {
        !self.reserve_released && config.reserve(self.allowance) > 0
    }

    /// Whether the pool can still grow within the window without a return: the reserve
    /// is held, or options are unsettled (a recall may bring them back). A pool that can
    /// is not exhausted: a node told so would stop asking until the boundary.
    pub(super) fn may_refill(&self, config: &OwnerConfig) -> bool {
        self.reserve_left(config) || self.unsettled_options(config) > 0
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

    /// P1: a node on a tightened policy reports a lower allowance. A live ledger takes
    /// it only as far as the credit already out allows (issued net of returns, and the
    /// reserve it still holds): lower, its invariant would read broken and halt the owner
    /// for the whole shard. The rest of the window is bounded by it; the nodes themselves
    /// switch at their next window.
    pub(super) fn tighten_allowance(&mut self, config: &OwnerConfig, reported: u64) {
        if reported < self.allowance {
            let floor = self.least_allowance(config);
            self.allowance = self.allowance.min(reported.max(floor));
        }
    }

    /// Whether a report line for `id` has a place here: a restart storm's new epochs are
    /// each a line of every key-window they report, so past `LINES_PER_NODE` per fleet
    /// node a new line is taken in only if it carries credit, which must be counted
    /// whatever it costs (the allowance bounds how many can).
    pub(super) fn has_room_for(
        &self,
        config: &OwnerConfig,
        id: &(NodeId, NodeEpoch),
        entry: &ReportEntry,
    ) -> bool {
        self.lines.len() < LINES_PER_NODE * config.fleet_size as usize
            || self.lines.get(id).is_some()
            || carries_credit(entry)
    }

    pub(super) fn issued_net(&self) -> u64 {
        let (issued, returned) = self.lines.values().fold((0u64, 0u64), |(i, r), l| {
            (
                i + l.issued(),
                r + l.returned.min(l.issued() + l.self_granted),
            )
        });
        issued.saturating_sub(returned)
    }

    /// Everything that may still be or has been spent: owner credit, self-grants, in
    /// fixed mode the shares of nodes not yet heard from, and in leasing the standing
    /// options no node has settled (`options`).
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
            OwnerMode::Leasing => self.unsettled_options(config),
        };
        lines + unseen_shares
    }

    /// See `OwnerConfig::spread_lines`.
    pub(super) fn spread_thin(&self, config: &OwnerConfig) -> bool {
        config.mode == OwnerMode::Leasing
            && self.lines.values().filter(|l| l.demand > 0).count() as u64 >= config.spread_lines
    }

    pub(super) fn available(&self, config: &OwnerConfig) -> u64 {
        self.allowance
            .saturating_sub(self.reserve_held(config) + self.committed(config))
    }
}

/// Whether a line holds or has spent credit, which the owner must count wherever it came
/// from (a line the node's own book keeps has spend <= applied + self-granted).
pub(super) fn carries_credit(entry: &ReportEntry) -> bool {
    entry.applied_grant > 0 || entry.self_granted > 0 || entry.cumulative_spend > 0
}

/// The safety property for one key-window: credit issued net of returns, plus the
/// reserve while it is held, within the allowance.
pub(super) fn check_ledger(
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

impl FoldOwner {
    /// The safety property over every ledger. A breach halts the owner: it issues
    /// nothing more (`poll_grant`).
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
