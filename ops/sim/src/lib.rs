//! `foldgate sim`: the deterministic fleet simulator and accuracy harness (issue 3).
//!
//! It drives the node limiters and fold owners of `gateway-node` and `fold-workers`, the
//! same state machines the services run, unchanged, through a simulated bus (`bus`) on a
//! virtual clock, with seeded traffic (`traffic`) and faults. It checks their invariants
//! as it goes and books every request against an exact oracle (`oracle`). The
//! `global-sync` baseline (`global_sync`) runs on the same bus with the same traffic.
//!
//! What a "step" is: every protocol event (a node or owner tick, a delivered message, a
//! fast-path exchange, a node restart) is followed by a check of the state machine it
//! touched, over the key-windows it changed, and of the fleet-wide truth (admitted + held
//! <= allowance + self-granted, dead epochs included) for those key-windows. The truth's
//! sums are kept per key-window and moved by each step's changes (`Sim::node_step`), so a
//! check costs what the step changed, not a walk of every node's books. That is a
//! complete check: a key-window no step changed has the same sum as before. Requests
//! between events only move a unit from a node's held credit to its spend, which leaves
//! the sum alone (the node book, checked on every change, keeps spend + held equal to
//! received less returned), and the atomic words themselves stay non-negative. Every
//! `full_check_rounds` rounds every node and owner is checked whole, and the kept sums
//! are cross-checked against a walk of every node's books.

pub mod bus;
pub mod global_sync;
pub mod offload;
pub mod oracle;
pub mod rng;
pub mod traffic;

use std::collections::BTreeMap;
use std::sync::Arc;

use bus_schemas::hashing::DetMap;
use bus_schemas::{KeyId, KeyWindow, NodeEpoch, NodeId, Now, OwnerEpoch, ShardId, WindowSpec};
use fold_core::{FOLD_AGE_BUCKETS, FoldOwner, OwnerConfig, OwnerMode};
use node_core::window::{window_at, window_end_ms};
use node_core::{
    Decision, DecisionSurface, KeyPolicy, Mode, NodeConfig, NodeLimiter, SurfaceConfig, Transmit,
};

use bus::{Bus, BusParams, FastPathFate, Payload, Target};
use global_sync::{GsNode, GsOwner};
use oracle::{Accuracy, Books, BooksThread, ClosedKw, round4};
use traffic::Traffic;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    Uniform,
    Pinned,
    Zipf,
    Bursty,
    Shift,
    HotKey,
    AllBurst,
    OwnerCrash,
    Partition,
    Restarts,
    Lossy,
    Skew,
}

impl Scenario {
    pub const ALL: [Scenario; 12] = [
        Scenario::Uniform,
        Scenario::Pinned,
        Scenario::Zipf,
        Scenario::Bursty,
        Scenario::Shift,
        Scenario::HotKey,
        Scenario::AllBurst,
        Scenario::OwnerCrash,
        Scenario::Partition,
        Scenario::Restarts,
        Scenario::Lossy,
        Scenario::Skew,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Scenario::Uniform => "uniform",
            Scenario::Pinned => "pinned",
            Scenario::Zipf => "zipf",
            Scenario::Bursty => "bursty",
            Scenario::Shift => "shift",
            Scenario::HotKey => "hot-key",
            Scenario::AllBurst => "all-burst",
            Scenario::OwnerCrash => "owner-crash",
            Scenario::Partition => "partition",
            Scenario::Restarts => "restarts",
            Scenario::Lossy => "lossy",
            Scenario::Skew => "skew",
        }
    }

    /// Scenarios with an injected fault: their leasing target is over max <= 2% (A1).
    pub fn is_fault(self) -> bool {
        matches!(
            self,
            Scenario::OwnerCrash
                | Scenario::Partition
                | Scenario::Restarts
                | Scenario::Lossy
                | Scenario::Skew
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum SimMode {
    Leasing,
    Fixed,
    GlobalSync,
}

impl SimMode {
    pub fn name(self) -> &'static str {
        match self {
            SimMode::Leasing => "leasing",
            SimMode::Fixed => "fixed",
            SimMode::GlobalSync => "global-sync",
        }
    }
}

/// A rule of the design lifted for one run, to measure what it costs (`--what-if`).
/// Never a production setting: a report of such a run names them, and so does its
/// replay command.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum WhatIf {
    /// Every fast path the bus delivers is answered within D5's 1 ms (losses stay lost).
    NoFastPathMisses,
    /// D5's one fast path per key per round lifted: every request short of credit asks.
    FastPathEveryRequest,
    /// The owner keeps the endgame's credit and gives it one unit per fast path.
    CentralEndgame,
}

impl WhatIf {
    pub fn name(self) -> &'static str {
        match self {
            WhatIf::NoFastPathMisses => "no-fast-path-misses",
            WhatIf::FastPathEveryRequest => "fast-path-every-request",
            WhatIf::CentralEndgame => "central-endgame",
        }
    }
}

#[derive(Clone, Debug)]
pub struct SimConfig {
    pub scenario: Scenario,
    pub mode: SimMode,
    pub nodes: u32,
    pub keys: u32,
    pub seconds: u64,
    pub seed: u64,
    /// Offered requests per second, fleet-wide.
    pub rate: u64,
    pub loss_pct: f64,
    pub dup_pct: f64,
    pub reorder_pct: f64,
    /// Largest difference between two nodes' wall clocks.
    pub skew_ms: u64,
    /// Plan limits; `None` derives them from the per-key offered rate (see `plan`).
    pub limit_1s: Option<u64>,
    pub limit_60s: Option<u64>,
    /// `partition`: when the bus is cut and for how long.
    pub cut_at_s: Option<u64>,
    pub cut_s: Option<u64>,
    /// Round-trip every envelope through the bus-schemas codec.
    pub codec: bool,
    pub full_check_rounds: u64,
    /// F5: how long a node waits before it reports degraded (30 s in production).
    pub degraded_after_ms: u64,
    /// Windows that begin before this are not booked (the fleet starts cold).
    pub warmup_s: u64,
    /// Owner tuning (C4); `None` keeps `OwnerConfig::reference`.
    pub lead_rounds: Option<u64>,
    pub headroom_permille: Option<u64>,
    pub burst_sigmas: Option<u64>,
    /// Rules lifted for this run (`WhatIf`), sorted and without repeats.
    pub what_if: Vec<WhatIf>,
}

