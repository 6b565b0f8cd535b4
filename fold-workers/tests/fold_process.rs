//! `foldgate-fold` as an OS process on a TLS-only nats-server (issue 4: B2, A56, F6). It
//! connects with its fold certificate, takes every shard's lease in JetStream key-value,
//! reads the policy from its key-value bucket (P1), answers a gateway's reports with
//! grants sized by it, drops garbage whole, and serves its bus metrics on
//! `--metrics-listen`.

mod common;

use common::workers::{free_port, scrape, value};

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bus_schemas::{
    Envelope, GrantBatch, KeyAssignment, KeyId, KeyWindow, NodeEpoch, NodeId, OwnerEpoch, Plan,
    PolicySnapshot, ReportBatch, ReportEntry, ShardId, WindowId, WindowSpec, subjects,
};
use foldgate_tests::KillOnDrop;
use foldgate_tests::tls::{connect_as, start_role_server};
use futures::StreamExt;

const SHARDS: u32 = 2;

const POLICY_LIMIT: u64 = 100;
const KEY_CANDIDATES: u128 = 64;

fn candidate_key(d: u128) -> KeyId {
    KeyId {
        version: 1,
        digest: d.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835),
    }
}

/// A key's current 1 s window that lands on `shard` (C2 hashes key and window).
fn window_on(shard: u32, now_ms: u64) -> KeyWindow {
    (1..=KEY_CANDIDATES)
        .map(|d| {
            let key = candidate_key(d);
            let window = WindowId {
                length_ms: 1_000,
                number: now_ms.saturating_sub(key.phase_offset_ms(1_000)) / 1_000,
            };
            KeyWindow { key, window }
        })
        .find(|kw| kw.shard(SHARDS) == ShardId(shard))
        .expect("some key-window lands on every shard")
}

