//! How late a fast-path deadline fires (D5: a hard 1 ms deadline): `deadline::Deadline`
//! against tokio's `sleep_until`, both armed 1 ms ahead on a two-worker runtime with
//! nothing else to run. Each iteration is one deadline; the figure is the time from
//! arming to the task running again, so 1 ms is the floor and what is above it is the
//! timer's lateness.
//!
//! Run: `cargo bench -p gateway-node --bench deadline`

use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use gateway_node::deadline::Deadline;

const DEADLINE: Duration = Duration::from_millis(1);

type BoxFuture = std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>;

fn bench_deadline(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    // Time from arming a 1 ms deadline to the task running again, summed over `iters`.
    let lateness = |iters: u64, arm: &dyn Fn(Instant) -> BoxFuture| {
        rt.block_on(async {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let armed = Instant::now();
                arm(armed + DEADLINE).await;
                total += armed.elapsed();
            }
            total
        })
    };
    let mut group = c.benchmark_group("deadline_1ms");
    group.bench_function("foldgate_deadline_thread", |b| {
        b.iter_custom(|iters| lateness(iters, &|at| Box::pin(Deadline::at(at))))
    });
    group.bench_function("tokio_sleep_until", |b| {
        b.iter_custom(|iters| lateness(iters, &|at| Box::pin(tokio::time::sleep_until(at.into()))))
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).measurement_time(Duration::from_secs(3));
    targets = bench_deadline
}
criterion_main!(benches);
