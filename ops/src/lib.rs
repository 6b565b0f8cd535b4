//! The operator tooling behind the `foldgate` binary.
//!
//! * `sim`: the deterministic fleet simulator and accuracy harness (`foldgate sim`). It
//!   drives the real node limiter and fold owner state machines through a simulated bus,
//!   with the global-sync baseline beside them, and measures against an exact oracle.
//!
//! * `fleet`: the same fleet on a real nats-server (`foldgate bench fleet`, and the NATS
//!   integration tests): server lifecycle, node runtimes, a real-time traffic driver.
//!
//! The binary (`src/main.rs`) is only argument parsing and printing.

//! * `http_tools`: the gateway's HTTP tooling: a tiny upstream (`foldgate upstream`), the
//!   open-loop load generator (`foldgate bench http`), seeded bench keys and the README
//!   demo (`foldgate demo`).
//!
pub mod fleet;
pub mod http_tools;
pub mod sim;
