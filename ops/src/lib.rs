//! The operator tooling behind the `foldgate` binary.
//!
//! The binary (`src/main.rs`) is argument parsing; what it runs lives in libraries:
//!
//! * `foldgate-sim` (`ops/sim/`): the deterministic fleet simulator (`foldgate sim`).
//! * `foldgate-harness` (`tests/harness/`): the real-NATS fleet, the test upstream and the
//!   HTTP load generator (`foldgate bench fleet`, `foldgate upstream`, `foldgate bench http`).
//! * [`demo`]: the README's main job (`foldgate demo`).

pub mod demo;

pub use foldgate_harness::{fleet, http_tools};
pub use foldgate_sim as sim;
