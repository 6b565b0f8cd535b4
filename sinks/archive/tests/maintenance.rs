//! The archive's upkeep on a real filesystem: compaction of closed days (exactly once,
//! through a crash), the retention roll-up (counts kept, idempotent), the erased-key set,
//! and the audit chain (tampering and torn tails found).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use bus_schemas::{EventId, KeyId, LimitEvent, LimitReason, NodeEpoch, NodeId, WindowId};
use foldgate_archive::compact::{
    COMPACTED_PREFIX, compact_closed_days, compact_day, parquet_files, today,
};
use foldgate_archive::encoder::{day_of, decode, rollup_schema, schema};
use foldgate_archive::reader::{DayRange, scan};
use foldgate_archive::retain::retain;
use foldgate_archive::sink::{node_file_name, write_events};
use foldgate_archive::{ArchiveLayout, SinkConfig, audit, erasure};

/// 2025-12-03 00:00:00 UTC: long closed, and past a 30-day retention.
const DAY0_MS: u64 = 1_764_720_000_000;
const DAY_MS: u64 = 86_400_000;

fn event(node: u32, seq: u64, at_ms: u64) -> LimitEvent {
    LimitEvent {
        id: EventId {
            node: NodeId(node),
            node_epoch: NodeEpoch(7),
            seq,
        },
        key: KeyId {
            version: 1 + (seq % 2) as u8,
            digest: u128::from(seq % 13) * 0x9e37_79b9_7f4a_7c15_0000_0001,
        },
        plan_id: 1,
        window: WindowId {
            length_ms: if seq.is_multiple_of(3) { 60_000 } else { 1_000 },
            number: at_ms / 1_000,
        },
        at_ms,
        correlation_id: format!("r{seq}"),
        reason: if seq.is_multiple_of(4) {
            LimitReason::FastPathDeadline
        } else {
            LimitReason::Exhausted
        },
        degraded: false,
        retry_after_ms: 100,
    }
}

/// `n` events of node `node` on the day starting at `day_ms`, spread over the day.
fn day_events(node: u32, day_ms: u64, n: u64) -> Vec<LimitEvent> {
    (0..n)
        .map(|s| event(node, s, day_ms + s * (DAY_MS / n)))
        .collect()
}

fn write(root: &Path, events: &[LimitEvent], per_file: usize) -> Vec<PathBuf> {
    let c = SinkConfig {
        layout: ArchiveLayout::new(root),
        file_events_max: per_file,
    };
    write_events(&c, events, node_file_name).unwrap().files
}

/// What readers see: every raw event, sorted by event id text for comparison.
fn raw_rows(root: &Path) -> Vec<LimitEvent> {
    let s = scan(
        &ArchiveLayout::new(root).events_dir(),
        DayRange::default(),
        &schema(),
    )
    .unwrap();
    assert!(s.warnings.is_empty(), "{:?}", s.warnings);
    let mut v: Vec<LimitEvent> = s.batches.iter().flat_map(|b| decode(b).unwrap()).collect();
    v.sort_by_key(|e| e.id.to_string());
    v
}

fn day_dir(root: &Path, day: i32) -> PathBuf {
    ArchiveLayout::day_dir(&ArchiveLayout::new(root).events_dir(), day)
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn file_rows(path: &Path) -> Vec<LimitEvent> {
    foldgate_archive::reader::read_file(path)
        .unwrap()
        .iter()
        .flat_map(|b| decode(b).unwrap())
        .collect()
}

#[test]
fn compaction_merges_each_closed_day_into_one_key_sorted_file_and_leaves_today_alone() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let d0 = day_of(DAY0_MS);
    // Two nodes on day 0, one on day 1, in files of 7; day 0's first file again under an
    // archiver's name (a range consumed twice): its events must count once.
    let mut all = day_events(1, DAY0_MS, 40);
    all.extend(day_events(2, DAY0_MS, 25));
    all.extend(day_events(1, DAY0_MS + DAY_MS, 30));
    let files = write(root, &all, 7);
    fs::copy(
        &files[0],
        day_dir(root, d0).join("limit-events+0+0-6.parquet"),
    )
    .unwrap();
    // Today's files belong to writers at work: never touched.
    let now_ms = chrono::Utc::now().timestamp_millis() as u64;
    let today_files = write(root, &[event(3, 1, now_ms), event(3, 2, now_ms)], 1);
    let today_bytes: Vec<Vec<u8>> = today_files.iter().map(|f| fs::read(f).unwrap()).collect();
    let before = raw_rows(root);
    assert_eq!(
        before.len(),
        95 + 7 + 2,
        "the replayed file is read twice before"
    );

    let reports =
        compact_closed_days(&ArchiveLayout::new(root), today(), &mut |_, _, _| {}).unwrap();
    assert_eq!(reports.len(), 2);
    assert_eq!(reports[0].rows_in, 72);
    assert_eq!(reports[0].rows_out, 65, "7 replayed event ids dropped");

    let mut expected = all.clone();
    expected.extend([event(3, 1, now_ms), event(3, 2, now_ms)]);
    expected.sort_by_key(|e| e.id.to_string());
    assert_eq!(raw_rows(root), expected, "every event once, unchanged");
    for day in [d0, d0 + 1] {
        let left = names(&day_dir(root, day));
        assert_eq!(left.len(), 1, "one file per closed day: {left:?}");
        assert!(left[0].starts_with(COMPACTED_PREFIX));
        let rows = file_rows(&day_dir(root, day).join(&left[0]));
        let keys: Vec<(String, u64)> = rows.iter().map(|e| (e.key.text(), e.at_ms)).collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted, "sorted by key id, then time");
    }
    for (f, bytes) in today_files.iter().zip(&today_bytes) {
        assert_eq!(&fs::read(f).unwrap(), bytes, "today's files untouched");
    }
    assert!(compact_day(&ArchiveLayout::new(root), today(), &mut |_, _| {}).is_err());
    // A second run finds nothing to do.
    let again = compact_closed_days(&ArchiveLayout::new(root), today(), &mut |_, _, _| {}).unwrap();
    assert!(again.iter().all(|r| r.output.is_none()), "{again:?}");
}

