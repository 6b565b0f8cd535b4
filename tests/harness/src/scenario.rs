//! Simulator traffic on a real NATS fleet: the simulator's own generator
//! (`foldgate_sim::traffic::Traffic`, seeded by `foldgate_sim::rng`) picks each request's
//! key and node, so a seed gives the same arrival sequence here as in `foldgate sim`, and
//! each request is decided by its node's runtime in real time and booked against the
//! exact oracle (`RunBooks`). Keys are named by their ids only.

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
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
/// Requests are sent without waiting for each other: one admitted or denied from what its
/// node holds is decided in the call that sends it (a read of the decision surface); one
/// that needs a fast path is left in flight (at most `MAX_IN_FLIGHT`) and polled as soon
/// as it is woken, so its latency, timed inside its own future, is the fast path's and not
/// the wait for the driver's next tick. Decisions are booked as they complete, in any
/// order, each in the windows of the moment it was sent.
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
    let mut in_flight = InFlight::new();
    let mut done = Vec::new();
    let started = Instant::now();
    let mut every = tokio::time::interval(Duration::from_millis(1));
    let mut t_ms = 0u64;
    while started.elapsed() < plan.run {
        // Book what completes while waiting for the tick.
        loop {
            let ticked = poll_fn(|cx| {
                in_flight.poll_done(cx, &mut done);
                if every.poll_tick(cx).is_ready() {
                    Poll::Ready(true)
                } else if done.is_empty() {
                    Poll::Pending
                } else {
                    Poll::Ready(false)
                }
            })
            .await;
            done.drain(..).for_each(|d| driver.book(d));
            if ticked {
                break;
            }
        }
        at(started.elapsed());
        for &(k, n) in arrivals.at(t_ms) {
            while in_flight.len() >= MAX_IN_FLIGHT {
                in_flight.completions(&mut done).await;
                done.drain(..).for_each(|d| driver.book(d));
            }
            send(&mut driver, &mut in_flight, &nodes[n as usize], k, clock);
        }
        t_ms += 1;
    }
    // What is still in flight ends by its fast path's deadline.
    while in_flight.len() > 0 {
        in_flight.completions(&mut done).await;
        done.drain(..).for_each(|d| driver.book(d));
    }
    driver.finish(clock)
}

/// Key `k`'s request to `node`: booked at once if decided in the call, else left in flight.
fn send<'a>(
    driver: &mut Driver,
    in_flight: &mut InFlight<'a, Decided>,
    node: &'a NodeBus,
    k: u32,
    clock: &Clock,
) {
    let issued = driver.issue(k, clock);
    let (key, policy) = driver.key(k);
    let fast_before = node.stats.fast_path_requests.load(Ordering::Relaxed);
    let decide = Box::pin(async move {
        let (decision, ns) = timed_decide(node, key, policy, issued.at).await;
        // Left in flight: it waited on a fast path, its own or one it joined.
        Decided {
            issued,
            decision,
            ns,
            fast: true,
        }
    });
    if let Some(mut d) = in_flight.start(decide) {
        // Decided in the call: a fast path only if one was sent and settled at once (a
        // missed deadline).
        d.fast = node.stats.fast_path_requests.load(Ordering::Relaxed) != fast_before;
        driver.book(d);
    }
}

/// Futures in flight, each polled only when its own waker has fired: a small
/// `FuturesUnordered` (this crate does not depend on `futures`). A slot's waker queues the
/// slot's index and wakes the driver, which polls the queued slots and no others.
struct InFlight<'a, T> {
    slots: Vec<Option<Pin<Box<dyn Future<Output = T> + 'a>>>>,
    /// One waker per slot, made when the slot is first used and kept for its reuse.
    wakers: Vec<Waker>,
    free: Vec<usize>,
    woken: Arc<Woken>,
    /// The woken slots taken from `woken`, reused so polling allocates nothing.
    scratch: Vec<usize>,
    len: usize,
}

#[derive(Default)]
struct Woken {
    slots: Mutex<Vec<usize>>,
    driver: Mutex<Option<Waker>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

struct SlotWaker {
    slot: usize,
    woken: Arc<Woken>,
}

impl Wake for SlotWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        lock(&self.woken.slots).push(self.slot);
        if let Some(driver) = lock(&self.woken.driver).as_ref() {
            driver.wake_by_ref();
        }
    }
}

