//! What a limit event adds to a 429 (E2): the decision that denies, over 10^5 exhausted
//! keys, alone and followed by its event's hand-off to the node's lock-free ring
//! (`EventQueue::emit`), in the same run.
//!
//! The ring is emptied between timed chunks (outside the timing), as the pump empties it
//! while the node serves, so every timed push is a real push and none is a full ring's
//! cheap refusal. Both functions run the same chunked loop, so the loop's cost cancels.
//!
//! Run: `cargo bench -p gateway-node --bench limit_events`

#[path = "../tests/support.rs"]
mod support;

use std::hint::black_box;
use std::time::{Duration, Instant};

use bus_schemas::{NodeEpoch, NodeId, WindowSpec};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use gateway_node::Decision;
use gateway_node::events::{EventQueue, Limited};
use support::*;

const KEYS: u64 = 100_000;
/// Pushes per timed chunk: the ring's capacity, so a chunk never meets a full ring.
const CHUNK: u64 = 4_096;

fn bench_limit_events(c: &mut Criterion) {
    let windows = [WindowSpec {
        length_ms: 60_000,
        limit: 2,
    }];
    let (mut node, policy) = fixed_node(&windows, 112_000);
    let surface = node.surface().clone();
    node.handle_tick(T0);
    // Spend every key's credit and this round's one fast path (answered with nothing):
    // from then on, within the round, each decision is a 429 from the surface alone.
    for i in 0..KEYS {
        let k = key(i);
        loop {
            match surface.decide(k, T0.wall_ms, &policy) {
                Decision::Admit => {}
                Decision::FastPath(_) => {
                    let _ = surface.decide_after_fast_path(k, T0.wall_ms, &policy, false);
                }
                Decision::Deny(_) => break,
                Decision::FailOpen => panic!("the bench's node failed open"),
            }
        }
    }
    let keys: Vec<_> = (0..1u64 << 16).map(|i| key(i * 7_919 % KEYS)).collect();
    for k in &keys {
        assert!(
            matches!(surface.decide(*k, T0.wall_ms, &policy), Decision::Deny(_)),
            "every key is exhausted, so every decision is a 429"
        );
    }
    let queue = EventQueue::new(NodeId(0), NodeEpoch(1), CHUNK as usize);
    let mut drained = Vec::with_capacity(CHUNK as usize);

    let mut group = c.benchmark_group("limit_429_1e5_keys");
    group.throughput(Throughput::Elements(1));
    let mut i = 0usize;
    group.bench_function("deny", |b| {
        b.iter_custom(|iters| {
            chunked(iters, |n| {
                for _ in 0..n {
                    i = (i + 1) & (keys.len() - 1);
                    black_box(surface.decide(black_box(keys[i]), T0.wall_ms, &policy));
                }
            })
        })
    });
    let mut j = 0usize;
    group.bench_function("deny_and_emit", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                let n = left.min(CHUNK);
                let t = Instant::now();
                for _ in 0..n {
                    j = (j + 1) & (keys.len() - 1);
                    let k = black_box(keys[j]);
                    if let Decision::Deny(d) = surface.decide(k, T0.wall_ms, &policy) {
                        black_box(queue.emit(&Limited {
                            key: k,
                            plan_id: 1,
                            window: d.window,
                            at_ms: T0.wall_ms,
                            reason: d.reason,
                            degraded: d.degraded,
                            retry_after_ms: d.wait_ms,
                            correlation_id: "0123456789abcdef0123456789abcdef",
                        }));
                    }
                }
                total += t.elapsed();
                drained.clear();
                queue.drain_into(&mut drained, CHUNK as usize);
                left -= n;
            }
            assert_eq!(
                queue
                    .counters
                    .dropped
                    .load(std::sync::atomic::Ordering::Relaxed),
                0,
                "every timed push found room"
            );
            total
        })
    });
    group.finish();
}

/// `f(n)` over `iters` in chunks of `CHUNK`, timed per chunk, as `deny_and_emit` runs.
fn chunked(iters: u64, mut f: impl FnMut(u64)) -> Duration {
    let mut total = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let n = left.min(CHUNK);
        let t = Instant::now();
        f(n);
        total += t.elapsed();
        left -= n;
    }
    total
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(60)
        .measurement_time(Duration::from_secs(4));
    targets = bench_limit_events
}
criterion_main!(benches);