#[test]
fn a_crash_between_write_and_remove_still_gives_every_event_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let layout = ArchiveLayout::new(root);
    let d0 = day_of(DAY0_MS);
    let events = day_events(1, DAY0_MS, 50);
    let files = write(root, &events, 10);
    // The crash: the output renamed into place, the inputs not yet removed. Simulated by
    // putting the inputs back after a whole run.
    let saved: Vec<(PathBuf, Vec<u8>)> = files
        .iter()
        .map(|f| (f.clone(), fs::read(f).unwrap()))
        .collect();
    compact_day(&layout, d0, &mut |_, _| {}).unwrap();
    for (f, bytes) in &saved {
        fs::write(f, bytes).unwrap();
    }
    // A crash before the rename: the output's temporary file.
    fs::write(
        day_dir(root, d0).join(format!("{COMPACTED_PREFIX}000002.parquet.tmp")),
        b"half a file",
    )
    .unwrap();
    assert_eq!(names(&day_dir(root, d0)).len(), 5 + 1 + 1);
    let mut expected = events.clone();
    expected.sort_by_key(|e| e.id.to_string());
    assert_eq!(raw_rows(root), expected, "readers skip the absorbed inputs");
    // The next run removes what the crashed one left, and nothing is doubled or lost.
    compact_day(&layout, d0, &mut |_, _| {}).unwrap();
    assert_eq!(
        names(&day_dir(root, d0)).len(),
        1,
        "{:?}",
        names(&day_dir(root, d0))
    );
    assert_eq!(raw_rows(root), expected);
    // A late file (a late partition) for the compacted day merges into a new generation.
    let late = vec![event(9, 1, DAY0_MS + 5), event(9, 2, DAY0_MS + 6)];
    write(root, &late, 10);
    compact_day(&layout, d0, &mut |_, _| {}).unwrap();
    let left = names(&day_dir(root, d0));
    assert_eq!(left, [format!("{COMPACTED_PREFIX}000002.parquet")]);
    expected.extend(late);
    expected.sort_by_key(|e| e.id.to_string());
    assert_eq!(raw_rows(root), expected);
}

#[test]
fn a_big_day_is_sorted_in_buckets_on_disk_with_the_same_result() {
    // Above the in-memory bound the bucket path runs: a bound of 1,000 rows sends this
    // day of 20,000 through it, with duplicates across files.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let n = 20_000u64;
    let events: Vec<LimitEvent> = (0..n)
        .map(|s| {
            let mut e = event(1, s, DAY0_MS + s * (DAY_MS / n));
            e.key.digest = (u128::from(s % 5_000) << 100) | u128::from(s % 5_000);
            e
        })
        .collect();
    let files = write(root, &events, 3_000);
    fs::copy(
        &files[1],
        day_dir(root, day_of(DAY0_MS)).join("replay.parquet"),
    )
    .unwrap();
    let r = foldgate_archive::compact::compact_day_bounded(
        &ArchiveLayout::new(root),
        day_of(DAY0_MS),
        1_000,
        &mut |_, _| {},
    )
    .unwrap();
    assert_eq!((r.rows_in, r.rows_out), (n + 3_000, n));
    let out = r.output.unwrap();
    let meta =
        parquet::file::reader::SerializedFileReader::new(fs::File::open(&out).unwrap()).unwrap();
    use parquet::file::reader::FileReader;
    assert_eq!(
        meta.metadata().num_row_groups(),
        1,
        "20,000 rows fit one group of 64 Ki"
    );
    let rows = file_rows(&out);
    assert_eq!(rows.len() as u64, n);
    assert!(
        rows.windows(2)
            .all(|w| (w[0].key.text(), w[0].at_ms) <= (w[1].key.text(), w[1].at_ms))
    );
    assert!(
        !ArchiveLayout::new(root)
            .scratch_dir()
            .join("compact-0")
            .exists()
    );
}

