//! The real-NATS fleet helpers live in `ops::fleet` (the `foldgate bench fleet` command uses
//! them too); the tests reach them here.

pub use ops::fleet::*;
