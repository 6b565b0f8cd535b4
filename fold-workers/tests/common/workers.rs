//! Fold workers as OS processes on a real nats-server, for the drills that kill or pause
//! one (`owner_kill`, `lease_fence`).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use async_nats::jetstream::kv::{Operation, Store};
use fold_workers::service::{LeaseConfig, lease_key};
use foldgate_tests::KillOnDrop;

/// `foldgate-fold` named `name` on `url`, competing for the leases of `shards` shards (a
/// fleet of as many nodes); killed when dropped.
pub fn spawn_fold_worker(url: &str, name: &str, shards: u32, lease_ms: u64) -> KillOnDrop {
    let shards = shards.to_string();
    KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_foldgate-fold"))
            .args(["--nats", url, "--name", name])
            .args(["--shards", &shards, "--fleet", &shards])
            .args(["--lease-ms", &lease_ms.to_string()])
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

/// Who holds `shard`'s lease, and the revision (owner epoch) it was taken at.
pub async fn holder(store: &Store, shard: u32) -> Option<(String, u64)> {
    let e = store.entry(lease_key(shard)).await.ok()??;
    (e.operation == Operation::Put)
        .then(|| (String::from_utf8_lossy(&e.value).into_owned(), e.revision))
}
