//! `foldgate-fold` stopped the way a deploy stops it (SIGTERM, from systemd, Kubernetes or
//! `docker stop`) hands its shards back at once and exits cleanly. It used to listen for
//! Ctrl-C alone, so its shards stayed unowned until their leases lapsed.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::workers::{holder, lease_store, spawn_fold_worker};
use foldgate_tests::nats::NatsServer;

/// Long enough that a lease gone within it was handed back, not lapsed.
const LEASE_MS: u64 = 20_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_hands_the_shards_back_at_once() {
    let server = NatsServer::start();
    let url = server.url();
    let mut worker = spawn_fold_worker(&url, "leaving", 2, LEASE_MS);
    let store = lease_store(async_nats::connect(&url).await.unwrap()).await;
    let by = Instant::now() + Duration::from_secs(10);
    while holder(&store, 0).await.is_none() || holder(&store, 1).await.is_none() {
        assert!(Instant::now() < by, "the worker took no leases");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pid = worker.0.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let by = Instant::now() + Duration::from_secs(5);
    let status = loop {
        if let Some(s) = worker.0.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < by, "the worker did not stop on SIGTERM");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "{status:?}");
    for shard in 0..2 {
        assert_eq!(
            holder(&store, shard).await,
            None,
            "shard {shard} handed back"
        );
    }
}
