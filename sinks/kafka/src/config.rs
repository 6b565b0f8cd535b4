//! What the sink is told: brokers, topic, the librdkafka properties passed through from the
//! node's `[events] kafka` table (TLS, SASL, tuning), and the bounds. The delivery
//! guarantees are set here and cannot be passed through: a table that tried to weaken them
//! is refused at start rather than obeyed.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::ClientConfig;

use crate::KafkaSinkError;

/// librdkafka properties this sink owns. Each is either the guarantee the issue asks for
/// (idempotent, every in-sync replica, zstd) or what counting delivered events depends on
/// (a delivery report for every message).
pub const RESERVED: &[&str] = &[
    "bootstrap.servers",
    "metadata.broker.list",
    "enable.idempotence",
    "acks",
    "request.required.acks",
    "compression.type",
    "compression.codec",
    "delivery.report.only.error",
    "transactional.id",
];

/// Defaults the `[events] kafka` table may override. The bounds: a broker gone for 15
/// minutes loses no buffered event (`message.timeout.ms`), and the producer holds at most
/// 500,000 events (over 15 minutes at the design's peak of 500 events/s) or 256 MiB,
/// whichever comes first; past that the node's ring fills and drops, counted.
pub const DEFAULTS: &[(&str, &str)] = &[
    ("message.timeout.ms", "900000"),
    ("queue.buffering.max.messages", "500000"),
    ("queue.buffering.max.kbytes", "262144"),
    // A broker that takes a connection but stops answering (hung, paused) makes
    // librdkafka's broker thread spin on one core while its partition has the five
    // requests in flight that idempotence allows and more messages wait: measured here as
    // a core for the whole of a 30 s outage, moving the gateway's p99. Timing a request
    // out after 5 s (60 s by default) closes that connection, and a reconnect that is not
    // answered does not spin. A request timed out is retried with its sequence numbers,
    // so idempotence keeps it from being written twice.
    ("socket.timeout.ms", "5000"),
    ("request.timeout.ms", "5000"),
    // Events are not latency-critical; batching them cuts requests and compresses better.
    ("linger.ms", "100"),
    ("client.id", "foldgate-node"),
];

/// Properties whose values are secrets or key material: a refusal names the property but
/// never repeats what librdkafka said about its value.
const SECRET_MARKERS: &[&str] = &["password", "secret", "ssl.key", "sasl.oauthbearer.config"];

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KafkaConfig {
    /// `host:port[,host:port...]`.
    pub brokers: String,
    pub topic: String,
    /// Passed to librdkafka as they are, after [`DEFAULTS`]; none of [`RESERVED`].
    pub properties: BTreeMap<String, String>,
    /// How long a stopping node waits for Kafka to acknowledge what it still holds; what
    /// is unacknowledged then is counted dropped.
    pub shutdown_flush: Duration,
}

impl KafkaConfig {
    pub fn new(brokers: impl Into<String>, topic: impl Into<String>) -> Self {
        Self {
            brokers: brokers.into(),
            topic: topic.into(),
            properties: BTreeMap::new(),
            shutdown_flush: Duration::from_secs(5),
        }
    }

    /// The producer's librdkafka configuration, or why it cannot be made.
    pub fn client_config(&self) -> Result<ClientConfig, KafkaSinkError> {
        if self.brokers.trim().is_empty() {
            return Err(KafkaSinkError::NoBrokers);
        }
        if self.topic.trim().is_empty() {
            return Err(KafkaSinkError::NoTopic);
        }
        if let Some(k) = self
            .properties
            .keys()
            .find(|k| RESERVED.contains(&k.as_str()))
        {
            return Err(KafkaSinkError::Reserved(k.clone()));
        }
        let mut c = ClientConfig::new();
        for (k, v) in DEFAULTS {
            c.set(*k, *v);
        }
        for (k, v) in &self.properties {
            c.set(k, v);
        }
        c.set("bootstrap.servers", self.brokers.trim())
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("compression.type", "zstd");
        Ok(c)
    }
}

/// Whether librdkafka's words about `property` may be shown (they can quote its value).
pub(crate) fn is_secret(property: &str) -> bool {
    SECRET_MARKERS.iter().any(|m| property.contains(m))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guarantees_cannot_be_passed_through() {
        for k in ["acks", "enable.idempotence", "compression.type"] {
            let mut c = KafkaConfig::new("127.0.0.1:9092", "t");
            c.properties.insert(k.into(), "1".into());
            assert!(
                matches!(c.client_config(), Err(KafkaSinkError::Reserved(r)) if r == k),
                "{k}"
            );
        }
    }

    #[test]
    fn pass_through_overrides_defaults_but_not_the_guarantees() {
        let mut c = KafkaConfig::new(" 127.0.0.1:9092 ", "t");
        c.properties
            .insert("message.timeout.ms".into(), "1000".into());
        c.properties
            .insert("security.protocol".into(), "ssl".into());
        let cc = c.client_config().unwrap();
        assert_eq!(cc.get("message.timeout.ms"), Some("1000"));
        assert_eq!(cc.get("security.protocol"), Some("ssl"));
        assert_eq!(cc.get("bootstrap.servers"), Some("127.0.0.1:9092"));
        assert_eq!(cc.get("enable.idempotence"), Some("true"));
        assert_eq!(cc.get("acks"), Some("all"));
        assert_eq!(cc.get("compression.type"), Some("zstd"));
    }

    #[test]
    fn no_brokers_or_topic_is_refused() {
        assert!(matches!(
            KafkaConfig::new(" ", "t").client_config(),
            Err(KafkaSinkError::NoBrokers)
        ));
        assert!(matches!(
            KafkaConfig::new("h:1", "").client_config(),
            Err(KafkaSinkError::NoTopic)
        ));
    }
}
