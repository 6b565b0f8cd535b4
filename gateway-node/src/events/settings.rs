//! The node's `[events]` settings: where limit events go (E2, E3) and the bounds on the
//! way there.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Where a node's limit events go. Kafka when `brokers` is set; else the local archive
/// when `archive_dir` is set (the single-process default, E3); else nowhere, and the
/// node makes no events.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct EventsSettings {
    /// Kafka bootstrap servers, `host:port[,host:port...]`; empty for none.
    pub brokers: String,
    /// The topic events are produced to.
    pub topic: String,
    /// The archive root a node without brokers writes Parquet under
    /// (`ARCHIVE/events/day=YYYY-MM-DD/`).
    pub archive_dir: Option<PathBuf>,
    /// Events that may wait between the 429 path and the sink; one more is dropped and
    /// counted (E2).
    pub queue_capacity: usize,
    /// The sink is handed what waited at least this often. Milliseconds.
    pub flush_ms: u64,
    /// The local archive closes a file at this many events, or at `flush_ms`.
    pub file_events_max: usize,
    /// librdkafka properties passed to the producer as they are: TLS (`security.protocol`,
    /// `ssl.ca.location`, ...) and SASL (`sasl.mechanism`, `sasl.username`, ...), or the
    /// producer's bounds (`message.timeout.ms`, 15 min by default;
    /// `queue.buffering.max.messages`, 500,000). The guarantees (idempotence, acks=all,
    /// zstd) are the sink's own: setting them here stops the node at start.
    pub kafka: BTreeMap<String, String>,
}

impl Default for EventsSettings {
    fn default() -> Self {
        Self {
            brokers: String::new(),
            topic: bus_schemas::subjects::LIMIT_EVENTS_TOPIC.into(),
            archive_dir: None,
            queue_capacity: 65_536,
            flush_ms: 1_000,
            file_events_max: 1_000_000,
            kafka: BTreeMap::new(),
        }
    }
}

/// The one sink a node's settings pick.
#[derive(Clone, Debug, PartialEq)]
pub enum SinkChoice {
    Kafka,
    Archive(PathBuf),
    None,
}

impl EventsSettings {
    pub fn sink(&self) -> SinkChoice {
        if !self.brokers.trim().is_empty() {
            SinkChoice::Kafka
        } else if let Some(dir) = &self.archive_dir {
            SinkChoice::Archive(dir.clone())
        } else {
            SinkChoice::None
        }
    }
}
