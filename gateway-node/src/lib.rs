//! The gateway node's limiter.
//!
//! Two halves, kept apart on purpose (ARCHITECTURE.md, "The node"):
//!
//! * [`surface`] — the **decision surface**: a concurrent map of atomic buckets that
//!   every request task calls into ([`DecisionSurface::decide`]). A decision is a memory
//!   read plus a compare-and-swap per window: no lock held across it, no allocation, no
//!   network call, no await (D4).
//! * [`limiter`] — the **reconciler**: a sans-IO state machine ([`NodeLimiter`]), one per
//!   node epoch, driven by one task. It is handed `now` and bus messages
//!   (`handle_tick`, `handle_grant_batch`, `handle_fast_path_*`) and hands back reports
//!   and fast-path requests (`poll_transmit`). It fills, closes and drains the surface's
//!   credit words; request tasks only ever decrement them.
//!
//! * [`bus`] — the runtime that drives the reconciler over real NATS: a tick task that
//!   publishes reports, a task that applies grants, and the 1 ms fast path (issue 4), its
//!   deadline kept by [`deadline`]'s sub-millisecond timer thread.
//!
//! * [`embedded`] — the same reconciler with its fold owners in-process: the single-node
//!   default when no NATS URL is configured (issue 5).
//! * [`http`] — the gateway around it all: `foldgate-node` and `foldgate-edge` (issue 5).
//!
//! Supporting modules: [`credit`] (the packed credit word), [`window`] (window ids from
//! wall time with the per-key phase, D3), [`policy`] (plans and overrides in a form the
//! request path can read without allocating), [`retry`] (the 429 timing, D6).

pub mod bus;
pub mod credit;
pub mod deadline;
pub mod embedded;
pub mod http;
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
