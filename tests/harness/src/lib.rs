//! Test and bench plumbing, shared by the integration tests and the `foldgate` CLI's
//! bench commands. Nothing here is on a production path.
//!
//! * [`fleet`]: a real nats-server started on a free loopback port, node runtimes on it,
//!   and a real-time traffic driver booked against the simulator's oracle
//!   (`foldgate bench fleet`, the NATS integration tests).
//! * [`scenario`]: the simulator's traffic shapes (uniform, zipf, pinned, ...) driven
//!   on that fleet in real time, the same arrival sequence for the same seed.
//! * [`http_tools`]: a tiny upstream (`foldgate upstream`), the open-loop load generator
//!   (`foldgate bench http`), and bench keys derived from a seed so no raw key is ever
//!   written to a file.
//! * [`kafka`]: a real Kafka-protocol broker (tansu) on a free loopback port, for the
//!   limit-event sink and archiver tests; it can be paused and resumed as a Kafka outage.
//! * [`KillOnDrop`]: the one guard for a child process a test or bench starts.

pub mod fleet;
pub mod http_tools;
pub mod kafka;
pub mod scenario;

/// A child process killed (SIGKILL) and reaped when dropped: a test that fails midway
/// leaves no server or worker behind, and dropping one is a real kill -9.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
