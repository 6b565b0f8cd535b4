//! The archiver's own work per event, without Kafka: 100,000 bus-encoded limit events
//! through `PartitionWriter` (decode, erasure check, de-duplication, Arrow encoding, zstd
//! Parquet, temporary file, fsync, rename, directory fsync) on one thread. What librdkafka
//! costs on top is in the end-to-end figure (`benches/end_to_end.rs`).
//!
//! `cargo bench -p foldgate-archiver --bench archiver`

use std::hint::black_box;

use bus_schemas::{Envelope, EventId, KeyId, LimitEvent, LimitReason, NodeEpoch, NodeId, WindowId};
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use foldgate_archive::ArchiveLayout;
use foldgate_archiver::NothingErased;
use foldgate_archiver::metrics::Metrics;
use foldgate_archiver::writer::{Incoming, PartitionWriter};

const EVENTS: usize = 100_000;

fn payloads() -> Vec<(Vec<u8>, Vec<u8>)> {
    (0..EVENTS as u64)
        .map(|i| {
            let e = LimitEvent {
                id: EventId {
                    node: NodeId((i % 20) as u32 + 1),
                    node_epoch: NodeEpoch(3),
                    seq: i / 20 + 1,
                },
                key: KeyId {
                    version: 1,
                    digest: u128::from(i % 100_000)
                        .wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835),
                },
                plan_id: 1 + (i % 3) as u32,
                window: WindowId {
                    length_ms: 60_000,
                    number: 29_000_000 + i / 30_000,
                },
                at_ms: 1_796_601_600_000 + i * 2,
                correlation_id: format!("{:016x}", i.wrapping_mul(0x2545_f491_4f6c_dd1d)),
                reason: LimitReason::Exhausted,
                degraded: false,
                retry_after_ms: 1_000 + i % 59_000,
            };
            (e.key.to_bytes().to_vec(), e.encode())
        })
        .collect()
}

fn push_all(w: &mut PartitionWriter, input: &[(Vec<u8>, Vec<u8>)], metrics: &Metrics) {
    for (offset, (key, payload)) in input.iter().enumerate() {
        let m = Incoming {
            offset: offset as i64,
            payload: Some(payload),
            key: Some(key),
            timestamp_ms: None,
        };
        w.push(m, &NothingErased, metrics).unwrap();
    }
}

fn bench(c: &mut Criterion) {
    let input = payloads();
    let root = tempfile::tempdir().unwrap();
    let metrics = Metrics::default();
    let mut run = 0u64;
    // Parquet bytes per million events, from one file of this data: 100,000 keys, 20
    // nodes, 16-hex correlation ids, three plans.
    let once = PartitionWriter::open(
        &ArchiveLayout::new(root.path().join("size")),
        "t",
        0,
        EVENTS,
        &metrics,
    );
    let mut once = once.unwrap();
    push_all(&mut once, &input, &metrics);
    let flushed = once.flush(&metrics).unwrap();
    let bytes: u64 = flushed
        .files
        .iter()
        .map(|f| std::fs::metadata(f).unwrap().len())
        .sum();
    println!(
        "archiver/parquet_bytes: {EVENTS} events in {} file(s), {bytes} bytes = {} bytes per million events",
        flushed.files.len(),
        bytes * 1_000_000 / EVENTS as u64
    );
    let mut g = c.benchmark_group("archiver");
    g.throughput(Throughput::Elements(EVENTS as u64));
    g.sample_size(10);
    g.bench_function("decode_encode_write_100k", |b| {
        b.iter_batched(
            || {
                run += 1;
                let layout = ArchiveLayout::new(root.path().join(run.to_string()));
                PartitionWriter::open(&layout, "foldgate.limit-events", 0, EVENTS, &metrics)
                    .unwrap()
            },
            |mut w| {
                push_all(&mut w, &input, &metrics);
                black_box(w.flush(&metrics).unwrap())
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
