//! The fold worker: `fold-core`'s owners driven over real NATS.
//!
//! [`service::run_elected_worker`] takes shard leases in the key-value bucket, runs one
//! [`FoldOwner`] per held shard, folds the nodes' reports into it and publishes its grants
//! and fast-path replies (`foldgate-fold`, `src/bin/`); [`metrics`] renders its bus
//! metrics for Prometheus (F6) and serves the scrape endpoint.
//!
//! The state machine itself lives in `fold-core` (no IO); it is re-exported here so the
//! worker's users name one crate.

pub mod metrics;
pub mod service;

pub use fold_core::{
    FOLD_AGE_BUCKETS, FoldOwner, HotKeyConfig, HotKeys, OwnerConfig, OwnerInvariantError,
    OwnerMode, OwnerPolicy, OwnerPolicyError, OwnerStats, held_target, round_of_pace,
};
pub use fold_core::{hot, owner, policy};