/// Node 0 (epoch 7) of a one-node fleet, reporting on `shard`.
fn report(
    seq: u64,
    shard: u32,
    owner_seen: OwnerEpoch,
    now_ms: u64,
    entries: Vec<ReportEntry>,
) -> ReportBatch {
    ReportBatch {
        node: NodeId(0),
        node_epoch: NodeEpoch(7),
        seq,
        shard: ShardId(shard),
        sent_at_ms: now_ms,
        full_report: Some(bus_schemas::FullReportChunk { index: 0, count: 1 }),
        owner_epoch_seen: owner_seen,
        entries,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fold_worker_process_joins_over_mtls_grants_and_exposes_its_bus_metrics() {
    let (_server, pki, url) = start_role_server();
    // P1: the policy says 100 per second for every key this test can use; the reports
    // below claim 1,000. The worker must size from the policy.
    let fold = pki.pem("fold");
    let admin = connect_as(&url, &pki, Some("fold"))
        .await
        .expect("fold role connects");
    let js = async_nats::jetstream::new(admin);
    let policy = js
        .create_key_value(async_nats::jetstream::kv::Config {
            bucket: subjects::POLICY_BUCKET.to_string(),
            history: 1,
            ..Default::default()
        })
        .await
        .expect("policy bucket");
    let snapshot = PolicySnapshot {
        version: 3,
        plans: vec![Plan {
            id: 1,
            name: "test".into(),
            windows: vec![WindowSpec {
                length_ms: 1_000,
                limit: POLICY_LIMIT,
            }],
        }],
        keys: (1..=KEY_CANDIDATES)
            .map(|d| KeyAssignment {
                key: candidate_key(d),
                plan_id: 1,
                override_windows: Vec::new(),
                carry_from: None,
            })
            .collect(),
    };
    policy
        .put(subjects::POLICY_KEY, snapshot.encode().into())
        .await
        .expect("policy put");
    let metrics_port = free_port();
    let _worker = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_foldgate-fold"))
            .args(["--nats", &url, "--name", "w0", "--lease-ms", "500"])
            .args(["--shards", &SHARDS.to_string(), "--fleet", "1"])
            // This test's node is a script that takes no standing option.
            .args(["--standing-permille", "0"])
            .arg("--nats-ca-file")
            .arg(pki.ca())
            .arg("--nats-cert-file")
            .arg(&fold.cert)
            .arg("--nats-key-file")
            .arg(&fold.key)
            .args(["--metrics-listen", &format!("127.0.0.1:{metrics_port}")])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("foldgate-fold"),
    );

    let up_by = Instant::now() + Duration::from_secs(10);
    while scrape(metrics_port).and_then(|m| value(&m, "foldgate_fold_policy_applied_total"))
        != Some(1.0)
    {
        assert!(Instant::now() < up_by, "the worker never took the policy");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let client = connect_as(&url, &pki, Some("gateway"))
        .await
        .expect("gateway connects over mTLS");
    let inbox = client.new_inbox();
    let mut grants = client.subscribe(inbox.clone()).await.unwrap();

    // Be a one-node fleet: report both shards every round, acknowledging whatever owner
    // epoch answers (the takeover fence, C8), until a grant with credit comes back.
    let now_ms = || foldgate_runtime::wall_since_epoch().as_millis() as u64;
    let mut owner_seen = [OwnerEpoch(0); SHARDS as usize];
    let mut credited = [false; SHARDS as usize];
    let give_up = Instant::now() + Duration::from_secs(15);
    let mut seq = 0;
    while credited.iter().any(|c| !c) {
        assert!(
            Instant::now() < give_up,
            "no grant with credit for every shard: {credited:?}"
        );
        seq += 1;
        for shard in 0..SHARDS {
            let key_window = window_on(shard, now_ms());
            let batch = report(
                seq,
                shard,
                owner_seen[shard as usize],
                now_ms(),
                vec![ReportEntry {
                    // 1,000 a round: unbounded by the policy, a grant would be ~980.
                    demand: 1_000_000,
                    ..common::line(key_window, 1_000)
                }],
            );
            client
                .publish_with_reply(
                    subjects::report(shard),
                    inbox.clone(),
                    batch.encode().into(),
                )
                .await
                .unwrap();
        }
        let round_end = tokio::time::Instant::now() + Duration::from_millis(25);
        while let Ok(Some(m)) = tokio::time::timeout_at(round_end, grants.next()).await {
            if m.status.is_some() {
                // "No responders" before the worker has subscribed.
                continue;
            }
            let g = GrantBatch::decode(&m.payload).expect("a worker's grant decodes");
            let s = g.shard.0 as usize;
            owner_seen[s] = owner_seen[s].max(g.owner_epoch);
            for e in &g.entries {
                assert!(
                    e.credit_total <= POLICY_LIMIT,
                    "granted {} against a policy limit of {POLICY_LIMIT}",
                    e.credit_total
                );
                credited[s] |= e.credit_total > 0;
            }
        }
    }
    // Garbage on a report subject: dropped whole, counted by reason.
    client
        .publish(subjects::report(0), vec![0xff; 16].into())
        .await
        .unwrap();
    client.flush().await.unwrap();

    // Keep reporting for over a second, so a full per-node rate period has ended.
    let keep_until = Instant::now() + Duration::from_millis(1_300);
    while Instant::now() < keep_until {
        seq += 1;
        for shard in 0..SHARDS {
            let batch = report(seq, shard, owner_seen[shard as usize], now_ms(), Vec::new());
            client
                .publish(subjects::report(shard), batch.encode().into())
                .await
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }

    let metrics = scrape(metrics_port).expect("the worker serves /metrics");
    let reports = value(&metrics, "foldgate_fold_reports_total").unwrap();
    assert!(reports >= 2.0 * 40.0, "reports folded: {reports}");
    assert_eq!(value(&metrics, "foldgate_fold_shards_owned"), Some(2.0));
    assert!(value(&metrics, "foldgate_fold_leases_taken_total").unwrap() >= 2.0);
    assert_eq!(
        value(
            &metrics,
            "foldgate_fold_rejected_envelopes_total{reason=\"malformed\"}"
        ),
        Some(1.0),
        "{metrics}"
    );
    // One batch per shard per round from node 0; rounds here are paced by a sleeping
    // test task, so anything from 1 to 2 per round is on time.
    let per_round = value(
        &metrics,
        "foldgate_fold_reports_received_per_node_per_round{node=\"0\"}",
    )
    .expect("node 0 has a rate");
    assert!(
        (0.8..=2.2).contains(&per_round),
        "reports per node per round: {per_round}"
    );
    let folded = value(&metrics, "foldgate_fold_reconciliation_freshness_ms_count").unwrap();
    assert_eq!(folded, reports, "every folded report has a fold age");
    // Loopback, one process: every report folds within a round of being sent.
    let within_round = value(
        &metrics,
        "foldgate_fold_reconciliation_freshness_ms_bucket{le=\"25\"}",
    )
    .unwrap();
    assert!(within_round >= 0.9 * folded, "{within_round} of {folded}");
    assert!(value(&metrics, "foldgate_fold_grant_latency_us_count").unwrap() >= reports);
    assert!(metrics.contains("foldgate_fold_invariant_breaches_total 0\n"));
}
