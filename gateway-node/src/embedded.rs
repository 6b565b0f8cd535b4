//! The embedded in-process bus: one node and its fold owners in one process, for a
//! single-node gateway run without NATS (the documented default of `foldgate-node`) and
//! nothing else. ADR-1 lets the owner be a role on the gateway; here it is the only
//! role, so messages pass as domain values, and the same state machines that run on NATS
//! run here unchanged.
//!
//! One mutex holds the node limiter and every owner, because a round moves messages
//! between them in both directions; it is held for state-machine calls only, never across
//! an await, and the decision surface beside it never takes it (D4). A fast path keeps
//! D5's hard 1 ms deadline (`bus::FAST_PATH_DEADLINE`), as over NATS: it answers in place
//! if the books are free (`EmbeddedBus::fast_path_in_place`, no future built); else it
//! waits, without blocking its thread, to be told they are free (`EmbeddedBus::books_by`)
//! until the deadline, on `deadline`'s timer thread, and past it the request is a miss.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError};
use std::time::{Duration, Instant};

use bus_schemas::{KeyId, Now, OwnerEpoch, ShardId};
use fold_core::{FoldOwner, OwnerConfig, OwnerMode};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::bus::{Clock, FAST_PATH_DEADLINE};
use crate::limiter::{Mode, NodeLimiter, Transmit};
use crate::policy::{KeyPolicy, PolicyIndex};
use crate::surface::{Decision, DecisionSurface, FastPathClaim, FastPathNeed};

struct Books {
    node: NodeLimiter,
    owners: Vec<FoldOwner>,
}

impl Books {
    /// Hands every queued report to its owner and every queued grant back to the node,
    /// until both sides are quiet (a grant never causes a report, so this ends). An
    /// owner that finds its books broken halts itself and grants nothing more: after a
    /// round every ledger is checked, after a fast path only the key-window it asked for
    /// (a walk of every ledger under the books' lock on each fast path held the others
    /// past D5's 1 ms as the key count grew).
    fn exchange(&mut self, now: Now, check: Check) {
        while let Some(t) = self.node.poll_transmit() {
            match t {
                Transmit::Report(r) => {
                    if let Some(o) = self.owners.get_mut(r.shard.0 as usize) {
                        o.handle_report_batch(now, &r);
                    }
                }
                Transmit::FastPath(f) => {
                    if let Some(o) = self.owners.get_mut(f.shard.0 as usize) {
                        let reply = o.handle_fast_path_request(now, &f);
                        let _ = o.check_key_windows([&f.entry.key_window]);
                        self.node.handle_fast_path_reply(now, &reply);
                    }
                }
            }
        }
        for o in &mut self.owners {
            if check == Check::Every {
                let _ = o.check_invariants();
            }
            while let Some(g) = o.poll_grant() {
                self.node.handle_grant_batch(now, &g);
            }
        }
    }
}

/// How much of the owners' books an exchange checks (`Books::exchange`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Check {
    /// Every ledger: after a round.
    Every,
    /// Only the key-windows the exchange's fast paths asked for.
    Touched,
}

impl Books {
    /// A round: the node's tick, the owners' ticks, and what they send each other.
    fn round(&mut self, now: Now) {
        self.node.handle_tick(now);
        self.exchange(now, Check::Every);
        for o in &mut self.owners {
            o.handle_tick(now);
        }
        self.exchange(now, Check::Every);
    }
}

pub struct EmbeddedBus {
    books: Arc<Mutex<Books>>,
    /// Woken whenever a holder lets go of the books, for the fast paths waiting on them.
    books_free: Arc<tokio::sync::Notify>,
    surface: Arc<DecisionSurface>,
    /// Woken when a fast path settles, for the requests that joined it.
    fast_path_done: tokio::sync::Notify,
    /// Fast paths that could not take the books within D5's 1 ms.
    fast_path_deadline_missed: std::sync::atomic::AtomicU64,
    clock: Clock,
    policy: watch::Sender<Arc<PolicyIndex>>,
    tick: JoinHandle<()>,
}

fn lock(books: &Mutex<Books>) -> MutexGuard<'_, Books> {
    // As in `bus`: a panic mid-call leaves the best books there are.
    books.lock().unwrap_or_else(PoisonError::into_inner)
}