impl SimConfig {
    pub fn new(scenario: Scenario, mode: SimMode) -> Self {
        Self {
            scenario,
            mode,
            nodes: 20,
            keys: 1_000,
            seconds: 60,
            seed: 1,
            rate: 5_000,
            loss_pct: 0.0,
            dup_pct: 0.0,
            reorder_pct: 0.0,
            skew_ms: 0,
            limit_1s: None,
            limit_60s: None,
            cut_at_s: None,
            cut_s: None,
            codec: true,
            full_check_rounds: FULL_CHECK_ROUNDS_DEFAULT,
            degraded_after_ms: 30_000,
            warmup_s: 1,
            lead_rounds: None,
            headroom_permille: None,
            burst_sigmas: None,
            what_if: Vec::new(),
        }
    }

    fn lifts(&self, rule: WhatIf) -> bool {
        self.what_if.contains(&rule)
    }

    /// The 1 s and 60 s plan. By default the 1 s limit is 80% of a key's mean offered rate
    /// (so Poisson traffic is often over it) and the 60 s limit half a minute of it (so a
    /// key that keeps sending runs into the long window halfway through).
    pub fn plan(&self) -> [WindowSpec; 2] {
        let per_key_milli = self.rate * 1_000 / u64::from(self.keys.max(1));
        let l1 = self
            .limit_1s
            .unwrap_or_else(|| (per_key_milli * 8 / 10_000).max(2));
        let l60 = self
            .limit_60s
            .unwrap_or_else(|| (per_key_milli * 30 / 1_000).max(l1 * 2));
        [
            WindowSpec {
                length_ms: 1_000,
                limit: l1,
            },
            WindowSpec {
                length_ms: 60_000,
                limit: l60,
            },
        ]
    }

    fn effective(&self) -> Self {
        let mut c = self.clone();
        if c.scenario == Scenario::Lossy
            && c.loss_pct == 0.0
            && c.dup_pct == 0.0
            && c.reorder_pct == 0.0
        {
            (c.loss_pct, c.dup_pct, c.reorder_pct) = (5.0, 2.0, 10.0);
        }
        if c.scenario == Scenario::Skew && c.skew_ms == 0 {
            c.skew_ms = 50;
        }
        c
    }

    /// The command that reproduces this run exactly.
    pub fn replay_command(&self) -> String {
        let mut s = format!(
            "foldgate sim --scenario {} --mode {} --nodes {} --keys {} --seconds {} --seed {} --rate {}",
            self.scenario.name(),
            self.mode.name(),
            self.nodes,
            self.keys,
            self.seconds,
            self.seed,
            self.rate
        );
        for (flag, v) in [
            ("--loss", self.loss_pct),
            ("--dup", self.dup_pct),
            ("--reorder", self.reorder_pct),
        ] {
            if v != 0.0 {
                s += &format!(" {flag} {v}");
            }
        }
        if self.skew_ms != 0 {
            s += &format!(" --skew-ms {}", self.skew_ms);
        }
        for (flag, v) in [
            ("--limit-1s", self.limit_1s),
            ("--limit-60s", self.limit_60s),
            ("--cut-at-s", self.cut_at_s),
            ("--cut-s", self.cut_s),
        ] {
            if let Some(v) = v {
                s += &format!(" {flag} {v}");
            }
        }
        if !self.codec {
            s += " --no-codec";
        }
        if self.full_check_rounds != FULL_CHECK_ROUNDS_DEFAULT {
            s += &format!(" --full-check-rounds {}", self.full_check_rounds);
        }
        for (flag, v) in [
            ("--lead-rounds", self.lead_rounds),
            ("--headroom-permille", self.headroom_permille),
            ("--burst-sigmas", self.burst_sigmas),
        ] {
            if let Some(v) = v {
                s += &format!(" {flag} {v}");
            }
        }
        if self.warmup_s != 1 {
            s += &format!(" --warmup-s {}", self.warmup_s);
        }
        if self.degraded_after_ms != 30_000 {
            s += &format!(" --degraded-after-ms {}", self.degraded_after_ms);
        }
        if !self.what_if.is_empty() {
            let names: Vec<_> = self.what_if.iter().map(|w| w.name()).collect();
            s += &format!(" --what-if {}", names.join(","));
        }
        s
    }
}

/// Full checks and the fleet-truth cross-check run once per simulated second by default:
/// every step is checked as it happens, so the full walk is a check of the checker.
pub const FULL_CHECK_ROUNDS_DEFAULT: u64 = 40;

#[derive(thiserror::Error, Debug)]
pub enum SimError {
    #[error("--nodes must be 2..=1024, --keys >= 1, --seconds >= 2 and --rate >= 1")]
    Shape,
    #[error("plan: {0}")]
    Policy(#[from] node_core::PolicyError),
}

/// One run's result: the summary and the closed key-windows behind it.
pub struct RunOutcome {
    pub counts: Counts,
    pub closed: Vec<ClosedKw>,
    /// Each violation, with the run's replay command.
    pub violations: Vec<String>,
}

#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct Counts {
    pub offered: u64,
    pub admitted: u64,
    pub fail_open_admitted: u64,
    pub denied: u64,
    pub fast_path: u64,
    pub fast_path_deadline_missed: u64,
    pub self_grants: u64,
    pub degraded_node_rounds: u64,
    pub owner_changes: u64,
    pub node_restarts: u64,
    pub bus_sent: u64,
    pub bus_lost: u64,
    pub bus_cut: u64,
    /// The protocol's work, for the node epochs alive at the end: report lines sent,
    /// keys their rounds visited, grant entries applied (the simulator's cost follows
    /// these more than the request count).
    pub report_entries: u64,
    pub keys_visited: u64,
    pub grants_applied: u64,
    /// C10: report entries folded in the owners' hot lane.
    pub hot_deferred: u64,
    /// Fold age histograms (whole rounds, last bucket = that many or more), summed over
    /// owners: keys outside the hot set, and hot keys.
    pub fold_age_rounds_cold: [u64; FOLD_AGE_BUCKETS],
    pub fold_age_rounds_hot: [u64; FOLD_AGE_BUCKETS],
}

impl Counts {
    fn add(&mut self, o: &Counts) {
        self.offered += o.offered;
        self.admitted += o.admitted;
        self.fail_open_admitted += o.fail_open_admitted;
        self.denied += o.denied;
        self.fast_path += o.fast_path;
        self.fast_path_deadline_missed += o.fast_path_deadline_missed;
        self.self_grants += o.self_grants;
        self.degraded_node_rounds += o.degraded_node_rounds;
        self.owner_changes += o.owner_changes;
        self.node_restarts += o.node_restarts;
        self.bus_sent += o.bus_sent;
        self.bus_lost += o.bus_lost;
        self.bus_cut += o.bus_cut;
        self.report_entries += o.report_entries;
        self.keys_visited += o.keys_visited;
        self.grants_applied += o.grants_applied;
        self.add_owner_histograms(
            o.hot_deferred,
            &o.fold_age_rounds_cold,
            &o.fold_age_rounds_hot,
        );
    }

