//! The runtime pieces every Foldgate service shares, written once.
//!
//! * [`clock`]: where a runtime reads the time it hands the sans-IO state machines
//!   ([`Clock`]), and the system clocks production passes ([`system_clock`]).
//! * [`nats`]: the connect options every bus client uses (reconnect pacing, mTLS).
//! * [`metrics`]: a fixed-bucket atomic histogram, and the Prometheus text rendering of
//!   it and of single counters and gauges.
//!
//! The protocol cores (`node-core`, `fold-core`) never see this crate: they are handed
//! `now` and messages. It is the services around them (`gateway-node`, `fold-workers`,
//! the test harness) that read clocks and open connections, and they do it through here.

pub mod clock;
pub mod metrics;
pub mod nats;

pub use clock::{Clock, system_clock, wall_since_epoch};