impl EmbeddedBus {
    /// Starts the round task on the current tokio runtime. The owners' fleet is the node's
    /// fleet (1 for a single gateway) and there is one owner per shard.
    pub fn start(node: NodeLimiter, clock: Clock, shutdown: watch::Receiver<bool>) -> Self {
        let config = node.config().clone();
        let now = clock();
        let owners = (0..config.shards)
            .map(|s| {
                let oc = OwnerConfig {
                    shards: config.shards,
                    fleet_size: config.fleet_size,
                    round_ms: config.round_ms,
                    reserve_permille: config.reserve_permille,
                    standing_permille: config.standing_permille,
                    mode: match config.mode {
                        Mode::Leasing => OwnerMode::Leasing,
                        Mode::Fixed => OwnerMode::Fixed,
                    },
                    ..OwnerConfig::reference(ShardId(s))
                };
                FoldOwner::new(oc, OwnerEpoch(1), now, false)
            })
            .collect();
        let surface = Arc::clone(node.surface());
        let books = Arc::new(Mutex::new(Books { node, owners }));
        let round = Duration::from_millis(u64::from(config.round_ms));
        let books_free = Arc::new(tokio::sync::Notify::new());
        let tick = {
            let (books, clock, free) = (
                Arc::clone(&books),
                Arc::clone(&clock),
                Arc::clone(&books_free),
            );
            tokio::spawn(crate::bus::each_round(round, shutdown, move || {
                lock(&books).round(clock());
                free.notify_waiters();
            }))
        };
        Self {
            books,
            books_free,
            surface,
            fast_path_done: tokio::sync::Notify::new(),
            fast_path_deadline_missed: Default::default(),
            clock,
            policy: watch::channel(Arc::new(PolicyIndex::default())).0,
            tick,
        }
    }

    /// P1 for a single process: apply a validated policy to the node's buckets and publish
    /// it to whoever resolves keys. An index no newer than the one in force is refused.
    pub fn set_policy(&self, index: PolicyIndex) -> bool {
        if index.version <= self.policy.borrow().version {
            return false;
        }
        lock(&self.books)
            .node
            .handle_policy((self.clock)(), index.version, |k| index.get(k).copied());
        self.books_free.notify_waiters();
        self.policy.send_replace(Arc::new(index));
        true
    }

    pub fn policy(&self) -> watch::Receiver<Arc<PolicyIndex>> {
        self.policy.subscribe()
    }

    pub fn surface(&self) -> &Arc<DecisionSurface> {
        &self.surface
    }

    pub fn with_limiter<R>(&self, f: impl FnOnce(&mut NodeLimiter) -> R) -> R {
        let r = f(&mut lock(&self.books).node);
        self.books_free.notify_waiters();
        r
    }

    /// The books if no one holds them now.
    fn try_books(&self) -> Option<MutexGuard<'_, Books>> {
        match self.books.try_lock() {
            Ok(guard) => Some(guard),
            // As `lock`: a panic mid-call leaves the best books there are.
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// The books if they can be had by `deadline`, without blocking the thread: each try
    /// that finds them held waits for a holder to let go (`books_free`), not spinning, or
    /// for the deadline (`deadline::within`, to the kernel's timer slack).
    async fn books_by(&self, deadline: Instant) -> Option<MutexGuard<'_, Books>> {
        loop {
            // Armed before the try, so a release in between still wakes us.
            let freed = self.books_free.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if let Some(guard) = self.try_books() {
                return Some(guard);
            }
            crate::deadline::within(deadline, freed).await?;
        }
    }

    /// One request's decision (`runtime::decide_at`). The owner is in this process, so
    /// the fast path is a function call once it has the books, with no answer to wait for;
    /// what it may wait for is the books themselves (a round's tick holds them for its
    /// pass over the due keys), and that wait has D5's hard 1 ms deadline, as an owner's
    /// answer over NATS does, without blocking the thread. Past it the request is a 429
    /// (`LimitReason::FastPathDeadline`), counted in `fast_path_deadline_missed`, never a
    /// free admit. Books that a round holds past 1 ms (a CPU-starved node, a pass over
    /// many due keys) can turn that into 429s for keys under their limit: the price of
    /// one deadline for both runtimes.
    pub async fn decide_at(&self, key: KeyId, policy: &KeyPolicy, now: Now) -> Decision {
        crate::runtime::decide_at(self, key, policy, now).await
    }

    /// The fast path in place, if the books are free: the common case, answered without
    /// building (and boxing) a future. `Err` hands the need back for `ask_owner`.
    fn fast_path_in_place(
        &self,
        now: Now,
        need: FastPathNeed,
        policy: &KeyPolicy,
    ) -> Result<Decision, FastPathNeed> {
        let Some(books) = self.try_books() else {
            return Err(need);
        };
        let claim = self
            .surface
            .claim_fast_path(need.key, || self.fast_path_done.notify_waiters());
        Ok(self.answer(books, claim, now, need, policy))
    }

