//! E4: common Parquet tooling reads the archive too. DuckDB (PyPI `duckdb`, which
//! `scripts/test.sh` installs) counts events per key and day over the same files and must
//! agree with `foldgate-history`'s SQL.

use std::process::Command;

mod support;

use bus_schemas::{EventId, KeyId, LimitEvent, LimitReason, NodeEpoch, NodeId, WindowId};
use foldgate_archive::sink::{node_file_name, write_events};
use foldgate_archive::{ArchiveLayout, SinkConfig};

const DAY0_MS: u64 = 1_764_720_000_000;

fn events() -> Vec<LimitEvent> {
    // 500 events over 7 keys and three days, unevenly.
    (1..=500u64)
        .map(|seq| {
            let at_ms = DAY0_MS + (seq * seq * 7_919) % (3 * 86_400_000);
            LimitEvent {
                id: EventId {
                    node: NodeId(0),
                    node_epoch: NodeEpoch(5),
                    seq,
                },
                key: KeyId {
                    version: 1 + (seq % 2) as u8,
                    digest: u128::from(seq * seq % 7),
                },
                plan_id: 1,
                window: WindowId {
                    length_ms: 60_000,
                    number: at_ms / 60_000,
                },
                at_ms,
                correlation_id: format!("r{seq}"),
                reason: LimitReason::Exhausted,
                degraded: false,
                retry_after_ms: 1_000,
            }
        })
        .collect()
}

/// DuckDB's count per key and day over every Parquet file of `root`'s `events/`.
fn duckdb_counts(root: &std::path::Path) -> Vec<String> {
    let script = format!(
        "import duckdb\n\
         rows = duckdb.sql(\"{}\").fetchall()\n\
         print('\\n'.join(f'{{k}},{{d}},{{n}}' for k, d, n in rows))\n",
        support::COUNT_PER_KEY_AND_DAY.replace(
            "FROM events",
            &format!(
                "FROM read_parquet('{}/events/*/*.parquet', hive_partitioning = false)",
                root.display()
            )
        )
    );
    let out = Command::new("python3")
        .args(["-c", &script])
        .output()
        .expect("python3 runs (scripts/test.sh installs DuckDB from PyPI)");
    assert!(
        out.status.success(),
        "DuckDB failed (scripts/test.sh installs it: pip install duckdb): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(String::from)
        .collect()
}

fn write(root: &std::path::Path, events: &[LimitEvent]) {
    let config = SinkConfig {
        layout: ArchiveLayout::new(root),
        file_events_max: 64,
    };
    write_events(&config, events, node_file_name).unwrap();
}

#[tokio::test]
async fn duckdb_counts_per_key_and_day_agree_with_foldgate_history() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &events());
    let (ours, warnings) = support::counts_per_key_and_day(dir.path()).await;
    assert!(warnings.is_empty(), "{warnings:?}");
    let theirs = duckdb_counts(dir.path());
    assert!(ours.len() > 7, "several keys on several days: {ours:?}");
    assert_eq!(ours, theirs);
}

/// After compaction (one key-sorted file per closed day, small row groups) both readers
/// still agree, and with the counts before it.
#[tokio::test]
async fn duckdb_reads_the_compacted_archive_and_agrees_with_foldgate_history() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &events());
    let (before, _) = support::counts_per_key_and_day(dir.path()).await;
    let layout = ArchiveLayout::new(dir.path());
    let reports = foldgate_archive::compact::compact_closed_days(
        &layout,
        foldgate_archive::compact::today(),
        &mut |_, _, _| {},
    )
    .unwrap();
    assert_eq!(reports.len(), 3, "three closed days");
    assert!(reports.iter().all(|r| r.output.is_some()));
    let (ours, warnings) = support::counts_per_key_and_day(dir.path()).await;
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(ours, before, "compaction keeps every count");
    assert_eq!(ours, duckdb_counts(dir.path()));
}
