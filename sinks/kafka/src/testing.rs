//! Test support, behind the `testing` feature: make a topic and read one back whole with
//! the real librdkafka, so a test can count and compare what a sink produced. Not used on
//! any production path.

use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Message, Offset, TopicPartitionList};

/// Creates `topic` with `partitions` partitions (one replica: a test broker has one).
pub async fn create_topic(bootstrap: &str, topic: &str, partitions: i32) -> Result<(), KafkaError> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()?;
    let spec = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    for r in admin.create_topics([&spec], &AdminOptions::new()).await? {
        r.map_err(|(_, code)| KafkaError::AdminOp(code))?;
    }
    Ok(())
}

/// One message as it is on the topic.
#[derive(Clone, Debug)]
pub struct Read {
    pub partition: i32,
    pub offset: i64,
    pub key: Vec<u8>,
    pub payload: Vec<u8>,
}

/// Reads `topic` from the start of every partition until `want` messages came and then
/// `quiet` passed with no more (so duplicates past `want` are seen), or until `within`.
/// Blocking: call it off the runtime's worker threads.
pub fn read_topic(
    bootstrap: &str,
    topic: &str,
    want: usize,
    quiet: Duration,
    within: Duration,
) -> Result<Vec<Read>, KafkaError> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "foldgate-readback")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .create()?;
    let by = Instant::now() + within;
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let mut assignment = TopicPartitionList::new();
    for t in metadata.topics().iter().filter(|t| t.name() == topic) {
        for p in t.partitions() {
            assignment.add_partition_offset(topic, p.id(), Offset::Beginning)?;
        }
    }
    consumer.assign(&assignment)?;
    let mut out = Vec::new();
    let mut last = Instant::now();
    while Instant::now() < by && (out.len() < want || last.elapsed() < quiet) {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                out.push(Read {
                    partition: m.partition(),
                    offset: m.offset(),
                    key: m.key().unwrap_or_default().to_vec(),
                    payload: m.payload().unwrap_or_default().to_vec(),
                });
                last = Instant::now();
            }
            Some(Err(e)) => return Err(e),
            None => {}
        }
    }
    Ok(out)
}
