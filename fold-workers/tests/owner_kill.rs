//! Issue 4 drill: fold workers as separate OS processes competing for shard leases on a
//! real nats-server; the owner of shard 0 is killed with SIGKILL mid-run. Ownership must
//! move to another worker, with a higher epoch, and the fleet must stay within A1's 2%.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

mod common;

use common::workers::{holder, lease_store, spawn_fold_worker};
use foldgate_tests::KillOnDrop;
use foldgate_tests::nats::{NatsServer, drill_plan, drive_pinned, start_nodes, system_clock};

const NODES: u32 = 5;
const WORKERS: usize = 3;
const LEASE_MS: u64 = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_nine_of_an_owner_moves_its_shards_and_stays_within_two_percent() {
    let server = NatsServer::start();
    let mut workers: Vec<Option<KillOnDrop>> = (0..WORKERS)
        .map(|w| {
            Some(spawn_fold_worker(
                &server.url(),
                &format!("w{w}"),
                NODES,
                LEASE_MS,
            ))
        })
        .collect();
    let store = lease_store(async_nats::connect(server.url()).await.unwrap()).await;
    let up_by = Instant::now() + Duration::from_secs(10);
    loop {
        let mut all = true;
        for s in 0..NODES {
            all &= holder(&store, s).await.is_some();
        }
        if all {
            break;
        }
        assert!(Instant::now() < up_by, "not every shard found an owner");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (victim, victim_rev) = holder(&store, 0).await.unwrap();
    let victim_index: usize = victim[1..].parse().unwrap();

    let clock = system_clock();
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let nodes = start_nodes(&server.url(), NODES, &clock, &stop).await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Watch shard 0's lease: when does someone else hold it?
    let killed_at_ms = Arc::new(AtomicU64::new(0));
    let moved_at_ms = Arc::new(AtomicU64::new(0));
    let watcher = {
        let (store, killed, moved, clock) = (
            store.clone(),
            Arc::clone(&killed_at_ms),
            Arc::clone(&moved_at_ms),
            Arc::clone(&clock),
        );
        let victim = victim.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(5)).await;
                if killed.load(Ordering::Relaxed) == 0 {
                    continue;
                }
                if let Some((who, rev)) = holder(&store, 0).await
                    && who != victim
                {
                    assert!(rev > victim_rev, "the new owner epoch is larger");
                    moved.store(clock().wall_ms, Ordering::Relaxed);
                    return;
                }
            }
        })
    };
    let windows = drill_plan();
    let kill_at = Duration::from_millis(2_500);
    let run = drive_pinned(
        &nodes,
        20,
        &windows,
        50_000,
        Duration::from_secs(6),
        &clock,
        |t| {
            if t >= kill_at && killed_at_ms.load(Ordering::Relaxed) == 0 {
                // Dropping a `KillOnDrop` sends SIGKILL (`Child::kill`): no chance to hand the
                // leases back.
                drop(workers[victim_index].take().expect("alive"));
                killed_at_ms.store(clock().wall_ms, Ordering::Relaxed);
            }
        },
    )
    .await;
    stop_tx.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(3), watcher)
        .await
        .expect("shard 0 found a new owner")
        .unwrap();
    let moved_after_ms = moved_at_ms.load(Ordering::Relaxed) - killed_at_ms.load(Ordering::Relaxed);
    for node in &nodes {
        node.with_limiter(|l| l.check_invariants()).unwrap();
    }
    let acc = run.accuracy(1_000);
    eprintln!(
        "ownership moved {moved_after_ms} ms after kill -9; {}",
        run.summary()
    );
    // The lease lapses LEASE_MS after its last renewal, and a survivor, trying every
    // quarter of it, takes it by revision once the server's timestamp on it is that old:
    // 86-92 ms seen (three runs, 2026-12-04). Waiting for the server's expiry sweep
    // instead took 186-231 ms, which this bound rules out.
    assert!(moved_after_ms <= 175, "moved after {moved_after_ms} ms");
    assert!(
        acc.over_admission_pct_max <= 2.0,
        "over {}%",
        acc.over_admission_pct_max
    );
    assert!(acc.closed_key_windows >= 40);
}
