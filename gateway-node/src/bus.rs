//! The node limiter on a real NATS bus (B1, C1, D5): the runtime around the
//! sans-IO `NodeLimiter`. It owns no protocol logic, only timers and sockets:
//!
//! * a tick task: every round, `handle_tick(now)`, then publish each report batch to its
//!   shard's subject with this node's grant inbox as the reply subject;
//! * a grant task: decode each message on the inbox (a bad envelope is counted by reason
//!   and dropped whole) and hand it to `handle_grant_batch` / `handle_fast_path_reply`;
//! * the fast path, run by the request that needs it: request/reply with a hard 1 ms
//!   deadline, at most once per key per round (the surface enforces that).
//!
//! The decision itself is `DecisionSurface::decide`, synchronous and never awaiting; only a
//! request that drew `Decision::FastPath` awaits, and never longer than the deadline. The
//! limiter sits behind a mutex that is held for a state-machine call and never across an
//! await.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bus_schemas::{Envelope, FastPathReply, GrantBatch, KeyId, Now, PolicySnapshot, subjects};
use futures::StreamExt;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::deadline::within;
use crate::limiter::{NodeLimiter, Transmit};
use crate::policy::{KeyPolicy, PolicyIndex};
use crate::surface::{Decision, DecisionSurface};

/// D5's hard deadline, kept to the kernel's timer slack rather than tokio's
/// millisecond (`deadline`).
pub const FAST_PATH_DEADLINE: Duration = Duration::from_millis(1);

/// Rounds of reports the publisher queue holds before the tick starts dropping them.
const REPORT_QUEUE_ROUNDS: usize = 4;

fn limiter_shards(limiter: &Mutex<NodeLimiter>) -> usize {
    lock(limiter).config().shards as usize
}

/// Calls `f` once a round until `shutdown` turns true. A late tick is delayed rather than
/// bunched: two rounds' work back to back would report the same state twice.
pub(crate) async fn each_round(
    round: Duration,
    mut shutdown: watch::Receiver<bool>,
    mut f: impl FnMut(),
) {
    let mut every = tokio::time::interval(round);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            _ = shutdown.changed() => return,
        }
        f();
    }
}

pub use foldgate_runtime::Clock;

