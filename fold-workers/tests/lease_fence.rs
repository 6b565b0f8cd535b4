//! C8's self-fence with fold workers as OS processes: the owner of shard 0 is paused
//! (SIGSTOP) past its lease, another worker takes the shard, and the paused one resumes.
//! It must send nothing more under its old owner epoch.
//!
//! This drill does not single out stop 20's fix (the fence checked before every round
//! and inbound message, where it ran only right after a renewal pass): with the fence as
//! it was, it passed 4 runs of 4. On resume the worker's lease pass usually runs before
//! any report queued during the pause reaches its loop, and that pass drops the shard.
//! It holds the outcome, not the order.

use std::process::Command;
use std::time::{Duration, Instant};

use bus_schemas::{
    Envelope, GrantBatch, KeyId, KeyWindow, NodeEpoch, NodeId, OwnerEpoch, ReportBatch,
    ReportEntry, ShardId, WindowId, subjects,
};
mod common;

use common::workers::{holder, lease_store, spawn_fold_worker};
use foldgate_tests::KillOnDrop;
use foldgate_tests::nats::NatsServer;
use futures::StreamExt;

const LEASE_MS: u64 = 200;

/// `kill SIGNAL pid`.
fn signal(signal: &str, pid: &str) {
    assert!(
        Command::new("kill")
            .args([signal, pid])
            .status()
            .unwrap()
            .success()
    );
}

fn wall_ms() -> u64 {
    foldgate_runtime::wall_since_epoch().as_millis() as u64
}

/// Node 0's report of one busy line, acknowledging any owner epoch.
fn report(seq: u64) -> ReportBatch {
    let key = KeyId {
        version: 1,
        digest: 0xfe_u128,
    };
    let now = wall_ms();
    ReportBatch {
        node: NodeId(0),
        node_epoch: NodeEpoch(1),
        seq,
        shard: ShardId(0),
        sent_at_ms: now,
        full_report: Some(bus_schemas::FullReportChunk { index: 0, count: 1 }),
        owner_epoch_seen: OwnerEpoch(u64::MAX / 2),
        entries: vec![ReportEntry {
            demand: 1_000,
            ..common::line(
                KeyWindow {
                    key,
                    window: WindowId {
                        length_ms: 60_000,
                        number: now / 60_000,
                    },
                },
                1_000_000,
            )
        }],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_owner_sends_nothing_under_the_epoch_it_lost() {
    let server = NatsServer::start();
    let workers: Vec<KillOnDrop> = (0..2)
        .map(|w| spawn_fold_worker(&server.url(), &format!("w{w}"), 1, LEASE_MS))
        .collect();
    let client = async_nats::connect(server.url()).await.unwrap();
    let store = lease_store(client.clone()).await;
    let by = Instant::now() + Duration::from_secs(10);
    let (victim, old_epoch) = loop {
        if let Some(h) = holder(&store, 0).await {
            break h;
        }
        assert!(Instant::now() < by, "shard 0 found no owner");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let victim_index: usize = victim[1..].parse().unwrap();
    let mut grants = client.subscribe(subjects::GRANT_TREE).await.unwrap();
    // A node reporting every round, its reply subject its grant inbox.
    let reporter = {
        let client = client.clone();
        tokio::spawn(async move {
            for seq in 1.. {
                let bytes = report(seq).encode();
                let _ = client
                    .publish_with_reply(subjects::report(0), subjects::grant_inbox(0), bytes.into())
                    .await;
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pid = workers[victim_index].0.id().to_string();
    signal("-STOP", &pid);
    // Past its lease, and long enough for the other worker to take the shard.
    let taken_by = Instant::now() + Duration::from_secs(5);
    loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if let Some((who, rev)) = holder(&store, 0).await
            && who != victim
        {
            assert!(rev > old_epoch);
            break;
        }
        assert!(
            Instant::now() < taken_by,
            "nobody took the paused owner's shard"
        );
    }
    // Let the paused worker's inbound reports queue up, then drain what was sent so far
    // (the new owner answers every round, so drain for a while, not until a gap).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let drained_by = tokio::time::Instant::now() + Duration::from_millis(100);
    while let Ok(Some(_)) = tokio::time::timeout_at(drained_by, grants.next()).await {}
    signal("-CONT", &pid);
    let mut stale = 0;
    let mut seen = 0;
    let until = tokio::time::Instant::now() + Duration::from_millis(600);
    while let Ok(Some(m)) = tokio::time::timeout_at(until, grants.next()).await {
        if let Ok(b) = GrantBatch::decode(&m.payload) {
            seen += 1;
            stale += usize::from(b.owner_epoch == OwnerEpoch(old_epoch));
        }
    }
    reporter.abort();
    assert!(seen > 0, "the new owner answers the reports");
    assert_eq!(
        stale, 0,
        "{stale} of {seen} grant batches after the resume carried the lost epoch"
    );
}

/// An owner that finds its invariant broken halts (it grants nothing more); its worker
/// then hands the shard back and never takes it again, so another worker can own it
/// afresh. The lease used to be renewed for good, the shard dark until a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_halted_owner_hands_its_shard_to_another_worker() {
    let server = NatsServer::start();
    let _a = spawn_fold_worker(&server.url(), "a", 1, LEASE_MS);
    let client = async_nats::connect(server.url()).await.unwrap();
    let store = lease_store(client.clone()).await;
    let by = Instant::now() + Duration::from_secs(10);
    while holder(&store, 0).await.map(|h| h.0).as_deref() != Some("a") {
        assert!(Instant::now() < by, "a took no lease");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Node 0 by its own account holds twice the window's allowance: the books cannot
    // both be right, and the owner halts rather than guess.
    let mut broken = report(1);
    let allowance = broken.entries[0].allowance;
    broken.entries[0].applied_grant = 2 * allowance;
    client
        .publish(subjects::report(0), broken.encode().into())
        .await
        .unwrap();
    let by = Instant::now() + Duration::from_secs(3);
    while holder(&store, 0).await.is_some() {
        assert!(Instant::now() < by, "the halted owner kept its lease");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Five lease passes: a does not take it back.
    tokio::time::sleep(Duration::from_millis(5 * LEASE_MS / 4)).await;
    assert_eq!(holder(&store, 0).await, None, "a took the shard it gave up");
    let _b = spawn_fold_worker(&server.url(), "b", 1, LEASE_MS);
    let by = Instant::now() + Duration::from_secs(10);
    while holder(&store, 0).await.map(|h| h.0).as_deref() != Some("b") {
        assert!(Instant::now() < by, "b did not take the shard");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
