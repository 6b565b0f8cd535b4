//! The node limiter's reconciliation state machine (sans-IO, like quinn-proto's
//! `Connection`): it is handed time and messages through `handle_*` and hands back
//! messages through `poll_transmit`. It never reads a clock, sleeps, spawns, awaits or
//! touches a socket; the NATS runtime and the simulator drive this same code.
//!
//! It is the single writer of everything on the surface except request-path decrements:
//! it turns attempt counters into demand, installs and closes window credit, applies
//! grants (C6), self-grants when the owner is gone (F4), and writes the round's reports
//! (C1).

use std::collections::VecDeque;
use std::sync::Arc;

use bus_schemas::limits::{FULL_REPORT_CHUNKS_MAX, PLAN_WINDOWS_MAX, REPORT_ENTRIES_MAX};
use bus_schemas::{
    FastPathOutcome, FastPathReply, FastPathRequest, FullReportChunk, GrantBatch, GrantEntry,
    KeyId, KeyWindow, NodeEpoch, NodeId, Now, OwnerEpoch, ReportBatch, ReportEntry, ShardId,
    WindowId,
};

use crate::credit;
use crate::policy::KeyPolicy;
use crate::surface::{DecisionSurface, FastPathNeed, KeyBucket};
use crate::window::{next_window, window_at, window_end_ms};

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
        }
    }

    /// F4: what a node may give itself at a boundary with no fold contact.
    pub fn self_grant(&self, allowance: u64) -> u64 {
        allowance / u64::from(self.fleet_size)
    }

    /// A-fixed: a node's share, the reserve held back.
    pub fn fixed_share(&self, allowance: u64) -> u64 {
        allowance * (1_000 - self.reserve_permille) / 1_000 / u64::from(self.fleet_size)
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
    pub credit_returned: u64,
    pub self_grants: u64,
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
}

/// Where a record's credit is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    /// Not in a credit word (not installed yet, or its bucket was evicted): `credit` units.
    Off { credit: u64 },
    /// In the surface's word for this window; the word holds the remainder.
    Live,
    /// The window is over; what was spent is final.
    Closed { spend: u64 },
}

/// What a line said when it was last reported: a line is due again when any of it changed.
/// Demand counts as changed only when it leaves its band (see `line_band`).
/// A grant applied, and the credit it added to the word, do not make a line due on their
/// own: the owner that issued it knows it (it counts `max(granted, applied)`), a new owner
/// gets every line in a full report (C8), and the refresh re-sends it within
/// `refresh_rounds`. Re-sending each line once per grant was a third of all report lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
struct Reported {
    spend: u64,
    demand_band: u32,
    returned: u64,
    self_granted: u64,
}

/// The reconciler's book for one key-window of this node epoch.
#[derive(Clone, Debug)]
struct WindowRecord {
    slot: u8,
    /// `kw.shard(shards)` and `window_end_ms(kw)`, fixed for the record's life: a round's
    /// passes read them for every line they visit, and each costs a divide.
    shard: u32,
    end_ms: u64,
    allowance: u64,
    applied_grant: u64,
    self_granted: u64,
    returned: u64,
    owner_epoch: OwnerEpoch,
    grant_seq: u64,
    exhausted: bool,
    place: Place,
    last_reported: Option<Reported>,
    /// The round of the last report of this line: it is due again `refresh_rounds` later
    /// (a stamp rather than a count, so a round need not visit a line it does not send).
    reported_round: u64,
    closed_reports_sent: u32,
    /// Spend as of the last invariant check, to prove it never goes backwards.
    spend_floor: u64,
    /// (spend + held, self-granted) as `take_changes` last handed it out: what this line
    /// adds to a fleet-wide sum a checker keeps.
    counted: Option<(u64, u64)>,
}

impl WindowRecord {
    fn received(&self) -> u64 {
        self.applied_grant + self.self_granted
    }
}

#[derive(Clone, Debug, Default)]
struct KeyTrack {
    last_attempts: u16,
    /// The bucket's short counters at the last round (`KeyBucket::shorts`).
    last_shorts: [u32; PLAN_WINDOWS_MAX + 1],
    /// Per plan window, smoothed requests per round that wanted its credit (passed every
    /// window, or were stopped by this one), in thousandths.
    demand_milli: [u64; PLAN_WINDOWS_MAX],
    last_round_milli: [u64; PLAN_WINDOWS_MAX],
    idle_rounds: u32,
    /// The highest smoothed demand when the current quiet spell began (thousandths of a
    /// request per round): how long a spell must last to mean the traffic has gone.
    quiet_from_milli: u64,
    /// Per plan window, the last round in which a request wanted its credit (0: not yet
    /// set). A key can be busy while one of its windows is not: see `blocked_return_rounds`.
    wanted_round: [u64; PLAN_WINDOWS_MAX],
    /// The highest smoothed demand of any window lately (thousandths of a request per
    /// round) and the round it was seen; read halved for every `PEAK_HALF_LIFE_ROUNDS`
    /// since (`KeyTrack::peak`). A stray request in a quiet spell starts a new spell
    /// from almost nothing, so `quiet_from_milli` forgets a burst that this keeps.
    peak_milli: u64,
    peak_round: u64,
    /// Which window number each credit word holds (slot, parity).
    installed: Installed,
    /// The last round whose decisions this track took in (0: none yet). Rounds a key
    /// is not visited in had no decisions for it, and are taken in as quiet rounds when
    /// it next is (`KeyTrack::observe`).
    scanned_round: u64,
    /// The idle wait `scan_key` chose at the key's last visit (`NodeLimiter::idle_cap_for`;
    /// 0: not visited yet), so that `schedule` plans the visit at which it runs out.
    idle_cap: u32,
}

/// Per plan slot and parity, the window number a credit word holds, if any. `u64::MAX`
/// stands for none (no window number comes near it), so the table takes 64 bytes instead
/// of 128: it sits in every key's state, which each round's passes walk whole.
#[derive(Clone, Copy, Debug)]
struct Installed([[u64; 2]; PLAN_WINDOWS_MAX]);

impl Default for Installed {
    fn default() -> Self {
        Self([[u64::MAX; 2]; PLAN_WINDOWS_MAX])
    }
}

impl Installed {
    fn get(&self, slot: usize, parity: usize) -> Option<u64> {
        Some(self.0[slot][parity]).filter(|n| *n != u64::MAX)
    }

    fn set(&mut self, slot: usize, parity: usize, number: Option<u64>) {
        debug_assert!(number != Some(u64::MAX));
        self.0[slot][parity] = number.unwrap_or(u64::MAX);
    }
}

/// How fast `KeyTrack::peak` forgets: halved every 4 s at 25 ms rounds, so a key that
/// bursts every few seconds (the sim's bursty keys: 1 s on in every 4) is still known
/// for one at its next burst.
const PEAK_HALF_LIFE_ROUNDS: u64 = 160;

impl KeyTrack {
    fn demand(&self, slot: usize) -> u64 {
        reported_demand(&self.demand_milli, &self.last_round_milli, slot)
    }

    /// The recent peak as of `round`, decayed on read so a quiet key costs nothing.
    fn peak(&self, round: u64) -> u64 {
        let halvings = round.saturating_sub(self.peak_round) / PEAK_HALF_LIFE_ROUNDS;
        self.peak_milli >> halvings.min(63)
    }

    /// Round `round` of the demand track: `delta` decisions since the last round,
    /// `shorts` the bucket's short counters now. Returns, per plan window, whether its
    /// smoothed demand left its factor-of-two band. A round with no decisions is
    /// `observe(round, 0, self.last_shorts)`, which is how the rounds a key was not
    /// visited in are taken in.
    fn observe(
        &mut self,
        round: u64,
        delta: u64,
        shorts: [u32; PLAN_WINDOWS_MAX + 1],
    ) -> [bool; PLAN_WINDOWS_MAX] {
        let short_delta =
            |i: usize| u64::from(shorts[i].wrapping_sub(self.last_shorts[i])).min(delta);
        let passed = delta - short_delta(PLAN_WINDOWS_MAX);
        let samples: [u64; PLAN_WINDOWS_MAX] =
            std::array::from_fn(|slot| (passed + short_delta(slot)).min(delta) * 1_000);
        self.last_shorts = shorts;
        // Read before this round's decay, and only in the round a quiet spell begins.
        let quiet_from_milli = (delta == 0 && self.idle_rounds == 0)
            .then(|| self.demand_milli.iter().copied().max().unwrap_or(0));
        let mut band_moved = [false; PLAN_WINDOWS_MAX];
        for (slot, sample) in samples.into_iter().enumerate() {
            // Peak-biased smoothing: rises within one round, decays over about eight,
            // so a burst is seen at once and a pause does not strand the next
            // window's grant. The step is at least 1 so integer decay reaches the
            // sample: a residue that never reached 0 kept an idle node asking for
            // (and returning) credit forever.
            let d = self.demand_milli[slot];
            self.last_round_milli[slot] = sample;
            self.demand_milli[slot] = smoothed(d, sample);
            band_moved[slot] = demand_band(d) != demand_band(self.demand_milli[slot]);
            if sample > 0 || self.wanted_round[slot] == 0 {
                self.wanted_round[slot] = round;
            }
        }
        let smoothed = self.demand_milli.iter().copied().max().unwrap_or(0);
        if smoothed >= self.peak(round) {
            self.peak_milli = smoothed;
            self.peak_round = round;
        }
        self.idle_rounds = if delta == 0 {
            if let Some(rate_milli) = quiet_from_milli {
                self.quiet_from_milli = rate_milli;
            }
            self.idle_rounds.saturating_add(1)
        } else {
            0
        };
        band_moved
    }

    /// `rounds` rounds with no decisions from round `first`, as that many `observe(r, 0,
    /// ..)` would take them. Once every demand has decayed to 0 (in at most ~150 rounds
    /// from any demand a 16-bit attempt counter allows) a quiet round only counts
    /// itself, so a key back after an hour costs no more than one back after a few
    /// seconds. The rest of the track needs no rounds counted then either: a zero sample
    /// never moves `wanted_round`, and the recent peak reads the same on both sides of
    /// the shortcut (`peak` decays on read, and a settled demand only replaces a peak
    /// that already reads 0).
    fn observe_quiet(&mut self, first: u64, rounds: u64) {
        for done in 0..rounds {
            let settled = self.idle_rounds > 0
                && self.demand_milli.iter().all(|d| *d == 0)
                && self.last_round_milli.iter().all(|d| *d == 0);
            if settled {
                let left = u32::try_from(rounds - done).unwrap_or(u32::MAX);
                self.idle_rounds = self.idle_rounds.saturating_add(left);
                return;
            }
            self.observe(first + done, 0, self.last_shorts);
        }
    }