    fn add_owner_histograms(
        &mut self,
        hot_deferred: u64,
        cold: &[u64; FOLD_AGE_BUCKETS],
        hot: &[u64; FOLD_AGE_BUCKETS],
    ) {
        self.hot_deferred += hot_deferred;
        for i in 0..FOLD_AGE_BUCKETS {
            self.fold_age_rounds_cold[i] += cold[i];
            self.fold_age_rounds_hot[i] += hot[i];
        }
    }

    fn add_owner(&mut self, owner: &FoldOwner) {
        let s = owner.stats();
        self.add_owner_histograms(
            s.hot_deferred,
            &s.fold_age_rounds_cold,
            &s.fold_age_rounds_hot,
        );
    }
}

/// The p99 of a fold-age histogram, in rounds.
fn p99_rounds(h: &[u64; FOLD_AGE_BUCKETS]) -> u64 {
    let total: u64 = h.iter().sum();
    let want = total - total / 100;
    let mut seen = 0;
    for (i, n) in h.iter().enumerate() {
        seen += n;
        if seen >= want && total > 0 {
            return i as u64;
        }
    }
    0
}

#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct PlanWindow {
    pub length_ms: u32,
    pub limit: u64,
}

/// The `--json` object. The first fields are the interface other tooling reads.
#[derive(Debug, serde::Serialize)]
pub struct SimReport {
    pub scenario: Scenario,
    pub mode: SimMode,
    pub seed: u64,
    pub seeds: u64,
    pub nodes: u32,
    pub keys: u32,
    pub sim_seconds: u64,
    pub offered: u64,
    pub admitted: u64,
    pub fail_open_admitted: u64,
    pub over_admission_pct_max: f64,
    pub over_admission_pct_p99: f64,
    pub under_admission_pct_p99: f64,
    pub under_admission_pct_mean: f64,
    pub fast_path_share_pct: f64,
    pub invariant_violations: u64,
    pub wall_ms: u64,
    pub rate: u64,
    pub plan: [PlanWindow; 2],
    /// The same accuracy figures per window kind ("1000", "60000").
    pub by_window: BTreeMap<String, Accuracy>,
    /// A57/C10: p99 fold age, in rounds, of keys outside the hot set and of hot keys.
    pub fold_age_p99_rounds_cold: u64,
    pub fold_age_p99_rounds_hot: u64,
    pub counts: Counts,
    pub replay: String,
    /// The rules this run lifted (`--what-if`); absent for the design as built.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub what_if: Vec<WhatIf>,
}

impl SimReport {
    pub fn build(cfg: &SimConfig, seeds: u64, outcomes: &[RunOutcome], wall_ms: u64) -> Self {
        let mut counts = Counts::default();
        for o in outcomes {
            counts.add(&o.counts);
        }
        let all = Accuracy::of(outcomes.iter().flat_map(|o| o.closed.iter()));
        let plan = cfg.plan();
        let by_window = plan
            .iter()
            .map(|w| {
                (
                    w.length_ms.to_string(),
                    Accuracy::of(
                        outcomes
                            .iter()
                            .flat_map(|o| o.closed.iter())
                            .filter(|c| c.window_kind == w.length_ms),
                    ),
                )
            })
            .collect();
        Self {
            scenario: cfg.scenario,
            mode: cfg.mode,
            seed: cfg.seed,
            seeds,
            nodes: cfg.nodes,
            keys: cfg.keys,
            sim_seconds: cfg.seconds,
            offered: counts.offered,
            admitted: counts.admitted,
            fail_open_admitted: counts.fail_open_admitted,
            over_admission_pct_max: all.over_admission_pct_max,
            over_admission_pct_p99: all.over_admission_pct_p99,
            under_admission_pct_p99: all.under_admission_pct_p99,
            under_admission_pct_mean: all.under_admission_pct_mean,
            fast_path_share_pct: round4(
                counts.fast_path as f64 * 100.0 / counts.offered.max(1) as f64,
            ),
            invariant_violations: outcomes.iter().map(|o| o.violations.len() as u64).sum(),
            wall_ms,
            rate: cfg.rate,
            plan: plan.map(|w| PlanWindow {
                length_ms: w.length_ms,
                limit: w.limit,
            }),
            by_window,
            fold_age_p99_rounds_cold: p99_rounds(&counts.fold_age_rounds_cold),
            fold_age_p99_rounds_hot: p99_rounds(&counts.fold_age_rounds_hot),
            counts,
            replay: cfg.replay_command(),
            what_if: cfg.what_if.clone(),
        }
    }
}

/// The virtual wall clock's origin (true time); nodes add their skew to it.
const WALL0_MS: u64 = 1_764_720_000_000;
const MONO0_MS: u64 = 1_000_000;
const ROUND_MS: u64 = 25;
/// `owner-crash`: a new owner takes over this long after the old one died (the lease of
/// the NATS runtime lapses in a few rounds).
const TAKEOVER_AFTER_MS: u64 = 4 * ROUND_MS;
/// `restarts`: how long a restarting node is gone (its traffic goes to the next node).
const RESTART_DOWN_MS: u64 = 300;
/// Violations kept per run (the count is exact; the text of the first few is enough).
const VIOLATIONS_KEPT: usize = 16;

struct SimNode {
    limiter: Option<NodeLimiter>,
    gs: GsNode,
    skew_ms: i64,
    phase_ms: u64,
    down_until_ms: u64,
}

struct SimOwner {
    owner: Option<FoldOwner>,
    gs: GsOwner,
    epoch: u64,
    revive_at_ms: Option<u64>,
    phase_ms: u64,
}

struct Faults {
    cut: Option<(u64, u64)>,
    crash_at_ms: Option<u64>,
    restarts: Vec<(u64, u32)>,
}

impl Faults {
    fn of(cfg: &SimConfig) -> Self {
        let sim_ms = cfg.seconds * 1_000;
        let cut = (cfg.scenario == Scenario::Partition).then(|| {
            let at = cfg.cut_at_s.map_or(sim_ms / 5, |s| s * 1_000);
            let len = cfg
                .cut_s
                .map_or((sim_ms * 3 / 5).min(35_000), |s| s * 1_000);
            (at, at + len)
        });
        // Mid-window for the 1 s windows of most keys, 40% of the way through the run.
        let crash_at_ms = (cfg.scenario == Scenario::OwnerCrash).then_some(sim_ms * 2 / 5 + 500);
        // A46: 3 of 20 nodes restart within one window.
        let restarts = if cfg.scenario == Scenario::Restarts {
            let at = sim_ms / 2;
            (0..cfg.nodes.min(3))
                .map(|i| (at + 100 + 300 * u64::from(i), i))
                .collect()
        } else {
            Vec::new()
        };
        Self {
            cut,
            crash_at_ms,
            restarts,
        }
    }
}

