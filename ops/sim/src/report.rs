//! What a run reports: its counts (`Counts`), the closed key-windows behind its accuracy
//! (`RunOutcome`), the `--json` object over one or more seeds (`SimReport`), and the
//! `--admissions-out` CSV.

use std::collections::BTreeMap;

use fold_core::{FOLD_AGE_BUCKETS, FoldOwner};

use crate::config::{Scenario, SimConfig, SimMode, WhatIf};
use crate::oracle::{Accuracy, ClosedKw, round4};

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
    /// Requests admitted on a deadline loan (a fast path past D5's deadline, booked as a
    /// self-grant: `DecisionSurface::lend`).
    pub deadline_loans: u64,
    /// The owners' answers to fast paths that came back: credit, "the pool is spent",
    /// and "nothing now, but the pool may refill".
    pub fast_path_granted: u64,
    pub fast_path_refused_exhausted: u64,
    pub fast_path_refused_open: u64,
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
    /// Standing-option recalls the owners sent (grants of nothing, `fold_core` options).
    pub recalls: u64,
    /// Fold age histograms (whole rounds, last bucket = that many or more), summed over
    /// owners: keys outside the hot set, and hot keys.
    pub fold_age_rounds_cold: [u64; FOLD_AGE_BUCKETS],
    pub fold_age_rounds_hot: [u64; FOLD_AGE_BUCKETS],
}

impl Counts {
    /// What a node epoch booked that outlives it: its self-grants, loans and the answers
    /// its fast paths got (added when it restarts, and for the living at the end).
    pub(crate) fn add_node_outcomes(&mut self, stats: &node_core::NodeStats) {
        self.self_grants += stats.self_grants;
        self.deadline_loans += stats.loans_booked;
        self.fast_path_granted += stats.fast_path_granted;
        self.fast_path_refused_exhausted += stats.fast_path_refused_exhausted;
        self.fast_path_refused_open += stats.fast_path_refused_open;
    }

    fn add(&mut self, o: &Counts) {
        self.offered += o.offered;
        self.admitted += o.admitted;
        self.fail_open_admitted += o.fail_open_admitted;
        self.denied += o.denied;
        self.fast_path += o.fast_path;
        self.fast_path_deadline_missed += o.fast_path_deadline_missed;
        self.self_grants += o.self_grants;
        self.deadline_loans += o.deadline_loans;
        self.fast_path_granted += o.fast_path_granted;
        self.fast_path_refused_exhausted += o.fast_path_refused_exhausted;
        self.fast_path_refused_open += o.fast_path_refused_open;
        self.degraded_node_rounds += o.degraded_node_rounds;
        self.owner_changes += o.owner_changes;
        self.node_restarts += o.node_restarts;
        self.bus_sent += o.bus_sent;
        self.bus_lost += o.bus_lost;
        self.bus_cut += o.bus_cut;
        self.report_entries += o.report_entries;
        self.keys_visited += o.keys_visited;
        self.grants_applied += o.grants_applied;
        self.recalls += o.recalls;
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

    pub(crate) fn add_owner(&mut self, owner: &FoldOwner) {
        let s = owner.stats();
        self.recalls += s.recalls;
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
    /// Under-admission as requests, and requests denied while every window of the plan
    /// was, per the oracle, under half used (`Accuracy`): over the closed key-windows of
    /// the plan's shortest window, which hold each request once (`by_window` has them per
    /// window kind). A request the oracle admitted and the fleet denied, with another the
    /// fleet admitted in its place in the same window, is no under-admission.
    pub under_admitted_requests: u64,
    pub under_admitted_pct_of_oracle: f64,
    pub denied_under_half_limit: u64,
    pub denied_under_half_limit_pct: f64,
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
        let of_kind = |length_ms: u32| {
            Accuracy::of(
                outcomes
                    .iter()
                    .flat_map(|o| o.closed.iter())
                    .filter(|c| c.window_kind == length_ms),
            )
        };
        let by_window = plan
            .iter()
            .map(|w| (w.length_ms.to_string(), of_kind(w.length_ms)))
            .collect();
        let shortest = plan.iter().map(|w| w.length_ms).min().unwrap_or_default();
        let requests = of_kind(shortest);
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
            under_admitted_requests: requests.under_admitted_requests,
            under_admitted_pct_of_oracle: requests.under_admitted_pct_of_oracle,
            denied_under_half_limit: requests.denied_under_half_limit,
            denied_under_half_limit_pct: requests.denied_under_half_limit_pct,
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
