//! Two `foldgate-fold` processes given one `--name` (a copied config) on a real
//! nats-server: each used to take the other's lease as its own on every renewal pass, a
//! new owner epoch with the takeover fence up each time. Now the first holds it.

mod common;

use std::time::{Duration, Instant};

use common::workers::{free_port, lease_store, scrape, spawn_fold_worker_with, value};
use foldgate_tests::nats::NatsServer;

const LEASE_MS: u64 = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_of_one_name_do_not_pass_a_lease_back_and_forth() {
    let server = NatsServer::start();
    let url = server.url();
    let ports = [free_port(), free_port()];
    let _workers: Vec<_> = ports
        .iter()
        .map(|p| {
            let listen = format!("127.0.0.1:{p}");
            spawn_fold_worker_with(&url, "twin", 1, LEASE_MS, &["--metrics-listen", &listen])
        })
        .collect();
    let client = async_nats::connect(&url).await.unwrap();
    let store = lease_store(client).await;
    let taken = || -> Option<f64> {
        ports
            .iter()
            .map(|&p| value(&scrape(p)?, "foldgate_fold_leases_taken_total"))
            .sum()
    };
    let by = Instant::now() + Duration::from_secs(10);
    while taken().unwrap_or(0.0) < 1.0 {
        assert!(Instant::now() < by, "nobody took the lease");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let holder = store.entry("shard.0").await.unwrap().unwrap().value;
    // Fifteen leases' time: 20 renewal passes of each worker.
    tokio::time::sleep(Duration::from_millis(15 * LEASE_MS)).await;
    assert_eq!(
        taken(),
        Some(1.0),
        "the lease changed hands between the twins"
    );
    let now = store.entry("shard.0").await.unwrap().unwrap().value;
    assert_eq!(now, holder, "the same process holds it");
    assert!(String::from_utf8_lossy(&now).starts_with("twin#"));
}
