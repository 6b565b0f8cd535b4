//! SQL over a real archive on disk: counts per key and day agree with the events
//! written, a bad file is named and skipped, and `rollup` exists before any roll-up.

mod support;

use bus_schemas::{EventId, KeyId, LimitEvent, LimitReason, NodeEpoch, NodeId, WindowId};
use datafusion::arrow::array::{Array, Int64Array};
use foldgate_archive::sink::{node_file_name, write_events};
use foldgate_archive::{ArchiveLayout, SinkConfig};

const DAY0_MS: u64 = 1_764_720_000_000;

fn event(seq: u64, key: u128, at_ms: u64) -> LimitEvent {
    LimitEvent {
        id: EventId {
            node: NodeId(1),
            node_epoch: NodeEpoch(9),
            seq,
        },
        key: KeyId {
            version: 1,
            digest: key,
        },
        plan_id: 1,
        window: WindowId {
            length_ms: 1_000,
            number: at_ms / 1_000,
        },
        at_ms,
        correlation_id: format!("c{seq}"),
        reason: LimitReason::Exhausted,
        degraded: false,
        retry_after_ms: 100,
    }
}

#[tokio::test]
async fn counts_per_key_and_day_and_bad_files_are_skipped() {
    let dir = tempfile::tempdir().unwrap();
    // Key 7: 3 events on day 0, 2 on day 1; key 8: 1 on day 1.
    let at = [0u64, 1, 2, 86_400_000, 86_400_001, 86_400_002];
    let keys = [7u128, 7, 7, 7, 7, 8];
    let events: Vec<_> = (0..6)
        .map(|i| event(i as u64 + 1, keys[i], DAY0_MS + at[i]))
        .collect();
    let config = SinkConfig {
        layout: ArchiveLayout::new(dir.path()),
        file_events_max: 2,
    };
    let w = write_events(&config, &events, node_file_name).unwrap();
    let day1 = w.files.last().unwrap().parent().unwrap().to_path_buf();
    std::fs::write(day1.join("broken.parquet"), b"PAR1 and then nothing").unwrap();

    let (got, warnings) = support::counts_per_key_and_day(dir.path()).await;
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("broken.parquet"), "{warnings:?}");
    let key = |d: u128| {
        KeyId {
            version: 1,
            digest: d,
        }
        .text()
    };
    assert_eq!(
        got,
        [
            format!("{},2025-12-03,3", key(7)),
            format!("{},2025-12-04,2", key(7)),
            format!("{},2025-12-04,1", key(8)),
        ]
    );

    let (rollup, _) = foldgate_history::run_sql(dir.path(), "SELECT count(*) FROM rollup")
        .await
        .unwrap();
    let n = rollup[0]
        .column(0)
        .as_any()
        .downcast_ref::<Int64Array>()
        .unwrap();
    assert_eq!(n.value(0), 0);
}
