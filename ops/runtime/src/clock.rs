//! The clock a runtime reads and hands to the state machines.

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

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
        wall_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
        mono_ms: 1_000_000 + start.elapsed().as_millis() as u64,
    })
}
