//! The step loop: one simulated millisecond at a time, faults first, then deliveries,
//! ticks, the periodic checks, and the millisecond's requests.

use crate::config::{Scenario, SimConfig, SimMode};
use crate::report::RunOutcome;
use crate::traffic::Traffic;

use super::{ROUND_MS, Sim, WALL0_MS};

/// The scenario's faults, in simulated ms: the bus cut (from, to), the owners' crash, and
/// each node restart (at, node).
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

impl Sim {
    /// Runs the whole simulated time and returns what it counted and booked.
    pub(crate) fn run(mut self) -> RunOutcome {
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
        for t_ms in 0..sim_ms {
            self.inject_faults(&faults, t_ms);
            self.deliver_due(t_ms);
            self.tick_due(t_ms);
            self.round_checks(t_ms);
            arrivals.clear();
            traffic.arrivals(t_ms, &mut arrivals);
            self.offer(&arrivals, t_ms);
        }
        self.finish(sim_ms)
    }

    /// The scenario's faults due at `t_ms`, and the restarted nodes due back.
    fn inject_faults(&mut self, faults: &Faults, t_ms: u64) {
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
        for i in 0..self.nodes.len() {
            if self.nodes[i].down_until_ms == t_ms && t_ms > 0 {
                self.revive_node(i, t_ms);
            }
        }
    }

    fn deliver_due(&mut self, t_ms: u64) {
        while let Some((target, payload)) = self.bus.pop_due(t_ms * 1_000) {
            self.deliver(t_ms, target, &payload);
            self.bus.checked(payload);
        }
    }

    /// Every node that is up, then every owner, whose round falls on `t_ms`.
    fn tick_due(&mut self, t_ms: u64) {
        for i in 0..self.nodes.len() {
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
    }

    fn round_checks(&mut self, t_ms: u64) {
        if t_ms.is_multiple_of(ROUND_MS) && self.cfg.mode != SimMode::GlobalSync {
            self.expire_dead_spend(t_ms);
            if t_ms.is_multiple_of(ROUND_MS * self.cfg.full_check_rounds) {
                self.check_fleet_truth(t_ms);
            }
        }
    }

    /// The millisecond's requests, each at the node the traffic sends it to.
    fn offer(&mut self, arrivals: &[(u32, u32)], t_ms: u64) {
        let n = self.nodes.len();
        for &(k, wanted) in arrivals {
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

    /// The counts only the end of a run knows (protocol work, the owners' histograms, the
    /// bus's totals), the codec check's verdict, and the closed key-windows.
    fn finish(mut self, sim_ms: u64) -> RunOutcome {
        for node in &self.nodes {
            if let Some(l) = &node.limiter {
                let stats = l.stats();
                self.counts.add_node_outcomes(stats);
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