    /// Idle credit goes back every quiet round from `idle_return_after` up to the
    /// configured wait, then only each time a window's decaying demand leaves its
    /// factor-of-two band (down to 0), rounds in which its report line is due anyway
    /// (`demand_band`). The owner re-grants against the demand residue what the node
    /// hands back, and handing it back every quiet round for as long as the residue
    /// lasted made a report line and a grant per quiet key per round, most of the
    /// protocol's traffic (BENCHMARKS.md, simulator). A busy key that went quiet (its
    /// traffic moved) still hands its credit back every round until the configured wait.
    fn idle(
        &self,
        band_moved: [bool; PLAN_WINDOWS_MAX],
        idle_min: u32,
        idle_cap: u32,
    ) -> [bool; PLAN_WINDOWS_MAX] {
        let idle_after = NodeLimiter::idle_return_after(idle_min, idle_cap, self.quiet_from_milli);
        std::array::from_fn(|slot| {
            idle_return_due(self.idle_rounds, idle_after, idle_cap, band_moved[slot])
        })
    }
}

/// A window's demand as a line reports it (`KeyTrack::demand`): the larger of the
/// smoothed rate and the last round's count, so a burst shows in the round it starts.
/// `QuietRun` reads its own copies of the two through this too.
fn reported_demand(
    demand_milli: &[u64; PLAN_WINDOWS_MAX],
    last_round_milli: &[u64; PLAN_WINDOWS_MAX],
    slot: usize,
) -> u64 {
    demand_milli[slot].max(last_round_milli[slot])
}

/// One round of `KeyTrack`'s peak-biased smoothing: rises within one round, decays over
/// about eight (see `KeyTrack::observe`).
fn smoothed(demand_milli: u64, sample_milli: u64) -> u64 {
    if sample_milli >= demand_milli {
        demand_milli + (sample_milli - demand_milli).div_ceil(8)
    } else {
        demand_milli - (demand_milli - sample_milli).div_ceil(8)
    }
}

/// Whether a window's idle credit goes back in a quiet spell's `idle_rounds`-th round
/// (see `KeyTrack::idle`).
fn idle_return_due(idle_rounds: u32, idle_after: u32, idle_cap: u32, band_moved: bool) -> bool {
    idle_rounds >= idle_after && (idle_rounds <= idle_cap || band_moved)
}

/// The part of a `KeyTrack` that quiet rounds move and `schedule` reads: `observe(r, 0,
/// ..)` run forward on a clone of the whole track cost a tenth of the simulator's main
/// thread (BENCHMARKS.md), most of it on fields a quiet round leaves alone or `schedule`
/// never looks at (the short counters, the recent peak, the wanted rounds). Kept exact:
/// `a_quiet_run_finds_the_round_a_forward_run_of_observe_finds` holds it to `observe`.
#[derive(Clone, Copy, Debug)]
struct QuietRun {
    demand_milli: [u64; PLAN_WINDOWS_MAX],
    last_round_milli: [u64; PLAN_WINDOWS_MAX],
    idle_rounds: u32,
    quiet_from_milli: u64,
}

impl QuietRun {
    fn of(track: &KeyTrack) -> Self {
        Self {
            demand_milli: track.demand_milli,
            last_round_milli: track.last_round_milli,
            idle_rounds: track.idle_rounds,
            quiet_from_milli: track.quiet_from_milli,
        }
    }

    /// The first of the quiet rounds 1..`rounds` after which the key is due: a window
    /// hands idle credit back (`KeyTrack::idle`) or a line's demand (`KeyTrack::demand`)
    /// has left the band it is in now.
    fn first_due(mut self, rounds: u64, idle_min: u32, idle_cap: u32) -> Option<u64> {
        let demand =
            |r: &Self, slot: usize| reported_demand(&r.demand_milli, &r.last_round_milli, slot);
        let bands: [u32; PLAN_WINDOWS_MAX] =
            std::array::from_fn(|slot| line_band(demand(&self, slot)));
        for j in 1..rounds {
            if self.idle_rounds == 0 {
                self.quiet_from_milli = self.demand_milli.iter().copied().max().unwrap_or(0);
            }
            let mut moved = [false; PLAN_WINDOWS_MAX];
            for (slot, d) in self.demand_milli.iter_mut().enumerate() {
                let before = *d;
                *d = smoothed(before, 0);
                moved[slot] = demand_band(before) != demand_band(*d);
            }
            self.last_round_milli = [0; PLAN_WINDOWS_MAX];
            self.idle_rounds = self.idle_rounds.saturating_add(1);
            let idle_after =
                NodeLimiter::idle_return_after(idle_min, idle_cap, self.quiet_from_milli);
            let idle = (0..PLAN_WINDOWS_MAX)
                .any(|slot| idle_return_due(self.idle_rounds, idle_after, idle_cap, moved[slot]));
            let band_moved =
                (0..PLAN_WINDOWS_MAX).any(|slot| line_band(demand(&self, slot)) != bands[slot]);
            if idle || band_moved {
                return Some(j);
            }
        }
        None
    }
}

/// Everything the reconciler keeps for one key: its demand track and the book of each of
/// its key-windows (the current window of each plan slot, a prefetched next one, closed
/// ones awaiting their final reports: a handful). Grouped by key, a round's passes look a
/// key up once and its bucket on the surface once for all its windows, where one map per
/// key-window cost a lookup in each map per window per pass.
#[derive(Clone, Debug, Default)]
struct KeyState {
    /// `None` until a tick or an install sees the key, and again after eviction (D7);
    /// the records outlive it so spend is never forgotten mid-window.
    track: Option<KeyTrack>,
    /// Inline: a round's passes walk the map's storage in order instead of chasing a
    /// pointer per key. Two (a plan's two current windows) most of the time; around a
    /// boundary a prefetched or a closed window spills to the heap for a few rounds,
    /// and `close_ended_windows` moves them back inline.
    records: smallvec::SmallVec<[(WindowId, WindowRecord); 2]>,
    /// The last round that visited this key (a key is visited once a round at most).
    visit_round: u64,
    /// The round this key is next due a visit in with no new decisions (0: none; see
    /// `NodeLimiter::schedule`).
    due_round: u64,
}

impl KeyState {
    fn rec(&self, window: WindowId) -> Option<&WindowRecord> {
        self.records
            .iter()
            .find(|(w, _)| *w == window)
            .map(|(_, r)| r)
    }

    fn rec_mut(&mut self, window: WindowId) -> Option<&mut WindowRecord> {
        self.records
            .iter_mut()
            .find(|(w, _)| *w == window)
            .map(|(_, r)| r)
    }

    fn has_live(&self) -> bool {
        self.records.iter().any(|(_, r)| r.place == Place::Live)
    }

    /// Demand for plan window `slot` (see `KeyTrack::demand_milli`) as of `round`.
    fn demand(&self, slot: u8, round: u64) -> u64 {
        self.demands(round)[usize::from(slot)]
    }

    /// Every plan window's demand at once as of `round`, for loops that hold the records
    /// mutably. A track not visited since an earlier round is read with those quiet
    /// rounds taken in, on a copy: the line is what a visit every round would show.
    fn demands(&self, round: u64) -> [u64; PLAN_WINDOWS_MAX] {
        self.track_at(round).map_or([0; PLAN_WINDOWS_MAX], |t| {
            std::array::from_fn(|slot| t.demand(slot))
        })
    }

    /// The demand track as a visit in every round up to `round` would have left it: the
    /// track itself when it is up to date, else a copy with the quiet rounds since its
    /// last visit taken in.
    fn track_at(&self, round: u64) -> Option<std::borrow::Cow<'_, KeyTrack>> {
        let track = self.track.as_ref()?;
        if track.scanned_round == 0 || track.scanned_round >= round {
            return Some(std::borrow::Cow::Borrowed(track));
        }
        let mut t = track.clone();
        t.observe_quiet(track.scanned_round + 1, round - track.scanned_round);
        Some(std::borrow::Cow::Owned(t))
    }
}

#[derive(Clone, Copy, Debug)]
struct ShardLink {
    owner_epoch_seen: OwnerEpoch,
    last_contact_mono_ms: u64,
    /// This node's round at that contact: a round missed is one this node reported in
    /// and heard nothing back for, not wall time alone (see `link_health`).
    last_contact_round: u64,
    /// C8 takeover fence: the owner of `owner_epoch_seen` has not yet answered that it
    /// took a full report of the shard from this node epoch (`GrantBatch::
    /// full_report_taken`). A new owner rebuilds its ledger from reports, and a line that
    /// had not changed would otherwise stay unreported for up to `refresh_rounds`, its
    /// credit unknown to it; so until the owner says so, a report of *every* line goes
    /// out again after `FULL_REPORT_RESEND_ROUNDS` rounds, then after twice as many, up
    /// to `FULL_REPORT_RESEND_ROUNDS_MAX` (a batch of it may be lost: the bus is at most
    /// once, and a takeover follows an outage).
    full_report_owed: bool,
    /// The round the last full report for `owner_epoch_seen` went out (0: none yet).
    full_report_round: u64,
    /// Full reports sent to `owner_epoch_seen` so far (the resend interval doubles).
    full_reports_sent: u32,
    /// This round's report of the shard is a full one.
    full_report_now: bool,
}

