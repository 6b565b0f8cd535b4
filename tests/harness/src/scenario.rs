//! Simulator traffic on a real NATS fleet: the simulator's own generator
//! (`foldgate_sim::traffic::Traffic`, seeded by `foldgate_sim::rng`) picks each request's
//! key and node, so a seed gives the same arrival sequence here as in `foldgate sim`, and
//! each request is decided by its node's runtime in real time and booked against the
//! exact oracle (`RunBooks`). Keys are named by their ids only.

use std::time::{Duration, Instant};

use bus_schemas::{KeyId, WindowSpec};
use foldgate_sim::Scenario;
use foldgate_sim::traffic::Traffic;
use gateway_node::bus::NodeBus;

use crate::fleet::{Clock, Driver, RunBooks};

/// The scenarios that are traffic shapes alone: the others inject faults the simulator
/// drives itself (an owner crash, a cut, loss) or move keys mid-run (`shift`), which a
/// real-time fleet run does through its own drills instead.
pub const TRAFFIC_SCENARIOS: [Scenario; 6] = [
    Scenario::Uniform,
    Scenario::Zipf,
    Scenario::Pinned,
    Scenario::Bursty,
    Scenario::HotKey,
    Scenario::AllBurst,
];

/// The traffic scenario named `name` (as `foldgate sim --scenario` spells it).
pub fn traffic_scenario(name: &str) -> Result<Scenario, String> {
    TRAFFIC_SCENARIOS
        .iter()
        .copied()
        .find(|s| s.name() == name)
        .ok_or_else(|| {
            let names: Vec<&str> = TRAFFIC_SCENARIOS.iter().map(|s| s.name()).collect();
            format!("expected one of {}", names.join(", "))
        })
}

/// The ids of `keys` bench keys: fixed, odd digests, so no raw key exists anywhere.
pub fn key_ids(keys: usize) -> Vec<KeyId> {
    (0..keys as u128)
        .map(|k| KeyId {
            version: 1,
            digest: (k + 11).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835) | 1,
        })
        .collect()
}

/// What a scenario run offers: the simulator's traffic shape at `rate` requests per
/// second fleet-wide over `keys` keys and `nodes` nodes, for `run`.
#[derive(Clone, Copy, Debug)]
pub struct ScenarioPlan {
    pub scenario: Scenario,
    pub seed: u64,
    pub keys: usize,
    pub nodes: usize,
    pub rate: u64,
    pub run: Duration,
}

/// The simulator's arrivals for one run, millisecond by millisecond, bounded by the run.
pub struct Arrivals {
    traffic: Traffic,
    run_ms: u64,
    buf: Vec<(u32, u32)>,
}

impl Arrivals {
    pub fn new(p: &ScenarioPlan) -> Self {
        let run_ms = p.run.as_millis() as u64;
        Self {
            traffic: Traffic::new(p.scenario, p.seed, p.keys, p.nodes, p.rate, run_ms),
            run_ms,
            buf: Vec::new(),
        }
    }

    /// Millisecond `t_ms`'s requests as (key index, node index); none past the run, where
    /// the generator's own bound (`sim_ms`) ends.
    pub fn at(&mut self, t_ms: u64) -> &[(u32, u32)] {
        self.buf.clear();
        if t_ms < self.run_ms {
            self.traffic.arrivals(t_ms, &mut self.buf);
        }
        &self.buf
    }
}