    /// The fast path once the books were found held: the owner's answer if they can be
    /// had within D5's 1 ms, else a miss.
    async fn ask_owner(&self, now: Now, need: FastPathNeed, policy: &KeyPolicy) -> Decision {
        let deadline = Instant::now() + FAST_PATH_DEADLINE;
        let claim = self
            .surface
            .claim_fast_path(need.key, || self.fast_path_done.notify_waiters());
        let Some(books) = self.books_by(deadline).await else {
            self.fast_path_deadline_missed
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return claim.settle(now.wall_ms, policy, true);
        };
        self.answer(books, claim, now, need, policy)
    }

    /// The owner's answer to `need`, with the books in hand: a few state-machine calls,
    /// then the decision on what came back. Books had by the deadline answer in full: the
    /// calls are synchronous, and their answer is in hand once they return.
    fn answer<F: FnMut()>(
        &self,
        mut books: MutexGuard<'_, Books>,
        claim: FastPathClaim<'_, F>,
        now: Now,
        need: FastPathNeed,
        policy: &KeyPolicy,
    ) -> Decision {
        books.node.handle_fast_path_need(now, need);
        books.exchange(now, Check::Touched);
        drop(books);
        self.books_free.notify_waiters();
        claim.settle(now.wall_ms, policy, false)
    }

    /// Fast paths that could not take the books within D5's 1 ms.
    pub fn fast_path_deadline_missed(&self) -> u64 {
        self.fast_path_deadline_missed
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl crate::runtime::NodeRuntime for EmbeddedBus {
    fn surface(&self) -> &Arc<DecisionSurface> {
        EmbeddedBus::surface(self)
    }

    fn policy(&self) -> watch::Receiver<Arc<PolicyIndex>> {
        EmbeddedBus::policy(self)
    }

    fn fast_path_deadline_missed(&self) -> u64 {
        EmbeddedBus::fast_path_deadline_missed(self)
    }

    fn fast_path_done(&self) -> &tokio::sync::Notify {
        &self.fast_path_done
    }

    fn fast_path_wait(&self) -> Duration {
        FAST_PATH_DEADLINE
    }

    fn fast_path_in_place(
        &self,
        now: Now,
        need: FastPathNeed,
        policy: &KeyPolicy,
    ) -> Result<Decision, FastPathNeed> {
        EmbeddedBus::fast_path_in_place(self, now, need, policy)
    }

    fn fast_path<'a>(
        &'a self,
        now: Now,
        need: FastPathNeed,
        policy: &'a KeyPolicy,
    ) -> crate::runtime::FastPathFuture<'a> {
        // Boxed (the trait's object safety) only when the books were held: a free-books
        // fast path was answered in place.
        Box::pin(self.ask_owner(now, need, policy))
    }

    fn with_limiter_dyn(&self, f: &mut dyn FnMut(&mut NodeLimiter)) {
        self.with_limiter(f)
    }
}

impl Drop for EmbeddedBus {
    fn drop(&mut self) {
        self.tick.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::NodeConfig;
    use crate::surface::{DecisionSurface, SurfaceConfig};
    use bus_schemas::{NodeEpoch, NodeId, WindowSpec};

    /// A one-node embedded bus on the system clock with `round_ms` rounds; the stop
    /// sender keeps it running. (The fast path's 1 ms deadline is checked from outside,
    /// in `tests/embedded_fast_path.rs`.)
    fn started(round_ms: u32) -> (Arc<EmbeddedBus>, watch::Sender<bool>) {
        let surface = Arc::new(DecisionSurface::new(SurfaceConfig::default()));
        let config = NodeConfig {
            fleet_size: 1,
            shards: 1,
            round_ms,
            ..NodeConfig::reference(NodeId(0))
        };
        let clock = crate::http::node::system_clock();
        let node = NodeLimiter::new(config, Arc::clone(&surface), NodeEpoch(1), clock());
        let (stop_tx, stop) = watch::channel(false);
        let bus = Arc::new(EmbeddedBus::start(node, clock, stop));
        (bus, stop_tx)
    }

    /// Holds the books for `hold` on a blocking thread, as a round's long pass would;
    /// returns once they are held.
    fn hold_books(bus: &Arc<EmbeddedBus>, hold: Duration) -> tokio::task::JoinHandle<()> {
        let held = Arc::clone(bus);
        let (locked_tx, locked_rx) = std::sync::mpsc::channel();
        let holder = tokio::task::spawn_blocking(move || {
            held.with_limiter(|_| {
                locked_tx.send(()).unwrap();
                std::thread::sleep(hold);
            })
        });
        locked_rx.recv().unwrap();
        holder
    }

    /// A wait for held books is woken when the holder lets go, not at its deadline and
    /// not by polling: with a deadline far off (a second, where a fast path has 1 ms, so
    /// the test does not hang on a noisy machine's scheduling), a 10 ms hold delays
    /// `books_by` by about that much.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_wait_for_the_books_is_woken_when_they_are_free() {
        // Second-long rounds: no round's tick lets go of the books (and wakes the
        // waiter) within the test, so only the holder's release can.
        let (bus, _stop) = started(1_000);
        // Past the start's first round.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let holder = hold_books(&bus, Duration::from_millis(10));
        let asked = Instant::now();
        let books = bus.books_by(asked + Duration::from_secs(1)).await;
        let took = asked.elapsed();
        assert!(books.is_some(), "not had after {took:?}");
        drop(books);
        assert!(
            took >= Duration::from_millis(5),
            "{took:?}: the books were held"
        );
        assert!(
            took < Duration::from_millis(500),
            "{took:?}: woken by the release"
        );
        holder.await.unwrap();
        // A deadline already past gives up at once while they are held.
        let holder = hold_books(&bus, Duration::from_millis(50));
        assert!(bus.books_by(Instant::now()).await.is_none());
        holder.await.unwrap();
    }