fn rollup_counts(root: &Path) -> BTreeMap<(i32, String, u32, String), u64> {
    use arrow::array::{Array, Date32Array, StringArray, UInt32Array, UInt64Array};
    let s = scan(
        &ArchiveLayout::new(root).rollup_dir(),
        DayRange::default(),
        &rollup_schema(),
    )
    .unwrap();
    assert!(s.warnings.is_empty(), "{:?}", s.warnings);
    let mut out = BTreeMap::new();
    for b in &s.batches {
        let c = |n: &str| b.column_by_name(n).unwrap().clone();
        let day = c("day");
        let day = day.as_any().downcast_ref::<Date32Array>().unwrap();
        let key = c("key_id");
        let key = key.as_any().downcast_ref::<StringArray>().unwrap();
        let w = c("window_ms");
        let w = w.as_any().downcast_ref::<UInt32Array>().unwrap();
        let r = c("reason");
        let r = r.as_any().downcast_ref::<StringArray>().unwrap();
        let n = c("events");
        let n = n.as_any().downcast_ref::<UInt64Array>().unwrap();
        for i in 0..b.num_rows() {
            let k = (
                day.value(i),
                key.value(i).to_string(),
                w.value(i),
                r.value(i).to_string(),
            );
            *out.entry(k).or_default() += n.value(i);
        }
    }
    out
}

#[test]
fn days_past_the_retention_become_rollup_rows_that_sum_to_the_raw_rows_and_rerun_idempotently() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let layout = ArchiveLayout::new(root);
    let today = today();
    let recent_ms = (today as u64 - 3) * DAY_MS;
    let mut old = day_events(1, DAY0_MS, 60);
    old.extend(day_events(1, DAY0_MS + DAY_MS, 45));
    write(root, &old, 8);
    write(root, &day_events(2, recent_ms, 20), 8);
    // The raw rows' own counts per key, window length, reason and day.
    let mut expected: BTreeMap<(i32, String, u32, String), u64> = BTreeMap::new();
    for e in &old {
        let k = (
            day_of(e.at_ms),
            e.key.text(),
            e.window.length_ms,
            foldgate_archive::encoder::reason_text(e.reason).to_string(),
        );
        *expected.entry(k).or_default() += 1;
    }
    let reports = retain(&layout, 30, today, &mut |_, _, _| {}).unwrap();
    assert_eq!(reports.len(), 2, "two days past 30 days");
    let got = rollup_counts(root);
    assert_eq!(got, expected);
    assert_eq!(got.values().sum::<u64>(), 105, "counts sum to the raw rows");
    // The old days' raw files are gone; the recent day's stay raw.
    assert!(!day_dir(root, day_of(DAY0_MS)).exists());
    assert_eq!(raw_rows(root).len(), 20);
    let files_after: Vec<Vec<PathBuf>> = [day_of(DAY0_MS), day_of(DAY0_MS) + 1]
        .iter()
        .map(|d| parquet_files(&ArchiveLayout::day_dir(&layout.rollup_dir(), *d)))
        .collect();
    // Twice gives the same roll-up, file for file.
    retain(&layout, 30, today, &mut |_, _, _| {}).unwrap();
    assert_eq!(rollup_counts(root), expected);
    let files_again: Vec<Vec<PathBuf>> = [day_of(DAY0_MS), day_of(DAY0_MS) + 1]
        .iter()
        .map(|d| parquet_files(&ArchiveLayout::day_dir(&layout.rollup_dir(), *d)))
        .collect();
    assert_eq!(files_after, files_again);
    // Late raw events for a rolled-up day are counted into the next generation, once.
    let late = vec![event(4, 1, DAY0_MS + 10)];
    write(root, &late, 8);
    retain(&layout, 30, today, &mut |_, _, _| {}).unwrap();
    let mut expected_late = expected.clone();
    *expected_late
        .entry((
            day_of(DAY0_MS),
            late[0].key.text(),
            1_000,
            "exhausted".into(),
        ))
        .or_default() += 1;
    assert_eq!(rollup_counts(root), expected_late);
    assert_eq!(
        parquet_files(&ArchiveLayout::day_dir(
            &layout.rollup_dir(),
            day_of(DAY0_MS)
        ))
        .len(),
        1
    );
}

