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

use bus_schemas::{Envelope, FastPathRequest, GrantBatch, Now, OwnerEpoch, ReportBatch, subjects};
use futures::StreamExt;
use tokio::sync::watch;

use crate::owner::{FoldOwner, OwnerConfig};

pub type Clock = Arc<dyn Fn() -> Now + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum FoldWorkerError {
    #[error("subscribing: {0}")]
    Subscribe(#[from] async_nats::SubscribeError),
    #[error("shard {0} is not below the configured shard count")]
    Shard(u32),
}

#[derive(Debug, Default)]
pub struct FoldWorkerStats {
    pub reports: AtomicU64,
    pub fast_path_requests: AtomicU64,
    pub grant_batches_published: AtomicU64,
    pub rejected: AtomicU64,
    pub publish_errors: AtomicU64,
    pub invariant_breaches: AtomicU64,
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
        let group = format!("foldgate-fold.{shard}");
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
    let mut every = tokio::time::interval(Duration::from_millis(u64::from(round_ms)));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.changed() => return Ok(()),
            _ = every.tick() => {
                let now = clock();
                let mut out = Vec::new();
                for owner in owners.values_mut() {
                    owner.handle_tick(now);
                    if owner.check_invariants().is_err() {
                        // The owner has halted itself; it grants nothing from here on.
                        stats.invariant_breaches.fetch_add(1, Ordering::Relaxed);
                    }
                    out.extend(std::iter::from_fn(|| owner.poll_grant()));
                }
                for g in out {
                    publish_grant(&client, &stats, subjects::grant_inbox(g.node.0), &g).await;
                }
            }
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

async fn handle(
    client: &async_nats::Client,
    stats: &FoldWorkerStats,
    owners: &mut BTreeMap<u32, FoldOwner>,
    clock: &Clock,
    m: Inbound,
) {
    let now = clock();
    match m {
        Inbound::Report(msg) => {
            let Ok(batch) = ReportBatch::decode(&msg.payload) else {
                stats.rejected.fetch_add(1, Ordering::Relaxed);
                return;
            };
            let Some(owner) = owners.get_mut(&batch.shard.0) else {
                stats.rejected.fetch_add(1, Ordering::Relaxed);
                return;
            };
            stats.reports.fetch_add(1, Ordering::Relaxed);
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
        }
        Inbound::FastPath(msg) => {
            let (Ok(req), Some(reply)) = (FastPathRequest::decode(&msg.payload), msg.reply) else {
                stats.rejected.fetch_add(1, Ordering::Relaxed);
                return;
            };
            let Some(owner) = owners.get_mut(&req.shard.0) else {
                stats.rejected.fetch_add(1, Ordering::Relaxed);
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
