//! The node limiter's reconciliation state machine (sans-IO, like quinn-proto's
//! `Connection`): it is handed time and messages through `handle_*` and hands back
//! messages through `poll_transmit`. It never reads a clock, sleeps, spawns, awaits or
//! touches a socket; the NATS runtime and the simulator drive this same code.
//!
//! It is the single writer of everything on the surface except request-path decrements:
//! it turns attempt counters into demand, installs and closes window credit, applies
//! grants (C6), self-grants when the owner is gone (F4), and writes the round's reports
//! (C1).
//!
//! The struct, its configuration and its outward types live here; its methods are
//! split by the part of a round they serve:
//!
//! * `tick`: a round, and the visit of each key it takes through its steps.
//! * `report`: the round's report lines and batches (C1).
//! * `returns`: credit handed back to the pool (C4, A2).
//! * `grants`: grants applied (C6) and credit installed into words.
//! * `fast_path`: D5's fast path, sent and answered.
//! * `links`: each shard's owner as this node sees it (C2, C8, F1-F5).
//! * `eviction`: D7's eviction of idle, empty buckets.
//! * `policy_switch`: P1's move of keys to a new policy version.
//! * `invariants`: the checks and reads the tests and the simulator use.
//! * `standing`: standing options booked, taken and given up.
//! * `track`: the per-key data the steps share (demand tracks, records).
//!
//! Credit words are read and written only through `crate::credit`.

mod eviction;
mod fast_path;
mod grants;
mod invariants;
mod links;
mod policy_switch;
mod report;
mod returns;
mod standing;
mod tick;
mod track;

use std::collections::VecDeque;
use std::sync::Arc;

use bus_schemas::limits::{FULL_REPORT_CHUNKS_MAX, REPORT_ENTRIES_MAX};
use bus_schemas::{
    FastPathRequest, KeyId, KeyWindow, NodeEpoch, NodeId, Now, OwnerEpoch, ReportBatch,
};

use crate::surface::DecisionSurface;
use crate::window::window_end_ms;
use fast_path::PendingFastPath;
use invariants::ChangeLog;
use links::ShardLink;
use tick::WHEEL_ROUNDS;
use track::{KeyState, Place, WindowRecord};

pub use links::LinkHealth;

// Deterministic hashing, so the simulator's output depends only on its seed.
use bus_schemas::hashing::DetMap;

/// O1: the two credit strategies, chosen by configuration (A55's decision gate).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Demand-driven leasing from the fold owner (ADR-1).
    Leasing,
    /// A-fixed: each node takes a fixed 1/fleet share (less the reserve) at every window
    /// start; the owner only releases the reserve, through the fast path.
    Fixed,
}

#[derive(Clone, Debug)]
pub struct NodeConfig {
    pub node: NodeId,
    pub fleet_size: u32,
    pub shards: u32,
    pub round_ms: u32,
    pub mode: Mode,
    /// C5: the reserve, in thousandths of the window allowance.
    pub reserve_permille: u64,
    /// F2: rounds without owner contact after which the fast path stops.
    pub missed_rounds_limit: u32,
    /// F5: owner silence after which enforcement is degraded.
    pub degraded_after_ms: u64,
    /// C4: rounds without a request after which held credit goes back to the pool, at
    /// most: a busy key's goes back sooner (`NodeLimiter::idle_return_after`). After this
    /// many, again only each time the quiet key's decaying demand halves (`scan_key`).
    pub idle_return_rounds: u32,
    /// C4: `idle_return_rounds` for a key this node sees only a small share of
    /// (`NodeLimiter::idle_cap_for`): at most this many quiet rounds. A test that keeps
    /// idle credit sets it to `u32::MAX` too.
    pub idle_return_rounds_thin: u32,
    /// C4: the fewest quiet rounds after which even a busy key's credit goes back. A
    /// test that keeps idle credit sets this and `idle_return_rounds` to `u32::MAX`.
    pub idle_return_rounds_min: u32,
    /// Rounds before a boundary at which the next window is reported, so its owner can
    /// grant before the first request of that window arrives.
    pub prefetch_rounds: u32,
    /// C4/A2: at every visit, credit a window holds above what the key's demand may
    /// still spend before the window ends goes back to the pool
    /// (`NodeLimiter::rest_of_window`). A test that keeps held credit (with
    /// `idle_return_rounds` at `u32::MAX`) turns this off.
    pub rest_return: bool,
    /// What that return keeps on top of h x the demand over the rounds left: this many
    /// standard deviations of Poisson arrivals over them.
    pub rest_return_sigmas: u64,
    /// An unchanged line is re-reported at least this often (reports are lossy).
    pub refresh_rounds: u32,
    /// Final reports sent for a closed window before its record is reaped.
    pub closed_reports: u32,
    /// D7 keeps the surface under its cap; this caps the reconciler's own records.
    pub records_cap: usize,
    /// Fast-path requests outstanding at once; more are not sent.
    pub pending_fast_path_cap: usize,
    /// Standing options (leasing mode): the share, in thousandths, of each window's
    /// leasable allowance the fleet's nodes may take unasked
    /// (`credit_sizing::standing_total`); 0 turns them off. The fold owners must use
    /// the same value.
    pub standing_permille: u64,
    /// The driver tells the limiter which keys it decided (`note_decision`) instead of
    /// the round's pass over every bucket finding them by their attempt counters. Only a
    /// single-threaded driver that sees every decision can (the simulator, whose fleet
    /// of 20 nodes x 10^5 keys would otherwise read 80 M buckets per simulated second);
    /// the visits are the same keys either way.
    pub decisions_hinted: bool,
}

