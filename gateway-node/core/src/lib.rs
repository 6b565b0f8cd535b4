//! The gateway node's limiter, with no IO: `node-core`.
//!
//! Two halves, kept apart on purpose (ARCHITECTURE.md, "Code map", `node-core`):
//!
//! * [`surface`]: the **decision surface**, a concurrent map of atomic buckets that every
//!   request task calls into ([`DecisionSurface::decide`]). A decision is a memory read
//!   plus a compare-and-swap per window: no lock held across it, no allocation, no network
//!   call, no await (D4 in docs/requirements.md).
//! * [`limiter`]: the **reconciler**, a sans-IO state machine ([`NodeLimiter`]), one per
//!   node epoch, driven by one task. It is handed `now` and bus messages (`handle_tick`,
//!   `handle_grant_batch`, `handle_fast_path_*`) and hands back reports and fast-path
//!   requests (`poll_transmit`). It fills, closes and drains the surface's credit words;
//!   request tasks only ever decrement them.
//!
//! Supporting modules: [`credit`] (the packed credit word and every operation on it),
//! [`window`] (window ids from wall time with the per-key phase, D3), [`policy`] (plans
//! and overrides in a form the request path can read without allocating), [`retry`] (the
//! 429 timing, D6).
//!
//! This crate cannot reach a clock, a socket or a runtime: its `Cargo.toml` has no such
//! dependency, and `tests/tests/core_purity.rs` fails if one appears in its tree. The
//! runtimes that drive it (`gateway-node`'s NATS and embedded buses, the simulator) hand
//! it the time.

pub mod credit;
pub mod limiter;
pub mod policy;
pub mod retry;
pub mod surface;
pub mod window;

pub use limiter::{
    LineChange, LinkHealth, Mode, NodeConfig, NodeInvariantError, NodeLimiter, NodeStats, Transmit,
};
pub use policy::{KeyPolicy, PolicyError, PolicyIndex};
pub use retry::RetryAfter;
pub use surface::{Decision, DecisionSurface, Denial, FastPathNeed, SurfaceConfig};