#[derive(Debug, thiserror::Error)]
pub enum NodeBusError {
    #[error("subscribing to the grant inbox: {0}")]
    Subscribe(#[from] async_nats::SubscribeError),
}

/// Bus counters (F6, A48). Rejected envelopes are counted by `DecodeError::reason()`.
#[derive(Debug, Default)]
pub struct NodeBusStats {
    pub reports_published: AtomicU64,
    /// Reports dropped because the bus could not take them (queue full, bus down).
    pub reports_dropped: AtomicU64,
    pub publish_errors: AtomicU64,
    pub grant_batches: AtomicU64,
    pub rejected_too_large: AtomicU64,
    pub rejected_malformed: AtomicU64,
    pub rejected_unknown_version: AtomicU64,
    pub rejected_invalid: AtomicU64,
    pub fast_path_requests: AtomicU64,
    pub fast_path_deadline_missed: AtomicU64,
    /// P1: snapshots applied, and snapshots refused (bad envelope, bad plan, old version).
    pub policy_applied: AtomicU64,
    pub policy_refused: AtomicU64,
    /// Errors and ends of the policy watch, each followed by watching on (`watch_policy`).
    pub policy_watch_errors: AtomicU64,
    /// Envelope bytes this node put on the bus and took off it (payloads, not framing).
    pub bytes_out: AtomicU64,
    pub bytes_in: AtomicU64,
}

impl NodeBusStats {
    fn rejected(&self, reason: &str) {
        let c = match reason {
            "too_large" => &self.rejected_too_large,
            "malformed" => &self.rejected_malformed,
            "unknown_version" => &self.rejected_unknown_version,
            _ => &self.rejected_invalid,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub fn rejected_total(&self) -> u64 {
        self.rejected_too_large.load(Ordering::Relaxed)
            + self.rejected_malformed.load(Ordering::Relaxed)
            + self.rejected_unknown_version.load(Ordering::Relaxed)
            + self.rejected_invalid.load(Ordering::Relaxed)
    }
}

pub use bus_schemas::subjects::POLICY_KEY;

#[derive(Debug, thiserror::Error)]
pub enum PolicyWatchError {
    #[error("opening the policy bucket: {0}")]
    Bucket(String),
    #[error("watching the policy key: {0}")]
    Watch(String),
}

pub struct NodeBus {
    limiter: Arc<Mutex<NodeLimiter>>,
    surface: Arc<DecisionSurface>,
    client: async_nats::Client,
    clock: Clock,
    pub stats: Arc<NodeBusStats>,
    tasks: Vec<JoinHandle<()>>,
    policy: watch::Sender<Arc<PolicyIndex>>,
    /// Woken whenever a fast path's answer is in, for requests that joined it.
    fast_path_done: tokio::sync::Notify,
}

fn lock(limiter: &Mutex<NodeLimiter>) -> std::sync::MutexGuard<'_, NodeLimiter> {
    // A panic inside a state-machine call is a bug the invariant checks would report; the
    // books it left are still the best this node has, so keep going with them.
    limiter
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The limiter's lock if it can be had by `deadline`, without blocking the thread: the
/// round's tick holds it for its whole pass over the due keys, and a fast path that
/// waited the pass out on a worker thread would miss its hard 1 ms deadline (D5) by
/// however long the pass took. Past the deadline the request is a miss, as a late reply is.
/// It yields to the runtime between tries: for 1 ms that costs less than a wake-up from
/// every holder (the embedded runtime, waiting up to a round, is woken instead).
pub(crate) async fn lock_by<T>(
    limiter: &Mutex<T>,
    deadline: Instant,
) -> Option<std::sync::MutexGuard<'_, T>> {
    loop {
        match limiter.try_lock() {
            Ok(guard) => return Some(guard),
            Err(std::sync::TryLockError::Poisoned(p)) => return Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => {}
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::task::yield_now().await;
    }
}

/// The grant task: decodes each message on the node's grant inbox (a bad envelope is
/// counted by reason and dropped whole) and hands it to the limiter.
async fn apply_grants(
    mut grants: async_nats::Subscriber,
    limiter: Arc<Mutex<NodeLimiter>>,
    stats: Arc<NodeBusStats>,
    clock: Clock,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let msg = tokio::select! {
            m = grants.next() => match m { Some(m) => m, None => return },
            _ = shutdown.changed() => return,
        };
        stats
            .bytes_in
            .fetch_add(msg.payload.len() as u64, Ordering::Relaxed);
        match GrantBatch::decode(&msg.payload) {
            Ok(batch) => {
                stats.grant_batches.fetch_add(1, Ordering::Relaxed);
                lock(&limiter).handle_grant_batch(clock(), &batch);
            }
            Err(e) => stats.rejected(e.reason()),
        }
    }
}

/// The publisher task: each queued report to its shard's subject, with the grant inbox
/// as the reply subject.
async fn publish_reports(
    mut reports: tokio::sync::mpsc::Receiver<(String, Vec<u8>)>,
    client: async_nats::Client,
    inbox: String,
    stats: Arc<NodeBusStats>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let (subject, bytes) = tokio::select! {
            r = reports.recv() => match r {
                Some(report) => report,
                None => return,
            },
            _ = shutdown.changed() => return,
        };
        // Not connected: drop it. The client would buffer it and, on reconnect, flush
        // thousands of stale reports (each superseded by a later cumulative one, C1) ahead
        // of the current round's, holding every owner busy for ~200 ms after a 5 s outage
        // (F7, BENCHMARKS.md).
        if client.connection_state() != async_nats::connection::State::Connected {
            stats.reports_dropped.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        match client
            .publish_with_reply(subject, inbox.clone(), bytes.into())
            .await
        {
            Ok(()) => stats.reports_published.fetch_add(1, Ordering::Relaxed),
            Err(_) => stats.publish_errors.fetch_add(1, Ordering::Relaxed),
        };
    }
}

/// One round's tick: the limiter's reports, queued for the publisher (dropped when the
/// queue is full).
fn tick(
    limiter: &Mutex<NodeLimiter>,
    stats: &NodeBusStats,
    clock: &Clock,
    reports: &tokio::sync::mpsc::Sender<(String, Vec<u8>)>,
) {
    let out: Vec<Transmit> = {
        let mut l = lock(limiter);
        l.handle_tick(clock());
        std::iter::from_fn(|| l.poll_transmit()).collect()
    };
    for t in out {
        let Transmit::Report(r) = t else { continue };
        let bytes = r.encode();
        stats
            .bytes_out
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        if reports
            .try_send((subjects::report(r.shard.0), bytes))
            .is_err()
        {
            stats.reports_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// After a policy watch error, before the next look (`NodeBus::watch_policy`).
const POLICY_WATCH_PAUSE: Duration = Duration::from_millis(100);
/// After a policy watch ends, before watching again.
const POLICY_REWATCH_PAUSE: Duration = Duration::from_secs(1);

impl NodeBus {
    /// Starts the tick and grant tasks on the current tokio runtime; they stop when
    /// `shutdown` turns true or the connection closes.
    pub async fn start(
        client: async_nats::Client,
        limiter: NodeLimiter,
        clock: Clock,
        shutdown: watch::Receiver<bool>,
    ) -> Result<Self, NodeBusError> {
        let node = limiter.node().0;
        let round = Duration::from_millis(u64::from(limiter.config().round_ms));
        let surface = Arc::clone(limiter.surface());
        let limiter = Arc::new(Mutex::new(limiter));
        let stats = Arc::new(NodeBusStats::default());
        let inbox = subjects::grant_inbox(node);
        let grants = client.subscribe(inbox.clone()).await?;
        let grant_task = tokio::spawn(apply_grants(
            grants,
            Arc::clone(&limiter),
            Arc::clone(&stats),
            Arc::clone(&clock),
            shutdown.clone(),
        ));
        // The tick never waits on the bus: reports go through a bounded queue to a
        // publisher task, and a full queue drops the newest (the bus is lossy anyway, and
        // the next round's report supersedes it). Awaiting the publish would stall the
        // tick while the bus is down, the surface would take the stalled reconciler for a
        // dead one (D8) and fail open: 27.5% over the limit in `bench fleet --bus-down-at`.
        let queue_cap = REPORT_QUEUE_ROUNDS * limiter_shards(&limiter);
        let (reports_tx, reports_rx) = tokio::sync::mpsc::channel::<(String, Vec<u8>)>(queue_cap);
        let publish_task = tokio::spawn(publish_reports(
            reports_rx,
            client.clone(),
            inbox.clone(),
            Arc::clone(&stats),
            shutdown.clone(),
        ));
        let tick_task = {
            let (limiter, stats, clock) =
                (Arc::clone(&limiter), Arc::clone(&stats), Arc::clone(&clock));
            tokio::spawn(each_round(round, shutdown, move || {
                tick(&limiter, &stats, &clock, &reports_tx)
            }))
        };
        Ok(Self {
            limiter,
            surface,
            client,
            clock,
            stats,
            tasks: vec![grant_task, tick_task, publish_task],
            policy: watch::channel(Arc::new(PolicyIndex::default())).0,
            fast_path_done: tokio::sync::Notify::new(),
        })
    }

    /// P1: follow the policy snapshot in the NATS key-value bucket. Each new version is
    /// validated whole (an envelope or plan that does not validate is refused and the
    /// current version stays), applied to the limiter's buckets (`handle_policy`), then
    /// published to `policy()` for whoever resolves keys (D1).
    pub async fn watch_policy(&mut self, bucket: &str) -> Result<(), PolicyWatchError> {
        let js = async_nats::jetstream::new(self.client.clone());
        let store = js
            .get_key_value(bucket)
            .await
            .map_err(|e| PolicyWatchError::Bucket(e.to_string()))?;
        let mut updates = store
            .watch_with_history(POLICY_KEY)
            .await
            .map_err(|e| PolicyWatchError::Watch(e.to_string()))?;
        let (limiter, stats, clock, publish) = (
            Arc::clone(&self.limiter),
            Arc::clone(&self.stats),
            Arc::clone(&self.clock),
            self.policy.clone(),
        );
        let round_ms = lock(&limiter).config().round_ms;
        self.tasks.push(tokio::spawn(async move {
            loop {
                while let Some(next) = updates.next().await {
                    // An error is not the watch's end: async-nats recreates the watch's
                    // consumer after a missed heartbeat (a server restart, a failover).
                    // Stopping at the first one would freeze the policy in force for good.
                    let Ok(entry) = next else {
                        stats.policy_watch_errors.fetch_add(1, Ordering::Relaxed);
                        // Not a hot loop if the errors keep coming.
                        tokio::time::sleep(POLICY_WATCH_PAUSE).await;
                        continue;
                    };
                    let index = PolicySnapshot::decode(&entry.value)
                        .ok()
                        .and_then(|snap| PolicyIndex::from_snapshot(&snap, round_ms).ok());
                    let Some(index) = index.filter(|i| i.version > publish.borrow().version) else {
                        stats.policy_refused.fetch_add(1, Ordering::Relaxed);
                        continue;
                    };
                    lock(&limiter).handle_policy(clock(), index.version, |k| index.get(k).copied());
                    publish.send_replace(Arc::new(index));
                    stats.policy_applied.fetch_add(1, Ordering::Relaxed);
                }
                // The watch ended: watch again from the history, once a second until it
                // takes (versions not newer than the one in force are refused).
                loop {
                    stats.policy_watch_errors.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(POLICY_REWATCH_PAUSE).await;
                    if let Ok(u) = store.watch_with_history(POLICY_KEY).await {
                        updates = u;
                        break;
                    }
                }
            }
        }));
        Ok(())
    }

    /// A restart drill (C9, A46): the node comes back as `epoch`, with zero credit and no
    /// records, on the same connection. What the old epoch spent since its last report is
    /// lost, as in a crash; the owner still counts the old epoch's grants as outstanding
    /// until the window closes (C7), so the loss is under-admission, never over.
    pub fn restart(&self, epoch: bus_schemas::NodeEpoch) {
        let mut l = lock(&self.limiter);
        assert!(epoch > l.epoch(), "a restarted node takes a newer epoch");
        let config = l.config().clone();
        self.surface.clear();
        *l = NodeLimiter::new(config, Arc::clone(&self.surface), epoch, (self.clock)());
    }

    /// The policy in force (P1), to resolve a key's plan when it authenticates (D1).
    pub fn policy(&self) -> watch::Receiver<Arc<PolicyIndex>> {
        self.policy.subscribe()
    }

    pub fn surface(&self) -> &Arc<DecisionSurface> {
        &self.surface
    }

    /// Runs `f` on the limiter (for invariant checks and inspection).
    pub fn with_limiter<R>(&self, f: impl FnOnce(&mut NodeLimiter) -> R) -> R {
        f(&mut lock(&self.limiter))
    }

    /// One request's decision. Returns at once unless the surface asks for the fast path,
    /// which is then given at most `FAST_PATH_DEADLINE`.
    pub async fn decide(&self, key: KeyId, policy: &KeyPolicy) -> Decision {
        self.decide_at(key, policy, (self.clock)()).await
    }

    /// As `decide`, for a request that arrived at `now` (`runtime::decide_at`).
    pub async fn decide_at(&self, key: KeyId, policy: &KeyPolicy, now: Now) -> Decision {
        crate::runtime::decide_at(self, key, policy, now).await
    }

    /// The fast path over the bus: request/reply with each shard's owner, all by one
    /// deadline.
    async fn ask_owners(
        &self,
        now: Now,
        need: crate::surface::FastPathNeed,
        policy: &KeyPolicy,
    ) -> Decision {
        let deadline = Instant::now() + FAST_PATH_DEADLINE;
        let claim = self
            .surface
            .claim_fast_path(need.key, || self.fast_path_done.notify_waiters());
        let requests: Vec<_> = match lock_by(&self.limiter, deadline).await {
            Some(mut l) => {
                l.handle_fast_path_need(now, need);
                std::iter::from_fn(|| l.poll_transmit())
                    .filter_map(|t| match t {
                        Transmit::FastPath(f) => Some(f),
                        // Reports are only queued by a tick, which publishes them itself.
                        Transmit::Report(_) => None,
                    })
                    .collect()
            }
            None => {
                self.stats
                    .fast_path_deadline_missed
                    .fetch_add(1, Ordering::Relaxed);
                return claim.settle(now.wall_ms, policy, true);
            }
        };
        let mut missed = false;
        let calls = requests.iter().map(|f| {
            self.stats
                .fast_path_requests
                .fetch_add(1, Ordering::Relaxed);
            let subject = subjects::fast_path(f.shard.0);
            let payload = f.encode();
            self.stats
                .bytes_out
                .fetch_add(payload.len() as u64, Ordering::Relaxed);
            let client = self.client.clone();
            async move { within(deadline, client.request(subject, payload.into())).await }
        });
        for answer in futures::future::join_all(calls).await {
            let Some(Ok(msg)) = answer else {
                missed = true;
                continue;
            };
            self.stats
                .bytes_in
                .fetch_add(msg.payload.len() as u64, Ordering::Relaxed);
            match FastPathReply::decode(&msg.payload) {
                Ok(reply) => match lock_by(&self.limiter, deadline).await {
                    Some(mut l) => l.handle_fast_path_reply((self.clock)(), &reply),
                    None => {
                        // The credit is the node's all the same: applied once the tick
                        // lets go, off the request's thread, and this request a miss.
                        missed = true;
                        let (limiter, clock) = (Arc::clone(&self.limiter), Arc::clone(&self.clock));
                        tokio::task::spawn_blocking(move || {
                            lock(&limiter).handle_fast_path_reply(clock(), &reply)
                        });
                    }
                },
                Err(e) => {
                    self.stats.rejected(e.reason());
                    missed = true;
                }
            }
        }
        if missed {
            self.stats
                .fast_path_deadline_missed
                .fetch_add(1, Ordering::Relaxed);
        }
        claim.settle(now.wall_ms, policy, missed)
    }
}

impl crate::runtime::NodeRuntime for NodeBus {
    fn surface(&self) -> &Arc<DecisionSurface> {
        NodeBus::surface(self)
    }

    fn policy(&self) -> watch::Receiver<Arc<PolicyIndex>> {
        NodeBus::policy(self)
    }

    fn fast_path_deadline_missed(&self) -> u64 {
        self.stats.fast_path_deadline_missed.load(Ordering::Relaxed)
    }

    fn bus_stats(&self) -> Option<&NodeBusStats> {
        Some(&self.stats)
    }

    fn fast_path_done(&self) -> &tokio::sync::Notify {
        &self.fast_path_done
    }

    fn fast_path_wait(&self) -> Duration {
        FAST_PATH_DEADLINE
    }

    fn fast_path<'a>(
        &'a self,
        now: Now,
        need: crate::surface::FastPathNeed,
        policy: &'a KeyPolicy,
    ) -> crate::runtime::FastPathFuture<'a> {
        Box::pin(self.ask_owners(now, need, policy))
    }

    fn with_limiter_dyn(&self, f: &mut dyn FnMut(&mut NodeLimiter)) {
        self.with_limiter(f)
    }
}

impl Drop for NodeBus {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}