struct Sim {
    cfg: SimConfig,
    policy: KeyPolicy,
    plan: [WindowSpec; 2],
    keys: Vec<KeyId>,
    nodes: Vec<SimNode>,
    owners: Vec<SimOwner>,
    bus: Bus,
    books: BooksThread,
    counts: Counts,
    violations: Vec<String>,
    violation_count: u64,
    next_node_epoch: u64,
    /// Spend of node epochs that died: admitted requests still count (C9).
    dead_spend: Vec<(KeyWindow, u64, u64)>,
    /// Fleet truth per key-window, kept up to date by every step (`node_step`).
    truth: DetMap<KeyWindow, Truth>,
    /// The cross-check's walk (`check_fleet_truth`), kept between walks: built from
    /// empty each time, the map's growth cost as much as filling it.
    truth_walk: DetMap<KeyWindow, (u64, u64, u64)>,
    changed: Vec<node_core::LineChange>,
}

/// One key-window's fleet truth: live node epochs' lines and dead epochs' spend.
#[derive(Clone, Copy, Debug, Default)]
struct Truth {
    allowance: u64,
    live_used: u64,
    live_self_granted: u64,
    live_lines: u32,
    dead_used: u64,
    dead_self_granted: u64,
    dead_lines: u32,
}

impl Truth {
    /// (used, self-granted) across the fleet, or None while no live node has a line (a
    /// dead epoch's spend alone is not checked, as before).
    fn sums(&self) -> Option<(u64, u64)> {
        (self.live_lines > 0).then_some((
            self.live_used + self.dead_used,
            self.live_self_granted + self.dead_self_granted,
        ))
    }
}

fn node_config(cfg: &SimConfig, i: u32) -> NodeConfig {
    NodeConfig {
        fleet_size: cfg.nodes,
        shards: cfg.nodes,
        mode: if cfg.mode == SimMode::Fixed {
            Mode::Fixed
        } else {
            Mode::Leasing
        },
        degraded_after_ms: cfg.degraded_after_ms,
        ..NodeConfig::reference(NodeId(i))
    }
}

fn owner_config(cfg: &SimConfig, shard: u32) -> OwnerConfig {
    let reference = OwnerConfig::reference(ShardId(shard));
    OwnerConfig {
        lead_rounds: cfg.lead_rounds.unwrap_or(reference.lead_rounds),
        headroom_permille: cfg.headroom_permille.unwrap_or(reference.headroom_permille),
        burst_sigmas: cfg.burst_sigmas.unwrap_or(reference.burst_sigmas),
        what_if_central_endgame: cfg.lifts(WhatIf::CentralEndgame),
        shards: cfg.nodes,
        fleet_size: cfg.nodes,
        mode: if cfg.mode == SimMode::Fixed {
            OwnerMode::Fixed
        } else {
            OwnerMode::Leasing
        },
        ..reference
    }
}

fn surface_for(cfg: &SimConfig) -> Arc<DecisionSurface> {
    Arc::new(DecisionSurface::new(SurfaceConfig {
        // Room for every key with eviction headroom (D7 starts at 90% of the cap).
        bucket_cap: (cfg.keys as usize * 2).max(1_024),
        // Nothing here races a rehash, and compact tables keep the fleet in cache.
        presize: false,
        what_if_fast_path_every_request: cfg.lifts(WhatIf::FastPathEveryRequest),
        ..SurfaceConfig::default()
    }))
}

impl Sim {
    fn new(cfg: SimConfig) -> Result<Self, SimError> {
        if !(2..=1_024).contains(&cfg.nodes) || cfg.keys == 0 || cfg.seconds < 2 || cfg.rate == 0 {
            return Err(SimError::Shape);
        }
        let plan = cfg.plan();
        let policy = KeyPolicy::new(&plan, ROUND_MS as u32)?;
        let mut rng = rng::Rng::stream(cfg.seed, 0x5e7);
        let keys: Vec<KeyId> = (0..cfg.keys)
            .map(|_| KeyId {
                version: 1,
                digest: (u128::from(rng.next_u64()) << 64) | u128::from(rng.next_u64()) | 1,
            })
            .collect();
        let now0 = |skew: i64| Now {
            wall_ms: WALL0_MS.wrapping_add_signed(skew),
            mono_ms: MONO0_MS,
        };
        let nodes = (0..cfg.nodes)
            .map(|i| {
                let skew_ms = if cfg.skew_ms == 0 {
                    0
                } else {
                    rng.below(cfg.skew_ms + 1) as i64 - (cfg.skew_ms / 2) as i64
                };
                SimNode {
                    limiter: (cfg.mode != SimMode::GlobalSync).then(|| {
                        let mut l = NodeLimiter::new(
                            node_config(&cfg, i),
                            surface_for(&cfg),
                            NodeEpoch(1),
                            now0(skew_ms),
                        );
                        l.track_changes();
                        l
                    }),
                    gs: GsNode::default(),
                    skew_ms,
                    phase_ms: rng.below(ROUND_MS),
                    down_until_ms: 0,
                }
            })
            .collect();
        let owners = (0..cfg.nodes)
            .map(|s| SimOwner {
                owner: (cfg.mode != SimMode::GlobalSync)
                    .then(|| FoldOwner::new(owner_config(&cfg, s), OwnerEpoch(1), now0(0), false)),
                gs: GsOwner::default(),
                epoch: 1,
                revive_at_ms: None,
                phase_ms: rng.below(ROUND_MS),
            })
            .collect();
        let params = BusParams {
            loss_pct: cfg.loss_pct,
            dup_pct: cfg.dup_pct,
            reorder_pct: cfg.reorder_pct,
            base_us: 150,
            jitter_mean_us: 100.0,
            reorder_max_us: 2 * ROUND_MS * 1_000,
            codec: cfg.codec,
            no_fast_path_misses: cfg.lifts(WhatIf::NoFastPathMisses),
        };
        Ok(Self {
            bus: Bus::new(params, cfg.seed),
            books: BooksThread::start(Books::new(keys.clone(), plan.to_vec())),
            policy,
            plan,
            keys,
            nodes,
            owners,
            counts: Counts::default(),
            violations: Vec::new(),
            violation_count: 0,
            next_node_epoch: 2,
            dead_spend: Vec::new(),
            truth: DetMap::default(),
            truth_walk: DetMap::default(),
            changed: Vec::new(),
            cfg,
        })
    }

