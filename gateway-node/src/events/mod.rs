//! Limit events (E1, E2): one per 429, handed by the request path to a bounded lock-free
//! ring ([`queue`]) and carried from there by one task ([`pump`]) to the sink the node's
//! `[events]` settings name ([`settings`]): Kafka (`foldgate-kafka`) when brokers are
//! set, else the local Parquet archive when `archive_dir` is set, else none (and no event
//! is made).

pub mod pump;
pub mod queue;
pub mod settings;

pub use pump::{EventsError, start};
pub use queue::{EventCounters, EventQueue, Limited};
pub use settings::EventsSettings;
