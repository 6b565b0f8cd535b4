//! Shard leases in NATS key-value: one key per shard, compare-and-set by revision, each
//! pass renewing the leases a worker holds and trying the free ones at once, off the
//! worker's loop.

use std::time::Duration;

use async_nats::jetstream::{self, kv};
use bus_schemas::subjects;

/// Shard leases in NATS key-value (B1, C8): one key per shard, its value the
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

pub fn lease_key(shard: u32) -> String {
    format!("shard.{shard}")
}

/// `name#<16 hex>`: a lease value no other process writes (`run_elected_worker`).
pub(super) fn lease_holder(name: &str) -> String {
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

/// The lease bucket, created if absent. It keeps one revision per key, and the server
/// expires a lease not renewed within `ttl`.
pub(super) async fn open_lease_bucket(
    js: &jetstream::Context,
    lease: &LeaseConfig,
) -> Result<kv::Store, LeaseError> {
    let created = js
        .create_key_value(kv::Config {
            bucket: lease.bucket.clone(),
            history: 1,
            max_age: lease.ttl,
            // On disk: the leases (and their revisions, the owner epochs) must survive a
            // server restart, or no worker can take a shard back afterwards.
            storage: jetstream::stream::StorageType::File,
            ..Default::default()
        })
        .await;
    match created {
        Ok(s) => Ok(s),
        Err(_) => js
            .get_key_value(lease.bucket.clone())
            .await
            .map_err(|e| LeaseError::Bucket(e.to_string())),
    }
}

/// Gives `shard`'s lease up at once, if it is still at revision `rev` (the lease is this
/// worker's); the fleet does not wait for it to lapse. A failure leaves it to lapse.
pub(super) async fn hand_back(store: &kv::Store, shard: u32, rev: u64) {
    let _ = store
        .delete_expect_revision(lease_key(shard), Some(rev))
        .await;
}

/// What one lease pass did, for the worker's loop to apply.
pub(super) struct LeasePass {
    pub(super) started: tokio::time::Instant,
    /// (shard, the revision renewed from, the new revision if renewed).
    pub(super) renewals: Vec<(u32, u64, Option<u64>)>,
    /// (shard, the revision it was taken at).
    pub(super) taken: Vec<(u32, u64)>,
}

/// One pass over the leases, off the worker's loop: renew those held, try those free.
/// Every shard's call goes out at once: one after another they would take tens of
/// key-value round trips after a bus outage, when all shards change hands at once, and
/// make up most of F7's recovery time.
pub(super) async fn lease_pass(
    store: kv::Store,
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
async fn take_lease(store: &kv::Store, key: &str, name: &str, lease: &LeaseConfig) -> Option<u64> {
    match store.create(key, name.to_owned().into()).await {
        Ok(rev) => Some(rev),
        Err(_) => match store.entry(key).await {
            // Taken over by revision (a renewal in between makes the update fail) rather
            // than after the server's expiry sweep, in two cases:
            // - still ours (this process's own value): this worker fenced itself off (a
            //   bus outage outlived half its lease). Nobody else can hold it, and the sweep
            //   comes ~800 ms after an outage, against F7's 75 ms;
            // - another holder's, unrenewed for a whole ttl by the server's clock (the
            //   sweep comes 86-131 ms after the ttl in the kill drill). Safe while clocks
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
    let now_ns = foldgate_runtime::wall_since_epoch().as_nanos() as i128;
    now_ns - written_ns > ttl.as_nanos() as i128
}
