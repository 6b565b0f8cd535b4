//! Issue 4 (S1, S2): decode plus fold of report entries on one core. Each iteration decodes
//! one node's encoded report batch (the real codec) and folds it into the shard's owner,
//! which sizes and queues the grants; throughput is in report entries.
//!
//! Run: `cargo bench -p fold-workers --bench fold`

use std::hint::black_box;

use bus_schemas::{
    Envelope, KeyId, KeyWindow, NodeEpoch, NodeId, Now, OwnerEpoch, ReportBatch, ReportEntry,
    ShardId, WindowId,
};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use fold_workers::{FoldOwner, OwnerConfig};

const NODES: u32 = 20;
/// Entries per batch: one node's lines for one shard in one round at the reference scale
/// (10^5 keys over 20 shards, two windows, the lines that changed).
const ENTRIES: usize = 500;

fn batches(now: Now, round: u64) -> Vec<Vec<u8>> {
    (0..NODES)
        .map(|n| {
            let entries = (0..ENTRIES)
                .map(|i| {
                    let key = KeyId {
                        version: 1,
                        digest: (u128::from(n) * 1_000_003 + i as u128 + 1)
                            .wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835)
                            | 1,
                    };
                    ReportEntry {
                        key_window: KeyWindow {
                            key,
                            window: WindowId {
                                length_ms: 60_000,
                                number: now.wall_ms / 60_000,
                            },
                        },
                        allowance: 1 << 30,
                        cumulative_spend: round * 3,
                        demand: 3_000,
                        held_credit: 10,
                        applied_grant: round * 3 + 10,
                        returned: 0,
                        self_granted: 0,
                        standing_option: false,
                    }
                })
                .collect();
            ReportBatch {
                node: NodeId(n),
                node_epoch: NodeEpoch(1),
                seq: round,
                shard: ShardId(0),
                sent_at_ms: now.wall_ms,
                full_report: None,
                owner_epoch_seen: OwnerEpoch(1),
                entries,
            }
            .encode()
        })
        .collect()
}

fn bench_fold(c: &mut Criterion) {
    let now = Now {
        wall_ms: 1_764_720_030_000,
        mono_ms: 10_000,
    };
    let config = OwnerConfig {
        shards: 1,
        fleet_size: NODES,
        ..OwnerConfig::reference(ShardId(0))
    };
    let mut owner = FoldOwner::new(config, OwnerEpoch(1), now, false);
    let rounds: Vec<Vec<Vec<u8>>> = (1..=8).map(|r| batches(now, r)).collect();
    let mut group = c.benchmark_group("fold");
    group.throughput(Throughput::Elements(ENTRIES as u64));
    let mut i = 0usize;
    group.bench_function("decode_and_fold_one_batch_of_500", |b| {
        b.iter(|| {
            let round = &rounds[(i / NODES as usize) % rounds.len()];
            let bytes = &round[i % NODES as usize];
            i += 1;
            let batch = ReportBatch::decode(black_box(bytes)).expect("valid");
            owner.handle_report_batch(now, &batch);
            while let Some(g) = owner.poll_grant() {
                black_box(g);
            }
        })
    });
    group.finish();
    owner
        .check_invariants()
        .expect("the fold kept the allowance");
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).measurement_time(std::time::Duration::from_secs(4));
    targets = bench_fold
}
criterion_main!(benches);
