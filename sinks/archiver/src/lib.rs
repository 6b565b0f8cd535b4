//! `foldgate-archiver` (E2, E3): the Kafka consumer group that writes limit events into
//! the Parquet archive exactly once, as Kafka Connect's S3 sink does.
//!
//! * [`config`] — brokers, group, topic, archive root, file bounds, librdkafka pass-through;
//! * [`consumer`] — the consume loop: rebalances, bounds, commits after the rename;
//! * [`writer`] — one partition's open file, cut into one-day runs of contiguous offsets,
//!   each written crash-safe as `<topic>+<partition>+<first>-<last>.parquet`;
//! * [`offsets`] — where a partition stands, read from the file names, and the window of
//!   recent event ids that drops a producer's duplicate;
//! * [`quarantine`] — messages that do not decode, kept whole with their offsets;
//! * [`erasure`] — the hook through which erased keys are kept out of the archive;
//! * [`metrics`] — counters, a stats line and a Prometheus text file.
//!
//! Exactly once: a partition's messages are read in offset order into one open file; the
//! file is written under a temporary name, fsynced, renamed and its directory fsynced, and
//! only then is the next offset committed (`enable.auto.commit=false`). A crash between
//! the rename and the commit makes the partition's new owner read those offsets again;
//! it finds the highest offset the partition's file names account for and skips up to it.
//! On top, event ids seen recently on a partition (seeded from its newest file) are
//! dropped as duplicates.

pub mod config;
pub mod consumer;
pub mod erasure;
pub mod metrics;
pub mod offsets;
pub mod quarantine;
pub mod writer;

pub use config::ArchiverConfig;
pub use consumer::{Archiver, StopWhen};
pub use erasure::{ErasedKeys, NothingErased};

#[derive(Debug, thiserror::Error)]
pub enum ArchiverError {
    #[error("configuration: {0}")]
    Config(String),
    #[error("kafka: {0}")]
    Kafka(rdkafka::error::KafkaError),
    #[error("archive: {0}")]
    Archive(#[from] foldgate_archive::ArchiveError),
}
