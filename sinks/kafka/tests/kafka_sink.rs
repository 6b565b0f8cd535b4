//! The Kafka sink against a real Kafka-protocol broker (tansu, `foldgate_harness::kafka`)
//! through the real librdkafka: every event arrives exactly once, keyed by its hashed key
//! id, one key's events in one partition in order, in zstd message sets; no raw key in
//! any message.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bus_schemas::{Envelope, EventId, KeyId, LimitEvent, LimitReason, NodeEpoch, NodeId, WindowId};
use foldgate_harness::kafka::KafkaBroker;
use foldgate_kafka::testing::{create_topic, read_topic};
use foldgate_kafka::{EventSource, KafkaConfig, KafkaSink, KafkaSinkError};
use tokio::sync::watch;

/// Events waiting for the sink, and what became of them.
#[derive(Default)]
struct Source {
    waiting: Mutex<VecDeque<LimitEvent>>,
    delivered: AtomicU64,
    dropped: AtomicU64,
}

impl EventSource for Source {
    fn drain_into(&self, out: &mut Vec<LimitEvent>, max: usize) -> usize {
        let mut w = self.waiting.lock().unwrap();
        let n = w.len().min(max);
        out.extend(w.drain(..n));
        n
    }
    fn delivered(&self, n: u64) {
        self.delivered.fetch_add(n, Ordering::Relaxed);
    }
    fn dropped(&self, n: u64) {
        self.dropped.fetch_add(n, Ordering::Relaxed);
    }
}

/// The raw keys this test pretends its events came from; only their hashed ids (here a
/// digest made from them) are in the events, and the scan checks the raw ones never are.
const RAW_KEYS: [&str; 4] = [
    "fgk_11111111aaaaaaaa2222222233333333",
    "fgk_44444444bbbbbbbb5555555566666666",
    "fgk_77777777cccccccc8888888899999999",
    "fgk_0000000dddddddd0eeeeeeeeffffffff",
];

fn key_id(i: usize) -> KeyId {
    KeyId {
        version: 1,
        digest: 0x5eed_0000_0000_0000_0000_0000_0000_0000u128 + i as u128 * 0x1_0000_0001,
    }
}

fn event(seq: u64, key: usize) -> LimitEvent {
    LimitEvent {
        id: EventId {
            node: NodeId(7),
            node_epoch: NodeEpoch(42),
            seq,
        },
        key: key_id(key),
        plan_id: 1,
        window: WindowId {
            length_ms: 1_000,
            number: 1_700_000_000 + seq / 100,
        },
        at_ms: 1_700_000_000_000 + seq,
        correlation_id: format!("req-{seq}"),
        reason: LimitReason::Exhausted,
        degraded: false,
        retry_after_ms: 250,
    }
}

/// Every log line librdkafka and the sink write in this test binary: the producer runs
/// with `debug=msg`, whose "Produce MessageSet" lines name the codec on the wire.
fn captured_logs() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&logs);
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || Capture(Arc::clone(&sink)))
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("one subscriber");
        logs
    })
}

struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_arrives_once_keyed_by_hashed_key_id_in_zstd() {
    const N: u64 = 3_000;
    let logs = captured_logs();
    let broker = KafkaBroker::start();
    let topic = "limit-events-once";
    create_topic(&broker.bootstrap(), topic, 3)
        .await
        .expect("create the topic");

    let source = Arc::new(Source::default());
    source
        .waiting
        .lock()
        .unwrap()
        .extend((1..=N).map(|s| event(s, (s % 4) as usize)));
    let mut config = KafkaConfig::new(broker.bootstrap(), topic);
    config.properties.insert("debug".into(), "msg".into());
    config.properties.insert("linger.ms".into(), "20".into());
    let sink = KafkaSink::new(&config).expect("a producer");
    let (stop, shutdown) = watch::channel(false);
    // Batches of 500 every 50 ms: several passes, several message sets per partition.
    let task = tokio::spawn(sink.run(
        Arc::clone(&source),
        Duration::from_millis(50),
        500,
        shutdown,
    ));

    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while source.delivered.load(Ordering::Relaxed) + source.dropped.load(Ordering::Relaxed) < N {
        assert!(
            tokio::time::Instant::now() < deadline,
            "delivered {} dropped {} of {N}; broker log:\n{}",
            source.delivered.load(Ordering::Relaxed),
            source.dropped.load(Ordering::Relaxed),
            broker.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.send(true).unwrap();
    task.await.unwrap();
    assert_eq!(source.delivered.load(Ordering::Relaxed), N);
    assert_eq!(source.dropped.load(Ordering::Relaxed), 0);

    let bootstrap = broker.bootstrap();
    let read = tokio::task::spawn_blocking(move || {
        read_topic(
            &bootstrap,
            topic,
            N as usize,
            Duration::from_secs(2),
            Duration::from_secs(30),
        )
    })
    .await
    .unwrap()
    .expect("read the topic back");
    assert_eq!(read.len() as u64, N, "each event exactly once");

    let mut ids = HashSet::new();
    let mut partition_of: HashMap<KeyId, i32> = HashMap::new();
    let mut last_seq: HashMap<KeyId, u64> = HashMap::new();
    let mut by_partition: HashMap<i32, usize> = HashMap::new();
    for m in &read {
        let e = LimitEvent::decode(&m.payload).expect("a valid event");
        assert!(ids.insert(e.id), "{} twice", e.id);
        assert_eq!(e, event(e.id.seq, (e.id.seq % 4) as usize));
        assert_eq!(
            KeyId::from_bytes(&m.key),
            Some(e.key),
            "keyed by hashed key id"
        );
        let p = *partition_of.entry(e.key).or_insert(m.partition);
        assert_eq!(p, m.partition, "{} left its key's partition", e.id);
        let before = last_seq.insert(e.key, e.id.seq).unwrap_or(0);
        assert!(before < e.id.seq, "{} out of order in its partition", e.id);
        *by_partition.entry(m.partition).or_default() += 1;
        for raw in RAW_KEYS {
            assert!(!contains(&m.payload, raw.as_bytes()) && !contains(&m.key, raw.as_bytes()));
        }
    }
    assert_eq!(ids.len() as u64, N);
    eprintln!("messages per partition: {by_partition:?}");

    let text = String::from_utf8_lossy(&logs.lock().unwrap()).into_owned();
    let produce: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("Produce MessageSet") && l.contains(topic))
        .collect();
    assert!(!produce.is_empty(), "no produce lines in the log:\n{text}");
    for l in &produce {
        assert!(l.contains(", zstd)"), "not zstd on the wire: {l}");
    }
    for raw in RAW_KEYS {
        assert!(!text.contains(raw), "raw key in the log");
    }
    eprintln!("{} zstd message sets, e.g. {}", produce.len(), produce[0]);
}

/// A broker that never answers: every event is still accounted for, as dropped, once the
/// producer gives up on it (here after 2 s) and when the sink stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_cannot_be_delivered_is_counted_dropped() {
    const N: u64 = 200;
    captured_logs();
    let mut broker = KafkaBroker::start();
    let topic = "limit-events-gone";
    create_topic(&broker.bootstrap(), topic, 1)
        .await
        .expect("create the topic");
    broker.pause();
    let source = Arc::new(Source::default());
    source
        .waiting
        .lock()
        .unwrap()
        .extend((1..=N).map(|s| event(s, 0)));
    let mut config = KafkaConfig::new(broker.bootstrap(), topic);
    config
        .properties
        .insert("message.timeout.ms".into(), "2000".into());
    let sink = KafkaSink::new(&config).expect("a producer");
    let (stop, shutdown) = watch::channel(false);
    let task = tokio::spawn(sink.run(Arc::clone(&source), Duration::from_millis(50), 64, shutdown));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while source.dropped.load(Ordering::Relaxed) < N {
        assert!(tokio::time::Instant::now() < deadline, "not all dropped");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.send(true).unwrap();
    task.await.unwrap();
    assert_eq!(source.delivered.load(Ordering::Relaxed), 0);
    assert_eq!(source.dropped.load(Ordering::Relaxed), N);
    broker.resume();
}

#[test]
fn a_weakened_guarantee_stops_the_sink_at_start() {
    let mut config = KafkaConfig::new("127.0.0.1:9", "t");
    config.properties.insert("acks".into(), "1".into());
    assert!(matches!(
        KafkaSink::new(&config),
        Err(KafkaSinkError::Reserved(k)) if k == "acks"
    ));
    let mut config = KafkaConfig::new("127.0.0.1:9", "t");
    config
        .properties
        .insert("sasl.password".into(), "hunter2-secret".into());
    config
        .properties
        .insert("no.such.property".into(), "x".into());
    let err = KafkaSink::new(&config).err().expect("refused").to_string();
    assert!(err.contains("no.such.property"), "{err}");
    assert!(!err.contains("hunter2-secret"), "{err}");
}
