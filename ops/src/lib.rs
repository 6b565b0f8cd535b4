//! The operator tooling behind the `foldgate` binary.
//!
//! The binary (`src/main.rs`) is argument parsing; each command is a function here:
//!
//! * [`sim_cmd`]: `foldgate sim`, on the deterministic fleet simulator (`foldgate-sim`,
//!   `ops/sim/`).
//! * [`bench_fleet`]: `foldgate bench fleet`, a drill on a real nats-server with the
//!   real-NATS fleet of `foldgate-harness` (`tests/harness/`).
//! * [`bench_http`] and [`upstream`]: `foldgate bench http` and `foldgate upstream`, on the
//!   harness's HTTP load generator and test upstream.
//! * [`keys`]: `foldgate key-id`, `foldgate bench-policy` and `foldgate bench-key`.
//! * [`demo`]: the README's main job (`foldgate demo`).
//! * [`history`]: `foldgate history`, throttling history from the limit-event archive.
//! * [`archive_cmd`]: `foldgate archive compact|retain|synth-day`, the archive's upkeep.
//! * [`keyring`] and [`privacy`]: the hash-key keyring (`foldgate hash-key`), subject
//!   access, erasure and the audit trail (`foldgate audit verify`).

pub mod archive_cmd;
pub mod bench_fleet;
pub mod bench_http;
pub mod demo;
pub mod history;
pub mod keyring;
pub mod keys;
pub mod privacy;
pub mod sim_cmd;
pub mod upstream;

pub use foldgate_harness::{fleet, http_tools};
pub use foldgate_sim as sim;

/// The multi-threaded runtime the HTTP commands run on.
fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
}
