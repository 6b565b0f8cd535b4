//! Exactly once into Parquet (issue 27 item 5), against a real tansu broker and the real
//! `foldgate-archiver` binary: every event produced is archived once, through a replay
//! of the whole topic by a new group and through three kill -9s mid-file.

mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::*;
use foldgate_archive::service::TEMP_SUFFIX;
use foldgate_archiver::writer::archived_ranges;
use foldgate_harness::kafka::KafkaBroker;

fn assert_exactly_once(archive: &std::path::Path, produced: &HashSet<String>, log: &str) {
    let events = archived_events(archive);
    let ids: HashSet<String> = events.iter().map(|e| e.id.to_string()).collect();
    assert_eq!(ids.len(), events.len(), "an event id archived twice\n{log}");
    assert_eq!(events.len(), produced.len(), "count\n{log}");
    assert_eq!(&ids, produced, "the set of event ids\n{log}");
}

/// The files of each partition tile its offsets: no gap, no overlap.
fn assert_ranges_tile(archive: &std::path::Path, n: u64) {
    let ranges = archived_ranges(&archive.join("events"), TOPIC).expect("ranges");
    let mut total = 0;
    for p in 0..PARTITIONS {
        let mut next = 0;
        for (_, first, last) in ranges.iter().filter(|r| r.0 == p) {
            assert_eq!(*first, next, "partition {p}: files {ranges:?}");
            next = last + 1;
        }
        total += next;
    }
    assert_eq!(total as u64, n, "offsets covered");
}

#[test]
fn twenty_thousand_events_are_archived_once_even_when_replayed() {
    let kafka = KafkaBroker::start();
    let bootstrap = kafka.bootstrap();
    create_topic(&bootstrap);
    const N: u64 = 20_000;
    let produced = produce_events(&bootstrap, N);
    let dir = tempfile::tempdir().unwrap();
    let run = ArchiverRun {
        bootstrap: &bootstrap,
        archive: dir.path(),
        group: "archiver-a",
        extra: vec!["--file-events-max".into(), "3000".into()],
        log: dir.path().join("archiver.log"),
    };
    let t = Instant::now();
    run.run_to_end(Duration::from_secs(90));
    eprintln!("archived {N} events in {:?}", t.elapsed());
    assert_exactly_once(dir.path(), &produced, &run.log_text());
    assert_ranges_tile(dir.path(), N);
    assert_eq!(
        metric(dir.path(), "foldgate_archiver_events_archived_total"),
        N
    );
    // Events cross midnight: some files are in each of the two day directories.
    let days: Vec<_> = std::fs::read_dir(dir.path().join("events"))
        .unwrap()
        .map(|d| d.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(days.len(), 2, "{days:?}");

    // A new group has no committed offsets and reads the whole topic again: the file
    // names say it is all archived, and nothing is written twice.
    let replay = ArchiverRun {
        group: "archiver-b",
        log: dir.path().join("replay.log"),
        ..run
    };
    replay.run_to_end(Duration::from_secs(90));
    assert_exactly_once(dir.path(), &produced, &replay.log_text());
    assert_eq!(
        metric(dir.path(), "foldgate_archiver_already_archived_total"),
        N,
        "{}",
        replay.log_text()
    );
    assert_eq!(
        metric(dir.path(), "foldgate_archiver_events_archived_total"),
        0
    );
    drop(kafka);
}

#[test]
fn kill_9_mid_file_three_times_then_a_clean_finish_is_still_exactly_once() {
    let kafka = KafkaBroker::start();
    let bootstrap = kafka.bootstrap();
    create_topic(&bootstrap);
    const N: u64 = 20_000;
    let t = Instant::now();
    let produced = produce_events_with(&bootstrap, N, &ONE_MESSAGE_PER_BATCH);
    eprintln!("produced {N} one per batch in {:?}", t.elapsed());
    let dir = tempfile::tempdir().unwrap();
    // Small files and a 300 ms pause between each flush's renames and its commit: the
    // archiver spends most of its time with files renamed but not committed, so a kill
    // at any moment most likely lands there, the window exactly-once must survive.
    let run = ArchiverRun {
        bootstrap: &bootstrap,
        archive: dir.path(),
        group: "archiver-kill",
        extra: ["--file-events-max", "400", "--test-pace-ms", "300"]
            .map(String::from)
            .to_vec(),
        log: dir.path().join("archiver.log"),
    };
    let mut renamed_before_each_kill = Vec::new();
    // Messages a restarted run read again and skipped because a file already held them:
    // above zero only if a kill landed between a rename and its commit.
    let mut reread = 0;
    for round in 0..3 {
        let before = archived_ranges(&dir.path().join("events"), TOPIC)
            .unwrap()
            .len();
        let mut child = run.spawn();
        // Wait until this run has renamed files of its own, then kill it mid-stream.
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            let now = archived_ranges(&dir.path().join("events"), TOPIC)
                .unwrap()
                .len();
            if now >= before + 3 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: no progress\n{}",
                run.log_text()
            );
            assert!(
                child.0.try_wait().unwrap().is_none(),
                "exited early\n{}",
                run.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(150 + 200 * round));
        child.0.kill().expect("SIGKILL");
        child.0.wait().unwrap();
        reread += metric(dir.path(), "foldgate_archiver_already_archived_total");
        let files = archived_ranges(&dir.path().join("events"), TOPIC)
            .unwrap()
            .len();
        renamed_before_each_kill.push(files);
        eprintln!("kill -9 #{}: {files} files renamed so far", round + 1);
    }
    // A crash mid-write leaves a temporary file; plant one as a kill inside
    // `write_atomic` would, and check the restart removes it.
    let day = std::fs::read_dir(dir.path().join("events"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let leftover = day.join(format!(
        "{TOPIC}+0+{:020}-{:020}.parquet{TEMP_SUFFIX}",
        99_999, 100_000
    ));
    std::fs::write(&leftover, b"half a file").unwrap();

    let before_finish = archived_events(dir.path()).len();
    assert!(
        (before_finish as u64) < N,
        "the kills came too late to test anything"
    );
    run.run_to_end(Duration::from_secs(100));
    let log = run.log_text();
    assert!(!leftover.exists(), "leftover temp file not removed\n{log}");
    assert_exactly_once(dir.path(), &produced, &log);
    assert_ranges_tile(dir.path(), N);
    reread += metric(dir.path(), "foldgate_archiver_already_archived_total");
    eprintln!(
        "files after each kill: {renamed_before_each_kill:?}; {before_finish} events archived \
         before the clean run; {reread} messages read again and skipped"
    );
    assert!(
        reread > 0,
        "no kill landed between a rename and its commit\n{log}"
    );
    drop(kafka);
}