impl NodeConfig {
    pub fn reference(node: NodeId) -> Self {
        Self {
            node,
            fleet_size: 20,
            shards: 20,
            round_ms: 25,
            mode: Mode::Leasing,
            reserve_permille: 20,
            missed_rounds_limit: 2,
            degraded_after_ms: 30_000,
            idle_return_rounds: 8,
            idle_return_rounds_thin: 4,
            idle_return_rounds_min: 3,
            prefetch_rounds: 2,
            rest_return: true,
            rest_return_sigmas: 1,
            refresh_rounds: 8,
            closed_reports: 2,
            records_cap: 400_000,
            pending_fast_path_cap: 4_096,
            standing_permille: 500,
            decisions_hinted: false,
        }
    }

    /// F4: what a node may give itself at a boundary with no fold contact.
    pub fn self_grant(&self, allowance: u64) -> u64 {
        allowance / u64::from(self.fleet_size)
    }

    /// A-fixed: a node's share, the reserve held back.
    pub fn fixed_share(&self, allowance: u64) -> u64 {
        credit_sizing::fixed_share(allowance, self.reserve_permille, self.fleet_size)
    }
}

/// What the node sends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transmit {
    Report(ReportBatch),
    FastPath(FastPathRequest),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NodeInvariantError {
    #[error("{kw:?}: spend went backwards from {before} to {after}")]
    SpendWentBackwards {
        kw: KeyWindow,
        before: u64,
        after: u64,
    },
    #[error(
        "{kw:?}: spend {spend} + held {held} + returned {returned} exceeds credit received {received}"
    )]
    CreditOverspent {
        kw: KeyWindow,
        spend: u64,
        held: u64,
        returned: u64,
        received: u64,
    },
    #[error("{kw:?}: applied grant {applied} exceeds allowance {allowance} plus credit returned")]
    GrantAboveAllowance {
        kw: KeyWindow,
        applied: u64,
        allowance: u64,
    },
    #[error("{kw:?}: record says installed but the word holds another window")]
    WordMismatch { kw: KeyWindow },
}

/// Counters for metrics (F6) and for tests to see what was refused and why.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeStats {
    pub rounds: u64,
    pub reports_sent: u64,
    pub report_entries_sent: u64,
    pub grants_applied: u64,
    pub grants_duplicate: u64,
    pub grant_batches_stale_owner: u64,
    pub grants_other_epoch: u64,
    pub grants_orphaned: u64,
    pub grants_invalid: u64,
    pub batches_misrouted: u64,
    pub fast_path_sent: u64,
    pub fast_path_unreachable: u64,
    pub fast_path_granted: u64,
    /// Fast paths the owner refused with the pool spent (the node stops asking until the
    /// boundary), and refused with the pool able to refill (options out, the reserve).
    pub fast_path_refused_exhausted: u64,
    pub fast_path_refused_open: u64,
    pub credit_returned: u64,
    pub self_grants: u64,
    /// Deadline loans booked as self-grants (`book_loans`).
    pub loans_booked: u64,
    pub evictions: u64,
    pub records_refused: u64,
    /// P1: buckets moved to a new policy version.
    pub policy_switched: u64,
    /// Keys visited by rounds (see `handle_tick`): the reconciler's work, which a pass
    /// over every key would make `rounds` x keys.
    pub keys_visited: u64,
    /// Of those, keys visited for new decisions.
    pub keys_visited_for_decisions: u64,
    /// C8: full reports of a shard sent (`ShardLink::full_report_owed`).
    pub full_reports_sent: u64,
    /// Standing options booked (taken by a request or by this reconciler).
    pub standing_taken: u64,
    /// A standing option of one key-window taken a second time (see `book_standing`).
    pub standing_retaken: u64,
}