/// Scenario traffic for `plan.run` in real time, each request decided by the node the
/// simulator drew for it. The traffic's clock is the count of 1 ms ticks, so a driver
/// that falls behind sends fewer requests, never a longer run: it stops at `plan.run`.
/// `at` is called every tick with the elapsed time (drills hook in there).
pub async fn drive_scenario(
    nodes: &[NodeBus],
    windows: &[WindowSpec],
    plan: &ScenarioPlan,
    clock: &Clock,
    mut at: impl FnMut(Duration),
) -> RunBooks {
    assert_eq!(
        plan.nodes,
        nodes.len(),
        "the plan's fleet is the fleet driven"
    );
    let mut driver = Driver::new(key_ids(plan.keys), windows, clock);
    let mut arrivals = Arrivals::new(plan);
    let started = Instant::now();
    let mut every = tokio::time::interval(Duration::from_millis(1));
    let mut t_ms = 0u64;
    while started.elapsed() < plan.run {
        every.tick().await;
        at(started.elapsed());
        for &(k, n) in arrivals.at(t_ms) {
            driver.request(&nodes[n as usize], k, clock).await;
        }
        t_ms += 1;
    }
    driver.finish(clock)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(scenario: Scenario, seed: u64) -> ScenarioPlan {
        ScenarioPlan {
            scenario,
            seed,
            keys: 200,
            nodes: 10,
            rate: 20_000,
            run: Duration::from_millis(500),
        }
    }

    /// Every (key, node) the plan's traffic sends over its run.
    fn sent(p: &ScenarioPlan) -> Vec<(u32, u32)> {
        let mut a = Arrivals::new(p);
        (0..p.run.as_millis() as u64 + 5)
            .flat_map(|t| a.at(t).to_vec())
            .collect()
    }

    #[test]
    fn same_seed_same_sequence_in_every_scenario() {
        for s in TRAFFIC_SCENARIOS {
            let a = sent(&plan(s, 7));
            assert!(!a.is_empty(), "{}", s.name());
            assert_eq!(a, sent(&plan(s, 7)), "{}", s.name());
            assert_ne!(a, sent(&plan(s, 8)), "{}", s.name());
        }
    }

    #[test]
    fn the_run_bounds_the_traffic() {
        let p = plan(Scenario::Uniform, 1);
        // 20,000 per second for 0.5 s, nothing after the run.
        assert_eq!(sent(&p).len(), 10_000);
        let mut a = Arrivals::new(&p);
        assert!(a.at(500).is_empty() && a.at(10_000).is_empty());
    }

    #[test]
    fn uniform_spreads_each_key_over_the_nodes() {
        let p = plan(Scenario::Uniform, 3);
        let mut per_node = vec![0u64; p.nodes];
        let mut nodes_of_key0 = std::collections::BTreeSet::new();
        for (k, n) in sent(&p) {
            per_node[n as usize] += 1;
            if k == 0 {
                nodes_of_key0.insert(n);
            }
        }
        // 1,000 expected per node; a uniform draw stays well within 20%.
        assert!(
            per_node.iter().all(|&c| (800..1_200).contains(&c)),
            "{per_node:?}"
        );
        assert!(nodes_of_key0.len() >= 5, "key 0 on {nodes_of_key0:?}");
    }

    #[test]
    fn pinned_keeps_a_key_on_its_one_or_two_nodes() {
        let p = plan(Scenario::Pinned, 5);
        let mut homes = vec![std::collections::BTreeSet::new(); p.keys];
        for (k, n) in sent(&p) {
            homes[k as usize].insert(n);
        }
        // A55: half the keys on one node, half on two (some of those draw the same twice).
        assert!(homes.iter().all(|h| h.len() <= 2), "a key on three nodes");
        let single = homes.iter().filter(|h| h.len() == 1).count();
        assert!(single >= p.keys / 3, "{single} keys on one node");
    }

    #[test]
    fn hot_key_and_all_burst_send_key_zero_from_every_node() {
        for s in [Scenario::HotKey, Scenario::AllBurst] {
            let key0: std::collections::BTreeSet<u32> = sent(&plan(s, 2))
                .into_iter()
                .filter(|(k, _)| *k == 0)
                .map(|(_, n)| n)
                .collect();
            assert_eq!(key0.len(), 10, "{}", s.name());
        }
    }

    #[test]
    fn scenario_names_parse() {
        for s in TRAFFIC_SCENARIOS {
            assert_eq!(traffic_scenario(s.name()), Ok(s));
        }
        assert!(traffic_scenario("owner-crash").is_err());
    }
}