impl ShardLink {
    /// Whether this round's report of the shard is a full one (`full_report_owed`):
    /// the first round it is owed, then after each resend wait. Sets `full_report_now`.
    fn full_report_turn(&mut self, round: u64) -> bool {
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
/// to the max (6.4 s at 25 ms rounds): an owner that never says so (one from before the
/// field, or a halted one, which sends nothing) costs a full report of the shard that
/// often, not every 200 ms.
const FULL_REPORT_RESEND_ROUNDS: u64 = 8;
const FULL_REPORT_RESEND_ROUNDS_MAX: u64 = 256;

#[derive(Clone, Copy, Debug)]
struct PendingFastPath {
    kw: KeyWindow,
    sent_mono_ms: u64,
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
    /// Keys whose records changed outside a tick (a grant or a fast path made one), to
    /// visit at the next tick. At most `records_cap` entries (`mark_dirty`): past that
    /// the next tick visits every key instead, which is exact too.
    dirty: Vec<KeyId>,
    /// Each bucket's (digest, attempts) as the last round's pass saw them, in the
    /// surface's iteration order, so the pass compares in order instead of looking up.
    attempts_seen: Vec<(u128, u16)>,
    /// The next tick visits every key: the first, one after a late round, a policy
    /// switch or an eviction.
    visit_all: bool,
    last_tick_wall_ms: u64,
    /// Key-windows whose books changed since the caller last took them
    /// (`track_changes`); `None` when nobody asked.
    changes: Option<Vec<KeyWindow>>,
    /// Lines reaped since the caller last took changes, with what they last counted.
    reaped: Option<Vec<LineChange>>,
    changes_overflowed: bool,
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

/// What a return of a window's held credit leaves on the node (`return_credit`).
#[derive(Clone, Copy, Debug)]
enum Keep {
    /// C4: the key is idle (or a shorter window blocks this one): everything goes back.
    Nothing,
    /// C4/A2: the rest of the window (`NodeLimiter::rest_of_window`), `mean_milli`
    /// thousandths of a request expected before its end: the node keeps h x that plus
    /// `rest_return_sigmas` standard deviations of Poisson arrivals, or once the owner
    /// has said the pool is exhausted, that alone.
    RestOfWindow { mean_milli: u64 },
}

/// Rounds the visit wheel spans: more than any due distance `schedule` sets.
const WHEEL_ROUNDS: u64 = 32;

/// Smoothed demand moves every round as it decays, and a line re-sent only for that made
/// almost every line of a quiet key due every round (C4 sizes a grant as h x demand, with h
/// = 1.25 of headroom, so the owner gains little from a step of 12%). A band is a power of
/// two: demand has left its band when it halves or doubles, reaches 0 or leaves it. The
/// idle return follows these bands (`KeyTrack::idle`); a line's report follows
/// `line_band`. Any line sent for another reason carries the exact demand.
fn demand_band(demand: u64) -> u32 {
    u64::BITS - demand.leading_zeros()
}

/// Below this demand (thousandths of a request per round: one request in four rounds) a
/// line is not re-sent for a change of band, only for reaching 0 or leaving it. Down
/// there the owner's grant for it is a unit or two whatever the band (C4: h x demand x
/// lead plus `burst_sigmas` standard deviations of Poisson arrivals, rounded up), while
/// the bands cost a line per halving of every quiet key's decaying demand: two thirds of
/// all report lines at the reference load (BENCHMARKS.md, simulator). Idle returns
/// still follow every band, so credit a quiet node holds goes back as before.
const LINE_BAND_FLOOR_MILLI: u64 = 256;

/// The band a line's demand is reported in (see `LINE_BAND_FLOOR_MILLI`).
fn line_band(demand: u64) -> u32 {
    if demand >= LINE_BAND_FLOOR_MILLI {
        demand_band(demand)
    } else {
        u32::from(demand > 0)
    }
}

/// How a shard's owner looks from this node (F2-F5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkHealth {
    Healthy,
    /// F2: fast path off, no rebalancing expected; F4: self-grant at boundaries.
    Silent,
    /// F5: silent for longer than `degraded_after_ms`.
    Degraded,
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
            .map(|_| ShardLink {
                owner_epoch_seen: OwnerEpoch(0),
                last_contact_mono_ms: now.mono_ms,
                last_contact_round: 0,
                full_report_owed: false,
                full_report_round: 0,
                full_reports_sent: 0,
                full_report_now: false,
            })
            .collect();
        surface.publish_round(0, now.wall_ms, now.wall_ms + u64::from(config.round_ms));
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
            dirty: Vec::new(),
            attempts_seen: Vec::new(),
            visit_all: true,
            last_tick_wall_ms: now.wall_ms,
            changes: None,
            reaped: None,
            changes_overflowed: false,
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

    /// F1-F5. Silent (no fast path, self-grants at boundaries) takes both the time and
    /// this node's own rounds: a node whose round task ran late (CPU starved) sent no
    /// report to be answered, so the owner's quiet is not a missed round. Counting wall
    /// time alone cut its fast path exactly when its credit ran short (false 429s,
    /// BENCHMARKS.md issue 5). Degraded stays wall time: 30 s of silence is degraded
    /// whatever the cause.
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

    fn publish_health(&self, now: Now) {
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

    /// One reconciliation round (T = `round_ms`, C1).
    ///
    /// A round visits only the keys that can need it: those with decisions since the
    /// last round (their attempt counters moved), those whose records changed outside a
    /// tick, and those due by time (`schedule`: a window ending or about to, a line due
    /// for its refresh or for a demand band, an idle-return round, a closed line's last
    /// reports). A key in none of these would have had every step of the round a no-op
    /// but its demand's decay, which its next visit takes in (`KeyTrack::observe`); so
    /// the round does what a pass over every key and bucket did, at the cost of the keys
    /// that move. A round whose wall time ran more than `round_step_ms` ahead of the last
    /// (a late round) visits every key, since `schedule` counts time in rounds.
    pub fn handle_tick(&mut self, now: Now) {
        self.round += 1;
        self.stats.rounds += 1;
        self.surface.publish_round(
            self.round,
            now.wall_ms,
            now.wall_ms + u64::from(self.config.round_ms),
        );
        self.publish_health(now);
        let late = now.wall_ms.saturating_sub(self.last_tick_wall_ms) > self.round_step_ms();
        self.last_tick_wall_ms = now.wall_ms;
        let mut full_report = false;
        for link in &mut self.links {
            if link.full_report_turn(self.round) {
                self.stats.full_reports_sent += 1;
                full_report = true;
            }
        }
        let all = std::mem::take(&mut self.visit_all) || late || full_report;
        let visit = self.keys_to_visit(all);
        self.stats.keys_visited += visit.len() as u64;
        // One pass, each key taken through every step at once with one bucket lookup:
        // no step reads another key's state, and a key's state and bucket are in cache
        // for its later steps (a pass per step missed on them again).
        let surface = Arc::clone(&self.surface);
        let mut per_shard: Vec<Vec<ReportEntry>> = vec![Vec::new(); self.config.shards as usize];
        for key in &visit {
            let bucket = surface.get(key);
            self.close_ended_windows(now, key, bucket.as_deref());
            if let Some(bucket) = bucket.as_deref() {
                self.scan_key(now, *key, bucket);
            }
            self.report_key(key, bucket.as_deref(), &mut per_shard);
            self.schedule(now, key);
        }
        self.send_reports(now, per_shard);
        self.evict_if_over_cap(now.wall_ms);
        let expiry_ms = 4 * u64::from(self.config.round_ms);
        self.pending
            .retain(|_, p| now.mono_ms.saturating_sub(p.sent_mono_ms) < expiry_ms);
    }

    /// This round's keys (see `handle_tick`), each once: with `all`, every key the
    /// reconciler or the surface knows.
    fn keys_to_visit(&mut self, all: bool) -> Vec<KeyId> {
        let round = self.round;
        let mut visit = Vec::new();
        // Decisions since the last round. A bucket the pass has not seen at this place
        // in the order (new, or moved by the map's growth) is visited too: a visit is
        // always exact, only skipping one needs a reason.
        let mut moved: Vec<KeyId> = Vec::new();
        let mut i = 0;
        let seen = &mut self.attempts_seen;
        self.surface.for_each_attempts(|bucket, digest, attempts| {
            let decided = match seen.get_mut(i) {
                Some(e) if e.0 == digest => {
                    let changed = e.1 != attempts;
                    e.1 = attempts;
                    changed
                }
                Some(e) => {
                    *e = (digest, attempts);
                    true
                }
                None => {
                    seen.push((digest, attempts));
                    true
                }
            };
            if decided {
                moved.push(bucket.key());
            }
            i += 1;
        });
        seen.truncate(i);
        // Stamps a known key so it is taken once; says whether the key was unknown.
        let take = |keys: &mut DetMap<KeyId, KeyState>, key: KeyId, visit: &mut Vec<KeyId>| {
            if let Some(state) = keys.get_mut(&key) {
                if state.visit_round != round {
                    state.visit_round = round;
                    visit.push(key);
                }
                return false;
            }
            visit.push(key);
            true
        };
        self.stats.keys_visited_for_decisions += moved.len() as u64;
        for key in moved {
            take(&mut self.keys, key, &mut visit);
        }
        let slot = (round % WHEEL_ROUNDS) as usize;
        for key in std::mem::take(&mut self.wheel[slot]) {
            if self.keys.get(&key).is_some_and(|s| s.due_round == round) {
                take(&mut self.keys, key, &mut visit);
            }
        }
        // Unknown keys come once each from the pass over the buckets; a second source of
        // them (a dirty key since removed, or `all`) needs the list deduplicated.
        let mut unknown_twice = false;
        for key in std::mem::take(&mut self.dirty) {
            unknown_twice |= take(&mut self.keys, key, &mut visit);
        }
        if all {
            let known: Vec<KeyId> = self.keys.keys().copied().collect();
            for key in known {
                take(&mut self.keys, key, &mut visit);
            }
            let mut fresh = Vec::new();
            self.surface.for_each(|key, _| fresh.push(key));
            for key in fresh {
                take(&mut self.keys, key, &mut visit);
            }
        }
        if all || unknown_twice {
            visit.sort_unstable();
            visit.dedup();
        }
        visit
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

    /// Note a key-window whose book changed, for a caller that checks them.
    fn note_change(&mut self, kw: KeyWindow) {
        Self::log_bounded(
            &mut self.changes,
            &mut self.changes_overflowed,
            self.config.records_cap,
            kw,
        );
    }

    /// Push onto a change log if one is kept (`track_changes`), up to `cap` entries;
    /// past that, `overflowed` says the log is incomplete. A free function for the
    /// passes that hold other fields of `self` borrowed.
    fn log_bounded<T>(log: &mut Option<Vec<T>>, overflowed: &mut bool, cap: usize, item: T) {
        if let Some(entries) = log.as_mut() {
            if entries.len() < cap {
                entries.push(item);
            } else {
                *overflowed = true;
            }
        }
    }

    /// Close a visited key's windows that have ended, fixing their spend; reap closed
    /// records once their final reports are out (the node-side mirror of C7).
    fn close_ended_windows(&mut self, now: Now, key: &KeyId, bucket: Option<&KeyBucket>) {
        let closed_reports = self.config.closed_reports;
        let cap = self.config.records_cap;
        let mut reaped = 0;
        let Self {
            keys,
            changes,
            changes_overflowed,
            reaped: reaped_log,
            ..
        } = self;
        let Some(state) = keys.get_mut(key) else {
            return;
        };
        let KeyState { track, records, .. } = state;
        let ended = records.iter().any(|(_, r)| r.end_ms <= now.wall_ms);
        records.retain_mut(|(window, rec)| {
            if !ended || rec.end_ms > now.wall_ms {
                return true;
            }
            let kw = KeyWindow {
                key: *key,
                window: *window,
            };
            match rec.place {
                Place::Closed { .. } => {
                    if rec.closed_reports_sent >= closed_reports {
                        reaped += 1;
                        if let Some(counted) = rec.counted {
                            Self::log_bounded(
                                reaped_log,
                                changes_overflowed,
                                cap,
                                LineChange {
                                    key_window: kw,
                                    allowance: rec.allowance,
                                    before: Some(counted),
                                    after: None,
                                },
                            );
                        }
                        return false;
                    }
                }
                Place::Off { credit } => {
                    rec.place = Place::Closed {
                        spend: rec.received() - rec.returned - credit,
                    };
                    Self::log_bounded(changes, changes_overflowed, cap, kw);
                }
                Place::Live => {
                    let taken = bucket
                        .and_then(|b| {
                            credit::drain(
                                b.word(usize::from(rec.slot), *window),
                                credit::tag_of(window.number),
                            )
                        })
                        .expect(
                            "a live record's word holds its window (checked by check_invariants)",
                        );
                    rec.place = Place::Closed {
                        spend: rec.received() - rec.returned - taken,
                    };
                    Self::log_bounded(changes, changes_overflowed, cap, kw);
                    if let Some(track) = track.as_mut() {
                        let p = credit::parity(window.number);
                        if track.installed.get(usize::from(rec.slot), p) == Some(window.number) {
                            track.installed.set(usize::from(rec.slot), p, None);
                        }
                    }
                }
            }
            true
        });
        if records.spilled() && records.len() <= records.inline_size() {
            records.shrink_to_fit();
        }
        if track.is_none() && records.is_empty() {
            keys.remove(key);
        }
        self.records_len -= reaped;
    }

    /// The most wall time one round may advance without making it late (see
    /// `handle_tick`): a quarter round over, since a timer-driven round task is often a
    /// millisecond or so late, and counting that as late would visit every key each round.
    fn round_step_ms(&self) -> u64 {
        let round_ms = u64::from(self.config.round_ms);
        round_ms + round_ms / 4
    }

    /// C4: quiet rounds after which a key's credit is idle. A node that saw `rate_milli`
    /// thousandths of a request a round sees a quiet spell of n rounds by chance with
    /// probability about e^(-rate n); past e^(-6) (0.25%) the traffic has most likely moved
    /// (the sim's shift scenario: a key's traffic leaves for another node mid-window, and
    /// its credit here is what that node lacks). A slow key keeps the configured wait, so
    /// a pause does not strand its next request on the fast path.
    fn idle_return_after(min: u32, cap: u32, rate_milli: u64) -> u32 {
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
    /// spend on a fast path: a wait of 5 for every key cut uniform's 1 s under mean
    /// 4.18% -> 2.61% but put pinned's fast path at 0.557%, over its 0.5% (seed 1,
    /// BENCHMARKS.md).
    fn idle_cap_for(
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
    /// over) keeps it. The sim's hot-key run showed why: every node held 16-74 of the
    /// hot key's 60 s credit while the 1 s credit, 40 a second fleet-wide, went to a few
    /// of them; a node with no 1 s credit never spent its 60 s credit, and the key never
    /// went quiet there, so the idle return never moved it. At the 60 s window's end 102
    /// of its 1,500 were still held that way: its whole under-admission (A2).
    /// Never fewer than `idle_cap` rounds, the key's own idle wait (a very short shorter
    /// window would otherwise hand credit back over an ordinary gap; a configuration that
    /// keeps idle credit, `u32::MAX`, keeps this too). `None`: no shorter window, so only
    /// the key's own idleness counts.
    fn blocked_return_rounds(
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

    /// One key's part of a round: demand from its decisions, then each plan window's
    /// record made and installed (the current window; the next one near the boundary),
    /// and idle credit handed back.
    fn scan_key(&mut self, now: Now, key: KeyId, bucket: &KeyBucket) {
        let prefetch_ms = u64::from(self.config.prefetch_rounds) * u64::from(self.config.round_ms);
        let (idle_min, idle_cap) = (
            self.config.idle_return_rounds_min,
            self.config.idle_return_rounds,
        );
        let round = self.round;
        let attempts = bucket.attempts.load(std::sync::atomic::Ordering::Relaxed);
        let track = self
            .keys
            .entry(key)
            .or_default()
            .track
            .get_or_insert_with(KeyTrack::default);
        if track.scanned_round != 0 {
            // The rounds since the last visit had no decisions for this key (the
            // attempts pass would have visited it), and `schedule` chose them as rounds
            // with nothing to do but the decay.
            track.observe_quiet(
                track.scanned_round + 1,
                round.saturating_sub(track.scanned_round + 1),
            );
        }
        track.scanned_round = round;
        let delta = u64::from(attempts.wrapping_sub(track.last_attempts));
        track.last_attempts = attempts;
        // A short counter moves only with a decision, which moves `attempts` too: a
        // visit with none (most are, see `schedule`) need not read them.
        let shorts = if delta == 0 {
            track.last_shorts
        } else {
            bucket.shorts()
        };
        let band_moved = track.observe(round, delta, shorts);
        let wanted_round = track.wanted_round;
        let demands: [u64; PLAN_WINDOWS_MAX] = std::array::from_fn(|slot| track.demand(slot));
        let active = delta > 0 || track.demand_milli.iter().any(|d| *d > 0);
        let idle_cap = Self::idle_cap_for(
            track.quiet_from_milli,
            bucket.policy().windows(),
            self.config.round_ms,
            idle_cap,
            self.config.idle_return_rounds_thin,
        );
        track.idle_cap = idle_cap;
        let idle = track.idle(band_moved, idle_min, idle_cap);
        // Whether a window still needs ensure_record + install: absent, or its credit
        // not yet in a word. Both are no-ops on a live or closed record, the common
        // case, so it is read here instead of each looking the key up again.
        let unplaced = |state: Option<&KeyState>, window| {
            state
                .and_then(|s| s.rec(window))
                .is_none_or(|r| matches!(r.place, Place::Off { .. }))
        };
        for (slot, spec) in bucket.policy().windows().iter().enumerate() {
            let current = window_at(key, spec.length_ms, now.wall_ms);
            let kw = KeyWindow {
                key,
                window: current,
            };
            let left_ms = window_end_ms(key, current).saturating_sub(now.wall_ms);
            let state = self.keys.get(&key);
            let has_current = state.and_then(|s| s.rec(current)).is_some();
            if active || has_current {
                if unplaced(state, current) {
                    if !self.ensure_record(now, kw, slot, spec.limit) {
                        // The cap refused it: try again next round, as a pass over
                        // every key did.
                        self.mark_dirty(key);
                    }
                    self.install(key, bucket, kw);
                }
                let blocked = delta > 0
                    && Self::blocked_return_rounds(
                        bucket.policy().windows(),
                        slot,
                        self.config.round_ms,
                        idle_cap,
                    )
                    .is_some_and(|r| round.saturating_sub(wanted_round[slot]) >= r);
                if self.config.mode == Mode::Leasing {
                    let keep = if idle[slot] || blocked {
                        Some(Keep::Nothing)
                    } else {
                        self.rest_of_window(left_ms, demands[slot])
                    };
                    if let Some(keep) = keep {
                        self.return_credit(now, bucket, kw, keep);
                    }
                }
            }
            let next = KeyWindow {
                key,
                window: next_window(current),
            };
            let near_end = left_ms <= prefetch_ms;
            let state = self.keys.get(&key);
            let has_next = state.and_then(|s| s.rec(next.window)).is_some();
            if ((near_end && active) || has_next) && unplaced(state, next.window) {
                if !self.ensure_record(now, next, slot, spec.limit) {
                    self.mark_dirty(key);
                }
                self.install(key, bucket, next);
            }
        }
    }

    /// After a visit, the round in which `key` next needs one if no decision comes for
    /// it, put on the wheel. Due is the earliest of: a record's window end (closing it,
    /// and a new current window for a key still in demand) and its prefetch point; a
    /// line's refresh; a closed line's next final report or its reaping; a record still
    /// off its word; and, run forward on a copy of the demand track, the first quiet
    /// round that hands idle credit back or moves a line's demand band (which makes it
    /// due). Wall times become rounds at `round_step_ms` a round, which is never late as
    /// long as no round advances the clock by more: such a round visits every key
    /// (`handle_tick`). Anything earlier than needed is harmless, since a visit is exact.
    fn schedule(&mut self, now: Now, key: &KeyId) {
        let round = self.round;
        let round_ms = u64::from(self.config.round_ms);
        let prefetch_ms = u64::from(self.config.prefetch_rounds) * round_ms;
        let refresh = u64::from(self.config.refresh_rounds);
        let (idle_min, idle_cap) = (
            self.config.idle_return_rounds_min,
            self.config.idle_return_rounds,
        );
        let step_ms = self.round_step_ms();
        let at_wall =
            |wall_ms: u64| round + wall_ms.saturating_sub(now.wall_ms).div_ceil(step_ms).max(1);
        let horizon = round + WHEEL_ROUNDS - 1;
        let Some(state) = self.keys.get_mut(key) else {
            return;
        };
        let mut due = u64::MAX;
        for (_, rec) in &state.records {
            match rec.place {
                Place::Closed { .. } => due = due.min(round + 1),
                Place::Off { .. } => {
                    // Off its word: installed in the next round with a bucket.
                    due = due.min(round + 1);
                }
                Place::Live => {}
            }
            if !matches!(rec.place, Place::Closed { .. }) {
                let end = rec.end_ms;
                due = due
                    .min(at_wall(end))
                    .min(at_wall(end.saturating_sub(prefetch_ms)))
                    .min(rec.reported_round + refresh.max(1));
            }
        }
        if let Some(track) = state.track.as_ref()
            && (track.demand_milli.iter().any(|d| *d > 0) || track.idle_rounds <= idle_cap)
        {
            // The wait the key's last visit chose; never longer than the configured one.
            let idle_cap = match track.idle_cap {
                0 => idle_cap,
                chosen => chosen,
            };
            let limit = due.min(horizon).saturating_sub(round);
            if let Some(j) = QuietRun::of(track).first_due(limit, idle_min, idle_cap) {
                due = due.min(round + j);
            }
        }
        if due == u64::MAX {
            state.due_round = 0;
            return;
        }
        let due = due.clamp(round + 1, horizon);
        if state.due_round != due {
            state.due_round = due;
            self.wheel[(due % WHEEL_ROUNDS) as usize].push(*key);
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
        self.note_change(kw);
        self.keys.entry(kw.key).or_default().records.push((
            kw.window,
            WindowRecord {
                slot: slot as u8,
                shard: kw.shard(self.config.shards).0,
                end_ms: window_end_ms(kw.key, kw.window),
                allowance,
                applied_grant: 0,
                self_granted,
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

    /// Move a record's credit into its credit word, closing whatever older window the word
    /// still held (that window ended at least one window ago: parity alternates).
    fn install(&mut self, key: KeyId, bucket: &KeyBucket, kw: KeyWindow) {
        let Some(state) = self.keys.get_mut(&key) else {
            return;
        };
        let KeyState { track, records, .. } = state;
        let Some(rec) = records
            .iter_mut()
            .find(|(w, _)| *w == kw.window)
            .map(|(_, r)| r)
        else {
            return;
        };
        let Place::Off { credit: off_credit } = rec.place else {
            return;
        };
        // The slot is where the bucket's own plan has this window's length, not the one
        // the record was made with: a policy switch (P1) can drop or move a length, and a
        // key evicted before it keeps records from the old plan. Placed by a stale slot,
        // the credit landed in another window's word and drained it (same parity).
        let Some(slot) = bucket
            .policy()
            .windows()
            .iter()
            .position(|w| w.length_ms == kw.window.length_ms)
        else {
            // The plan has no such window now: the credit stays off the word, for the
            // record to hand back as its window closes.
            return;
        };
        rec.slot = slot as u8;
        let (exhausted, p) = (rec.exhausted, credit::parity(kw.window.number));
        let track = track.get_or_insert_with(KeyTrack::default);
        let in_word = track.installed.get(slot, p);
        if in_word.is_some_and(|n| n > kw.window.number) {
            // Credit for a window older than the one in the word (a grant backlog flushed
            // late, its record long reaped): it stays off the word, and its record closes
            // at the key's next visit, as its window has ended. Installed, it closed the
            // live window and drained its credit.
            return;
        }
        if let Some(older) = in_word.filter(|n| *n != kw.window.number) {
            let older_window = WindowId {
                length_ms: kw.window.length_ms,
                number: older,
            };
            let taken =
                credit::drain(bucket.word(slot, older_window), credit::tag_of(older)).unwrap_or(0);
            if let Some((_, old)) = records.iter_mut().find(|(w, _)| *w == older_window)
                && old.place == Place::Live
            {
                old.place = Place::Closed {
                    spend: old.received() - old.returned - taken,
                };
                Self::log_bounded(
                    &mut self.changes,
                    &mut self.changes_overflowed,
                    self.config.records_cap,
                    KeyWindow {
                        key,
                        window: older_window,
                    },
                );
            }
        }
        track.installed.set(slot, p, Some(kw.window.number));
        credit::install(
            bucket.word(slot, kw.window),
            credit::tag_of(kw.window.number),
            off_credit,
            exhausted,
        );
        if let Some((_, rec)) = records.iter_mut().find(|(w, _)| *w == kw.window) {
            rec.place = Place::Live;
        }
        self.note_change(kw);
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
    /// nodes, offered about the 40 a second) it sat on the quiet node for twenty rounds
    /// while the busy one was told the pool was spent and denied. Seeds 1-4, under 1 s
    /// p99 / mean, with the return in the last 4 rounds only -> at every visit: hot-key
    /// 5.0 / 0.2006% -> **2.5** / 0.1725%, pinned 2.5 / 0.0858% -> 2.5 / 0.0726%, shift
    /// 0.1090% -> 0.0945%, restarts and skew 5.0 -> 2.5; zipf 60 s p99 2.467% ->
    /// 2.533%, lossy 60 s 0.133% -> 0.267%; fast paths in hot-key 0.49% -> 0.62%, pinned
    /// 0.458% -> 0.459% (BENCHMARKS.md).
    fn rest_of_window(&self, left_ms: u64, demand_milli: u64) -> Option<Keep> {
        let round_ms = u64::from(self.config.round_ms.max(1));
        (self.config.rest_return && left_ms > 0).then(|| Keep::RestOfWindow {
            mean_milli: demand_milli * left_ms.div_ceil(round_ms),
        })
    }

    /// Hand back what `kw`'s word holds above what `keep` leaves, so the owner can give
    /// it to a node that is using it. Only while the owner is there to re-grant it.
    fn return_credit(&mut self, now: Now, bucket: &KeyBucket, kw: KeyWindow, keep: Keep) {
        const HEADROOM_PERMILLE: u64 = 1_250; // C4's h
        if self.link_health(kw.shard(self.config.shards), now) != LinkHealth::Healthy {
            return;
        }
        let sigmas = self.config.rest_return_sigmas;
        let Some(rec) = self.record_mut(&kw) else {
            return;
        };
        if rec.place != Place::Live {
            return;
        }
        let keep = match keep {
            Keep::Nothing => 0,
            // The pool is empty: what this node keeps above its expected need is the
            // window's last credit, and a node that runs short here can still get what
            // the others hand back (the owner reopens its fast path). Keeping the margin
            // too: seeds 1-4, zipf 60 s under p99 3.87% (3.80% without), hot-key 1 s
            // mean 0.207% (0.201%).
            Keep::RestOfWindow { mean_milli } if rec.exhausted => mean_milli.div_ceil(1_000),
            Keep::RestOfWindow { mean_milli } => {
                credit_sizing::held_target(mean_milli, HEADROOM_PERMILLE, sigmas)
            }
        };
        let taken = credit::drain_above(
            bucket.word(usize::from(rec.slot), kw.window),
            credit::tag_of(kw.window.number),
            keep,
        )
        .unwrap_or(0);
        rec.returned += taken;
        self.stats.credit_returned += taken;
        if taken > 0 {
            self.note_change(kw);
        }
    }

    /// The record's current numbers, as a report line.
    fn line(&self, kw: &KeyWindow, rec: &WindowRecord) -> ReportEntry {
        let state = self.keys.get(&kw.key);
        let bucket = match rec.place {
            Place::Live => self.surface.get(&kw.key),
            _ => None,
        };
        line_of(
            bucket.as_deref(),
            state.map_or(0, |s| s.demand(rec.slot, self.round)),
            kw,
            rec,
        )
    }

    /// A visited key's report lines, into its shards' lists: every line that changed, is
    /// due for its refresh, or is a closed line's final report. A key not visited has
    /// none due (`schedule`), and a line's order in its batch does not depend on the
    /// visit order (`send_reports` sorts).
    fn report_key(
        &mut self,
        key: &KeyId,
        bucket: Option<&KeyBucket>,
        per_shard: &mut [Vec<ReportEntry>],
    ) {
        let (config, links, round) = (&self.config, &self.links, self.round);
        let Some(state) = self.keys.get_mut(key) else {
            return;
        };
        let demands = state.demands(round);
        for (window, rec) in state.records.iter_mut() {
            let kw = KeyWindow {
                key: *key,
                window: *window,
            };
            let line = line_of(bucket, demands[usize::from(rec.slot)], &kw, rec);
            let reported = Reported {
                spend: line.cumulative_spend,
                demand_band: line_band(line.demand),
                returned: line.returned,
                self_granted: line.self_granted,
            };
            let closed = matches!(rec.place, Place::Closed { .. });
            let shard = rec.shard as usize;
            let due = if links[shard].full_report_now {
                true
            } else if closed {
                rec.closed_reports_sent < config.closed_reports
            } else {
                rec.last_reported != Some(reported)
                    || round - rec.reported_round >= u64::from(config.refresh_rounds)
            };
            if due {
                per_shard[shard].push(line);
                rec.last_reported = Some(reported);
                rec.reported_round = round;
                if closed {
                    rec.closed_reports_sent += 1;
                }
            }
        }
    }

    /// The round's report batches from the lines `report_key` collected.
    fn send_reports(&mut self, now: Now, per_shard: Vec<Vec<ReportEntry>>) {
        // One batch per shard every round, empty or not: it is also the heartbeat the
        // owner uses to see this node (C8). Only a full report acknowledges its epoch.
        for (shard, mut entries) in per_shard.into_iter().enumerate() {
            entries.sort_unstable_by_key(|e| e.key_window);
            let chunk_count = entries.len().div_ceil(REPORT_ENTRIES_MAX).max(1);
            // `records_cap` keeps a full report within the chunks the wire allows (`new`).
            assert!(chunk_count <= FULL_REPORT_CHUNKS_MAX as usize);
            let full = self.links[shard].full_report_now;
            for i in 0..chunk_count {
                // The first chunk leaves, the rest stays: one batch (the usual case) moves
                // its vector rather than copying it.
                let rest = entries.split_off(entries.len().min(REPORT_ENTRIES_MAX));
                let chunk = std::mem::replace(&mut entries, rest);
                let full_report = full.then_some(FullReportChunk {
                    index: i as u32,
                    count: chunk_count as u32,
                });
                self.push_report(now, shard, chunk, full_report);
            }
        }
    }

    fn push_report(
        &mut self,
        now: Now,
        shard: usize,
        entries: Vec<ReportEntry>,
        full_report: Option<FullReportChunk>,
    ) {
        self.stats.reports_sent += 1;
        self.stats.report_entries_sent += entries.len() as u64;
        self.outbox.push_back(Transmit::Report(ReportBatch {
            node: self.config.node,
            node_epoch: self.epoch,
            seq: self.round,
            shard: ShardId(shard as u32),
            sent_at_ms: now.wall_ms,
            owner_epoch_seen: self.links[shard].owner_epoch_seen,
            entries,
            full_report,
        }));
    }

    /// D7: when the surface nears its cap, evict the least recently seen buckets that hold
    /// no credit in any word. Their records stay, so spend is never forgotten mid-window.
    fn evict_if_over_cap(&mut self, now_ms: u64) {
        let surface = Arc::clone(&self.surface);
        let cap = self.surface.config().bucket_cap;
        let high = cap - cap / 10;
        if self.surface.len() <= high {
            return;
        }
        let target = cap - cap / 5;
        let mut candidates = Vec::new();
        self.surface.for_each(|key, bucket| {
            let empty = bucket
                .all_words()
                .all(|w| credit::word_credit(w.load(std::sync::atomic::Ordering::Acquire)) == 0);
            if empty && !surface.fast_path_in_flight(bucket, now_ms) {
                // A track is as of its key's last visit; the rounds since were quiet.
                let round = self.round;
                let idle_rounds = self
                    .keys
                    .get(&key)
                    .and_then(|s| s.track.as_ref())
                    .map(|t| {
                        let unseen = if t.scanned_round == 0 {
                            0
                        } else {
                            round - t.scanned_round
                        };
                        t.idle_rounds
                            .saturating_add(u32::try_from(unseen).unwrap_or(u32::MAX))
                    })
                    // No track yet: a key whose first request came since the last round,
                    // the least idle there is (it was evicted first, as if the most).
                    .unwrap_or(0);
                candidates.push((std::cmp::Reverse(idle_rounds), key));
            }
        });
        candidates.sort_unstable();
        let excess = self.surface.len().saturating_sub(target);
        let mut evicted = std::collections::HashSet::new();
        for (_, key) in candidates.into_iter().take(excess) {
            // A key whose fast path is in flight stays: evicted, its answer had no
            // bucket to land in and the request and its joiners failed open (D7 says
            // reload on next sight, not admit unchecked).
            let gone = self.surface.evict_if(&key, |b| {
                !surface.fast_path_in_flight(b, now_ms)
                    && b.all_words().all(|w| {
                        credit::word_credit(w.load(std::sync::atomic::Ordering::Acquire)) == 0
                    })
            });
            if gone {
                self.stats.evictions += 1;
                if let Some(state) = self.keys.get_mut(&key) {
                    state.track = None;
                    if state.records.is_empty() {
                        self.keys.remove(&key);
                    }
                }
                evicted.insert(key);
            }
        }
        if evicted.is_empty() {
            return;
        }
        // Rare (the surface near its cap): the next round visits every key rather than
        // work out which schedules an eviction moved.
        self.visit_all = true;
        // The words went with the bucket and held nothing; the records keep the spend,
        // and credit granted later waits off-word until the key is seen again.
        for key in &evicted {
            for (window, rec) in self
                .keys
                .get_mut(key)
                .into_iter()
                .flat_map(|s| &mut s.records)
            {
                if rec.place == Place::Live {
                    rec.place = Place::Off { credit: 0 };
                    Self::log_bounded(
                        &mut self.changes,
                        &mut self.changes_overflowed,
                        self.config.records_cap,
                        KeyWindow {
                            key: *key,
                            window: *window,
                        },
                    );
                }
            }
        }
    }

    /// D5: the request path found no credit and took this round's fast path for `need`.
    /// Returns how many requests went out (one per short window, each to its own owner);
    /// 0 means the caller should decide at once, as no owner is reachable (F2).
    pub fn handle_fast_path_need(&mut self, now: Now, need: FastPathNeed) -> usize {
        if need.join {
            // Another request is already asking for this key this round (D5).
            return 0;
        }
        let Some(bucket) = self.surface.get(&need.key) else {
            return 0;
        };
        let round_ms = u64::from(self.config.round_ms);
        // (slot, length, limit, ask): a window short here, or one holding less than the
        // owner's least fast-path grant (`credit_sizing::round_of_pace`). After an
        // idle spell the reconciler has returned all but a few credits of every window;
        // asking for the empty one alone left the other to run dry a moment later, with
        // this round's ask spent: a round of 429s per idle spell (BENCHMARKS.md, issue 5).
        let windows: Vec<(usize, u32, u64, bool)> = bucket
            .policy()
            .windows()
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let pace = credit_sizing::round_of_pace(
                    w.limit,
                    w.length_ms,
                    self.config.round_ms,
                    self.config.fleet_size,
                );
                let held = bucket.credit_in(i, window_at(need.key, w.length_ms, now.wall_ms));
                let ask = need.short_windows & (1 << i) != 0 || held < pace;
                (i, w.length_ms, w.limit, ask)
            })
            .collect();
        let attempts = bucket.attempts.load(std::sync::atomic::Ordering::Relaxed);
        drop(bucket);
        // The key's, so the same for every window asked for (sending one does not move
        // the demand track).
        let demand = self.fast_path_demand(&need.key, attempts);
        let mut sent = 0;
        for (slot, length_ms, limit, ask) in windows {
            if !ask {
                continue;
            }
            let current = KeyWindow {
                key: need.key,
                window: window_at(need.key, length_ms, now.wall_ms),
            };
            sent += usize::from(self.send_fast_path(now, current, slot, limit, demand));
            if window_end_ms(need.key, current.window).saturating_sub(now.wall_ms) <= round_ms {
                // The window ends before the next round: credit for it alone would leave
                // the next window's first requests short with this round's ask spent
                // (D5), a round of 429s at the boundary. Ask for the next one too, in
                // the same round, as the tick's prefetch would have.
                let next = KeyWindow {
                    key: need.key,
                    window: next_window(current.window),
                };
                sent += usize::from(self.send_fast_path(now, next, slot, limit, demand));
            }
        }
        sent
    }

    /// The demand a fast-path request advertises (C4 sizes its grant from it): the
    /// key's, not only the short window's. The window's own estimate is stale exactly
    /// when a fast path is needed: it decayed while a shorter window stopped every
    /// request, or over a quiet spell whose end this request is the first sign of (the
    /// tick has not seen it yet). Sized from that, the grant was one round of pace (one
    /// unit), the round's one fast path was spent, and the rest of the round's burst got
    /// 429s: in the sim's bursty run, 6,300 of the 8,000 requests the oracle admitted
    /// and the 60 s window refused came with credit in the owner's pool. At the end of
    /// a quiet spell the recent peak counts too: the bursty keys' stray requests between
    /// bursts left `quiet_from_milli` under one request a round, and their first fast
    /// path of a burst still got 3 units for a round of 3-5 requests. The requests of
    /// this round so far count as a round's demand too: no tick has seen them, and a
    /// burst's first round is what they are (seeds 1-4: pinned's fast path 0.426% ->
    /// 0.422%, the under means of uniform, zipf, bursty and hot-key down 1-4%; at seeds
    /// 5-8 zipf's went up 2%, the rest down). A key not visited for rounds had no
    /// decision in them (a decision makes the next tick visit it), so the attempts since
    /// its last visit are this round's. `attempts`: the key's bucket's attempt counter,
    /// read by the caller, which holds the bucket.
    fn fast_path_demand(&self, key: &KeyId, attempts: u16) -> u64 {
        let Some(track) = self.keys.get(key).and_then(|s| s.track_at(self.round)) else {
            return 0;
        };
        let this_round_milli = u64::from(attempts.wrapping_sub(track.last_attempts)) * 1_000;
        let busiest = (0..PLAN_WINDOWS_MAX)
            .map(|slot| track.demand(slot))
            .max()
            .unwrap_or(0)
            .max(this_round_milli);
        if track.idle_rounds > 0 {
            busiest
                .max(track.quiet_from_milli)
                .max(track.peak(self.round))
        } else {
            busiest
        }
    }

    /// One D5 request for `kw`, advertising at least `key_demand` (`fast_path_demand`);
    /// false when the link is not healthy or the caps are hit.
    fn send_fast_path(
        &mut self,
        now: Now,
        kw: KeyWindow,
        slot: usize,
        limit: u64,
        key_demand: u64,
    ) -> bool {
        let shard = kw.shard(self.config.shards);
        if self.link_health(shard, now) != LinkHealth::Healthy
            || self.pending.len() >= self.config.pending_fast_path_cap
        {
            self.stats.fast_path_unreachable += 1;
            return false;
        }
        if !self.ensure_record(now, kw, slot, limit) {
            return false;
        }
        let surface = Arc::clone(&self.surface);
        if let Some(bucket) = surface.get(&kw.key) {
            self.install(kw.key, &bucket, kw);
        }
        // The record may be new (its line is due) and an install may have closed an
        // older window: the next tick looks at the key.
        self.mark_dirty(kw.key);
        let rec = self.record(&kw).expect("ensured above");
        let mut entry = self.line(&kw, rec);
        entry.demand = entry.demand.max(key_demand);
        let request_id = self.next_request_id;
        self.next_request_id += 1;
        self.pending.insert(
            request_id,
            PendingFastPath {
                kw,
                sent_mono_ms: now.mono_ms,
            },
        );
        self.outbox.push_back(Transmit::FastPath(FastPathRequest {
            node: self.config.node,
            node_epoch: self.epoch,
            shard,
            request_id,
            owner_epoch_seen: self.links[shard.0 as usize].owner_epoch_seen,
            entry,
        }));
        self.stats.fast_path_sent += 1;
        true
    }

    pub fn handle_fast_path_reply(&mut self, now: Now, reply: &FastPathReply) {
        let pending = self.pending.remove(&reply.request_id);
        if reply.shard.0 >= self.config.shards
            || !self.accept_owner_epoch(now, reply.shard, reply.owner_epoch)
        {
            return;
        }
        match reply.outcome {
            FastPathOutcome::Granted(entry) => {
                if entry.key_window.shard(self.config.shards) != reply.shard {
                    self.stats.grants_invalid += 1;
                } else if self.apply_grant(now, reply.owner_epoch, &entry) {
                    self.stats.fast_path_granted += 1;
                }
            }
            FastPathOutcome::Refused { exhausted: true } => {
                // The owner has nothing left for the window: later 429s wait for its
                // boundary rather than for the next round (D6).
                if let Some(p) = pending {
                    self.mark_exhausted(p.kw);
                }
            }
            FastPathOutcome::Refused { exhausted: false } | FastPathOutcome::Withheld => {}
        }
    }

    fn mark_exhausted(&mut self, kw: KeyWindow) {
        let Some(rec) = self
            .keys
            .get_mut(&kw.key)
            .and_then(|s| s.rec_mut(kw.window))
        else {
            return;
        };
        rec.exhausted = true;
        if rec.place == Place::Live
            && let Some(bucket) = self.surface.get(&kw.key)
        {
            credit::add_credit(
                bucket.word(usize::from(rec.slot), kw.window),
                credit::tag_of(kw.window.number),
                0,
                true,
            );
        }
    }

    /// C2: grants and replies from an older owner epoch than one already seen for the
    /// shard are refused whole.
    fn accept_owner_epoch(&mut self, now: Now, shard: ShardId, epoch: OwnerEpoch) -> bool {
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

    /// C6: apply a grant batch. Each entry is a whole-bucket total, applied as
    /// `max(applied, total)` in (owner epoch, grant_seq) order, so a duplicate or a
    /// reordered older grant changes nothing.
    pub fn handle_grant_batch(&mut self, now: Now, batch: &GrantBatch) {
        if batch.node != self.config.node || batch.shard.0 >= self.config.shards {
            self.stats.batches_misrouted += 1;
            return;
        }
        if !self.accept_owner_epoch(now, batch.shard, batch.owner_epoch) {
            return;
        }
        if batch.full_report_taken == Some(self.epoch) {
            // From the owner epoch just accepted, about this node epoch's report: neither
            // an older owner nor an answer to this node's previous life can clear it.
            self.links[batch.shard.0 as usize].full_report_owed = false;
        }
        for entry in &batch.entries {
            if entry.key_window.shard(self.config.shards) != batch.shard {
                self.stats.grants_invalid += 1;
                continue;
            }
            self.apply_grant(now, batch.owner_epoch, entry);
        }
        self.publish_health(now);
    }

    fn apply_grant(&mut self, now: Now, owner_epoch: OwnerEpoch, entry: &GrantEntry) -> bool {
        if entry.node_epoch != self.epoch {
            // For an earlier incarnation of this node: that credit is orphaned (C9).
            self.stats.grants_other_epoch += 1;
            return false;
        }
        let kw = entry.key_window;
        let fresh = !self.has_record(&kw);
        if fresh && window_end_ms(kw.key, kw.window) <= now.wall_ms {
            // A late or repeated grant for a window that has ended and whose record is
            // reaped: a new record would start from nothing and take the cumulative total
            // as fresh credit, although the reaped one had returned or spent part of it
            // (the property tests' fleet truth: 36 held where 22 was out).
            self.stats.grants_orphaned += 1;
            return false;
        }
        if fresh {
            // A grant can arrive before a tick saw the key (the fast path on a new key, or a
            // pre-grant for the next window); it needs the key's bucket to know the slot.
            let slot = self.surface.get(&kw.key).and_then(|b| {
                let windows = b.policy().windows();
                windows
                    .iter()
                    .position(|w| w.length_ms == kw.window.length_ms)
                    .map(|i| (i, windows[i].limit))
            });
            let Some((slot, allowance)) = slot else {
                self.stats.grants_orphaned += 1;
                return false;
            };
            let self_granted = if self.config.mode == Mode::Fixed {
                self.config.fixed_share(allowance)
            } else {
                0
            };
            if !self.insert_record(kw, slot, allowance, self_granted) {
                return false;
            }
        }
        let rec = self
            .keys
            .get_mut(&kw.key)
            .and_then(|s| s.rec_mut(kw.window))
            .expect("just ensured");
        if (owner_epoch, entry.grant_seq) <= (rec.owner_epoch, rec.grant_seq) {
            self.stats.grants_duplicate += 1;
            return false;
        }
        if entry.credit_total > rec.allowance + rec.returned {
            // Both sides assert the allowance: a grant above it is refused, not clamped.
            // Totals are cumulative, so credit handed back may be granted again.
            self.stats.grants_invalid += 1;
            return false;
        }
        Self::log_bounded(
            &mut self.changes,
            &mut self.changes_overflowed,
            self.config.records_cap,
            kw,
        );
        rec.owner_epoch = owner_epoch;
        rec.grant_seq = entry.grant_seq;
        rec.exhausted = entry.exhausted;
        let delta = entry.credit_total.saturating_sub(rec.applied_grant);
        rec.applied_grant = rec.applied_grant.max(entry.credit_total);
        self.stats.grants_applied += 1;
        match rec.place {
            Place::Off { credit } => {
                rec.place = Place::Off {
                    credit: credit + delta,
                }
            }
            Place::Live => {
                let slot = usize::from(rec.slot);
                if let Some(bucket) = self.surface.get(&kw.key) {
                    let added = credit::add_credit(
                        bucket.word(slot, kw.window),
                        credit::tag_of(kw.window.number),
                        delta,
                        entry.exhausted,
                    );
                    assert!(added, "{kw:?}: live record's word holds another window");
                }
            }
            Place::Closed { .. } => {}
        }
        let off = matches!(rec.place, Place::Off { .. });
        let surface = Arc::clone(&self.surface);
        if off && let Some(bucket) = surface.get(&kw.key) {
            self.install(kw.key, &bucket, kw);
        }
        if fresh || off {
            // A new line is due, and an install may have closed an older window: the
            // next tick looks at the key. A grant to a record in place changes nothing
            // a round would act on (it is not a reason to report, see `Reported`).
            self.mark_dirty(kw.key);
        }
        true
    }

    /// P1: policy version `version` is now in force; `resolve` gives each key's policy in
    /// it (`None`: the key is not in it, and keeps what it has). Versions only move
    /// forward, so a late or repeated switch changes nothing.
    ///
    /// What changes when: a window already open keeps the allowance it started with, here
    /// and at the owner (a switch must not strand or revoke credit mid-window); every
    /// window that opens after the switch uses the new plan. A key whose windows changed
    /// gets a new bucket; credit held for a window length both plans share moves into it,
    /// and credit for a length the new plan drops goes back to the owner as returned.
    /// Returns how many keys switched.
    pub fn handle_policy(
        &mut self,
        _now: Now,
        version: u64,
        resolve: impl Fn(&KeyId) -> Option<KeyPolicy>,
    ) -> usize {
        if version <= self.policy_version {
            return 0;
        }
        self.policy_version = version;
        let mut changed: Vec<(KeyId, KeyPolicy)> = Vec::new();
        self.surface.for_each(|key, bucket| {
            if let Some(new) = resolve(&key)
                && new != *bucket.policy()
            {
                changed.push((key, new));
            }
        });
        changed.sort_unstable_by_key(|(k, _)| *k);
        if changed.is_empty() {
            return 0;
        }
        // Rare: the next round visits every key rather than work out whose schedule
        // the switch moved.
        self.visit_all = true;
        let switching: DetMap<KeyId, KeyPolicy> = changed.iter().copied().collect();
        // Every record of a switching key, with the slot its window length has in the
        // new plan (None: the new plan has no window of that length).
        let mut moves: DetMap<KeyId, Vec<(KeyWindow, usize, Option<usize>)>> = DetMap::default();
        for (key, state) in &self.keys {
            let Some(policy) = switching.get(key) else {
                continue;
            };
            for (window, rec) in &state.records {
                let kw = KeyWindow {
                    key: *key,
                    window: *window,
                };
                let new_slot = policy
                    .windows()
                    .iter()
                    .position(|w| w.length_ms == kw.window.length_ms);
                moves
                    .entry(kw.key)
                    .or_default()
                    .push((kw, usize::from(rec.slot), new_slot));
            }
        }
        let mut switched = 0;
        for (key, policy) in changed {
            let mut list = moves.remove(&key).unwrap_or_default();
            list.sort_unstable_by_key(|(kw, _, _)| *kw);
            let live: Vec<bool> = list
                .iter()
                .map(|(kw, _, _)| self.record(kw).expect("listed").place == Place::Live)
                .collect();
            let exhausted: Vec<bool> = list
                .iter()
                .map(|(kw, _, _)| self.record(kw).expect("listed").exhausted)
                .collect();
            let mut taken = vec![0u64; list.len()];
            let replaced = self.surface.replace_bucket(key, policy, |old, new| {
                for (i, (kw, old_slot, new_slot)) in list.iter().enumerate() {
                    if !live[i] {
                        continue;
                    }
                    let tag = credit::tag_of(kw.window.number);
                    taken[i] = credit::drain(old.word(*old_slot, kw.window), tag).unwrap_or(0);
                    if let Some(slot) = new_slot {
                        credit::install(new.word(*slot, kw.window), tag, taken[i], exhausted[i]);
                    }
                }
            });
            if !replaced {
                continue;
            }
            switched += 1;
            let KeyState { track, records, .. } = self.keys.entry(key).or_default();
            let track = track.get_or_insert_with(KeyTrack::default);
            track.installed = Installed::default();
            for (i, (kw, _, new_slot)) in list.iter().enumerate() {
                Self::log_bounded(
                    &mut self.changes,
                    &mut self.changes_overflowed,
                    self.config.records_cap,
                    *kw,
                );
                let rec = records
                    .iter_mut()
                    .find(|(w, _)| *w == kw.window)
                    .map(|(_, r)| r)
                    .expect("listed from records");
                match (new_slot, live[i], rec.place) {
                    (Some(slot), true, _) => {
                        rec.slot = *slot as u8;
                        track.installed.set(
                            *slot,
                            credit::parity(kw.window.number),
                            Some(kw.window.number),
                        );
                    }
                    (Some(slot), false, _) => rec.slot = *slot as u8,
                    (None, true, _) => {
                        // The new plan has no such window: hand its credit back (C4).
                        rec.returned += taken[i];
                        self.stats.credit_returned += taken[i];
                        rec.place = Place::Off { credit: 0 };
                    }
                    (None, false, Place::Off { credit }) => {
                        rec.returned += credit;
                        self.stats.credit_returned += credit;
                        rec.place = Place::Off { credit: 0 };
                    }
                    (None, false, _) => {}
                }
            }
        }
        self.stats.policy_switched += switched as u64;
        switched
    }

    /// The policy version `handle_policy` last switched to.
    pub fn policy_version(&self) -> u64 {
        self.policy_version
    }

    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.outbox.pop_front()
    }

    /// From now on, remember every key-window whose book changes (a record made,
    /// granted, installed, returned, closed or reaped), for a caller that checks each
    /// step's changes instead of every record (the simulator). Bounded by `records_cap`.
    pub fn track_changes(&mut self) {
        self.changes.get_or_insert_with(Vec::new);
        self.reaped.get_or_insert_with(Vec::new);
    }

    /// The node-side invariants for every key-window changed since the last call, and
    /// each changed line's part of a fleet-wide sum, before and now, into `out` (a
    /// reaped line first, then at most one per line). A record no change touched keeps its part: only decisions
    /// touched it, and a decision moves a unit from held to spend. `Ok(false)`: more
    /// changed than the bound holds, and `out` is not complete.
    pub fn take_changes(&mut self, out: &mut Vec<LineChange>) -> Result<bool, NodeInvariantError> {
        let complete = !std::mem::take(&mut self.changes_overflowed);
        let mut kws = self
            .changes
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default();
        if let Some(reaped) = self.reaped.as_mut() {
            out.append(reaped);
        }
        kws.sort_unstable();
        kws.dedup();
        let mut result = Ok(complete);
        for kw in &kws {
            let Some(state) = self.keys.get_mut(&kw.key) else {
                continue;
            };
            // Neither the checks nor the sums read demand: skip catching the track up.
            let demand = 0;
            let has_bucket_need = state.rec(kw.window).is_some_and(|r| r.place == Place::Live);
            let bucket = if has_bucket_need {
                self.surface.get(&kw.key)
            } else {
                None
            };
            let Some(rec) = state.rec_mut(kw.window) else {
                continue;
            };
            match check_record(bucket.as_deref(), demand, kw, rec) {
                Ok(spend) => rec.spend_floor = spend,
                Err(e) => {
                    if result.is_ok() {
                        result = Err(e);
                    }
                    continue;
                }
            }
            let line = line_of(bucket.as_deref(), demand, kw, rec);
            let now = Some((line.cumulative_spend + line.held_credit, line.self_granted));
            if rec.counted != now {
                out.push(LineChange {
                    key_window: *kw,
                    allowance: rec.allowance,
                    before: rec.counted,
                    after: now,
                });
                rec.counted = now;
            }
        }
        if let Some(c) = self.changes.as_mut()
            && c.capacity() < kws.capacity()
        {
            // Hand the larger buffer back: the log is refilled every step.
            kws.clear();
            *c = kws;
        }
        result
    }

    /// This epoch's line for a key-window, as it would be reported now (tests and the
    /// simulator use it to check fleet-wide truth).
    pub fn line_for(&self, kw: &KeyWindow) -> Option<ReportEntry> {
        self.record(kw).map(|rec| self.line(kw, rec))
    }

    /// Every key-window this epoch has a record for.
    pub fn key_windows(&self) -> impl Iterator<Item = KeyWindow> + '_ {
        self.keys.iter().flat_map(|(key, state)| {
            state.records.iter().map(|(window, _)| KeyWindow {
                key: *key,
                window: *window,
            })
        })
    }

    /// Every record's line, as `line_for` gives it, in one pass: a key's bucket is read
    /// once for all its windows (the simulator checks fleet truth every round with it).
    pub fn for_each_line(&self, mut f: impl FnMut(&ReportEntry)) {
        let round = self.round;
        for (key, state) in &self.keys {
            let bucket = if state.has_live() {
                self.surface.get(key)
            } else {
                None
            };
            let demands = state.demands(round);
            for (window, rec) in &state.records {
                let kw = KeyWindow {
                    key: *key,
                    window: *window,
                };
                f(&line_of(
                    bucket.as_deref(),
                    demands[usize::from(rec.slot)],
                    &kw,
                    rec,
                ));
            }
        }
    }

    /// The node-side safety properties (ARCHITECTURE.md, "Invariants"), checked after
    /// every step by the tests and the simulator.
    pub fn check_invariants(&mut self) -> Result<(), NodeInvariantError> {
        // Each floor moves as its record passes; a failed check puts back every floor it
        // moved, so it leaves them all where they were, as checking whole first would.
        let mut moved = Vec::with_capacity(self.records_len);
        let mut failure = None;
        let round = self.round;
        'keys: for (key, state) in self.keys.iter_mut() {
            let bucket = if state.has_live() {
                self.surface.get(key)
            } else {
                None
            };
            let demands = state.demands(round);
            for (window, rec) in state.records.iter_mut() {
                let kw = KeyWindow {
                    key: *key,
                    window: *window,
                };
                match check_record(bucket.as_deref(), demands[usize::from(rec.slot)], &kw, rec) {
                    Ok(spend) => moved.push(std::mem::replace(&mut rec.spend_floor, spend)),
                    Err(e) => {
                        failure = Some(e);
                        break 'keys;
                    }
                }
            }
        }
        let Some(e) = failure else {
            return Ok(());
        };
        // The map has not changed since, so it iterates in the same order.
        let mut moved = moved.into_iter();
        'restore: for state in self.keys.values_mut() {
            for (_, rec) in state.records.iter_mut() {
                let Some(floor) = moved.next() else {
                    break 'restore;
                };
                rec.spend_floor = floor;
            }
        }
        Err(e)
    }

    /// The same properties for the named key-windows only (those a message just touched),
    /// so a simulator can check after every message without a full scan each time.
    pub fn check_key_windows<'a>(
        &mut self,
        kws: impl IntoIterator<Item = &'a KeyWindow>,
    ) -> Result<(), NodeInvariantError> {
        let mut floors = Vec::new();
        for kw in kws {
            let Some(state) = self.keys.get(&kw.key) else {
                continue;
            };
            if let Some(rec) = state.rec(kw.window) {
                let bucket = match rec.place {
                    Place::Live => self.surface.get(&kw.key),
                    _ => None,
                };
                floors.push((
                    *kw,
                    check_record(
                        bucket.as_deref(),
                        state.demand(rec.slot, self.round),
                        kw,
                        rec,
                    )?,
                ));
            }
        }
        for (kw, spend) in floors {
            if let Some(rec) = self.record_mut(&kw) {
                rec.spend_floor = spend;
            }
        }
        Ok(())
    }
}

/// A record's current numbers as a report line. `bucket` is the key's bucket on the
/// surface, needed only while the record is live (its word holds the credit).
fn line_of(
    bucket: Option<&KeyBucket>,
    demand: u64,
    kw: &KeyWindow,
    rec: &WindowRecord,
) -> ReportEntry {
    let (held, spend) = match rec.place {
        // Saturating: a broken book must reach check_invariants, not panic here.
        Place::Off { credit } => (credit, rec.received().saturating_sub(rec.returned + credit)),
        Place::Live => {
            let held = bucket
                .map(|b| b.credit_in(usize::from(rec.slot), kw.window))
                .unwrap_or(0);
            (held, rec.received().saturating_sub(rec.returned + held))
        }
        Place::Closed { spend } => (0, spend),
    };
    let demand = match rec.place {
        Place::Closed { .. } => 0,
        _ => demand,
    };
    ReportEntry {
        key_window: *kw,
        allowance: rec.allowance,
        cumulative_spend: spend,
        demand,
        held_credit: held,
        applied_grant: rec.applied_grant,
        returned: rec.returned,
        self_granted: rec.self_granted,
    }
}

/// Checks one record; returns its cumulative spend, which must never go backwards.
fn check_record(
    bucket: Option<&KeyBucket>,
    demand: u64,
    kw: &KeyWindow,
    rec: &WindowRecord,
) -> Result<u64, NodeInvariantError> {
    if rec.applied_grant > rec.allowance + rec.returned {
        return Err(NodeInvariantError::GrantAboveAllowance {
            kw: *kw,
            applied: rec.applied_grant,
            allowance: rec.allowance,
        });
    }
    if rec.place == Place::Live {
        let ours = bucket.is_some_and(|b| {
            let w = b
                .word(usize::from(rec.slot), kw.window)
                .load(std::sync::atomic::Ordering::Acquire);
            credit::word_tag(w) == credit::tag_of(kw.window.number)
        });
        if !ours {
            return Err(NodeInvariantError::WordMismatch { kw: *kw });
        }
    }
    let line = line_of(bucket, demand, kw, rec);
    let used = line.cumulative_spend + line.held_credit + line.returned;
    if used > rec.received() || line.returned > rec.received() {
        return Err(NodeInvariantError::CreditOverspent {
            kw: *kw,
            spend: line.cumulative_spend,
            held: line.held_credit,
            returned: line.returned,
            received: rec.received(),
        });
    }
    if line.cumulative_spend < rec.spend_floor {
        return Err(NodeInvariantError::SpendWentBackwards {
            kw: *kw,
            before: rec.spend_floor,
            after: line.cumulative_spend,
        });
    }
    Ok(line.cumulative_spend)
}

#[cfg(test)]
mod tests {
    use super::{KeyTrack, NodeLimiter};

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

    /// `QuietRun` is `schedule`'s shortcut for running `observe(r, 0, ..)` forward on a
    /// clone of the track: for tracks left by varied traffic (a burst per short window
    /// and a one-window key included), at every quiet round count and idle setting, both
    /// name the same first due round.
    #[test]
    fn a_quiet_run_finds_the_round_a_forward_run_of_observe_finds() {
        let forward = |track: &KeyTrack, rounds: u64, idle_min: u32, idle_cap: u32| {
            let bands: [u32; super::PLAN_WINDOWS_MAX] =
                std::array::from_fn(|slot| super::line_band(track.demand(slot)));
            let mut t = track.clone();
            (1..rounds).find(|j| {
                let moved = t.observe(100 + j, 0, t.last_shorts);
                let idle = t.idle(moved, idle_min, idle_cap);
                idle.iter().any(|i| *i)
                    || (0..super::PLAN_WINDOWS_MAX)
                        .any(|slot| super::line_band(t.demand(slot)) != bands[slot])
            })
        };
        let mut checked = 0;
        let mut found = 0;
        for seed in 0..400u64 {
            let mut track = KeyTrack::default();
            let mut shorts = [0u32; super::PLAN_WINDOWS_MAX + 1];
            let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let mut next = |m: u64| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x % m
            };
            let busy = 1 + next(30);
            for round in 1..=busy {
                let delta = if next(3) == 0 { 0 } else { next(12) };
                // Some decisions stopped by one window only: its demand differs.
                shorts[0] = shorts[0].wrapping_add(u32::try_from(next(delta + 1)).unwrap());
                track.observe(round, delta, shorts);
            }
            for (idle_min, idle_cap) in [(2u32, 8u32), (8, 8), (1, 30)] {
                for rounds in [1u64, 2, 5, 31] {
                    let want = forward(&track, rounds, idle_min, idle_cap);
                    let got = super::QuietRun::of(&track).first_due(rounds, idle_min, idle_cap);
                    assert_eq!(
                        got, want,
                        "seed {seed} idle {idle_min}/{idle_cap} rounds {rounds}"
                    );
                    checked += 1;
                    found += usize::from(want.is_some());
                }
            }
        }
        // Both outcomes are exercised, or the test proves nothing.
        assert!(
            found > checked / 10 && found < checked,
            "{found} of {checked}"
        );
    }

    /// A key not visited for n rounds takes them in at its next visit: the shortcut
    /// once demand has settled at 0 must equal n quiet rounds one by one.
    #[test]
    fn quiet_rounds_taken_in_at_once_equal_one_by_one() {
        for (sample, busy, n) in [(1u64, 1u64, 1u64), (3, 4, 7), (40, 2, 200), (1, 9, 5_000)] {
            let mut a = KeyTrack::default();
            let mut attempts = [0u32; super::PLAN_WINDOWS_MAX + 1];
            for round in 1..=busy {
                attempts[0] += 1;
                a.observe(round, sample, attempts);
            }
            let mut b = a.clone();
            for round in busy + 1..=busy + n {
                a.observe(round, 0, a.last_shorts);
            }
            b.observe_quiet(busy + 1, n);
            let end = busy + n;
            for later in [end, end + 1, end + 10_000] {
                assert_eq!(a.peak(later), b.peak(later), "{sample} {busy} {n} {later}");
            }
            assert_eq!(
                (
                    a.demand_milli,
                    a.last_round_milli,
                    a.idle_rounds,
                    a.quiet_from_milli,
                    a.wanted_round
                ),
                (
                    b.demand_milli,
                    b.last_round_milli,
                    b.idle_rounds,
                    b.quiet_from_milli,
                    b.wanted_round
                ),
                "{sample} {busy} {n}"
            );
        }
    }

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