    fn node_now(&self, i: usize, t_ms: u64) -> Now {
        Now {
            wall_ms: (WALL0_MS + t_ms).wrapping_add_signed(self.nodes[i].skew_ms),
            mono_ms: MONO0_MS + t_ms,
        }
    }

    fn owner_now(t_ms: u64) -> Now {
        Now {
            wall_ms: WALL0_MS + t_ms,
            mono_ms: MONO0_MS + t_ms,
        }
    }

    fn violation(&mut self, t_ms: u64, what: String) {
        self.violation_count += 1;
        if self.violations.len() < VIOLATIONS_KEPT {
            self.violations.push(format!(
                "t={t_ms} ms seed={}: {what}\n  replay: {}",
                self.cfg.seed,
                self.cfg.replay_command()
            ));
        }
    }

    fn send_transmits(&mut self, i: usize, t_ms: u64) {
        let Some(limiter) = self.nodes[i].limiter.as_mut() else {
            return;
        };
        let mut out = Vec::new();
        while let Some(t) = limiter.poll_transmit() {
            out.push(t);
        }
        for t in out {
            match t {
                Transmit::Report(r) => {
                    let shard = r.shard.0;
                    self.bus
                        .send(t_ms * 1_000, Target::Owner(shard), Payload::Report(r));
                }
                Transmit::FastPath(f) => {
                    // Only produced by `request`, which handles it itself.
                    let shard = f.shard.0;
                    self.bus.send(
                        t_ms * 1_000,
                        Target::Owner(shard),
                        Payload::FastPathRequest(f),
                    );
                }
            }
        }
    }

    fn send_grants(&mut self, s: usize, t_ms: u64) {
        let Some(owner) = self.owners[s].owner.as_mut() else {
            return;
        };
        let mut out = Vec::new();
        while let Some(g) = owner.poll_grant() {
            out.push(g);
        }
        self.send_grant_batches(t_ms, out);
    }

    fn send_grant_batches(&mut self, t_ms: u64, out: Vec<bus_schemas::GrantBatch>) {
        for g in out {
            let node = g.node.0;
            self.bus
                .send(t_ms * 1_000, Target::Node(node), Payload::Grant(g));
        }
    }

    fn deliver(&mut self, t_ms: u64, target: Target, payload: &Payload) {
        match (target, payload) {
            (Target::Owner(s), Payload::Report(r)) => {
                let now = Self::owner_now(t_ms);
                let Some(owner) = self.owners[s as usize].owner.as_mut() else {
                    return;
                };
                owner.handle_report_batch(now, r);
                if let Err(e) = owner.check_key_windows(r.entries.iter().map(|e| &e.key_window)) {
                    self.violation(t_ms, format!("owner {s}: {e}"));
                }
                self.send_grants(s as usize, t_ms);
            }
            (Target::Owner(s), Payload::FastPathRequest(f)) => {
                let now = Self::owner_now(t_ms);
                let Some(owner) = self.owners[s as usize].owner.as_mut() else {
                    return;
                };
                let reply = owner.handle_fast_path_request(now, f);
                if let Err(e) = owner.check_key_windows([&f.entry.key_window]) {
                    self.violation(t_ms, format!("owner {s}: {e}"));
                }
                self.bus.send(
                    t_ms * 1_000,
                    Target::Node(f.node.0),
                    Payload::FastPathReply(reply),
                );
            }
            (Target::Node(n), Payload::Grant(g)) => {
                let now = self.node_now(n as usize, t_ms);
                let Some(limiter) = self.nodes[n as usize].limiter.as_mut() else {
                    return;
                };
                limiter.handle_grant_batch(now, g);
                self.node_step(n as usize, t_ms);
            }
            (Target::Node(n), Payload::FastPathReply(r)) => {
                let now = self.node_now(n as usize, t_ms);
                if let Some(limiter) = self.nodes[n as usize].limiter.as_mut() {
                    limiter.handle_fast_path_reply(now, r);
                    self.node_step(n as usize, t_ms);
                }
            }
            (Target::Owner(s), Payload::GsHits(h)) => {
                let plan = self.plan;
                let limit_of = |len: u32| {
                    plan.iter()
                        .find(|w| w.length_ms == len)
                        .map_or(0, |w| w.limit)
                };
                if self.owners[s as usize].revive_at_ms.is_none() {
                    self.owners[s as usize].gs.handle_hits(h, limit_of);
                }
            }
            (Target::Node(n), Payload::GsRemaining(r)) => {
                self.nodes[n as usize].gs.handle_remaining(r);
            }
            _ => {}
        }
    }

    fn tick_node(&mut self, i: usize, t_ms: u64) {
        let now = self.node_now(i, t_ms);
        if self.cfg.mode == SimMode::GlobalSync {
            let nodes = self.cfg.nodes;
            let keys = &self.keys;
            let hits = self.nodes[i].gs.flush(|k| {
                KeyWindow {
                    key: keys[k as usize],
                    window: bus_schemas::WindowId {
                        length_ms: 1_000,
                        number: 0,
                    },
                }
                .shard(nodes)
                .0
            });
            for h in hits {
                let shard = h.shard;
                self.bus
                    .send(t_ms * 1_000, Target::Owner(shard), Payload::GsHits(h));
            }
            if t_ms.is_multiple_of(1_000) {
                self.nodes[i].gs.reap(|kw| gs_ended(keys, kw, now.wall_ms));
            }
            return;
        }
        let Some(limiter) = self.nodes[i].limiter.as_mut() else {
            return;
        };
        limiter.handle_tick(now);
        let degraded = limiter.surface().degraded();
        self.node_step(i, t_ms);
        let limiter = self.nodes[i].limiter.as_mut().expect("ticked above");
        if (t_ms / ROUND_MS).is_multiple_of(self.cfg.full_check_rounds)
            && let Err(e) = limiter.check_invariants()
        {
            self.violation(t_ms, format!("node {i}: {e}"));
        }
        self.counts.degraded_node_rounds += u64::from(degraded);
        self.send_transmits(i, t_ms);
    }

    fn tick_owner(&mut self, s: usize, t_ms: u64) {
        let now = Self::owner_now(t_ms);
        if self.cfg.mode == SimMode::GlobalSync {
            if self.owners[s].revive_at_ms.is_some() {
                return;
            }
            for r in self.owners[s].gs.broadcast(self.cfg.nodes) {
                let node = r.node;
                self.bus
                    .send(t_ms * 1_000, Target::Node(node), Payload::GsRemaining(r));
            }
            if t_ms.is_multiple_of(1_000) {
                let keys = self.keys.clone();
                self.owners[s]
                    .gs
                    .reap(|kw| gs_ended(&keys, kw, now.wall_ms));
            }
            return;
        }
        let Some(owner) = self.owners[s].owner.as_mut() else {
            return;
        };
        owner.handle_tick(now);
        let mut out = Vec::new();
        while let Some(g) = owner.poll_grant() {
            out.push(g);
        }
        // A tick changes the ledgers it grants from (the hot lane) and drops reaped ones.
        let checked = if (t_ms / ROUND_MS).is_multiple_of(self.cfg.full_check_rounds) {
            owner.check_invariants()
        } else {
            owner.check_key_windows(
                out.iter()
                    .flat_map(|g| g.entries.iter().map(|e| &e.key_window)),
            )
        };
        if let Err(e) = checked {
            self.violation(t_ms, format!("owner {s}: {e}"));
        }
        self.send_grant_batches(t_ms, out);
    }

