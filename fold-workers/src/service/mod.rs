//! The fold worker on a real NATS bus (B1): one task that owns the `FoldOwner`s of the
//! shards this worker holds and drives them. It subscribes to each shard's report and
//! fast-path subjects, answers each report with a grant batch on the report's reply
//! subject (the node's grant inbox), answers fast-path requests on theirs, and ticks every
//! owner each round. Envelopes that do not decode are counted by reason and dropped whole.
//!
//! * [`worker`]: the round and message handling both kinds of worker share, and
//!   [`run_fold_worker`], a worker whose shards and owner epoch the caller assigns.
//! * [`elected`]: [`run_elected_worker`], a worker that competes for shard leases and owns
//!   whatever it holds.
//! * [`lease`]: the shard leases in NATS key-value those workers compete for.
//! * [`policy_watch`]: the policy snapshot (P1) an elected worker follows.
//! * [`stats`]: the counters the worker keeps for `metrics::render`.

pub mod elected;
pub mod lease;
pub mod policy_watch;
pub mod stats;
pub mod worker;

pub use elected::{Candidate, run_elected_worker};
pub use foldgate_runtime::Clock;
pub use lease::{LeaseConfig, LeaseError, lease_holder_name, lease_key};
pub use stats::FoldWorkerStats;
pub use worker::{Assignment, FoldWorkerError, run_fold_worker};
