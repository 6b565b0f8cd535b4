//! Plumbing shared by the archiver's tests: a real tansu broker (the harness), a topic
//! made with the real librdkafka admin client, limit events produced with the real
//! librdkafka producer in bus-schemas' encoding, the real `foldgate-archiver` binary, and
//! the archive read back by `foldgate_archive::reader`.

#![allow(dead_code)]

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bus_schemas::{Envelope, EventId, KeyId, LimitEvent, LimitReason, NodeEpoch, NodeId, WindowId};
use foldgate_archive::encoder::{decode, schema};
use foldgate_archive::reader::{DayRange, scan};
use foldgate_harness::KillOnDrop;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::message::DeliveryResult;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};

pub const TOPIC: &str = "foldgate.limit-events";
pub const PARTITIONS: i32 = 3;
/// 2026-12-06 23:59:00 UTC: events produced from here cross midnight, so a file's events
/// fall on two days.
pub const START_MS: u64 = 1_796_687_940_000;

/// Event `i` of a run: three nodes, keys spread so every partition gets some, one event
/// every 10 ms of wall time from `START_MS`.
pub fn event(i: u64) -> LimitEvent {
    LimitEvent {
        id: EventId {
            node: NodeId((i % 3) as u32 + 1),
            node_epoch: NodeEpoch(7),
            seq: i / 3 + 1,
        },
        key: KeyId {
            version: 1,
            digest: u128::from(i % 997).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835),
        },
        plan_id: 2,
        window: WindowId {
            length_ms: 60_000,
            number: 29_944_799 + i / 6_000,
        },
        at_ms: START_MS + i * 10,
        correlation_id: format!("req-{i}"),
        reason: LimitReason::Exhausted,
        degraded: i.is_multiple_of(50),
        retry_after_ms: 1_500,
    }
}

pub fn create_topic(bootstrap: &str) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("admin client");
    let topic = NewTopic::new(TOPIC, PARTITIONS, TopicReplication::Fixed(1));
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let results =
        futures::executor::block_on(admin.create_topics([&topic], &opts)).expect("create_topics");
    for r in results {
        r.expect("topic created");
    }
}

#[derive(Default)]
pub struct Deliveries {
    pub ok: AtomicU64,
    pub failed: AtomicU64,
}

impl rdkafka::ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();
    fn delivery(&self, r: &DeliveryResult<'_>, _: ()) {
        let c = if r.is_ok() { &self.ok } else { &self.failed };
        c.fetch_add(1, Ordering::Relaxed);
    }
}

pub struct EventProducer {
    producer: BaseProducer<Deliveries>,
}

impl EventProducer {
    /// Idempotent, acks=all, zstd: the settings the node's Kafka sink uses (E2).
    pub fn new(bootstrap: &str) -> Self {
        Self::with(bootstrap, &[])
    }

    /// As `new`, with more librdkafka properties.
    pub fn with(bootstrap: &str, extra: &[(&str, &str)]) -> Self {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", bootstrap)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("compression.type", "zstd")
            .set("linger.ms", "5");
        for (k, v) in extra {
            config.set(*k, *v);
        }
        let producer = config
            .create_with_context(Deliveries::default())
            .expect("producer");
        Self { producer }
    }

    /// Sends `payload` keyed by `key`, to `partition` when given (else librdkafka's
    /// partitioner on the key), waiting while its queue is full.
    pub fn send(&self, key: &[u8], payload: &[u8], partition: Option<i32>) {
        let mut record = BaseRecord::to(TOPIC).key(key).payload(payload);
        if let Some(p) = partition {
            record = record.partition(p);
        }
        loop {
            match self.producer.send(record) {
                Ok(()) => return,
                Err((e, r)) => {
                    assert!(
                        matches!(
                            e.rdkafka_error_code(),
                            Some(rdkafka::types::RDKafkaErrorCode::QueueFull)
                        ),
                        "produce failed: {e}"
                    );
                    record = r;
                    self.producer.poll(Duration::from_millis(10));
                }
            }
        }
    }

    pub fn send_event(&self, e: &LimitEvent, partition: Option<i32>) {
        self.send(&e.key.to_bytes(), &e.encode(), partition);
    }

    /// Waits until every message is acknowledged; panics if one failed.
    pub fn finish(&self) -> u64 {
        self.producer
            .flush(Duration::from_secs(60))
            .expect("producer flushed");
        let ctx = self.producer.context();
        assert_eq!(ctx.failed.load(Ordering::Relaxed), 0, "deliveries failed");
        ctx.ok.load(Ordering::Relaxed)
    }
}

/// Produces events `0..n` keyed by key id; returns their ids.
pub fn produce_events(bootstrap: &str, n: u64) -> HashSet<String> {
    produce_events_with(bootstrap, n, &[])
}