    /// After a step that touched node `i`: its book and the fleet truth, checked for the
    /// key-windows the step changed, the truth's sums moved by what changed (see the
    /// module comment for why that is complete).
    fn node_step(&mut self, i: usize, t_ms: u64) {
        let mut changed = std::mem::take(&mut self.changed);
        changed.clear();
        let Some(limiter) = self.nodes[i].limiter.as_mut() else {
            self.changed = changed;
            return;
        };
        let mut found = Vec::new();
        match limiter.take_changes(&mut changed) {
            Ok(true) => {}
            Ok(false) => found.push(format!("node {i}: more changes than its log holds")),
            Err(e) => found.push(format!("node {i}: {e}")),
        }
        // A reaped line's removal comes before any new line for its key-window, so a
        // sum checked as each change lands never exceeds the step's final one.
        let mut breached = Vec::new();
        for c in &changed {
            if truth_move(
                &mut self.truth,
                c.key_window,
                c.allowance,
                c.before,
                c.after,
            ) {
                breached.push(c.key_window);
            }
        }
        self.changed = changed;
        breached.sort_unstable();
        breached.dedup();
        found.extend(
            breached
                .iter()
                .filter_map(|kw| truth_breach(&self.truth, kw)),
        );
        for f in found {
            self.violation(t_ms, f);
        }
    }

    /// Fleet-wide truth per key-window: admitted plus still-spendable credit across every
    /// epoch, dead ones included, never exceeds the allowance plus what nodes gave
    /// themselves (F4). Every step checks the key-windows it changed (`node_step`); this
    /// walk of every node's books, every `full_check_rounds` rounds, checks them all and
    /// cross-checks the kept sums against it.
    fn check_fleet_truth(&mut self, t_ms: u64) {
        let mut walk = std::mem::take(&mut self.truth_walk);
        for n in &self.nodes {
            let Some(l) = n.limiter.as_ref() else {
                continue;
            };
            l.for_each_line(|line| {
                let t = walk
                    .entry(line.key_window)
                    .or_insert((0, 0, line.allowance));
                t.0 += line.cumulative_spend + line.held_credit;
                t.1 += line.self_granted;
            });
        }
        for (kw, spend, self_granted) in &self.dead_spend {
            if let Some(t) = walk.get_mut(kw) {
                t.0 += spend;
                t.1 += self_granted;
            }
        }
        let kept_live = self.truth.values().filter(|t| t.live_lines > 0).count();
        if kept_live != walk.len() {
            let count = walk.len();
            self.violation(
                t_ms,
                format!("fleet truth: {kept_live} key-windows kept, {count} walked"),
            );
        }
        let mut bad: Vec<(KeyWindow, String)> = Vec::new();
        // Only breaches are sorted (for a stable report order); the scan itself is O(lines).
        for (kw, (used, self_granted, allowance)) in walk.drain() {
            let kept = self.truth.get(&kw).and_then(Truth::sums);
            if kept != Some((used, self_granted)) {
                bad.push((
                    kw,
                    format!("fleet truth {kw:?}: kept {kept:?}, walked ({used}, {self_granted})"),
                ));
            }
            if used > allowance.saturating_add(self_granted) {
                bad.push((
                    kw,
                    format!(
                        "fleet truth {kw:?}: used {used} > allowance {allowance} + self-granted {self_granted}"
                    ),
                ));
            }
        }
        self.truth_walk = walk;
        bad.sort_unstable_by_key(|(kw, _)| *kw);
        for (_, b) in bad {
            self.violation(t_ms, b);
        }
    }

    /// Dead epochs' lines matter only while their window is open.
    fn expire_dead_spend(&mut self, t_ms: u64) {
        let wall = WALL0_MS + t_ms;
        let truth = &mut self.truth;
        self.dead_spend.retain(|(kw, spend, self_granted)| {
            if window_end_ms(kw.key, kw.window) + 1_000 > wall {
                return true;
            }
            let t = truth.get_mut(kw).expect("every dead line is kept");
            t.dead_used -= spend;
            t.dead_self_granted -= self_granted;
            t.dead_lines -= 1;
            if t.live_lines == 0 && t.dead_lines == 0 {
                truth.remove(kw);
            }
            false
        });
    }

    fn restart_node(&mut self, i: usize, t_ms: u64) {
        if let Some(old) = self.nodes[i].limiter.take() {
            let mut touched = Vec::new();
            let (dead, truth) = (&mut self.dead_spend, &mut self.truth);
            old.for_each_line(|line| {
                let kw = line.key_window;
                // Its live part is what it last counted: only decisions came since.
                truth_move(
                    truth,
                    kw,
                    line.allowance,
                    Some((line.cumulative_spend + line.held_credit, line.self_granted)),
                    None,
                );
                dead.push((kw, line.cumulative_spend, line.self_granted));
                let t = truth.entry(kw).or_insert(Truth {
                    allowance: line.allowance,
                    ..Truth::default()
                });
                t.dead_used += line.cumulative_spend;
                t.dead_self_granted += line.self_granted;
                t.dead_lines += 1;
                touched.push(kw);
            });
            touched.sort_unstable();
            touched.dedup();
            let found: Vec<String> = touched
                .iter()
                .filter_map(|kw| truth_breach(&self.truth, kw))
                .collect();
            for f in found {
                self.violation(t_ms, f);
            }
            self.counts.self_grants += old.stats().self_grants;
        }
        self.nodes[i].gs = GsNode::default();
        self.nodes[i].down_until_ms = t_ms + RESTART_DOWN_MS;
        self.counts.node_restarts += 1;
    }

    fn revive_node(&mut self, i: usize, t_ms: u64) {
        if self.cfg.mode == SimMode::GlobalSync || self.nodes[i].limiter.is_some() {
            return;
        }
        let epoch = NodeEpoch(self.next_node_epoch);
        self.next_node_epoch += 1;
        let now = self.node_now(i, t_ms);
        let mut limiter = NodeLimiter::new(
            node_config(&self.cfg, i as u32),
            surface_for(&self.cfg),
            epoch,
            now,
        );
        limiter.track_changes();
        self.nodes[i].limiter = Some(limiter);
    }

