//! The node's Kafka sink for limit events (E2): each event the 429 path left in the
//! node's ring is produced to `events.topic`, idempotent, acks=all, zstd, keyed by its
//! hashed key id, and counted delivered on Kafka's acknowledgement or dropped when it
//! will never get one.
//!
//! Laid out as every sink is: [`config`] (brokers, topic, librdkafka pass-through, the
//! bounds), [`encoder`] (an event as a keyed message, through `bus-schemas`),
//! [`service`] (the producer), [`sink`] (the loop from the ring to the producer and the
//! counting).

pub mod config;
pub mod encoder;
pub mod service;
pub mod sink;
#[cfg(feature = "testing")]
pub mod testing;

pub use config::KafkaConfig;
pub use sink::{EventSource, KafkaSink};

#[derive(Debug, thiserror::Error)]
pub enum KafkaSinkError {
    #[error("`events.brokers` is empty")]
    NoBrokers,
    #[error("`events.topic` is empty")]
    NoTopic,
    #[error(
        "`events.kafka.{0}` is the sink's own (idempotence, acks=all, zstd, a report per \
         event) and cannot be passed through"
    )]
    Reserved(String),
    #[error("`events.kafka.{key}`: {reason}")]
    Property { key: String, reason: String },
    #[error("the Kafka producer could not be created: {0}")]
    Create(String),
}
