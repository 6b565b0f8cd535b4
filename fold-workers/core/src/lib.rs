//! The fold owner, with no IO: `fold-core`, the only issuer of credit for its key shard
//! (C2 in docs/requirements.md).
//!
//! [`FoldOwner`] is a sans-IO state machine, one per (shard, owner epoch). It is handed
//! reports, fast-path requests and ticks with the time (`handle_*`), and hands back grant
//! batches (`poll_grant`) and fast-path replies (returned directly: the caller is on a
//! request/reply subject). The NATS fold worker (`fold-workers`), the embedded bus and the
//! simulator all drive this same code.
//!
//! Its one safety property, checked by [`FoldOwner::check_invariants`] after every step
//! by tests and the simulator, and before every grant here: for every key-window, the
//! credit it and earlier owners issued, net of what nodes returned, never exceeds the
//! allowance less the unreleased reserve. An owner that finds it broken halts: it stops
//! issuing credit rather than guess.
//!
//! C10: [`hot::HotKeys`] picks the few keys causing most of the shard's fold work each
//! round; their report entries are folded once per round at the tick (the hot lane), so a
//! hot key's report storm cannot delay grants for the other keys.
//!
//! This crate cannot reach a clock, a socket or a runtime: its `Cargo.toml` has no such
//! dependency, and `tests/tests/core_purity.rs` fails if one appears in its tree.

pub mod hot;
pub mod owner;
pub mod policy;

pub use credit_sizing::{held_target, round_of_pace};
pub use hot::{HotKeyConfig, HotKeys};
pub use owner::{
    FOLD_AGE_BUCKETS, FoldOwner, OwnerConfig, OwnerInvariantError, OwnerMode, OwnerStats,
};
pub use policy::{OwnerPolicy, OwnerPolicyError};