    fn crash_owners(&mut self, t_ms: u64) {
        // Half the shards lose their owner mid-window.
        for s in (0..self.owners.len()).step_by(2) {
            if let Some(dead) = self.owners[s].owner.take() {
                self.counts.add_owner(&dead);
            }
            self.owners[s].gs = GsOwner::default();
            self.owners[s].revive_at_ms = Some(t_ms + TAKEOVER_AFTER_MS);
        }
    }

    fn revive_owners(&mut self, t_ms: u64) {
        for s in 0..self.owners.len() {
            if self.owners[s].revive_at_ms.is_some_and(|at| at <= t_ms) {
                self.owners[s].revive_at_ms = None;
                self.owners[s].epoch += 1;
                self.counts.owner_changes += 1;
                if self.cfg.mode != SimMode::GlobalSync {
                    // C8: the new owner rebuilds from reports and withholds.
                    self.owners[s].owner = Some(FoldOwner::new(
                        owner_config(&self.cfg, s as u32),
                        OwnerEpoch(self.owners[s].epoch),
                        Self::owner_now(t_ms),
                        true,
                    ));
                }
            }
        }
    }

    /// One request at node `i` (already rerouted if its node was down).
    fn request(&mut self, k: u32, i: usize, t_ms: u64) {
        self.counts.offered += 1;
        let true_wall = WALL0_MS + t_ms;
        self.books.offer(k, true_wall);
        let now = self.node_now(i, t_ms);
        let key = self.keys[k as usize];
        let admitted = if self.cfg.mode == SimMode::GlobalSync {
            let kws = self.plan.map(|w| {
                (
                    (
                        k,
                        w.length_ms,
                        window_at(key, w.length_ms, now.wall_ms).number,
                    ),
                    w.limit,
                )
            });
            self.nodes[i].gs.decide(&kws)
        } else {
            self.decide_leasing(key, i, t_ms, now)
        };
        if admitted {
            self.counts.admitted += 1;
            self.books.admitted(k, now.wall_ms);
        } else {
            self.counts.denied += 1;
        }
    }

    fn decide_leasing(&mut self, key: KeyId, i: usize, t_ms: u64, now: Now) -> bool {
        let Some(limiter) = self.nodes[i].limiter.as_mut() else {
            return false;
        };
        let surface = Arc::clone(limiter.surface());
        let mut d = surface.decide(key, now.wall_ms, &self.policy);
        if let Decision::FastPath(need) = d {
            self.counts.fast_path += 1;
            limiter.handle_fast_path_need(now, need);
            let mut requests = Vec::new();
            while let Some(t) = limiter.poll_transmit() {
                if let Transmit::FastPath(f) = t {
                    requests.push(f);
                }
            }
            let mut missed = false;
            for f in requests {
                let s = f.shard.0 as usize;
                match self.bus.fast_path(t_ms * 1_000) {
                    FastPathFate::OnTime if self.owners[s].owner.is_some() => {
                        let owner_now = Self::owner_now(t_ms);
                        let owner = self.owners[s].owner.as_mut().expect("checked");
                        let reply = owner.handle_fast_path_request(owner_now, &f);
                        if let Err(e) = owner.check_key_windows([&f.entry.key_window]) {
                            self.violation(t_ms, format!("owner {s}: {e}"));
                        }
                        let limiter = self.nodes[i].limiter.as_mut().expect("present");
                        limiter.handle_fast_path_reply(now, &reply);
                    }
                    FastPathFate::OnTime | FastPathFate::Lost => missed = true,
                    FastPathFate::Late { at_us } => {
                        missed = true;
                        self.bus.schedule(
                            at_us,
                            Target::Owner(s as u32),
                            Payload::FastPathRequest(f),
                        );
                    }
                }
            }
            self.counts.fast_path_deadline_missed += u64::from(missed);
            // The exchange is one step: the records the need made, the replies applied.
            self.node_step(i, t_ms);
            d = surface.decide_after_fast_path(key, now.wall_ms, &self.policy, missed);
        }
        match d {
            Decision::Admit => true,
            Decision::FailOpen => {
                self.counts.fail_open_admitted += 1;
                true
            }
            Decision::Deny(_) => false,
            Decision::FastPath(_) => {
                self.violation(t_ms, "fast path offered twice for one request".into());
                false
            }
        }
    }

    fn run(mut self) -> RunOutcome {
        let sim_ms = self.cfg.seconds * 1_000;
        let mut traffic = Traffic::new(
            self.cfg.scenario,
            self.cfg.seed,
            self.cfg.keys as usize,
            self.cfg.nodes as usize,
            self.cfg.rate,
            sim_ms,
        );
        let faults = Faults::of(&self.cfg);
        let mut arrivals = Vec::new();
        let n = self.nodes.len();
        for t_ms in 0..sim_ms {
            if let Some((from, to)) = faults.cut {
                self.bus.set_cut(t_ms >= from && t_ms < to);
            }
            if faults.crash_at_ms == Some(t_ms) {
                self.crash_owners(t_ms);
            }
            self.revive_owners(t_ms);
            for &(at, i) in &faults.restarts {
                if at == t_ms {
                    self.restart_node(i as usize, t_ms);
                }
            }
            for i in 0..n {
                if self.nodes[i].down_until_ms == t_ms && t_ms > 0 {
                    self.revive_node(i, t_ms);
                }
            }
            while let Some((target, payload)) = self.bus.pop_due(t_ms * 1_000) {
                self.deliver(t_ms, target, &payload);
                self.bus.checked(payload);
            }
            for i in 0..n {
                if (t_ms + self.nodes[i].phase_ms).is_multiple_of(ROUND_MS)
                    && self.nodes[i].down_until_ms <= t_ms
                {
                    self.tick_node(i, t_ms);
                }
            }
            for s in 0..self.owners.len() {
                if (t_ms + self.owners[s].phase_ms).is_multiple_of(ROUND_MS) {
                    self.tick_owner(s, t_ms);
                }
            }
            if t_ms.is_multiple_of(ROUND_MS) && self.cfg.mode != SimMode::GlobalSync {
                self.expire_dead_spend(t_ms);
                if t_ms.is_multiple_of(ROUND_MS * self.cfg.full_check_rounds) {
                    self.check_fleet_truth(t_ms);
                }
            }
            arrivals.clear();
            traffic.arrivals(t_ms, &mut arrivals);
            for &(k, wanted) in &arrivals {
                // A node that is down has its traffic taken by the next one up.
                let mut i = wanted as usize;
                for _ in 0..n {
                    if self.nodes[i].down_until_ms <= t_ms {
                        break;
                    }
                    i = (i + 1) % n;
                }
                self.request(k, i, t_ms);
            }
        }
        for node in &self.nodes {
            if let Some(l) = &node.limiter {
                let stats = l.stats();
                self.counts.self_grants += stats.self_grants;
                self.counts.report_entries += stats.report_entries_sent;
                self.counts.keys_visited += stats.keys_visited;
                self.counts.grants_applied += stats.grants_applied;
            }
        }
        for o in &self.owners {
            if let Some(owner) = &o.owner {
                self.counts.add_owner(owner);
            }
        }
        if let Some(fault) = self.bus.finish() {
            self.violation(sim_ms, fault);
        }
        self.counts.bus_sent = self.bus.stats.sent;
        self.counts.bus_lost = self.bus.stats.lost;
        self.counts.bus_cut = self.bus.stats.cut;
        let closed = self
            .books
            .finish()
            .closed(WALL0_MS + self.cfg.warmup_s * 1_000, WALL0_MS + sim_ms);
        let mut violations = self.violations;
        if self.violation_count > violations.len() as u64 {
            violations.resize(
                self.violation_count as usize,
                "(further violations not kept)".into(),
            );
        }
        RunOutcome {
            counts: self.counts,
            closed,
            violations,
        }
    }
}

