//! The archive on a real filesystem: events written and read back unchanged, split by UTC
//! day, a writer's temporary files never read, and bad files named and skipped.

use std::fs;

use bus_schemas::{EventId, KeyId, LimitEvent, LimitReason, NodeEpoch, NodeId, WindowId};
use foldgate_archive::encoder::{decode, schema};
use foldgate_archive::reader::{DayRange, list_files, scan};
use foldgate_archive::service::remove_leftovers;
use foldgate_archive::sink::{node_file_name, write_events};
use foldgate_archive::{ArchiveLayout, SinkConfig};

/// 2025-12-03 00:00:00 UTC.
const DAY0_MS: u64 = 1_764_720_000_000;

fn event(seq: u64, at_ms: u64) -> LimitEvent {
    LimitEvent {
        id: EventId {
            node: NodeId(2),
            node_epoch: NodeEpoch(1_764_000_000_000),
            seq,
        },
        key: KeyId {
            version: 1 + (seq % 2) as u8,
            digest: u128::from(seq) * 0x9e37_79b9_7f4a_7c15,
        },
        plan_id: 4,
        window: WindowId {
            length_ms: 1_000,
            number: at_ms / 1_000,
        },
        at_ms,
        correlation_id: format!("req-{seq}"),
        reason: if seq.is_multiple_of(3) {
            LimitReason::FastPathDeadline
        } else {
            LimitReason::Exhausted
        },
        degraded: seq.is_multiple_of(5),
        retry_after_ms: 250 + seq,
    }
}

fn config(root: &std::path::Path, file_events_max: usize) -> SinkConfig {
    SinkConfig {
        layout: ArchiveLayout::new(root),
        file_events_max,
    }
}

fn read_all(root: &std::path::Path) -> (Vec<LimitEvent>, Vec<String>) {
    let s = scan(
        &ArchiveLayout::new(root).events_dir(),
        DayRange::default(),
        &schema(),
    )
    .unwrap();
    let events = s.batches.iter().flat_map(|b| decode(b).unwrap()).collect();
    (events, s.warnings)
}

#[test]
fn events_come_back_unchanged_one_partition_per_day() {
    let dir = tempfile::tempdir().unwrap();
    // Five events late on day 0, four early on day 1; at most three per file.
    let events: Vec<_> = (1..=9)
        .map(|s| event(s, DAY0_MS + 86_400_000 - 5_000 + s * 1_000))
        .collect();
    let w = write_events(&config(dir.path(), 3), &events, node_file_name).unwrap();
    assert_eq!(w.events, 9);
    assert_eq!(
        w.files.len(),
        4,
        "day 0: 3 + 1, day 1: 3 + 1 (seq 5 is day 1)"
    );
    let names: Vec<String> = list_files(
        &ArchiveLayout::new(dir.path()).events_dir(),
        DayRange::default(),
    )
    .unwrap()
    .iter()
    .map(|p| {
        p.strip_prefix(dir.path())
            .unwrap()
            .to_string_lossy()
            .into_owned()
    })
    .collect();
    assert_eq!(
        names,
        [
            "events/day=2025-12-03/node2-e1764000000000-s1-3.parquet",
            "events/day=2025-12-03/node2-e1764000000000-s4-4.parquet",
            "events/day=2025-12-04/node2-e1764000000000-s5-7.parquet",
            "events/day=2025-12-04/node2-e1764000000000-s8-9.parquet",
        ]
    );
    let (back, warnings) = read_all(dir.path());
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(back, events);
    // A day range reads only its partitions.
    let day1 = scan(
        &ArchiveLayout::new(dir.path()).events_dir(),
        DayRange {
            first: Some(foldgate_archive::encoder::day_of(DAY0_MS) + 1),
            last: None,
        },
        &schema(),
    )
    .unwrap();
    assert_eq!(day1.batches.iter().map(|b| b.num_rows()).sum::<usize>(), 5);
}

#[test]
fn bad_files_are_named_and_skipped_and_temporary_ones_never_read() {
    let dir = tempfile::tempdir().unwrap();
    let events: Vec<_> = (1..=4).map(|s| event(s, DAY0_MS + s)).collect();
    let w = write_events(&config(dir.path(), 2), &events, node_file_name).unwrap();
    let day_dir = w.files[0].parent().unwrap().to_path_buf();
    // A file cut short by a crash of some other writer, one of garbage, and a writer's
    // temporary file (which holds a whole, valid file's bytes).
    let whole = fs::read(&w.files[0]).unwrap();
    fs::write(day_dir.join("truncated.parquet"), &whole[..whole.len() / 2]).unwrap();
    fs::write(day_dir.join("garbage.parquet"), b"not parquet at all").unwrap();
    fs::write(day_dir.join("inflight.parquet.tmp"), &whole).unwrap();
    let (back, warnings) = read_all(dir.path());
    assert_eq!(
        back, events,
        "every good row, none twice, no temporary file"
    );
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(warnings.iter().any(|w| w.contains("truncated.parquet")));
    assert!(warnings.iter().any(|w| w.contains("garbage.parquet")));
    assert_eq!(remove_leftovers(dir.path()).unwrap(), 1);
    assert!(!day_dir.join("inflight.parquet.tmp").exists());
}

#[test]
fn rewriting_the_same_events_replaces_their_file_whole() {
    let dir = tempfile::tempdir().unwrap();
    let events: Vec<_> = (1..=3).map(|s| event(s, DAY0_MS + s)).collect();
    let c = config(dir.path(), 10);
    write_events(&c, &events, node_file_name).unwrap();
    write_events(&c, &events, node_file_name).unwrap();
    let (back, _) = read_all(dir.path());
    assert_eq!(back, events, "same events, same name: one copy");
}
