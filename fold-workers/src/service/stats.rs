//! What a fold worker counts, shared between its tasks and the scrape endpoint.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::metrics::{Histogram, NodeRates, REJECT_REASONS, Unit};

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
    pub(super) fn reject(&self, reason: &str) {
        self.rejected.fetch_add(1, Ordering::Relaxed);
        let i = REJECT_REASONS
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(REJECT_REASONS.len() - 1);
        self.rejected_by_reason[i].fetch_add(1, Ordering::Relaxed);
    }
}
