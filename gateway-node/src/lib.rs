//! The gateway node: `node-core`'s limiter driven by a runtime, behind an HTTP gateway.
//!
//! * [`bus`]: the runtime that drives the reconciler over real NATS: a tick task that
//!   publishes reports, a task that applies grants, and the 1 ms fast path, its deadline
//!   kept by [`deadline`]'s sub-millisecond timer thread.
//! * [`embedded`]: the same reconciler with its fold owners in-process: the single-node
//!   default when no NATS URL is configured.
//! * [`runtime`]: the one API both runtimes implement ([`runtime::NodeRuntime`]), which is
//!   all the HTTP gateway sees.
//! * [`events`]: limit events (E1, E2), from the 429 path's lock-free ring to Kafka or
//!   the local archive.
//! * [`http`]: the gateway around it all: `foldgate-node` and `foldgate-edge`.
//!
//! The limiter itself (decision surface, reconciler, credit words, windows, policy, retry
//! timing) lives in `node-core`, which has no IO; its modules are re-exported here under
//! their own names so the node's users name one crate.

pub mod bus;
pub mod deadline;
pub mod embedded;
pub mod events;
pub mod http;
pub mod runtime;

pub use node_core::{
    Decision, DecisionSurface, Denial, FastPathNeed, KeyPolicy, LineChange, LinkHealth, Mode,
    NodeConfig, NodeInvariantError, NodeLimiter, NodeStats, PolicyError, PolicyIndex, RetryAfter,
    SurfaceConfig, Transmit,
};
pub use node_core::{credit, limiter, policy, retry, surface, window};
