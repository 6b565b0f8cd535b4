//! Simulator traffic on a real NATS fleet: the simulator's own generator
//! (`foldgate_sim::traffic::Traffic`, seeded by `foldgate_sim::rng`) picks each request's
//! key and node, so a seed gives the same arrival sequence here as in `foldgate sim`, and
//! each request is decided by its node's runtime in real time and booked against the
//! exact oracle (`RunBooks`). Keys are named by their ids only.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bus_schemas::{KeyId, WindowSpec};
use foldgate_sim::Scenario;
use foldgate_sim::traffic::Traffic;
use gateway_node::bus::NodeBus;

use crate::fleet::{Clock, Decided, Driver, RunBooks, timed_decide};

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

/// At most this many requests wait on a fast path at once; a driver that reaches it waits
/// for one to finish before sending the next (and so offers less than asked).
pub const MAX_IN_FLIGHT: usize = 256;

/// Scenario traffic for `plan.run` in real time, each request decided by the node the
/// simulator drew for it. The traffic's clock is the count of 1 ms ticks, so a driver
/// that falls behind sends fewer requests, never a longer run: it stops at `plan.run`.
/// `at` is called every tick with the elapsed time (drills hook in there).
///
/// The driver sends in order and never waits on a decision: each request's decision is
/// polled once in the call that sends it, which decides every request its node holds
/// credit for (a read of the decision surface) and books it at once. One that needs a
/// fast path (its own, or a join of the one in flight for its key) is handed to a tokio
/// task of its own, as the gateway gives each request (at most `MAX_IN_FLIGHT`), and
/// reports back when done; its latency is timed inside its future, from the driver's
/// call to the poll that finds it decided. Decisions are booked as they come back, in any
/// order, each in the windows of the moment it was sent.
///
/// A fast path is not polled by the driver: polled from the driver's future (on
/// `block_on`'s thread, outside the runtime's workers) its every wake-up had to get that
/// thread scheduled again, and its wait for the limiter's lock (`lock_by` yields) spun
/// that thread, so on two cores completions were seen 1.5-9 ms late and the late
/// fast paths, missing D5's deadline, were asked again.
pub async fn drive_scenario(
    nodes: &Arc<Vec<NodeBus>>,
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
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut in_flight = 0usize;
    let started = Instant::now();
    let mut every = tokio::time::interval(Duration::from_millis(1));
    let mut t_ms = 0u64;
    while started.elapsed() < plan.run {
        every.tick().await;
        while let Ok(d) = done_rx.try_recv() {
            in_flight -= 1;
            driver.book(d);
        }
        at(started.elapsed());
        for &(k, n) in arrivals.at(t_ms) {
            while in_flight >= MAX_IN_FLIGHT {
                let d = done_rx.recv().await.expect("the driver holds a sender");
                in_flight -= 1;
                driver.book(d);
            }
            let node = n as usize;
            let fast_before = nodes[node].stats.fast_path_requests.load(Ordering::Relaxed);
            let issued = driver.issue(k, clock);
            let (key, policy) = driver.key(k);
            let fleet = Arc::clone(nodes);
            let decide = Box::pin(async move {
                let (decision, ns) = timed_decide(&fleet[node], key, policy, issued.at).await;
                Decided {
                    issued,
                    decision,
                    ns,
                    // Not decided in the call: it waited on a fast path, its own or one
                    // it joined.
                    fast: true,
                }
            });
            match decide_or_spawn(decide, &done_tx) {
                Some(mut d) => {
                    // Decided in the call: a fast path only if one was sent and settled at
                    // once (a missed deadline).
                    d.fast =
                        nodes[node].stats.fast_path_requests.load(Ordering::Relaxed) != fast_before;
                    driver.book(d);
                }
                None => in_flight += 1,
            }
        }
        t_ms += 1;
    }
    // What is still in flight ends by its fast path's deadline.
    while in_flight > 0 {
        let d = done_rx.recv().await.expect("the driver holds a sender");
        in_flight -= 1;
        driver.book(d);
    }
    driver.finish(clock)
}

/// Polls `fut` once in the caller: its output if that poll finished it; else it goes on
/// as a tokio task of its own, whose first poll picks it up where it stopped, and sends
/// its output on `done`. The first poll's waker wakes nothing: a future re-checks what it
/// waits on whenever it is polled, and the task polls it as soon as it is spawned.
fn decide_or_spawn<T: Send + 'static>(
    mut fut: Pin<Box<dyn Future<Output = T> + Send>>,
    done: &tokio::sync::mpsc::UnboundedSender<T>,
) -> Option<T> {
    match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => Some(out),
        Poll::Pending => {
            let done = done.clone();
            tokio::spawn(async move {
                // The receiver outlives every task the driver counts in flight.
                let _ = done.send(fut.await);
            });
            None
        }
    }
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

    /// Ready at once, or after its oneshot fires: decided in the call or spawned.
    fn decide_later(
        v: u32,
        rx: Option<tokio::sync::oneshot::Receiver<()>>,
    ) -> Pin<Box<dyn Future<Output = u32> + Send>> {
        Box::pin(async move {
            if let Some(rx) = rx {
                rx.await.expect("sender kept");
            }
            v
        })
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ready_ones_come_back_at_once_and_the_rest_when_done() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        assert_eq!(decide_or_spawn(decide_later(1, None), &tx), Some(1));
        let mut senders = Vec::new();
        for v in 10..13 {
            let (s, r) = tokio::sync::oneshot::channel();
            assert_eq!(decide_or_spawn(decide_later(v, Some(r)), &tx), None);
            senders.push(s);
        }
        assert!(rx.try_recv().is_err(), "nothing done yet");
        senders.remove(1).send(()).unwrap();
        assert_eq!(rx.recv().await, Some(11));
        // Fired from another thread, even before the spawned task first polls.
        let (s, r) = tokio::sync::oneshot::channel();
        s.send(()).unwrap();
        assert_eq!(decide_or_spawn(decide_later(7, Some(r)), &tx), Some(7));
        let (s, r) = tokio::sync::oneshot::channel();
        assert_eq!(decide_or_spawn(decide_later(8, Some(r)), &tx), None);
        std::thread::spawn(move || s.send(()).unwrap());
        for s in senders.drain(..) {
            s.send(()).unwrap();
        }
        let mut got: Vec<u32> = Vec::new();
        for _ in 0..3 {
            got.push(rx.recv().await.unwrap());
        }
        got.sort_unstable();
        assert_eq!(got, vec![8, 10, 12]);
    }

    #[test]
    fn scenario_names_parse() {
        for s in TRAFFIC_SCENARIOS {
            assert_eq!(traffic_scenario(s.name()), Ok(s));
        }
        assert!(traffic_scenario("owner-crash").is_err());
    }
}
