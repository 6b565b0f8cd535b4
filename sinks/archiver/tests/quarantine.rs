//! Messages that do not decode (issue 27 item 5): a garbage message and one of an unknown
//! schema version are quarantined with their offsets and counted, and every other event
//! of their partition is archived; DuckDB, an independent reader, agrees on the counts,
//! in all and per day.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use bus_schemas::{DecodeError, Envelope, LimitEvent};
use common::*;
use foldgate_archive::encoder::{day_of, day_text};
use foldgate_harness::kafka::KafkaBroker;

/// A valid event whose schema version (field 1, a one-byte varint after tag 0x08) is
/// rewritten to 99, which this release does not know.
fn unknown_version(e: &LimitEvent) -> Vec<u8> {
    let mut bytes = e.encode();
    assert_eq!(&bytes[..2], &[0x08, 0x01], "field 1 first, version 1");
    bytes[1] = 99;
    assert!(matches!(
        LimitEvent::decode(&bytes),
        Err(DecodeError::UnknownSchemaVersion { got: 99, .. })
    ));
    bytes
}

#[test]
fn garbage_and_an_unknown_version_are_quarantined_and_the_partition_goes_on() {
    let kafka = KafkaBroker::start();
    let bootstrap = kafka.bootstrap();
    create_topic(&bootstrap);
    let p = EventProducer::new(&bootstrap);
    // All on partition 1: 1,000 events, the garbage at offset 300, the unknown version at
    // offset 700.
    let mut produced = HashSet::new();
    let mut i = 0;
    for offset in 0..1_002 {
        match offset {
            300 => p.send(b"not-a-key", b"\xff\xfe garbage, not protobuf", Some(1)),
            700 => p.send(b"k", &unknown_version(&event(50_000)), Some(1)),
            _ => {
                let e = event(i);
                produced.insert(e.id.to_string());
                p.send_event(&e, Some(1));
                i += 1;
            }
        }
    }
    assert_eq!(p.finish(), 1_002);

    let dir = tempfile::tempdir().unwrap();
    let run = ArchiverRun {
        bootstrap: &bootstrap,
        archive: dir.path(),
        group: "archiver-q",
        extra: vec!["--file-events-max".into(), "250".into()],
        log: dir.path().join("archiver.log"),
    };
    run.run_to_end(Duration::from_secs(60));
    let log = run.log_text();

    let q = dir.path().join("quarantine");
    for (offset, reason) in [(300, "malformed"), (700, "schema version 99")] {
        let file = q.join(format!("{TOPIC}+1+{offset:020}.json"));
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("{}: {e}\n{log}", file.display()));
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["partition"], 1);
        assert_eq!(v["offset"], offset);
        assert!(
            v["reason"].as_str().unwrap().contains(reason),
            "{offset}: {text}"
        );
    }
    assert_eq!(std::fs::read_dir(&q).unwrap().count(), 2);
    assert_eq!(metric(dir.path(), "foldgate_archiver_quarantined_total"), 2);

    let events = archived_events(dir.path());
    let ids: HashSet<String> = events.iter().map(|e| e.id.to_string()).collect();
    assert_eq!(events.len(), 1_000, "{log}");
    assert_eq!(ids, produced);

    // A replay by a new group quarantines nothing twice and archives nothing twice.
    let replay = ArchiverRun {
        group: "archiver-q2",
        log: dir.path().join("replay.log"),
        ..run
    };
    replay.run_to_end(Duration::from_secs(60));
    assert_eq!(metric(dir.path(), "foldgate_archiver_quarantined_total"), 0);
    assert_eq!(archived_events(dir.path()).len(), 1_000);
    drop(kafka);
}

#[test]
fn duckdb_reads_the_archive_and_agrees_on_the_count() {
    let kafka = KafkaBroker::start();
    let bootstrap = kafka.bootstrap();
    create_topic(&bootstrap);
    // Past 6,000 the events cross midnight, so two day directories are compared.
    const N: u64 = 8_000;
    produce_events(&bootstrap, N);
    let dir = tempfile::tempdir().unwrap();
    let run = ArchiverRun {
        bootstrap: &bootstrap,
        archive: dir.path(),
        group: "archiver-duck",
        extra: vec!["--file-events-max".into(), "700".into()],
        log: dir.path().join("archiver.log"),
    };
    run.run_to_end(Duration::from_secs(60));
    let events = archived_events(dir.path());
    assert_eq!(events.len() as u64, N);
    assert_eq!(duckdb_counts(dir.path()), (N, N), "{}", run.log_text());
    let mut ours = std::collections::BTreeMap::<String, u64>::new();
    for e in &events {
        *ours.entry(day_text(day_of(e.at_ms))).or_default() += 1;
    }
    let ours: Vec<(String, u64)> = ours.into_iter().collect();
    assert_eq!(duckdb_counts_per_day(dir.path()), ours);
    assert_eq!(ours.len(), 2, "{ours:?}");
    drop(kafka);
}
