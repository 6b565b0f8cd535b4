//! The decision with 10^5 keys and two windows per key (S2, S3), credit held locally, beside
//! governor's keyed limiter (DashMap state store) over the same keys in the same run.
//!
//! A third function measures the floor under both: a bare dashmap of 10^5 `u128 -> AtomicU64`
//! entries (32-byte slots, the same hasher as the surface), one lookup and one atomic
//! decrement per call. Neither limiter can decide faster than the map it reads, so on a host
//! where this floor moves the absolute figures move with it (BENCHMARKS.md).
//!
//! Run: `cargo bench -p gateway-node --bench decision`

#[path = "../tests/support.rs"]
mod support;

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};

use bus_schemas::WindowSpec;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use gateway_node::Decision;
use gateway_node::surface::KeyIdHasherBuilder;
use support::*;

const KEYS: u64 = 100_000;

fn key_sequence() -> Vec<u64> {
    // A fixed pseudo-random walk over the keys, so both limiters see the same order and
    // the map is touched the way many independent clients touch it.
    let mut x = 0x2545_f491_4f6c_dd1d_u64;
    (0..1 << 16)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % KEYS
        })
        .collect()
}

fn bench_decision(c: &mut Criterion) {
    let windows = [
        WindowSpec {
            length_ms: 1_000,
            limit: 1 << 38,
        },
        WindowSpec {
            length_ms: 60_000,
            limit: 1 << 39,
        },
    ];
    // The cap sits just above the key count (eviction starts at 90% of it), as a node sized
    // for its keys would be; the map is pre-sized to the cap.
    let (mut node, policy) = fixed_node(&windows, 112_000);
    let surface = node.surface().clone();
    for i in 0..KEYS {
        let _ = surface.decide(key(i), T0.wall_ms, &policy);
    }
    node.handle_tick(T0);
    let keys: Vec<_> = key_sequence().into_iter().map(key).collect();
    assert!(
        keys.iter()
            .all(|k| surface.decide(*k, T0.wall_ms, &policy) == Decision::Admit)
    );

    let mut group = c.benchmark_group("decision_1e5_keys");
    group.throughput(Throughput::Elements(1));
    let mut i = 0usize;
    group.bench_function("foldgate_two_windows", |b| {
        b.iter(|| {
            i = (i + 1) & (keys.len() - 1);
            black_box(surface.decide(black_box(keys[i]), T0.wall_ms, &policy))
        })
    });

    let quota = governor::Quota::per_second(NonZeroU32::new(u32::MAX).unwrap());
    let keyed = governor::RateLimiter::dashmap(quota);
    let gkeys: Vec<u128> = keys.iter().map(|k| k.digest).collect();
    for k in &gkeys {
        let _ = keyed.check_key(k);
    }
    let mut j = 0usize;
    group.bench_function("governor_keyed_one_window", |b| {
        b.iter(|| {
            j = (j + 1) & (gkeys.len() - 1);
            black_box(keyed.check_key(black_box(&gkeys[j])).is_ok())
        })
    });

    let floor: dashmap::DashMap<u128, AtomicU64, KeyIdHasherBuilder> =
        dashmap::DashMap::with_capacity_and_hasher(112_000, KeyIdHasherBuilder);
    for k in 0..KEYS {
        floor.insert(key(k).digest, AtomicU64::new(u64::MAX));
    }
    let mut f = 0usize;
    group.bench_function("dashmap_floor_one_word", |b| {
        b.iter(|| {
            f = (f + 1) & (gkeys.len() - 1);
            let entry = floor.get(black_box(&gkeys[f])).expect("inserted above");
            black_box(entry.fetch_sub(1, Ordering::AcqRel))
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(60).measurement_time(std::time::Duration::from_secs(4));
    targets = bench_decision
}
criterion_main!(benches);
