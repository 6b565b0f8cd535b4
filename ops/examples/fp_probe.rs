//! Fast-path reply latency from fold workers on a real nats-server (D5): a request to
//! each of two shards every millisecond for the given seconds, each answer timed from
//! send to reply. Driven by `scripts/fast-path-probe.sh`, which starts the server and two
//! `foldgate-fold` workers competing for the two shards' leases (BENCHMARKS.md, D5).
//!
//!     fp_probe NATS_URL SECONDS

use std::time::{Duration, Instant};

use bus_schemas::{
    Envelope, FastPathRequest, KeyId, KeyWindow, NodeEpoch, NodeId, OwnerEpoch, ReportEntry,
    ShardId, WindowId, subjects,
};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (url, secs) = (&args[1], args[2].parse::<u64>().unwrap());
    let client = async_nats::connect(url).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut lat = Vec::new();
    let mut none = 0;
    let end = Instant::now() + Duration::from_secs(secs);
    let mut id = 0u64;
    while Instant::now() < end {
        for shard in 0..2u32 {
            id += 1;
            // a key-window on `shard` of 2
            let mut d = id as u128;
            let kw = loop {
                let kw = KeyWindow {
                    key: KeyId {
                        version: 1,
                        digest: d.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
                    },
                    window: WindowId {
                        length_ms: 60_000,
                        number: 29_412_000 + id / 100_000,
                    },
                };
                if kw.shard(2) == ShardId(shard) {
                    break kw;
                }
                d += 1_000_003;
            };
            let req = FastPathRequest {
                node: NodeId(0),
                node_epoch: NodeEpoch(1),
                shard: ShardId(shard),
                request_id: id,
                owner_epoch_seen: OwnerEpoch(0),
                entry: ReportEntry {
                    key_window: kw,
                    allowance: 1_000_000,
                    cumulative_spend: 0,
                    demand: 1_000,
                    held_credit: 0,
                    applied_grant: 0,
                    returned: 0,
                    self_granted: 0,
                    standing_option: false,
                },
            };
            let t = Instant::now();
            match tokio::time::timeout(
                Duration::from_millis(50),
                client.request(subjects::fast_path(shard), req.encode().into()),
            )
            .await
            {
                Ok(Ok(_)) => lat.push(t.elapsed().as_micros() as u64),
                _ => none += 1,
            }
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    lat.sort();
    let p = |q: f64| lat[((lat.len() as f64 - 1.0) * q) as usize];
    let over = lat.iter().filter(|&&l| l > 1_000).count();
    println!(
        "n={} p50={} p99={} p999={} max={} over_1ms={} unanswered={}",
        lat.len(),
        p(0.5),
        p(0.99),
        p(0.999),
        lat[lat.len() - 1],
        over,
        none
    );
}