#[test]
fn a_crash_between_rollup_and_raw_removal_counts_each_event_once() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let layout = ArchiveLayout::new(root);
    let events = day_events(1, DAY0_MS, 30);
    write(root, &events, 30);
    let d0 = day_of(DAY0_MS);
    compact_day(&layout, d0, &mut |_, _| {}).unwrap();
    let compacted = parquet_files(&day_dir(root, d0)).remove(0);
    let bytes = fs::read(&compacted).unwrap();
    retain(&layout, 30, today(), &mut |_, _, _| {}).unwrap();
    // Put the compacted raw file back: the roll-up already counted it.
    fs::create_dir_all(day_dir(root, d0)).unwrap();
    fs::write(&compacted, &bytes).unwrap();
    assert!(
        raw_rows(root).is_empty(),
        "readers skip raw files a roll-up counted"
    );
    retain(&layout, 30, today(), &mut |_, _, _| {}).unwrap();
    assert_eq!(rollup_counts(root).values().sum::<u64>(), 30);
    assert!(!compacted.exists());
}

#[test]
fn the_erased_key_set_knows_erased_ids_without_keeping_them() {
    let dir = tempfile::tempdir().unwrap();
    let layout = ArchiveLayout::new(dir.path());
    assert!(
        !erasure::ErasedKeys::load(&layout)
            .unwrap()
            .contains("v1:00")
    );
    let ids = [
        "v1:0000000000000000000000000000abcd",
        "v2:0000000000000000000000000000ef01",
    ];
    erasure::record_erased(&layout, ids).unwrap();
    let set = erasure::ErasedKeys::load(&layout).unwrap();
    assert!(ids.iter().all(|k| set.contains(k)));
    assert!(!set.contains("v1:0000000000000000000000000000abce"));
    let text = fs::read_to_string(layout.erasure_dir().join(erasure::ERASED_FILE)).unwrap();
    assert!(
        !text.contains("abcd") && !text.contains("ef01"),
        "no key id in clear: {text}"
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = fs::metadata(erasure::salt_path(&layout))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o077, 0);
    // Adding more keeps the earlier ones.
    erasure::record_erased(&layout, ["v1:00000000000000000000000000000001"]).unwrap();
    assert_eq!(erasure::ErasedKeys::load(&layout).unwrap().len(), 3);
}

fn record(action: &str) -> serde_json::Map<String, serde_json::Value> {
    let mut m = serde_json::Map::new();
    m.insert("action".into(), action.into());
    m
}

#[test]
fn the_audit_chain_verifies_and_finds_an_edited_byte_and_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let layout = ArchiveLayout::new(dir.path());
    for a in ["one", "two", "three"] {
        audit::append(&layout, record(a)).unwrap();
    }
    let v = audit::verify(&layout).unwrap();
    assert_eq!(v.records, 3);
    let path = audit::audit_path(&layout);
    let good = fs::read(&path).unwrap();

    // One byte of the first record changed: the first bad record is named.
    let mut bad = good.clone();
    let at = good.iter().position(|&b| b == b'o').unwrap();
    bad[at] = b'0';
    fs::write(&path, &bad).unwrap();
    let e = audit::verify(&layout).unwrap_err().to_string();
    assert!(e.contains("record 1 "), "{e}");
    assert!(
        audit::append(&layout, record("four")).is_err(),
        "no append onto a bad chain"
    );

    // A record removed: the next one's `prev` no longer matches.
    let lines: Vec<&[u8]> = good.split_inclusive(|&b| b == b'\n').collect();
    fs::write(&path, [lines[0], lines[2]].concat()).unwrap();
    let e = audit::verify(&layout).unwrap_err().to_string();
    assert!(e.contains("record 2 "), "{e}");

    // A torn tail (a crash mid-append): reported, and no append is chained to it.
    let mut torn = good.clone();
    torn.extend_from_slice(&good[..good.len() / 6]);
    fs::write(&path, &torn).unwrap();
    let e = audit::verify(&layout).unwrap_err().to_string();
    assert!(e.contains("record 4 ") && e.contains("torn"), "{e}");
    assert!(audit::append(&layout, record("four")).is_err());

    fs::write(&path, &good).unwrap();
    audit::append(&layout, record("four")).unwrap();
    assert_eq!(audit::verify(&layout).unwrap().records, 4);
}