    /// False 429s on a CPU-starved node (BENCHMARKS.md): there the round task runs late,
    /// by up to several rounds. A key far under its limit must
    /// still be admitted every time: late rounds are not missed rounds (C8 at the
    /// owner, F1 at the node), D5's round keeps pace with wall time, and a fast path at
    /// the end of a window asks for the next one too, and a fast path asks for every
    /// window of the key that runs low, not just the empty one. Without any one of the five,
    /// this test (or its idle-gap part) denies hundreds to 200,000 requests.
    #[test]
    fn late_rounds_never_deny_a_key_far_under_its_limit() {
        let t0 = Now {
            wall_ms: 1_764_720_000_000,
            mono_ms: 5_000,
        };
        let surface = Arc::new(DecisionSurface::new(SurfaceConfig::default()));
        let config = NodeConfig {
            fleet_size: 1,
            shards: 1,
            ..NodeConfig::reference(NodeId(0))
        };
        let node = NodeLimiter::new(config.clone(), Arc::clone(&surface), NodeEpoch(1), t0);
        let owner_config = OwnerConfig {
            shards: 1,
            fleet_size: 1,
            round_ms: config.round_ms,
            reserve_permille: config.reserve_permille,
            ..OwnerConfig::reference(ShardId(0))
        };
        let owners = vec![FoldOwner::new(owner_config, OwnerEpoch(1), t0, false)];
        let mut books = Books { node, owners };
        // The bench's plan: 1 M/s and 60 M/60 s; 30 requests per ms is 3% of it.
        let policy = KeyPolicy::new(
            &[
                WindowSpec {
                    length_ms: 1_000,
                    limit: 1_000_000,
                },
                WindowSpec {
                    length_ms: 60_000,
                    limit: 60_000_000,
                },
            ],
            config.round_ms,
        )
        .unwrap();
        let key = KeyId {
            version: 1,
            digest: 0x1234_5678_9abc_def0_1234_5678_9abc_def1,
        };
        let mut state = 7u64;
        let mut rng = move || {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            state >> 33
        };
        let mut next_tick_ms = 0u64;
        let mut denied = 0u64;
        // 130 s crosses two 60 s boundaries and 130 of 1 s.
        for ms in 0..130_000u64 {
            let now = Now {
                wall_ms: t0.wall_ms + ms,
                mono_ms: t0.mono_ms + ms,
            };
            if ms >= next_tick_ms {
                books.round(now);
                books.node.check_invariants().unwrap();
                for o in &mut books.owners {
                    o.check_invariants().unwrap();
                }
                // One round in ten runs late by up to six rounds.
                let r = rng();
                let late_ms = if r % 10 == 0 { (r >> 8) % 150 } else { 0 };
                next_tick_ms = ms + u64::from(config.round_ms) + late_ms;
            }
            // Idle for the first second of every five, as a client that pauses between
            // runs: the reconciler hands idle credit back, and the next burst must not
            // find any window empty with no way to ask.
            let requests = if ms % 5_000 < 1_000 { 0 } else { 30 };
            for _ in 0..requests {
                let d = match surface.decide(key, now.wall_ms, &policy) {
                    Decision::FastPath(need) if need.join => {
                        surface.decide_after_fast_path(key, now.wall_ms, &policy, false)
                    }
                    Decision::FastPath(need) => {
                        books.node.handle_fast_path_need(now, need);
                        books.exchange(now, Check::Touched);
                        surface.decide_after_fast_path(key, now.wall_ms, &policy, false)
                    }
                    d => d,
                };
                denied += u64::from(matches!(d, Decision::Deny(_)));
            }
        }
        assert_eq!(denied, 0, "false 429s on a key at 3% of its limit");
    }
}
