//! The worker's loop over its owners: each round's tick, and each report and fast-path
//! request handled as it arrives. [`run_fold_worker`] drives it for shards the caller
//! assigns; `elected` drives it for the shards whose leases the worker holds.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bus_schemas::{Envelope, FastPathRequest, GrantBatch, Now, OwnerEpoch, ReportBatch, subjects};
use futures::StreamExt;
use tokio::sync::watch;

use super::{Clock, FoldWorkerStats};
use crate::owner::{FoldOwner, OwnerConfig};

#[derive(Debug, thiserror::Error)]
pub enum FoldWorkerError {
    #[error("subscribing: {0}")]
    Subscribe(#[from] async_nats::SubscribeError),
    #[error("shard {0} is not below the configured shard count")]
    Shard(u32),
}

/// A message on one of a held shard's subjects.
pub(super) enum Inbound {
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

/// A worker that owns the shards the caller assigns, as the owner epoch it names. Runs until
/// `shutdown` turns true. `config_for(shard)` gives each owner's configuration.
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
pub(super) trait Owners {
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

/// A timer that, when the task falls behind, waits a full period instead of firing a burst.
pub(super) fn interval(period: Duration) -> tokio::time::Interval {
    let mut i = tokio::time::interval(period);
    i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    i
}

/// One round for every owner: tick (reaping, the hot lane), check, and send what it queued
/// to each node's inbox. An owner that finds its invariant broken has halted itself and
/// grants nothing from here on; the breach is counted.
pub(super) async fn tick_round(
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

/// One message for a held shard: a report folded and answered with its grants, or a
/// fast-path request answered.
pub(super) async fn handle(
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
