//! The fold worker on a real NATS bus (issue 4, B1): one task that owns the `FoldOwner`s of
//! the shards assigned to this worker and drives them. It subscribes to each shard's
//! report and fast-path subjects (queue group `foldgate-fold.{shard}`), answers each
//! report with a grant batch on the report's reply subject (the node's grant inbox),
//! answers fast-path requests on theirs, and ticks every owner each round. Envelopes that
//! do not decode are counted by reason and dropped whole.
//!
//! Assignment here is static (the caller says which shards this worker owns, with which
//! owner epoch); leases in NATS key-value that move ownership are the next step of issue 4.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bus_schemas::{
    Envelope, FastPathRequest, GrantBatch, Now, OwnerEpoch, PolicySnapshot, ReportBatch, subjects,
};
use futures::StreamExt;
use tokio::sync::watch;

use crate::metrics::{Histogram, NodeRates, REJECT_REASONS, Unit};
use crate::owner::{FoldOwner, OwnerConfig};
use crate::policy::OwnerPolicy;

pub use foldgate_runtime::Clock;

#[derive(Debug, thiserror::Error)]
pub enum FoldWorkerError {
    #[error("subscribing: {0}")]
    Subscribe(#[from] async_nats::SubscribeError),
    #[error("shard {0} is not below the configured shard count")]
    Shard(u32),
}

/// Fold-age buckets, ms: a round is 25 ms, F7 asks for under one, A57 for under two.
const FOLD_AGE_BOUNDS_MS: &[u64] = &[1, 2, 5, 10, 25, 50, 100, 250, 1_000, 5_000];
/// Grant-latency buckets, us (D4's budget is 2 ms for the whole decision).
const GRANT_LATENCY_BOUNDS_US: &[u64] = &[10, 25, 50, 100, 250, 500, 1_000, 2_500, 10_000];

/// What `metrics::render` exposes; shared with the worker's tasks, atomics only.
#[derive(Debug)]
pub struct FoldWorkerStats {
    pub reports: AtomicU64,
    pub fast_path_requests: AtomicU64,
    pub grant_batches_published: AtomicU64,
    pub rejected: AtomicU64,
    pub publish_errors: AtomicU64,
    pub invariant_breaches: AtomicU64,
    /// Shards whose owner halted, handed back and not taken again (`give_up_halted`).
    pub shards_given_up: AtomicU64,
    pub leases_taken: AtomicU64,
    pub leases_lost: AtomicU64,
    /// Valid envelopes for a shard this worker does not (or no longer) own.
    pub not_owned: AtomicU64,
    /// `rejected`, split by `metrics::REJECT_REASONS`.
    pub rejected_by_reason: [AtomicU64; REJECT_REASONS.len()],
    pub shards_owned: AtomicU64,
    /// P1 snapshots taken into force, and refused (bad, or not newer).
    pub policy_applied: AtomicU64,
    pub policy_refused: AtomicU64,
    /// Errors and ends of the policy watch, each followed by watching on.
    pub policy_watch_errors: AtomicU64,
    pub node_rates: NodeRates,
    pub fold_age_ms: Histogram,
    pub grant_latency_us: Histogram,
}

impl Default for FoldWorkerStats {
    fn default() -> Self {
        Self {
            reports: AtomicU64::new(0),
            fast_path_requests: AtomicU64::new(0),
            grant_batches_published: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            publish_errors: AtomicU64::new(0),
            invariant_breaches: AtomicU64::new(0),
            shards_given_up: AtomicU64::new(0),
            leases_taken: AtomicU64::new(0),
            leases_lost: AtomicU64::new(0),
            not_owned: AtomicU64::new(0),
            rejected_by_reason: Default::default(),
            shards_owned: AtomicU64::new(0),
            policy_applied: AtomicU64::new(0),
            policy_refused: AtomicU64::new(0),
            policy_watch_errors: AtomicU64::new(0),
            node_rates: NodeRates::default(),
            fold_age_ms: Histogram::new(FOLD_AGE_BOUNDS_MS, Unit::Count),
            grant_latency_us: Histogram::new(GRANT_LATENCY_BOUNDS_US, Unit::Count),
        }
    }
}

impl FoldWorkerStats {
    fn reject(&self, reason: &str) {
        self.rejected.fetch_add(1, Ordering::Relaxed);
        let i = REJECT_REASONS
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(REJECT_REASONS.len() - 1);
        self.rejected_by_reason[i].fetch_add(1, Ordering::Relaxed);
    }
}

enum Inbound {
    Report(async_nats::Message),
    FastPath(async_nats::Message),
}

/// Which shards a worker owns, and as what.
pub struct Assignment {
    pub shards: Vec<u32>,
    pub epoch: OwnerEpoch,
    /// Another owner held these shards before (its grants may still be in flight, C8).
    pub takeover: bool,
}

/// Runs until `shutdown` turns true. `config_for(shard)` gives each owner's configuration.
pub async fn run_fold_worker(
    client: async_nats::Client,
    assignment: Assignment,
    config_for: impl Fn(u32) -> OwnerConfig,
    clock: Clock,
    stats: Arc<FoldWorkerStats>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), FoldWorkerError> {
    let Assignment {
        shards,
        epoch,
        takeover,
    } = assignment;
    stats
        .shards_owned
        .store(shards.len() as u64, Ordering::Relaxed);
    let now = clock();
    let mut owners: BTreeMap<u32, FoldOwner> = BTreeMap::new();
    let mut streams = Vec::new();
    let mut round_ms = 25;
    for shard in shards {
        let config = config_for(shard);
        if shard >= config.shards {
            return Err(FoldWorkerError::Shard(shard));
        }
        round_ms = config.round_ms;
        owners.insert(shard, FoldOwner::new(config, epoch, now, takeover));
        let group = subjects::fold_queue_group(shard);
        let reports = client
            .queue_subscribe(subjects::report(shard), group.clone())
            .await?;
        let fast = client
            .queue_subscribe(subjects::fast_path(shard), group)
            .await?;
        streams.push(reports.map(Inbound::Report).boxed());
        streams.push(fast.map(Inbound::FastPath).boxed());
    }
    let mut inbound = futures::stream::select_all(streams);
    let mut every = interval(Duration::from_millis(u64::from(round_ms)));
    loop {
        tokio::select! {
            _ = shutdown.changed() => return Ok(()),
            _ = every.tick() => tick_round(&client, &stats, &mut owners, clock()).await,
            m = inbound.next() => {
                let Some(m) = m else { return Ok(()) };
                handle(&client, &stats, &mut owners, &clock, m).await;
            }
        }
    }
}

async fn publish_grant(
    client: &async_nats::Client,
    stats: &FoldWorkerStats,
    subject: String,
    g: &GrantBatch,
) {
    match client.publish(subject, g.encode().into()).await {
        Ok(()) => stats
            .grant_batches_published
            .fetch_add(1, Ordering::Relaxed),
        Err(_) => stats.publish_errors.fetch_add(1, Ordering::Relaxed),
    };
}

/// Whatever holds this worker's owners, by shard.
trait Owners {
    fn owner(&mut self, shard: u32) -> Option<&mut FoldOwner>;
    fn each(&mut self) -> impl Iterator<Item = &mut FoldOwner>;
}

impl Owners for BTreeMap<u32, FoldOwner> {
    fn owner(&mut self, shard: u32) -> Option<&mut FoldOwner> {
        self.get_mut(&shard)
    }
    fn each(&mut self) -> impl Iterator<Item = &mut FoldOwner> {
        self.values_mut()
    }
}

impl Owners for BTreeMap<u32, Held> {
    fn owner(&mut self, shard: u32) -> Option<&mut FoldOwner> {
        self.get_mut(&shard).map(|h| &mut h.owner)
    }
    fn each(&mut self) -> impl Iterator<Item = &mut FoldOwner> {
        self.values_mut().map(|h| &mut h.owner)
    }
}

/// A timer that, when the task falls behind, waits a full period instead of firing a burst.
fn interval(period: Duration) -> tokio::time::Interval {
    let mut i = tokio::time::interval(period);
    i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    i
}

/// One round for every owner: tick (reaping, the hot lane), check, and send what it queued
/// to each node's inbox. An owner that finds its invariant broken has halted itself and
/// grants nothing from here on; the breach is counted.
async fn tick_round(
    client: &async_nats::Client,
    stats: &FoldWorkerStats,
    owners: &mut impl Owners,
    now: Now,
) {
    stats.node_rates.end_round();
    let mut out = Vec::new();
    for owner in owners.each() {
        owner.handle_tick(now);
        if owner.check_invariants().is_err() {
            stats.invariant_breaches.fetch_add(1, Ordering::Relaxed);
        }
        out.extend(std::iter::from_fn(|| owner.poll_grant()));
    }
    for g in out {
        publish_grant(client, stats, subjects::grant_inbox(g.node.0), &g).await;
    }
}

async fn handle(
    client: &async_nats::Client,
    stats: &FoldWorkerStats,
    owners: &mut impl Owners,
    clock: &Clock,
    m: Inbound,
) {
    let now = clock();
    let arrived = std::time::Instant::now();
    match m {
        Inbound::Report(msg) => {
            let batch = match ReportBatch::decode(&msg.payload) {
                Ok(b) => b,
                Err(e) => return stats.reject(e.reason()),
            };
            let Some(owner) = owners.owner(batch.shard.0) else {
                stats.not_owned.fetch_add(1, Ordering::Relaxed);
                return;
            };
            stats.reports.fetch_add(1, Ordering::Relaxed);
            stats.node_rates.report_from(batch.node.0);
            // Clocks of node and worker differ by their skew (A50 allows 50 ms); a report
            // from a node ahead of this worker reads as age 0.
            stats
                .fold_age_ms
                .observe(now.wall_ms.saturating_sub(batch.sent_at_ms));
            owner.handle_report_batch(now, &batch);
            let grants: Vec<GrantBatch> = std::iter::from_fn(|| owner.poll_grant()).collect();
            for g in grants {
                // The answer to this report goes to its reply subject; anything else the
                // owner queued goes to its node's inbox.
                let subject = match &msg.reply {
                    Some(reply) if g.node == batch.node => reply.to_string(),
                    _ => subjects::grant_inbox(g.node.0),
                };
                publish_grant(client, stats, subject, &g).await;
            }
            stats
                .grant_latency_us
                .observe(arrived.elapsed().as_micros() as u64);
        }
        Inbound::FastPath(msg) => {
            let req = match FastPathRequest::decode(&msg.payload) {
                Ok(r) => r,
                Err(e) => return stats.reject(e.reason()),
            };
            let Some(reply) = msg.reply else {
                return stats.reject("no_reply");
            };
            let Some(owner) = owners.owner(req.shard.0) else {
                stats.not_owned.fetch_add(1, Ordering::Relaxed);
                return;
            };
            stats.fast_path_requests.fetch_add(1, Ordering::Relaxed);
            let answer = owner.handle_fast_path_request(now, &req);
            if client.publish(reply, answer.encode().into()).await.is_err() {
                stats.publish_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Shard leases in NATS key-value (issue 4, B1, C8): one key per shard, its value the
/// holder's name and process token (`lease_holder`), compare-and-set by revision,
/// expiring after `ttl` unless renewed.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    pub bucket: String,
    pub ttl: Duration,
    pub renew_every: Duration,
}

impl LeaseConfig {
    pub fn reference() -> Self {
        Self {
            bucket: subjects::OWNERS_BUCKET.into(),
            ttl: Duration::from_millis(500),
            renew_every: Duration::from_millis(100),
        }
    }
}

/// Who a worker is in the lease bucket, and what it competes for.
#[derive(Clone, Debug)]
pub struct Candidate {
    pub name: String,
    pub shard_count: u32,
    pub lease: LeaseConfig,
    /// P1: the key-value bucket to watch for the policy snapshot (`subjects::POLICY_BUCKET`
    /// in production); `None` runs on the allowances the nodes report alone.
    pub policy_bucket: Option<String>,
}

pub fn lease_key(shard: u32) -> String {
    format!("shard.{shard}")
}

/// `name#<16 hex>`: a lease value no other process writes (`run_elected_worker`).
fn lease_holder(name: &str) -> String {
    use std::hash::BuildHasher;
    // RandomState is keyed afresh per process from the OS's randomness.
    let token = std::collections::hash_map::RandomState::new().hash_one(std::process::id());
    format!("{name}#{token:016x}")
}

/// The name part of a lease value (`lease_holder`).
pub fn lease_holder_name(value: &[u8]) -> String {
    let value = String::from_utf8_lossy(value);
    value
        .rsplit_once('#')
        .map_or(&*value, |(n, _)| n)
        .to_string()
}

#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("opening the lease bucket: {0}")]
    Bucket(String),
}

struct Held {
    owner: FoldOwner,
    revision: u64,
    renewed: tokio::time::Instant,
    forwarders: Vec<tokio::task::JoinHandle<()>>,
}

/// Self-fence (C8): a lease last renewed half its life ago may lapse, or have lapsed while
/// this worker was paused, with another worker taking it. The shard is dropped before this
/// worker answers anything more for it: checked right after a renewal pass only, it never
/// fired (the pass had just stamped every lease it kept), and a worker back from a pause
/// went on granting under its old epoch until its next pass.
fn fence_stale_leases(held: &mut BTreeMap<u32, Held>, ttl: Duration, stats: &FoldWorkerStats) {
    let now = tokio::time::Instant::now();
    let before = held.len();
    held.retain(|_, h| now.duration_since(h.renewed) < ttl / 2);
    if held.len() != before {
        stats
            .leases_lost
            .fetch_add((before - held.len()) as u64, Ordering::Relaxed);
        stats
            .shards_owned
            .store(held.len() as u64, Ordering::Relaxed);
    }
}

/// Gives `shard`'s lease up at once, if it is still at revision `rev` (the lease is this
/// worker's); the fleet does not wait for it to lapse. A failure leaves it to lapse.
async fn hand_back(store: &async_nats::jetstream::kv::Store, shard: u32, rev: u64) {
    let _ = store
        .delete_expect_revision(lease_key(shard), Some(rev))
        .await;
}

/// An owner that found its invariant broken grants nothing more (it halted itself), and
/// this worker will not guess either: it hands the shard's lease back at once, so another
/// worker can take the shard with books rebuilt from the nodes' reports behind the
/// takeover fence (C8), and never takes that shard again itself. Kept, the lease was
/// renewed for good, every node went degraded on that shard (F5) and stayed so until
/// someone restarted the worker.
async fn give_up_halted(
    store: &async_nats::jetstream::kv::Store,
    stats: &FoldWorkerStats,
    held: &mut BTreeMap<u32, Held>,
    given_up: &mut std::collections::BTreeSet<u32>,
) {
    let halted: Vec<u32> = held
        .iter()
        .filter(|(_, h)| h.owner.halted().is_some())
        .map(|(s, _)| *s)
        .collect();
    for shard in halted {
        let Some(h) = held.remove(&shard) else {
            continue;
        };
        hand_back(store, shard, h.revision).await;
        given_up.insert(shard);
        stats.shards_given_up.fetch_add(1, Ordering::Relaxed);
        stats
            .shards_owned
            .store(held.len() as u64, Ordering::Relaxed);
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        for f in &self.forwarders {
            f.abort();
        }
    }
}

/// A fold worker that competes for shard leases and owns whatever it holds. The owner
/// epoch of a shard is the key-value revision at which its lease was taken: revisions
/// only grow, so a later owner always has the larger epoch, and nodes refuse the older
/// one's grants (C2). A new owner starts with the takeover fence up (C8). A worker that
/// has not renewed for half the lease stops issuing for that shard before its lease can
/// have lapsed, so two owners never issue at once.
pub async fn run_elected_worker(
    client: async_nats::Client,
    candidate: Candidate,
    config_for: impl Fn(u32) -> OwnerConfig,
    clock: Clock,
    stats: Arc<FoldWorkerStats>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), LeaseError> {
    let Candidate {
        name,
        shard_count,
        lease,
        policy_bucket,
    } = candidate;
    // What this process writes into its leases: the name for operators, and a token of
    // this process's own. Two workers given one name (a copied config) each took the
    // other's lease as their own on every pass, a new owner epoch with the takeover fence
    // up each time, and the shard granted almost nothing.
    let name = lease_holder(&name);
    use async_nats::jetstream::{self, kv};
    let js = jetstream::new(client.clone());
    let store = match js
        .create_key_value(kv::Config {
            bucket: lease.bucket.clone(),
            history: 1,
            max_age: lease.ttl,
            // On disk: the leases (and their revisions, the owner epochs) must survive a
            // server restart, or no worker can take a shard back afterwards.
            storage: jetstream::stream::StorageType::File,
            ..Default::default()
        })
        .await
    {
        Ok(s) => s,
        Err(_) => js
            .get_key_value(lease.bucket.clone())
            .await
            .map_err(|e| LeaseError::Bucket(e.to_string()))?,
    };
    let (policy_tx, mut policy_rx) = watch::channel(None::<Arc<OwnerPolicy>>);
    if let Some(bucket) = policy_bucket {
        tokio::spawn(watch_policy(
            js.clone(),
            bucket,
            policy_tx,
            Arc::clone(&stats),
            shutdown.clone(),
        ));
    }
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Inbound>(16_384);
    let mut held: BTreeMap<u32, Held> = BTreeMap::new();
    // Shards whose owner halted here: not taken again by this process (`give_up_halted`).
    let mut given_up = std::collections::BTreeSet::new();
    let round_ms = config_for(0).round_ms;
    let mut rounds = interval(Duration::from_millis(u64::from(round_ms)));
    let mut leases = interval(lease.renew_every);
    // Lease passes run off this loop (`lease_pass`): awaited here, their key-value round
    // trips held every report and fast path behind them, and a second worker competing
    // for the leases put this worker's fast-path p99 past D5's 1 ms. One at a time.
    let (pass_tx, mut pass_rx) = tokio::sync::mpsc::channel::<LeasePass>(1);
    let mut pass_running = false;
    loop {
        tokio::select! {
            _ = shutdown.changed() => {
                // A pass in flight may have taken or renewed leases: wait for it, so that
                // they are handed back too.
                if pass_running
                    && let Ok(Some(pass)) = tokio::time::timeout(lease.ttl, pass_rx.recv()).await
                {
                    for (shard, rev) in pass.taken {
                        hand_back(&store, shard, rev).await;
                    }
                    for (shard, sent, renewed) in pass.renewals {
                        if let (Some(h), Some(rev)) = (held.get_mut(&shard), renewed)
                            && h.revision == sent
                        {
                            h.revision = rev;
                        }
                    }
                }
                // Hand the shards back at once rather than make the fleet wait a lease.
                for (shard, h) in std::mem::take(&mut held) {
                    hand_back(&store, shard, h.revision).await;
                }
                return Ok(());
            }
            _ = leases.tick(), if !pass_running => {
                pass_running = true;
                let renew: Vec<(u32, u64)> = held.iter().map(|(s, h)| (*s, h.revision)).collect();
                let free: Vec<u32> = (0..shard_count)
                    .filter(|s| !held.contains_key(s) && !given_up.contains(s))
                    .collect();
                tokio::spawn(lease_pass(
                    store.clone(),
                    name.clone(),
                    lease.clone(),
                    renew,
                    free,
                    pass_tx.clone(),
                ));
            }
            Some(pass) = pass_rx.recv() => {
                pass_running = false;
                for (shard, sent, renewed) in pass.renewals {
                    // Fenced or given up meanwhile: that shard is no longer this loop's.
                    let Some(h) = held.get_mut(&shard).filter(|h| h.revision == sent) else {
                        // Given up: the renewal moved the lease past the revision the hand-back
                        // deleted at, so hand it back at the new one (else it stays dark a lease).
                        if let Some(rev) = renewed.filter(|_| given_up.contains(&shard)) {
                            hand_back(&store, shard, rev).await;
                        }
                        continue;
                    };
                    match renewed {
                        Some(rev) => {
                            h.revision = rev;
                            // When the renewal was sent: the lease is at least this fresh.
                            h.renewed = pass.started;
                        }
                        None => {
                            held.remove(&shard);
                            stats.leases_lost.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                for (shard, rev) in pass.taken {
                    let mut forwarders = Vec::new();
                    for subject in [subjects::report(shard), subjects::fast_path(shard)] {
                        let is_report = subjects::is_report(&subject);
                        let Ok(mut sub) = client.subscribe(subject).await else { continue };
                        let tx = tx.clone();
                        forwarders.push(tokio::spawn(async move {
                            while let Some(m) = sub.next().await {
                                let m = if is_report { Inbound::Report(m) } else { Inbound::FastPath(m) };
                                if tx.send(m).await.is_err() {
                                    return;
                                }
                            }
                        }));
                    }
                    stats.leases_taken.fetch_add(1, Ordering::Relaxed);
                    let mut owner = FoldOwner::new(config_for(shard), OwnerEpoch(rev), clock(), true);
                    if let Some(p) = policy_rx.borrow().clone() {
                        owner.handle_policy(p);
                    }
                    held.insert(shard, Held {
                        owner,
                        revision: rev,
                        renewed: pass.started,
                        forwarders,
                    });
                }
                stats.shards_owned.store(held.len() as u64, Ordering::Relaxed);
            }
            _ = rounds.tick() => {
                fence_stale_leases(&mut held, lease.ttl, &stats);
                tick_round(&client, &stats, &mut held, clock()).await;
                give_up_halted(&store, &stats, &mut held, &mut given_up).await;
            }
            Ok(()) = policy_rx.changed() => {
                if let Some(p) = policy_rx.borrow_and_update().clone() {
                    for owner in held.each() {
                        owner.handle_policy(Arc::clone(&p));
                    }
                }
            }
            m = rx.recv() => {
                let Some(m) = m else { return Ok(()) };
                fence_stale_leases(&mut held, lease.ttl, &stats);
                handle(&client, &stats, &mut held, &clock, m).await;
                give_up_halted(&store, &stats, &mut held, &mut given_up).await;
            }
        }
    }
}

/// What one lease pass did, for the worker's loop to apply.
struct LeasePass {
    started: tokio::time::Instant,
    /// (shard, the revision renewed from, the new revision if renewed).
    renewals: Vec<(u32, u64, Option<u64>)>,
    /// (shard, the revision it was taken at).
    taken: Vec<(u32, u64)>,
}

/// One pass over the leases, off the worker's loop: renew those held, try those free.
/// Every shard's call goes out at once: one after another they took tens of key-value
/// round trips after a bus outage, when all shards change hands at once, and that pass
/// was most of F7's recovery time.
async fn lease_pass(
    store: async_nats::jetstream::kv::Store,
    holder: String,
    lease: LeaseConfig,
    renew: Vec<(u32, u64)>,
    free: Vec<u32>,
    done: tokio::sync::mpsc::Sender<LeasePass>,
) {
    let started = tokio::time::Instant::now();
    let renewals = futures::future::join_all(renew.into_iter().map(|(shard, rev)| {
        let (store, holder) = (&store, holder.clone());
        async move {
            let renewed = store.update(&lease_key(shard), holder.into(), rev).await;
            (shard, rev, renewed.ok())
        }
    }))
    .await;
    let taken = futures::future::join_all(free.into_iter().map(|shard| {
        let (store, holder, lease) = (&store, &holder, &lease);
        async move {
            (
                shard,
                take_lease(store, &lease_key(shard), holder, lease).await,
            )
        }
    }))
    .await
    .into_iter()
    .filter_map(|(shard, rev)| Some((shard, rev?)))
    .collect();
    let _ = done
        .send(LeasePass {
            started,
            renewals,
            taken,
        })
        .await;
}

/// One try at a free shard's lease: the revision it was taken at, if taken.
async fn take_lease(
    store: &async_nats::jetstream::kv::Store,
    key: &str,
    name: &str,
    lease: &LeaseConfig,
) -> Option<u64> {
    use async_nats::jetstream::kv;
    match store.create(key, name.to_owned().into()).await {
        Ok(rev) => Some(rev),
        Err(_) => match store.entry(key).await {
            // Taken over by revision (a renewal in between makes the update fail) rather
            // than after the server's expiry sweep, in two cases:
            // - still ours (this process's own value): this worker fenced itself off (a
            //   bus outage outlived half its lease). Nobody else can hold it (the sweep came ~800 ms after an
            //   outage, against F7's 75 ms);
            // - another holder's, unrenewed for a whole ttl by the server's clock (the
            //   sweep came 86-131 ms after the ttl in the kill drill). Safe while clocks
            //   agree to within ttl/2 - renew_every: the holder stops issuing once its
            //   last renewal is ttl/2 old, checked every renew_every.
            // Either way it comes back as a new owner epoch with the takeover fence up, as
            // any new owner does (C8).
            Ok(Some(e))
                if e.operation == kv::Operation::Put
                    && (e.value == name.as_bytes()
                        || lapsed(e.created.unix_timestamp_nanos(), lease.ttl)) =>
            {
                store
                    .update(key, name.to_owned().into(), e.revision)
                    .await
                    .ok()
            }
            _ => None,
        },
    }
}

/// Whether a lease written at `written_ns` (the server's timestamp, ns since the epoch)
/// is older than `ttl` by this worker's wall clock.
fn lapsed(written_ns: i128, ttl: Duration) -> bool {
    let now_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128);
    now_ns - written_ns > ttl.as_nanos() as i128
}

/// P1: follows the policy snapshot in `bucket` (waiting for the bucket to exist) and
/// publishes each newer valid version. A snapshot that does not decode or names an
/// unknown plan is refused whole and counted; the policy in force stays.
async fn watch_policy(
    js: async_nats::jetstream::Context,
    bucket: String,
    publish: watch::Sender<Option<Arc<OwnerPolicy>>>,
    stats: Arc<FoldWorkerStats>,
    mut shutdown: watch::Receiver<bool>,
) {
    let store = loop {
        if let Ok(s) = js.get_key_value(bucket.clone()).await {
            break s;
        }
        if !pause(&mut shutdown, Duration::from_secs(1)).await {
            return;
        }
    };
    // A watch that fails to start, or ends, is started again once a second: returning
    // left the worker on the policy in force for good. After an error it carries on, a
    // little later, so errors that keep coming are no hot loop.
    let mut updates = None;
    loop {
        let wait = match updates.as_mut() {
            None => match store.watch_with_history(subjects::POLICY_KEY).await {
                Ok(w) => {
                    updates = Some(w);
                    continue;
                }
                Err(_) => Duration::from_secs(1),
            },
            Some(watch) => match tokio::select! {
                _ = shutdown.changed() => return,
                e = watch.next() => e,
            } {
                Some(Ok(entry)) => {
                    take_policy(&entry.value, &publish, &stats);
                    continue;
                }
                Some(Err(_)) => Duration::from_millis(100),
                None => {
                    updates = None;
                    Duration::from_secs(1)
                }
            },
        };
        stats.policy_watch_errors.fetch_add(1, Ordering::Relaxed);
        if !pause(&mut shutdown, wait).await {
            return;
        }
    }
}

/// Waits `wait`; false if `shutdown` came first.
async fn pause(shutdown: &mut watch::Receiver<bool>, wait: Duration) -> bool {
    tokio::select! {
        _ = shutdown.changed() => false,
        _ = tokio::time::sleep(wait) => true,
    }
}

/// One snapshot from the watch: into force if it is valid and newer, else refused.
fn take_policy(
    value: &[u8],
    publish: &watch::Sender<Option<Arc<OwnerPolicy>>>,
    stats: &FoldWorkerStats,
) {
    let newest = publish.borrow().as_ref().map_or(0, |p| p.version);
    match PolicySnapshot::decode(value)
        .ok()
        .and_then(|s| OwnerPolicy::from_snapshot(&s).ok())
    {
        Some(p) if p.version > newest => {
            publish.send_replace(Some(Arc::new(p)));
            stats.policy_applied.fetch_add(1, Ordering::Relaxed);
        }
        _ => {
            stats.policy_refused.fetch_add(1, Ordering::Relaxed);
        }
    }
}
