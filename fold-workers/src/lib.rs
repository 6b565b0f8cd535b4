//! The fold owner: the only issuer of credit for its key shard (C2).
//!
//! [`FoldOwner`] is a sans-IO state machine, one per (shard, owner epoch). It is handed
//! reports, fast-path requests and ticks with the time (`handle_*`), and hands back grant
//! batches (`poll_grant`) and fast-path replies (returned directly: the caller is on a
//! request/reply subject). The NATS fold worker and the simulator drive this same code.
//!
//! Its one safety property, checked by [`FoldOwner::check_invariants`] after every step
//! by tests and the simulator, and before every grant here: for every key-window, the
//! credit it and earlier owners issued, net of what nodes returned, never exceeds the
//! allowance less the unreleased reserve. An owner that finds it broken halts: it stops
//! issuing credit rather than guess.
//!
//! [`service::run_fold_worker`] drives owners over real NATS (issue 4);
//! [`metrics`] renders its bus metrics for Prometheus (F6) and serves the scrape endpoint.
//!
//! C10: [`hot::HotKeys`] picks the few keys causing most of the shard's fold work each
//! round; their report entries are folded once per round at the tick (the hot lane), so a
//! hot key's report storm cannot delay grants for the other keys.

pub mod hot;
pub mod metrics;
pub mod owner;
pub mod policy;
pub mod service;

pub use hot::{HotKeyConfig, HotKeys};
pub use owner::{
    FOLD_AGE_BUCKETS, FoldOwner, OwnerConfig, OwnerInvariantError, OwnerMode, OwnerStats,
    held_target, round_of_pace,
};
pub use policy::{OwnerPolicy, OwnerPolicyError};
