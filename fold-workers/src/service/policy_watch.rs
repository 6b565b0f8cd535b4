//! The policy watch (P1): an elected worker follows the policy snapshot in key-value and
//! hands each newer valid version to its owners.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bus_schemas::{Envelope, PolicySnapshot, subjects};
use futures::StreamExt;
use tokio::sync::watch;

use super::FoldWorkerStats;
use crate::policy::OwnerPolicy;

/// P1: follows the policy snapshot in `bucket` (waiting for the bucket to exist) and
/// publishes each newer valid version. A snapshot that does not decode or names an
/// unknown plan is refused whole and counted; the policy in force stays.
pub(super) async fn watch_policy(
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
    // would leave the worker on the policy in force for good. After an error it carries
    // on, a little later, so errors that keep coming are no hot loop.
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