/// tansu 0.6 answers a fetch that starts inside a record batch with nothing (a real
/// Kafka broker returns the batch and the client skips to the offset), so a consumer
/// resuming from a committed offset mid-batch would wait forever. Tests that restart the
/// archiver produce one message per batch, so every offset starts a batch.
pub const ONE_MESSAGE_PER_BATCH: [(&str, &str); 2] =
    [("batch.num.messages", "1"), ("linger.ms", "0")];

pub fn produce_events_with(bootstrap: &str, n: u64, extra: &[(&str, &str)]) -> HashSet<String> {
    let p = EventProducer::with(bootstrap, extra);
    let mut ids = HashSet::new();
    for i in 0..n {
        let e = event(i);
        ids.insert(e.id.to_string());
        p.send_event(&e, None);
    }
    assert_eq!(p.finish(), n);
    ids
}

/// Group settings that let a restarted archiver take its partitions back within seconds
/// of a kill -9 (the defaults wait 45 s for the dead member's session to expire).
pub const FAST_GROUP: [&str; 6] = [
    "-X",
    "session.timeout.ms=6000",
    "-X",
    "heartbeat.interval.ms=500",
    "-X",
    "max.poll.interval.ms=10000",
];

pub struct ArchiverRun<'a> {
    pub bootstrap: &'a str,
    pub archive: &'a Path,
    pub group: &'a str,
    pub extra: Vec<String>,
    pub log: PathBuf,
}

impl ArchiverRun<'_> {
    pub fn command(&self) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_foldgate-archiver"));
        c.args(["--brokers", self.bootstrap, "--group-id", self.group])
            .arg("--archive-dir")
            .arg(self.archive)
            .arg("--metrics-file")
            .arg(self.archive.join("archiver.prom"))
            .args(["--log-format", "text", "--stats-interval-ms", "500"])
            .args(FAST_GROUP)
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("archiver log");
        c.stderr(log);
        c
    }

    pub fn spawn(&self) -> KillOnDrop {
        KillOnDrop(self.command().spawn().expect("spawn foldgate-archiver"))
    }

    /// Runs with `--until-caught-up` to its end; panics (with the log) unless it exits 0
    /// within `limit`.
    pub fn run_to_end(&self, limit: Duration) {
        let mut child = KillOnDrop(
            self.command()
                .arg("--until-caught-up")
                .spawn()
                .expect("spawn foldgate-archiver"),
        );
        let deadline = std::time::Instant::now() + limit;
        loop {
            if let Some(status) = child.0.try_wait().expect("wait") {
                assert!(
                    status.success(),
                    "archiver exited {status}:\n{}",
                    self.log_text()
                );
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "archiver not done in {limit:?}:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log_text(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let tail: Vec<&str> = text
            .lines()
            .rev()
            .filter(|l| !l.contains("archiver stats"))
            .take(80)
            .collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }
}

/// Every event in the archive's `events/` table, through the crate the history command
/// reads with; panics if a file was skipped.
pub fn archived_events(archive: &Path) -> Vec<LimitEvent> {
    let s = scan(&archive.join("events"), DayRange::default(), &schema()).expect("scan");
    assert!(s.warnings.is_empty(), "skipped files: {:?}", s.warnings);
    s.batches
        .iter()
        .flat_map(|b| decode(b).expect("decode"))
        .collect()
}

/// A counter from the archiver's metrics file.
pub fn metric(archive: &Path, name: &str) -> u64 {
    let text = std::fs::read_to_string(archive.join("archiver.prom")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// `count(*)` and `count(distinct event_id)` of the archive's Parquet, read by DuckDB.
pub fn duckdb_counts(archive: &Path) -> (u64, u64) {
    let glob = archive.join("events/*/*.parquet");
    let script = format!(
        "import duckdb; r = duckdb.sql(\"select count(*), count(distinct event_id) from read_parquet('{}')\").fetchall()[0]; print(r[0], r[1])",
        glob.display()
    );
    let text = python(&script);
    let mut parts = text
        .split_whitespace()
        .map(|p| p.parse::<u64>().expect("a count"));
    (
        parts.next().expect("count"),
        parts.next().expect("distinct"),
    )
}

/// Events per UTC day (`YYYY-MM-DD`), as DuckDB counts them in the archive's Parquet.
pub fn duckdb_counts_per_day(archive: &Path) -> Vec<(String, u64)> {
    let glob = archive.join("events/*/*.parquet");
    let script = format!(
        "import duckdb\nfor d, n in duckdb.sql(\"select strftime(day, '%Y-%m-%d'), count(*) from read_parquet('{}') group by 1 order by 1\").fetchall(): print(d, n)",
        glob.display()
    );
    python(&script)
        .lines()
        .map(|l| {
            let (d, n) = l.split_once(' ').expect("day count");
            (d.to_string(), n.parse().expect("a count"))
        })
        .collect()
}

/// The standard output of `python3 -c script`; panics with its stderr if it fails.
fn python(script: &str) -> String {
    let out = Command::new("python3")
        .args(["-c", script])
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "duckdb failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