/// One node epoch's reconciler.
pub struct NodeLimiter {
    config: NodeConfig,
    surface: Arc<DecisionSurface>,
    epoch: NodeEpoch,
    round: u64,
    keys: DetMap<KeyId, KeyState>,
    /// Records across every key (the cap counts them).
    records_len: usize,
    links: Vec<ShardLink>,
    pending: DetMap<u64, PendingFastPath>,
    next_request_id: u64,
    outbox: VecDeque<Transmit>,
    stats: NodeStats,
    /// P1: the policy version this node's buckets follow.
    policy_version: u64,
    /// Keys due a visit with no new decisions, by due round mod `WHEEL_ROUNDS`. An entry
    /// is live while its key's `due_round` still names that round; a key is due within
    /// `refresh_rounds` at most, so one turn of the wheel covers every live entry.
    wheel: Vec<Vec<KeyId>>,
    /// Keys due further ahead than the wheel spans (a 60 s window's end), by due round;
    /// moved onto the wheel's slot as their round comes. An entry is live while its
    /// key's `due_round` still names it. Without it such a key would be visited each
    /// turn of the wheel for nothing: at 10^5 keys, every key every 0.8 s.
    far: std::collections::BinaryHeap<std::cmp::Reverse<(u64, KeyId)>>,
    /// Keys whose records changed outside a tick (a grant or a fast path made one), to
    /// visit at the next tick. At most `records_cap` entries (`mark_dirty`): past that
    /// the next tick visits every key instead, which is exact too.
    dirty: Vec<KeyId>,
    /// Each bucket's (digest, attempts) as the last round's pass saw them, in the
    /// surface's iteration order, so the pass compares in order instead of looking up.
    attempts_seen: Vec<(u128, u16)>,
    /// Keys decided since the last round, when the driver says so (`decisions_hinted`).
    hinted: Vec<KeyId>,
    /// The next tick visits every key: the first, one after a late round, a policy
    /// switch or an eviction.
    visit_all: bool,
    last_tick_wall_ms: u64,
    /// Books changed since the caller last took them (`track_changes`).
    log: ChangeLog,
}

/// One line's part of a fleet-wide sum, as `take_changes` last handed it out and now:
/// (spend + held, self-granted); `None` for no line (not yet counted, or reaped).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LineChange {
    pub key_window: KeyWindow,
    pub allowance: u64,
    pub before: Option<(u64, u64)>,
    pub after: Option<(u64, u64)>,
}

impl NodeLimiter {
    /// A node starts a new epoch with zero credit (C9); `epoch` must exceed every epoch
    /// this node id used before (the runtime takes it from a durable counter).
    pub fn new(
        config: NodeConfig,
        surface: Arc<DecisionSurface>,
        epoch: NodeEpoch,
        now: Now,
    ) -> Self {
        assert!(config.fleet_size > 0 && config.shards > 0 && config.round_ms > 0);
        assert!(config.reserve_permille < 1_000);
        // Every line of a shard fits in the chunks a full report may span.
        assert!(config.records_cap <= FULL_REPORT_CHUNKS_MAX as usize * REPORT_ENTRIES_MAX);
        assert!(epoch > NodeEpoch(0), "epoch 0 means none");
        let links = (0..config.shards)
            .map(|_| ShardLink::new(now.mono_ms))
            .collect();
        let log = ChangeLog::new(config.records_cap);
        surface.publish_round(0, now.wall_ms, now.wall_ms + u64::from(config.round_ms));
        if config.mode == Mode::Leasing && config.standing_permille > 0 {
            surface.set_standing_rule(crate::surface::StandingRule {
                node: config.node.0,
                fleet_size: config.fleet_size,
                reserve_permille: config.reserve_permille,
                standing_permille: config.standing_permille,
                // C9: an epoch is its start in wall ms (the runtimes and the simulator
                // make it so), which the owner can read off every line as well.
                epoch_start_wall_ms: epoch.0,
            });
        }
        let limiter = Self {
            config,
            surface,
            epoch,
            round: 0,
            keys: DetMap::default(),
            records_len: 0,
            links,
            pending: DetMap::default(),
            next_request_id: 1,
            outbox: VecDeque::new(),
            stats: NodeStats::default(),
            policy_version: 0,
            wheel: vec![Vec::new(); WHEEL_ROUNDS as usize],
            far: Default::default(),
            dirty: Vec::new(),
            attempts_seen: Vec::new(),
            hinted: Vec::new(),
            visit_all: true,
            last_tick_wall_ms: now.wall_ms,
            log,
        };
        limiter.publish_health(now);
        limiter
    }

    pub fn epoch(&self) -> NodeEpoch {
        self.epoch
    }

    pub fn node(&self) -> NodeId {
        self.config.node
    }

    pub fn config(&self) -> &NodeConfig {
        &self.config
    }

    pub fn stats(&self) -> &NodeStats {
        &self.stats
    }

    pub fn surface(&self) -> &Arc<DecisionSurface> {
        &self.surface
    }

