//! The decision with 10^5 keys and two windows per key (S2, S3), credit held locally, beside
//! governor's keyed limiter (DashMap state store) over the same keys in the same run.
//!
//! A third function measures the floor under both: a bare dashmap of 10^5 `u128 -> AtomicU64`
//! entries (32-byte slots, the same hasher as the surface), one lookup and one atomic
//! decrement per call. Neither limiter can decide faster than the map it reads, so on a host
//! where this floor moves the absolute figures move with it (BENCHMARKS.md).
//!
//! Each function runs twice: in criterion's wall time (`decision_1e5_keys`) and in the
//! bench thread's own CPU time (`decision_1e5_keys_thread_cpu`). This 2-vCPU machine is
//! shared, and wall time also counts the slices the thread spent descheduled while a
//! neighbour ran; CPU time does not, so it is the code's own cost (cache effects of the
//! neighbour still included). Both are reported (BENCHMARKS.md).
//!
//! Run: `cargo bench -p gateway-node --bench decision`

#[path = "../tests/support.rs"]
mod support;

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};

use bus_schemas::WindowSpec;
use criterion::measurement::{Measurement, ValueFormatter, WallTime};
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

/// The calling thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), in nanoseconds. Criterion
/// reads it once per sample, so the syscall is amortised over the sample's iterations.
struct ThreadCpuTime;

#[allow(unsafe_code)]
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, exclusively borrowed timespec for the call's duration.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl Measurement for ThreadCpuTime {
    type Intermediate = u64;
    type Value = u64;

    fn start(&self) -> u64 {
        thread_cpu_ns()
    }
    fn end(&self, started_ns: u64) -> u64 {
        thread_cpu_ns() - started_ns
    }
    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }
    fn zero(&self) -> u64 {
        0
    }
    fn to_f64(&self, ns: &u64) -> f64 {
        *ns as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        // Values are nanoseconds, as wall time's are, so its formatter reads them right.
        WallTime.formatter()
    }
}

fn bench_decision_wall(c: &mut Criterion) {
    bench_decision(c, "decision_1e5_keys");
}

fn bench_decision_thread_cpu(c: &mut Criterion<ThreadCpuTime>) {
    bench_decision(c, "decision_1e5_keys_thread_cpu");
}

fn bench_decision<M: Measurement>(c: &mut Criterion<M>, group_name: &str) {
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

    let mut group = c.benchmark_group(group_name);
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

fn config<M: Measurement>(c: Criterion<M>) -> Criterion<M> {
    c.sample_size(60)
        .measurement_time(std::time::Duration::from_secs(4))
}

criterion_group! {
    name = wall;
    config = config(Criterion::default());
    targets = bench_decision_wall
}
criterion_group! {
    name = thread_cpu;
    config = config(Criterion::default().with_measurement(ThreadCpuTime));
    targets = bench_decision_thread_cpu
}
criterion_main!(wall, thread_cpu);
