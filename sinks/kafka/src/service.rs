//! The producer: one rdkafka `FutureProducer` (idempotent, acks=all, zstd; [`config`]),
//! whose local queue is the second bound after the node's ring. Handing it a message never
//! waits: a full queue says so at once and the caller keeps the message.
//!
//! [`config`]: crate::config

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};

use crate::KafkaSinkError;
use crate::config::{KafkaConfig, is_secret};
use crate::encoder::Encoded;

pub struct KafkaService {
    producer: FutureProducer,
    topic: String,
}

/// Why the producer did not take a message.
#[derive(Debug)]
pub enum Refused {
    /// Its local queue is full: try again once acknowledgements make room.
    QueueFull,
    /// It never will (a fatal producer error, a message over the broker's limit, ...).
    Failed(KafkaError),
}

impl KafkaService {
    /// A producer for `config`. It does not connect yet: a node starts while Kafka is
    /// down and buffers until it is back.
    pub fn new(config: &KafkaConfig) -> Result<Self, KafkaSinkError> {
        let producer: Result<FutureProducer, _> = config.client_config()?.create();
        let producer = producer.map_err(|e| match e {
            KafkaError::ClientConfig(_, desc, key, _value) => {
                let reason = if is_secret(&key) {
                    "librdkafka refused its value".to_owned()
                } else {
                    desc
                };
                KafkaSinkError::Property { key, reason }
            }
            e => KafkaSinkError::Create(e.to_string()),
        })?;
        Ok(Self {
            producer,
            topic: config.topic.clone(),
        })
    }

    /// Hands one message to librdkafka; the future resolves with Kafka's acknowledgement
    /// or with why it will not come.
    pub fn send(&self, m: &Encoded) -> Result<DeliveryFuture, Refused> {
        let record = FutureRecord::to(&self.topic)
            .key(&m.key[..])
            .payload(&m.payload[..]);
        self.producer.send_result(record).map_err(|(e, _)| match e {
            KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull) => Refused::QueueFull,
            e => Refused::Failed(e),
        })
    }

    pub fn topic(&self) -> &str {
        &self.topic
    }
}
