//! The operator tooling behind the `foldgate` binary.
//!
//! * `sim`: the deterministic fleet simulator and accuracy harness (`foldgate sim`). It
//!   drives the real node limiter and fold owner state machines through a simulated bus,
//!   with the global-sync baseline beside them, and measures against an exact oracle.
//!
//! The binary (`src/main.rs`) is only argument parsing and printing.

pub mod sim;
