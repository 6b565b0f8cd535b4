//! The clock a runtime reads and hands to the state machines.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bus_schemas::Now;

/// Where a runtime reads time. Production passes [`system_clock`]; tests may share one
/// they move by hand.
pub type Clock = Arc<dyn Fn() -> Now + Send + Sync>;

/// The system clocks, as a runtime hands them to the state machines: wall time for window
/// ids (D3), and a monotonic reading for everything measured in rounds. The monotonic one
/// starts at 1,000,000 ms so that "some time before the first reading" is representable
/// without going below zero.
pub fn system_clock() -> Clock {
    let start = Instant::now();
    Arc::new(move || Now {
        wall_ms: wall_since_epoch().as_millis() as u64,
        mono_ms: 1_000_000 + start.elapsed().as_millis() as u64,
    })
}

/// The system's wall clock since the Unix epoch; zero for a clock set before it. The one
/// reading of wall time: [`system_clock`]'s window ids, the edge's seconds, the lease
/// ages a worker judges against the server's timestamps.
pub fn wall_since_epoch() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}
