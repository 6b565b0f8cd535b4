//! The archiver's settings: a TOML file, each value overridable by a flag of the binary.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rdkafka::ClientConfig;
use serde::Deserialize;

use crate::ArchiverError;

/// librdkafka properties the archiver owns: exactly-once rests on committing by hand,
/// after the rename, so none of these may come from the pass-through table.
pub const RESERVED_PROPERTIES: [&str; 5] = [
    "bootstrap.servers",
    "group.id",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "enable.partition.eof",
];

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ArchiverConfig {
    /// Kafka bootstrap servers, `host:port[,host:port...]`.
    pub brokers: String,
    /// The consumer group: archivers sharing one archive share one group, so each
    /// partition has one writer.
    pub group_id: String,
    pub topic: String,
    /// The archive root; files go under `events/day=YYYY-MM-DD/` and `quarantine/`.
    pub archive_dir: PathBuf,
    /// A partition's file is closed at this many events.
    pub file_events_max: usize,
    /// ... or at this many bytes of Kafka payload.
    pub file_bytes_max: usize,
    /// ... or when its first message has waited this long. Milliseconds.
    pub file_age_max_ms: u64,
    /// Event ids remembered per partition to drop a producer's duplicate.
    pub dedupe_window: usize,
    /// How often the stats line is logged and the metrics file rewritten. Milliseconds.
    pub stats_interval_ms: u64,
    /// Prometheus text exposition written here (crash-safe) every stats interval, for
    /// node_exporter's textfile collector; none when unset.
    pub metrics_file: Option<PathBuf>,
    /// librdkafka properties passed to the consumer as they are: TLS (`security.protocol`,
    /// `ssl.ca.location`, ...), SASL (`sasl.mechanism`, `sasl.username`, ...), timeouts.
    pub kafka: BTreeMap<String, String>,
}

impl Default for ArchiverConfig {
    fn default() -> Self {
        Self {
            brokers: String::new(),
            group_id: "foldgate-archiver".into(),
            topic: bus_schemas::subjects::LIMIT_EVENTS_TOPIC.into(),
            archive_dir: PathBuf::new(),
            file_events_max: 1_000_000,
            file_bytes_max: 128 * 1024 * 1024,
            file_age_max_ms: 60_000,
            dedupe_window: 1_000_000,
            stats_interval_ms: 10_000,
            metrics_file: None,
            kafka: BTreeMap::new(),
        }
    }
}

impl ArchiverConfig {
    pub fn from_toml_file(path: &Path) -> Result<Self, ArchiverError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ArchiverError::Config(format!("{}: {e}", path.display())))?;
        toml::from_str(&text).map_err(|e| ArchiverError::Config(format!("{}: {e}", path.display())))
    }

    pub fn validate(&self) -> Result<(), ArchiverError> {
        let bad = |what: &str| Err(ArchiverError::Config(what.to_string()));
        if self.brokers.trim().is_empty() {
            return bad("brokers is empty");
        }
        if self.group_id.is_empty() || self.topic.is_empty() {
            return bad("group_id and topic must be set");
        }
        if self.topic.contains('+') {
            return bad("topic holds `+`, which file names use as their separator");
        }
        if self.archive_dir.as_os_str().is_empty() {
            return bad("archive_dir is empty");
        }
        if self.file_events_max == 0 || self.file_bytes_max == 0 {
            return bad("file_events_max and file_bytes_max must be at least 1");
        }
        if let Some(k) = self
            .kafka
            .keys()
            .find(|k| RESERVED_PROPERTIES.contains(&k.as_str()))
        {
            return Err(ArchiverError::Config(format!(
                "kafka.{k} is set by the archiver itself and may not be passed through"
            )));
        }
        Ok(())
    }

    /// The consumer's librdkafka configuration: the pass-through table, then what the
    /// archiver owns. A new group starts at the earliest offset, so an archiver added to
    /// a running system archives what the topic still retains.
    pub fn client_config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("auto.offset.reset", "earliest");
        for (k, v) in &self.kafka {
            c.set(k, v);
        }
        c.set("bootstrap.servers", &self.brokers)
            .set("group.id", &self.group_id)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "true");
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_reads_and_reserved_properties_are_refused() {
        let mut c: ArchiverConfig = toml::from_str(
            r#"
            brokers = "127.0.0.1:9092"
            archive_dir = "/tmp/a"
            file_events_max = 10
            [kafka]
            "security.protocol" = "ssl"
            "#,
        )
        .unwrap();
        assert_eq!(c.file_events_max, 10);
        assert_eq!(c.topic, "foldgate.limit-events");
        c.validate().unwrap();
        assert_eq!(
            c.client_config().get("security.protocol"),
            Some("ssl"),
            "TLS passes through"
        );
        assert_eq!(c.client_config().get("enable.auto.commit"), Some("false"));
        c.kafka.insert("enable.auto.commit".into(), "true".into());
        assert!(c.validate().is_err());
    }
}