    /// The policy version `handle_policy` last switched to.
    pub fn policy_version(&self) -> u64 {
        self.policy_version
    }

    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.outbox.pop_front()
    }

    /// With `decisions_hinted`, the driver's word that it decided `key` since the last
    /// round (a no-op otherwise). Bounded as `mark_dirty` is.
    pub fn note_decision(&mut self, key: KeyId) {
        if !self.config.decisions_hinted {
            return;
        }
        if self.hinted.len() < self.config.records_cap {
            self.hinted.push(key);
        } else {
            self.visit_all = true;
        }
    }

    /// Visit `key` at the next tick. The list is bounded: a flood of grants or fast
    /// paths between two ticks (each may name a key again) turns into one visit of
    /// every key rather than into memory.
    fn mark_dirty(&mut self, key: KeyId) {
        if self.dirty.len() < self.config.records_cap {
            self.dirty.push(key);
        } else {
            self.visit_all = true;
        }
    }

    /// Create the record for a key-window this node is about to use; in fixed mode or
    /// with the owner silent at a boundary, the node gives itself its share here.
    fn ensure_record(&mut self, now: Now, kw: KeyWindow, slot: usize, allowance: u64) -> bool {
        if self.has_record(&kw) {
            return true;
        }
        let shard = kw.shard(self.config.shards);
        let self_granted = match self.config.mode {
            Mode::Fixed => self.config.fixed_share(allowance),
            Mode::Leasing if self.link_health(shard, now) != LinkHealth::Healthy => {
                // F4: exactly 1/fleet, flagged in every report of this window.
                self.stats.self_grants += 1;
                self.config.self_grant(allowance)
            }
            Mode::Leasing => 0,
        };
        self.insert_record(kw, slot, allowance, self_granted)
    }

    fn insert_record(
        &mut self,
        kw: KeyWindow,
        slot: usize,
        allowance: u64,
        self_granted: u64,
    ) -> bool {
        if self.records_len >= self.config.records_cap {
            self.stats.records_refused += 1;
            return false;
        }
        self.records_len += 1;
        self.log.note(kw);
        let option = self
            .standing_rule()
            .is_some_and(|r| r.entitled(kw.key, kw.window));
        self.keys.entry(kw.key).or_default().records.push((
            kw.window,
            WindowRecord {
                slot: slot as u8,
                shard: kw.shard(self.config.shards).0,
                end_ms: window_end_ms(kw.key, kw.window),
                allowance,
                applied_grant: 0,
                self_granted,
                standing: 0,
                option,
                declined: false,
                fast_path_asked: false,
                loan_booked: false,
                returned: 0,
                owner_epoch: OwnerEpoch(0),
                grant_seq: 0,
                exhausted: false,
                place: Place::Off {
                    credit: self_granted,
                },
                last_reported: None,
                reported_round: 0,
                closed_reports_sent: 0,
                spend_floor: 0,
                counted: None,
            },
        ));
        true
    }

    fn has_record(&self, kw: &KeyWindow) -> bool {
        self.record(kw).is_some()
    }

    fn record(&self, kw: &KeyWindow) -> Option<&WindowRecord> {
        self.keys.get(&kw.key)?.rec(kw.window)
    }

    fn record_mut(&mut self, kw: &KeyWindow) -> Option<&mut WindowRecord> {
        self.keys.get_mut(&kw.key)?.rec_mut(kw.window)
    }
}

#[cfg(test)]
mod tests {
    use super::NodeLimiter;

    /// The keys to visit between two ticks are bounded by `records_cap`; past it the next
    /// tick visits every key, and the one after goes back to visiting what changed.
    #[test]
    fn dirty_keys_are_bounded_and_overflow_into_a_visit_of_every_key() {
        use bus_schemas::{KeyId, NodeEpoch, NodeId, Now};
        let t0 = Now {
            wall_ms: 1_764_720_000_000,
            mono_ms: 5_000,
        };
        let config = super::NodeConfig {
            records_cap: 3,
            ..super::NodeConfig::reference(NodeId(0))
        };
        let surface = std::sync::Arc::new(crate::DecisionSurface::new(Default::default()));
        let mut node = NodeLimiter::new(config, surface, NodeEpoch(1), t0);
        node.handle_tick(t0);
        assert!(
            !node.visit_all,
            "the first tick visits every key, then stops"
        );
        for digest in 1..=5u128 {
            node.mark_dirty(KeyId { version: 1, digest });
        }
        assert_eq!(node.dirty.len(), 3);
        assert!(node.visit_all);
        node.handle_tick(Now {
            wall_ms: t0.wall_ms + 25,
            mono_ms: t0.mono_ms + 25,
        });
        assert!(node.dirty.is_empty() && !node.visit_all);
    }
}
