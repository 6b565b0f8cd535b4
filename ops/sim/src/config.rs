//! What a run is: the scenario, the limiting mode, the rules lifted for a what-if run, the
//! fleet's shape and faults (`SimConfig`), and the command that replays it.

use bus_schemas::WindowSpec;

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
    /// Standing options, per mille of each window's leasable allowance (node and owner
    /// alike); `None` keeps the reference configs'.
    pub standing_permille: Option<u64>,
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
            standing_permille: None,
            what_if: Vec::new(),
        }
    }

    pub(crate) fn lifts(&self, rule: WhatIf) -> bool {
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

    /// The configuration a run uses: `lossy` and `skew` given no faults of their own take
    /// their scenario's defaults.
    pub(crate) fn effective(&self) -> Self {
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
            ("--standing-permille", self.standing_permille),
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
