//! The elected fold worker: it competes for shard leases (`lease`) and owns whatever it
//! holds, follows the policy snapshot (`policy_watch`), and fences itself off a shard
//! before its lease can have lapsed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_nats::jetstream::{self, kv};
use bus_schemas::{OwnerEpoch, subjects};
use futures::StreamExt;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::lease::{
    LeaseConfig, LeaseError, LeasePass, hand_back, lease_holder, lease_pass, open_lease_bucket,
};
use super::policy_watch::watch_policy;
use super::worker::{Inbound, Owners, handle, interval, tick_round};
use super::{Clock, FoldWorkerStats};
use crate::owner::{FoldOwner, OwnerConfig};
use crate::policy::OwnerPolicy;

/// The policy in force, as the watch hands it on (`None` until the first snapshot).
type PolicyRx = watch::Receiver<Option<Arc<OwnerPolicy>>>;

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

/// A shard this worker holds the lease of, and its owner.
struct Held {
    owner: FoldOwner,
    revision: u64,
    renewed: tokio::time::Instant,
    forwarders: Vec<JoinHandle<()>>,
}

impl Drop for Held {
    fn drop(&mut self) {
        for f in &self.forwarders {
            f.abort();
        }
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

/// Self-fence (C8): a lease last renewed half its life ago may lapse, or have lapsed while
/// this worker was paused, with another worker taking it. The shard is dropped before this
/// worker answers anything more for it. It is checked each round and before each message,
/// not only after a renewal pass: a pass has just stamped every lease it kept, so a check
/// there never fires, and a worker back from a pause would grant under its old epoch until
/// its next pass.
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

/// An owner that found its invariant broken grants nothing more (it halted itself), and
/// this worker will not guess either: it hands the shard's lease back at once, so another
/// worker can take the shard with books rebuilt from the nodes' reports behind the
/// takeover fence (C8), and never takes that shard again itself. Were the lease kept, it
/// would be renewed for good, and every node would stay degraded on that shard (F5) until
/// someone restarted the worker.
async fn give_up_halted(
    store: &kv::Store,
    stats: &FoldWorkerStats,
    held: &mut BTreeMap<u32, Held>,
    given_up: &mut BTreeSet<u32>,
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
    // this process's own. Were it the name alone, two workers given one name (a copied
    // config) would each take the other's lease as their own on every pass, a new owner
    // epoch with the takeover fence up each time, and the shard would grant almost nothing.
    let name = lease_holder(&name);
    let js = jetstream::new(client.clone());
    let store = open_lease_bucket(&js, &lease).await?;
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
    let (tx, mut rx) = mpsc::channel::<Inbound>(16_384);
    let round_ms = config_for(0).round_ms;
    let mut rounds = interval(Duration::from_millis(u64::from(round_ms)));
    let mut leases = interval(lease.renew_every);
    // Lease passes run off this loop (`lease_pass`): awaited here, their key-value round
    // trips would hold every report and fast path behind them, and a second worker
    // competing for the leases would put this worker's fast-path p99 past D5's 1 ms. One
    // at a time.
    let (pass_tx, mut pass_rx) = mpsc::channel::<LeasePass>(1);
    let mut worker = Elected {
        client,
        store,
        name,
        lease,
        shard_count,
        config_for,
        clock,
        stats,
        inbound: tx,
        passes: pass_tx,
        pass_running: false,
        held: BTreeMap::new(),
        given_up: BTreeSet::new(),
    };
    loop {
        tokio::select! {
            _ = shutdown.changed() => {
                worker.shut_down(&mut pass_rx).await;
                return Ok(());
            }
            _ = leases.tick(), if !worker.pass_running => worker.start_pass(),
            Some(pass) = pass_rx.recv() => worker.apply_pass(pass, &policy_rx).await,
            _ = rounds.tick() => worker.round().await,
            Ok(()) = policy_rx.changed() => {
                if let Some(p) = policy_rx.borrow_and_update().clone() {
                    for owner in worker.held.each() {
                        owner.handle_policy(Arc::clone(&p));
                    }
                }
            }
            m = rx.recv() => {
                let Some(m) = m else { return Ok(()) };
                worker.message(m).await;
            }
        }
    }
}

/// An elected worker's state between the events of its loop.
struct Elected<F> {
    client: async_nats::Client,
    store: kv::Store,
    /// What this process writes into its leases (`lease_holder`).
    name: String,
    lease: LeaseConfig,
    shard_count: u32,
    config_for: F,
    clock: Clock,
    stats: Arc<FoldWorkerStats>,
    /// Where the held shards' subscriptions forward their messages.
    inbound: mpsc::Sender<Inbound>,
    passes: mpsc::Sender<LeasePass>,
    pass_running: bool,
    held: BTreeMap<u32, Held>,
    /// Shards whose owner halted here: not taken again by this process (`give_up_halted`).
    given_up: BTreeSet<u32>,
}

impl<F: Fn(u32) -> OwnerConfig> Elected<F> {
    /// Starts a lease pass over the held shards and the free ones not given up.
    fn start_pass(&mut self) {
        self.pass_running = true;
        let renew: Vec<(u32, u64)> = self.held.iter().map(|(s, h)| (*s, h.revision)).collect();
        let free: Vec<u32> = (0..self.shard_count)
            .filter(|s| !self.held.contains_key(s) && !self.given_up.contains(s))
            .collect();
        tokio::spawn(lease_pass(
            self.store.clone(),
            self.name.clone(),
            self.lease.clone(),
            renew,
            free,
            self.passes.clone(),
        ));
    }

    /// Takes in what a lease pass did: renewals kept or lost, shards newly taken.
    async fn apply_pass(&mut self, pass: LeasePass, policy: &PolicyRx) {
        self.pass_running = false;
        self.apply_renewals(pass.renewals, pass.started).await;
        for (shard, rev) in pass.taken {
            self.take_shard(shard, rev, pass.started, policy).await;
        }
        self.stats
            .shards_owned
            .store(self.held.len() as u64, Ordering::Relaxed);
    }

    async fn apply_renewals(
        &mut self,
        renewals: Vec<(u32, u64, Option<u64>)>,
        started: tokio::time::Instant,
    ) {
        for (shard, sent, renewed) in renewals {
            // Fenced or given up meanwhile: that shard is no longer this loop's.
            let Some(h) = self.held.get_mut(&shard).filter(|h| h.revision == sent) else {
                // Given up: the renewal moved the lease past the revision the hand-back
                // deleted at, so hand it back at the new one (else it stays dark a lease).
                if let Some(rev) = renewed.filter(|_| self.given_up.contains(&shard)) {
                    hand_back(&self.store, shard, rev).await;
                }
                continue;
            };
            match renewed {
                Some(rev) => {
                    h.revision = rev;
                    // When the renewal was sent: the lease is at least this fresh.
                    h.renewed = started;
                }
                None => {
                    self.held.remove(&shard);
                    self.stats.leases_lost.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// A shard whose lease was taken at `rev`: its subjects forwarded to this loop, and a
    /// new owner of epoch `rev` behind the takeover fence (C8), on the policy in force.
    async fn take_shard(
        &mut self,
        shard: u32,
        rev: u64,
        renewed: tokio::time::Instant,
        policy: &PolicyRx,
    ) {
        let forwarders = self.forward(shard).await;
        self.stats.leases_taken.fetch_add(1, Ordering::Relaxed);
        let config = (self.config_for)(shard);
        let mut owner = FoldOwner::new(config, OwnerEpoch(rev), (self.clock)(), true);
        if let Some(p) = policy.borrow().clone() {
            owner.handle_policy(p);
        }
        self.held.insert(
            shard,
            Held {
                owner,
                revision: rev,
                renewed,
                forwarders,
            },
        );
    }

    /// Subscribes to `shard`'s report and fast-path subjects, each forwarded to this loop
    /// by a task of its own.
    async fn forward(&self, shard: u32) -> Vec<JoinHandle<()>> {
        let mut forwarders = Vec::new();
        for subject in [subjects::report(shard), subjects::fast_path(shard)] {
            let is_report = subjects::is_report(&subject);
            let Ok(mut sub) = self.client.subscribe(subject).await else {
                continue;
            };
            let tx = self.inbound.clone();
            forwarders.push(tokio::spawn(async move {
                while let Some(m) = sub.next().await {
                    let m = if is_report {
                        Inbound::Report(m)
                    } else {
                        Inbound::FastPath(m)
                    };
                    if tx.send(m).await.is_err() {
                        return;
                    }
                }
            }));
        }
        forwarders
    }

    /// A round: stale leases fenced off, every owner ticked, halted owners given up.
    async fn round(&mut self) {
        fence_stale_leases(&mut self.held, self.lease.ttl, &self.stats);
        tick_round(&self.client, &self.stats, &mut self.held, (self.clock)()).await;
        self.give_up_halted().await;
    }

    /// One message for a held shard, handled once stale leases are fenced off.
    async fn message(&mut self, m: Inbound) {
        fence_stale_leases(&mut self.held, self.lease.ttl, &self.stats);
        handle(&self.client, &self.stats, &mut self.held, &self.clock, m).await;
        self.give_up_halted().await;
    }

    async fn give_up_halted(&mut self) {
        give_up_halted(&self.store, &self.stats, &mut self.held, &mut self.given_up).await;
    }

    /// Hands every lease back at once rather than make the fleet wait a lease out.
    async fn shut_down(&mut self, passes: &mut mpsc::Receiver<LeasePass>) {
        // A pass in flight may have taken or renewed leases: wait for it, so that they
        // are handed back too.
        if self.pass_running
            && let Ok(Some(pass)) = tokio::time::timeout(self.lease.ttl, passes.recv()).await
        {
            for (shard, rev) in pass.taken {
                hand_back(&self.store, shard, rev).await;
            }
            for (shard, sent, renewed) in pass.renewals {
                if let (Some(h), Some(rev)) = (self.held.get_mut(&shard), renewed)
                    && h.revision == sent
                {
                    h.revision = rev;
                }
            }
        }
        for (shard, h) in std::mem::take(&mut self.held) {
            hand_back(&self.store, shard, h.revision).await;
        }
    }
}