impl<'a, T> InFlight<'a, T> {
    fn new() -> Self {
        Self {
            slots: Vec::new(),
            wakers: Vec::new(),
            free: Vec::new(),
            woken: Arc::default(),
            scratch: Vec::new(),
            len: 0,
        }
    }

    /// How many are in flight.
    fn len(&self) -> usize {
        self.len
    }

    /// Polls `fut` once with the waker of the slot it would wait in: its output if that
    /// poll finished it, else `None` and it waits in the slot. A stale wake of a reused
    /// slot only costs its new occupant a spurious poll.
    fn start(&mut self, mut fut: Pin<Box<dyn Future<Output = T> + 'a>>) -> Option<T> {
        let slot = self.free.pop().unwrap_or_else(|| {
            let slot = self.slots.len();
            self.slots.push(None);
            self.wakers.push(Waker::from(Arc::new(SlotWaker {
                slot,
                woken: Arc::clone(&self.woken),
            })));
            slot
        });
        match fut
            .as_mut()
            .poll(&mut Context::from_waker(&self.wakers[slot]))
        {
            Poll::Ready(out) => {
                self.free.push(slot);
                Some(out)
            }
            Poll::Pending => {
                self.slots[slot] = Some(fut);
                self.len += 1;
                None
            }
        }
    }

    /// Polls every slot woken since the last call, pushing what finished to `done`; `cx`'s
    /// task is woken when another slot is.
    fn poll_done(&mut self, cx: &mut Context<'_>, done: &mut Vec<T>) {
        {
            // Registered before the queue is taken, so a wake in between is not lost.
            let mut driver = lock(&self.woken.driver);
            if !driver.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *driver = Some(cx.waker().clone());
            }
        }
        self.scratch.clear();
        std::mem::swap(&mut *lock(&self.woken.slots), &mut self.scratch);
        for &slot in &self.scratch {
            let Some(fut) = self.slots[slot].as_mut() else {
                continue;
            };
            if let Poll::Ready(out) = fut
                .as_mut()
                .poll(&mut Context::from_waker(&self.wakers[slot]))
            {
                self.slots[slot] = None;
                self.free.push(slot);
                self.len -= 1;
                done.push(out);
            }
        }
    }

    /// Waits until at least one in flight has finished (pushed to `done`).
    async fn completions(&mut self, done: &mut Vec<T>) {
        poll_fn(|cx| {
            self.poll_done(cx, done);
            if done.is_empty() {
                Poll::Pending
            } else {
                Poll::Ready(())
            }
        })
        .await;
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

    /// Ready at once, or after its oneshot fires: decided in the call or left in flight.
    fn decide_later(
        v: u32,
        rx: Option<tokio::sync::oneshot::Receiver<()>>,
    ) -> Pin<Box<dyn Future<Output = u32>>> {
        Box::pin(async move {
            if let Some(rx) = rx {
                rx.await.expect("sender kept");
            }
            v
        })
    }

    #[tokio::test]
    async fn in_flight_returns_ready_ones_at_once_and_the_rest_as_woken() {
        let mut f = InFlight::new();
        assert_eq!(f.start(decide_later(1, None)), Some(1));
        assert_eq!(f.len(), 0);
        let mut senders = Vec::new();
        for v in 10..13 {
            let (tx, rx) = tokio::sync::oneshot::channel();
            assert_eq!(f.start(decide_later(v, Some(rx))), None);
            senders.push(tx);
        }
        // A slot freed by a ready future is reused; parked ones keep theirs.
        assert_eq!(f.start(decide_later(2, None)), Some(2));
        assert_eq!(f.len(), 3);
        let mut done = Vec::new();
        senders.remove(1).send(()).unwrap();
        f.completions(&mut done).await;
        assert_eq!(done, vec![11]);
        for tx in senders.drain(..) {
            tx.send(()).unwrap();
        }
        while f.len() > 0 {
            f.completions(&mut done).await;
        }
        done.sort_unstable();
        assert_eq!(done, vec![10, 11, 12]);
        // Wakes from another thread reach the driver too.
        let (tx, rx) = tokio::sync::oneshot::channel();
        assert_eq!(f.start(decide_later(7, Some(rx))), None);
        std::thread::spawn(move || tx.send(()).unwrap());
        done.clear();
        f.completions(&mut done).await;
        assert_eq!(done, vec![7]);
    }

    #[test]
    fn scenario_names_parse() {
        for s in TRAFFIC_SCENARIOS {
            assert_eq!(traffic_scenario(s.name()), Ok(s));
        }
        assert!(traffic_scenario("owner-crash").is_err());
    }
}
