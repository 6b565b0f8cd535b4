//! Fold workers as OS processes on a real nats-server, for the drills that kill or pause
//! one (`owner_kill`, `lease_fence`).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use async_nats::jetstream::kv::{Operation, Store};
use fold_workers::service::{LeaseConfig, lease_holder_name, lease_key};
use foldgate_tests::KillOnDrop;

/// `foldgate-fold` named `name` on `url`, competing for the leases of `shards` shards (a
/// fleet of as many nodes); killed when dropped.
pub fn spawn_fold_worker(url: &str, name: &str, shards: u32, lease_ms: u64) -> KillOnDrop {
    spawn_fold_worker_with(url, name, shards, lease_ms, &[])
}

/// `spawn_fold_worker` with more flags.
pub fn spawn_fold_worker_with(
    url: &str,
    name: &str,
    shards: u32,
    lease_ms: u64,
    extra: &[&str],
) -> KillOnDrop {
    let shards = shards.to_string();
    KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_foldgate-fold"))
            .args(["--nats", url, "--name", name])
            .args(["--shards", &shards, "--fleet", &shards])
            .args(["--lease-ms", &lease_ms.to_string()])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("foldgate-fold"),
    )
}

/// The lease bucket, once a worker has made it (within 10 s).
pub async fn lease_store(client: async_nats::Client) -> Store {
    let js = async_nats::jetstream::new(client);
    let by = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(s) = js.get_key_value(LeaseConfig::reference().bucket).await {
            return s;
        }
        assert!(Instant::now() < by, "no worker created the lease bucket");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Who holds `shard`'s lease (by name), and the revision (owner epoch) it was taken at.
pub async fn holder(store: &Store, shard: u32) -> Option<(String, u64)> {
    let e = store.entry(lease_key(shard)).await.ok()??;
    (e.operation == Operation::Put).then(|| (lease_holder_name(&e.value), e.revision))
}

/// A free loopback port, for a worker's `--metrics-listen`.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// A worker's `GET /metrics`, if it answers 200.
pub fn scrape(port: u16) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: fold\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    text.starts_with("HTTP/1.1 200").then_some(text)
}

/// The value of one unlabelled `series` in a scrape.
pub fn value(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}