fn gs_ended(keys: &[KeyId], kw: &global_sync::GsKw, wall_ms: u64) -> bool {
    let id = bus_schemas::WindowId {
        length_ms: kw.1,
        number: kw.2,
    };
    window_end_ms(keys[kw.0 as usize], id) + 1_000 < wall_ms
}

/// Runs one seed.
pub fn run(cfg: &SimConfig) -> Result<RunOutcome, SimError> {
    Ok(Sim::new(cfg.effective())?.run())
}

/// Runs `seeds` seeds from `cfg.seed` on up to `threads` threads; outcomes in seed order.
pub fn run_seeds(cfg: &SimConfig, seeds: u64, threads: usize) -> Result<Vec<RunOutcome>, SimError> {
    let configs: Vec<SimConfig> = (0..seeds)
        .map(|i| SimConfig {
            seed: cfg.seed + i,
            ..cfg.clone()
        })
        .collect();
    let threads = threads.clamp(1, configs.len().max(1));
    let chunks: Vec<Vec<(usize, SimConfig)>> = (0..threads)
        .map(|t| {
            configs
                .iter()
                .cloned()
                .enumerate()
                .filter(|(i, _)| i % threads == t)
                .collect()
        })
        .collect();
    let mut results: Vec<(usize, Result<RunOutcome, SimError>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = chunks
            .into_iter()
            .map(|chunk| {
                scope.spawn(move || {
                    chunk
                        .into_iter()
                        .map(|(i, c)| (i, run(&c)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a simulator thread panicked"))
            .collect()
    });
    results.sort_by_key(|(i, _)| *i);
    results.into_iter().map(|(_, r)| r).collect()
}

/// `--admissions-out`: one row per closed key-window.
pub fn write_admissions_csv(
    out: &mut impl std::io::Write,
    outcomes: &[RunOutcome],
) -> std::io::Result<()> {
    writeln!(
        out,
        "key,window_kind,window_id,allowance,offered,admitted,oracle_admitted"
    )?;
    for o in outcomes {
        for c in &o.closed {
            writeln!(
                out,
                "{},{},{},{},{},{},{}",
                c.key,
                c.window_kind,
                c.window_id,
                c.allowance,
                c.offered,
                c.admitted,
                c.oracle_admitted
            )?;
        }
    }
    Ok(())
}

/// Moves one node line's part of a key-window's truth from `before` to `now` (used,
/// self-granted); an entry no line holds any more is dropped. Returns whether the
/// key-window's truth is now breached (one lookup for the move and the check).
fn truth_move(
    truth: &mut DetMap<KeyWindow, Truth>,
    kw: KeyWindow,
    allowance: u64,
    before: Option<(u64, u64)>,
    now: Option<(u64, u64)>,
) -> bool {
    if before == now {
        return false;
    }
    let t = truth.entry(kw).or_default();
    if let Some((used, self_granted)) = before {
        assert!(
            t.live_lines > 0,
            "{kw:?}: a line leaves the truth it never joined"
        );
        t.live_used -= used;
        t.live_self_granted -= self_granted;
        t.live_lines -= 1;
    }
    if let Some((used, self_granted)) = now {
        if t.live_lines == 0 && t.dead_lines == 0 {
            t.allowance = allowance;
        }
        t.live_used += used;
        t.live_self_granted += self_granted;
        t.live_lines += 1;
    }
    if t.live_lines == 0 && t.dead_lines == 0 {
        truth.remove(&kw);
        return false;
    }
    t.sums()
        .is_some_and(|(used, self_granted)| used > t.allowance.saturating_add(self_granted))
}

/// A breach of fleet truth at `kw`, as a violation's text.
fn truth_breach(truth: &DetMap<KeyWindow, Truth>, kw: &KeyWindow) -> Option<String> {
    let t = truth.get(kw)?;
    let (used, self_granted) = t.sums()?;
    (used > t.allowance.saturating_add(self_granted)).then(|| {
        format!(
            "fleet truth {kw:?}: used {used} > allowance {} + self-granted {self_granted}",
            t.allowance
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A violation the checks find names the run's seed, the simulated time and the
    /// command that replays it. The breach is planted in the kept fleet truth (a line no
    /// node holds, over its allowance), and the periodic cross-check against every
    /// node's books is what finds it.
    #[test]
    fn a_violation_names_its_seed_and_the_command_that_replays_it() {
        let cfg = SimConfig {
            nodes: 3,
            keys: 5,
            seconds: 2,
            seed: 42,
            rate: 100,
            ..SimConfig::new(Scenario::Pinned, SimMode::Leasing)
        };
        let mut sim = Sim::new(cfg.clone()).expect("valid config");
        let kw = KeyWindow {
            key: sim.keys[0],
            window: bus_schemas::WindowId {
                length_ms: 1_000,
                number: 7,
            },
        };
        assert!(truth_move(&mut sim.truth, kw, 10, None, Some((11, 0))));
        sim.check_fleet_truth(1_250);
        assert_eq!(sim.violation_count, 1, "{:?}", sim.violations);
        let v = &sim.violations[0];
        let replay = cfg.replay_command();
        assert!(replay.contains("--seed 42") && replay.contains("--scenario pinned"));
        assert!(
            v.starts_with("t=1250 ms seed=42: fleet truth: 1 key-windows kept, 0 walked"),
            "{v}"
        );
        assert!(v.ends_with(&format!("replay: {replay}")), "{v}");
    }
}
