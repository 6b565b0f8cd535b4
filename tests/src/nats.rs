//! The real-NATS fleet helpers live in `foldgate_harness::fleet` (the `foldgate bench
//! fleet` command uses them too); the tests reach them here.

pub use foldgate_harness::fleet::*;
