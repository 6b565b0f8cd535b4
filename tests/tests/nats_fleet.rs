//! Issue 4, first slice: node limiters and fold workers as services on a real nats-server
//! (no mock), pinned traffic in real time, booked against the simulator's exact oracle.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bus_schemas::{KeyId, NodeEpoch, NodeId, OwnerEpoch, ShardId, WindowSpec};
use fold_workers::OwnerConfig;
use fold_workers::service::{Assignment, FoldWorkerStats, run_fold_worker};
use foldgate_tests::nats::{
    NatsServer, drill_plan, drive_pinned, start_nodes, start_nodes_with, system_clock,
};
use gateway_node::bus::{Clock, NodeBus};
use gateway_node::{KeyPolicy, NodeConfig};

const NODES: u32 = 5;
const WORKERS: u32 = 3;
const KEYS: usize = 20;

fn clock() -> Clock {
    system_clock()
}

/// One in-process fold worker owning `shards` of `shard_count` (fleet of `shard_count`
/// nodes), with static assignment at owner epoch 1.
async fn spawn_worker(
    url: &str,
    shards: Vec<u32>,
    shard_count: u32,
    clock: &Clock,
    stats: Arc<FoldWorkerStats>,
    stop: &tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<Result<(), fold_workers::service::FoldWorkerError>> {
    let client = foldgate_tests::nats::connect(url).await;
    tokio::spawn(run_fold_worker(
        client,
        Assignment {
            shards,
            epoch: OwnerEpoch(1),
            takeover: false,
        },
        move |s| OwnerConfig {
            shards: shard_count,
            fleet_size: shard_count,
            ..OwnerConfig::reference(ShardId(s))
        },
        Arc::clone(clock),
        stats,
        stop.clone(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_nodes_and_three_fold_workers_on_real_nats_admit_to_the_limit() {
    let server = NatsServer::start();
    let clock = clock();
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let mut workers = Vec::new();
    let worker_stats: Vec<Arc<FoldWorkerStats>> = (0..WORKERS).map(|_| Arc::default()).collect();
    for w in 0..WORKERS {
        let shards: Vec<u32> = (0..NODES).filter(|s| s % WORKERS == w).collect();
        let stats = Arc::clone(&worker_stats[w as usize]);
        workers.push(spawn_worker(&server.url(), shards, NODES, &clock, stats, &stop).await);
    }
    let nodes = start_nodes(&server.url(), NODES, &clock, &stop).await;
    // Let every subscription reach the server before traffic starts.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let run = drive_pinned(
        &nodes,
        KEYS,
        &drill_plan(),
        50_000,
        Duration::from_secs(5),
        &clock,
        |_| {},
    )
    .await;
    stop_tx.send(true).unwrap();
    for w in workers {
        w.await.unwrap().unwrap();
    }

    for node in &nodes {
        node.with_limiter(|l| l.check_invariants()).unwrap();
        assert_eq!(node.stats.rejected_total(), 0, "no envelope was rejected");
        assert!(
            node.stats.grant_batches.load(Ordering::Relaxed) > 0,
            "grants arrived"
        );
    }
    for s in &worker_stats {
        assert_eq!(s.invariant_breaches.load(Ordering::Relaxed), 0);
        assert_eq!(s.rejected.load(Ordering::Relaxed), 0);
        assert!(s.reports.load(Ordering::Relaxed) > 0);
    }
    let acc = run.accuracy(1_000);
    let fast_path: u64 = nodes
        .iter()
        .map(|n| n.stats.fast_path_requests.load(Ordering::Relaxed))
        .sum();
    let missed: u64 = nodes
        .iter()
        .map(|n| n.stats.fast_path_deadline_missed.load(Ordering::Relaxed))
        .sum();
    eprintln!(
        "fast-path requests {fast_path}, deadline missed {missed}; {}",
        run.summary()
    );
    assert!(acc.closed_key_windows >= (KEYS as u64) * 2);
    // The simulator's steady target (issue 3/4): over max <= 0.5% at 1 s windows.
    assert!(
        acc.over_admission_pct_max <= 0.5,
        "over {}%",
        acc.over_admission_pct_max
    );
    // Offered is 50/s against 40/s: the simulator's steady target for under-admission
    // at 1 s windows (issue 4's must-show), p99 <= 2.5%: one credit of 40.
    assert!(
        acc.under_admission_pct_p99 <= 2.5,
        "under p99 {}% (mean {}%)",
        acc.under_admission_pct_p99,
        acc.under_admission_pct_mean
    );
    drop(server);
}

/// Node 0 of a fleet of one node and one shard on `url` (`start_nodes_with`), its
/// configuration `tweak`ed, given 200 ms to hear from its owner; and a client of its own.
async fn one_node(
    url: &str,
    clock: &Clock,
    stop: &tokio::sync::watch::Receiver<bool>,
    tweak: impl Fn(&mut NodeConfig),
) -> (NodeBus, async_nats::Client) {
    let node = start_nodes_with(url, 1, clock, stop, tweak)
        .await
        .pop()
        .expect("one node");
    tokio::time::sleep(Duration::from_millis(200)).await;
    (node, async_nats::connect(url).await.unwrap())
}

/// Bad envelopes on the grant inbox and the report subject, on real NATS: each is counted
/// by reason, and nothing of it is applied (B2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_unknown_version_oversized_and_replayed_envelopes_change_nothing() {
    use bus_schemas::{
        Envelope, GrantBatch, GrantEntry, KeyWindow, ReportBatch, ReportEntry, subjects,
    };
    use gateway_node::window::window_at;

    let server = NatsServer::start();
    let clock = clock();
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let windows = [WindowSpec {
        length_ms: 60_000,
        limit: 1_000,
    }];
    let policy = KeyPolicy::new(&windows, 25).unwrap();
    let stats = Arc::new(FoldWorkerStats::default());
    let worker = spawn_worker(&server.url(), vec![0], 1, &clock, Arc::clone(&stats), &stop).await;
    let (node, client) = one_node(&server.url(), &clock, &stop, |c| {
        // Grants from the owner, not a standing option, are what this test checks.
        c.standing_permille = 0;
        // Keep idle credit, so the held figure below only moves if a bad envelope were
        // applied.
        c.idle_return_rounds = u32::MAX;
        c.idle_return_rounds_thin = u32::MAX;
        c.idle_return_rounds_min = u32::MAX;
        c.rest_return = false;
    })
    .await;
    let key = KeyId {
        version: 1,
        digest: 0xfeed_beef_u128 << 64 | 7,
    };
    for _ in 0..20 {
        let _ = node.decide(key, &policy).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    let kw = KeyWindow {
        key,
        window: window_at(key, 60_000, clock().wall_ms),
    };
    let line = |node: &NodeBus| node.with_limiter(|l| l.line_for(&kw)).expect("a line");
    let before = line(&node);
    assert!(before.applied_grant > 0, "the owner granted: {before:?}");

    let inbox = subjects::grant_inbox(0);
    // A grant that would hand out the whole allowance, if anything let it through.
    let forged = GrantBatch {
        full_report_taken: None,
        owner_epoch: OwnerEpoch(1),
        shard: ShardId(0),
        node: NodeId(0),
        entries: vec![GrantEntry {
            key_window: kw,
            node_epoch: NodeEpoch(1),
            grant_seq: 1,
            credit_total: 1_000,
            exhausted: false,
        }],
    };
    let mut unknown_version = forged.encode();
    unknown_version[1] = 9;
    let sends: Vec<Vec<u8>> = vec![vec![0xff; 64], unknown_version, forged.encode()];
    for bytes in sends {
        client.publish(inbox.clone(), bytes.into()).await.unwrap();
    }
    // Larger than the server's max_payload (1 MiB): refused before it reaches anyone.
    let oversized = vec![0u8; 2 * 1024 * 1024];
    assert!(
        client
            .publish(inbox.clone(), oversized.into())
            .await
            .is_err()
    );
    // On the report subject: a batch cut off mid-varint, and a whole batch at schema
    // version 9, whose report line (if anything took it in) would draw a grant.
    let report = ReportBatch {
        node: NodeId(0),
        node_epoch: NodeEpoch(1),
        seq: u64::MAX / 2,
        shard: ShardId(0),
        sent_at_ms: clock().wall_ms,
        full_report: None,
        owner_epoch_seen: OwnerEpoch(1),
        entries: vec![ReportEntry {
            key_window: kw,
            cumulative_spend: 0,
            demand: 1_000_000,
            held_credit: 0,
            applied_grant: 0,
            returned: 0,
            self_granted: 0,
            standing_option: false,
            allowance: 1_000,
        }],
    };
    let mut report_v9 = report.encode();
    assert_eq!(
        report_v9[..2],
        [0x08, 0x01],
        "the version is the first field"
    );
    report_v9[1] = 9;
    for bytes in [vec![0x08, 0x01, 0xff], report_v9] {
        client
            .publish(subjects::report(0), bytes.into())
            .await
            .unwrap();
    }
    // And on the fast-path subject: a garbage request gets no answer at all.
    let unanswered = tokio::time::timeout(
        Duration::from_millis(300),
        client.request(subjects::fast_path(0), vec![0x08, 0x01, 0xff, 0xff].into()),
    )
    .await;
    assert!(
        !matches!(unanswered, Ok(Ok(_))),
        "a garbage fast-path request was answered"
    );
    client.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;

    assert_eq!(node.stats.rejected_malformed.load(Ordering::Relaxed), 1);
    assert_eq!(
        node.stats.rejected_unknown_version.load(Ordering::Relaxed),
        1
    );
    // The worker's refusals, by reason: the cut-off report and the garbage fast-path
    // request as malformed, the version-9 report as unknown, nothing else.
    let by_reason = |reason: &str| {
        let i = fold_workers::metrics::REJECT_REASONS
            .iter()
            .position(|r| *r == reason)
            .expect("a reject reason");
        stats.rejected_by_reason[i].load(Ordering::Relaxed)
    };
    assert_eq!(by_reason("malformed"), 2);
    assert_eq!(by_reason("unknown_version"), 1);
    assert_eq!(stats.rejected.load(Ordering::Relaxed), 3);
    let after = line(&node);
    assert_eq!(
        after.applied_grant, before.applied_grant,
        "the replayed grant changed nothing"
    );
    assert_eq!(after.held_credit, before.held_credit);
    node.with_limiter(|l| {
        assert!(
            l.stats().grants_duplicate >= 1,
            "the replay was seen as one"
        );
        l.check_invariants()
    })
    .unwrap();
    stop_tx.send(true).unwrap();
    worker.await.unwrap().unwrap();
}

/// F1-F5 drill: the bus really stops for longer than the degraded threshold (made 1 s
/// here, 30 s in production). Nodes keep deciding from held credit, self-grant at window
/// boundaries, report degraded, and come back when the bus does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bus_stopped_past_the_degraded_threshold_nodes_keep_deciding_and_recover() {
    use gateway_node::window::window_start_ms;

    let mut server = NatsServer::start();
    let url = server.url();
    let clock = clock();
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let stats: Arc<FoldWorkerStats> = Arc::default();
    let worker = spawn_worker(
        &server.url(),
        (0..NODES).collect(),
        NODES,
        &clock,
        Arc::clone(&stats),
        &stop,
    )
    .await;
    let nodes = foldgate_tests::nats::start_nodes_with(&url, NODES, &clock, &stop, |c| {
        c.degraded_after_ms = 1_000;
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;

    let (down_at, up_at) = (Duration::from_millis(2_000), Duration::from_millis(4_500));
    let bus = &mut server;
    let mut state = 0; // 0 up, 1 down, 2 back
    let mut degraded_seen = 0usize;
    let (mut down_ms, mut up_ms, mut recovered_ms) = (0u64, 0u64, None::<u64>);
    let (mut probed_ms, mut probe) = (None::<u64>, None);
    let run = drive_pinned(
        &nodes,
        KEYS,
        &drill_plan(),
        50_000,
        Duration::from_secs(7),
        &clock,
        |t| {
            let degraded = nodes.iter().filter(|n| n.surface().degraded()).count();
            degraded_seen = degraded_seen.max(degraded);
            if state == 0 && t >= down_at {
                bus.stop();
                down_ms = clock().wall_ms;
                state = 1;
            } else if state == 1 && t >= up_at {
                bus.restart();
                up_ms = clock().wall_ms;
                state = 2;
            } else if state == 2 && recovered_ms.is_none() && degraded == 0 {
                recovered_ms = Some(clock().wall_ms - up_ms);
            }
            // F7: recovery as the probe sees it, not as the nodes' own flags say.
            if state == 2 && probed_ms.is_none() {
                let now = clock();
                let p = foldgate_tests::nats::RecoveryProbe::take(&nodes, now);
                if p.recovered(25) {
                    probed_ms = Some(now.wall_ms - up_ms);
                    probe = Some(p);
                }
            }
        },
    )
    .await;
    stop_tx.send(true).unwrap();
    worker.await.unwrap().unwrap();

    let self_grants: u64 = nodes
        .iter()
        .map(|n| n.with_limiter(|l| l.stats().self_grants))
        .sum();
    for n in &nodes {
        n.with_limiter(|l| l.check_invariants()).unwrap();
    }
    // Admissions in 1 s windows that lay wholly inside the outage: deciding went on.
    let during: u64 = run
        .books
        .closed(down_ms, up_ms)
        .iter()
        .filter(|c| {
            c.window_kind == 1_000
                && window_start_ms(
                    c.key,
                    bus_schemas::WindowId {
                        length_ms: 1_000,
                        number: c.window_id,
                    },
                ) >= down_ms
        })
        .map(|c| c.admitted)
        .sum();
    let acc = run.accuracy(1_000);
    eprintln!(
        "bus down {} ms; degraded nodes at most {degraded_seen}; self-grants {self_grants}; \
         admitted inside the outage {during}; back to not-degraded {recovered_ms:?} ms after \
         the bus; recovery probe passed {probed_ms:?} ms after ({probe:?}); {}",
        up_ms - down_ms,
        run.summary()
    );
    assert_eq!(
        degraded_seen, NODES as usize,
        "every node reported degraded (F5)"
    );
    assert!(
        self_grants > 0,
        "nodes self-granted at window boundaries (F4)"
    );
    assert!(
        during > 0,
        "nodes kept deciding while the bus was down (F1, F3)"
    );
    let recovered = recovered_ms.expect("the degraded flag cleared after the bus came back");
    // Normal again within 3 rounds of the bus coming back, by the nodes' flags and, F7,
    // by the probe: fold age under a round everywhere, one owner epoch per shard, books
    // reconciled to allowance.
    assert!(recovered <= 3 * 25, "recovered after {recovered} ms");
    let probed = probed_ms.expect("the recovery probe passed after the bus came back");
    assert!(probed <= 3 * 25, "probe passed after {probed} ms");
    let probe = probe.expect("taken");
    assert!(probe.key_windows > 0 && probe.shards == NODES);
    assert!(
        acc.over_admission_pct_max <= 2.0,
        "over {}%",
        acc.over_admission_pct_max
    );
    drop(server);
}

/// P1 on NATS: the policy snapshot lives in a key-value bucket; a node follows it, refuses
/// a bad or stale version whole, and switches its buckets when a new version lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_version_put_in_key_value_is_switched_to_atomically() {
    use bus_schemas::{Envelope, subjects};
    use gateway_node::bus::POLICY_KEY;
    use gateway_node::window::window_at;

    let server = NatsServer::start();
    let url = server.url();
    let clock = clock();
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let kv = foldgate_tests::nats::policy_bucket(&url).await;
    let key = KeyId {
        version: 1,
        digest: 0xabcd_u128 << 64 | 3,
    };
    let snapshot = |version: u64, per_second: u64| {
        let windows = [
            WindowSpec {
                length_ms: 1_000,
                limit: per_second,
            },
            WindowSpec {
                length_ms: 60_000,
                limit: 1_500,
            },
        ];
        foldgate_tests::nats::one_plan_snapshot(version, &windows, [key])
    };
    kv.put(POLICY_KEY, snapshot(1, 40).encode().into())
        .await
        .unwrap();
    let worker = spawn_worker(&server.url(), vec![0], 1, &clock, Arc::default(), &stop).await;
    let mut nodes = start_nodes(&url, 1, &clock, &stop).await;
    let node = &mut nodes[0];
    node.watch_policy(subjects::POLICY_BUCKET).await.unwrap();
    let policy = node.policy();
    let wait_for = |applied: u64, refused: u64| {
        let stats = Arc::clone(&node.stats);
        async move {
            let by = std::time::Instant::now() + Duration::from_secs(5);
            while stats.policy_applied.load(Ordering::Relaxed) < applied
                || stats.policy_refused.load(Ordering::Relaxed) < refused
            {
                assert!(std::time::Instant::now() < by, "policy watch stalled");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    wait_for(1, 0).await;
    let v1 = *policy.borrow().get(&key).expect("the key is in v1");
    for _ in 0..10 {
        let _ = node.decide(key, &v1).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    // A snapshot that does not decode, and one that repeats the version: refused whole.
    kv.put(POLICY_KEY, vec![0x08, 0x07, 0xff].into())
        .await
        .unwrap();
    kv.put(POLICY_KEY, snapshot(1, 999).encode().into())
        .await
        .unwrap();
    wait_for(1, 2).await;
    assert_eq!(policy.borrow().version, 1);
    assert_eq!(node.with_limiter(|l| l.policy_version()), 1);

    kv.put(POLICY_KEY, snapshot(2, 80).encode().into())
        .await
        .unwrap();
    wait_for(2, 2).await;
    let v2 = *policy.borrow().get(&key).expect("the key is in v2");
    assert_eq!(v2.windows()[0].limit, 80);
    assert_eq!(node.with_limiter(|l| l.policy_version()), 2);
    assert_eq!(node.with_limiter(|l| l.stats().policy_switched), 1);
    // The next 1 s window opens under v2.
    let deadline = std::time::Instant::now() + Duration::from_millis(1_300);
    while std::time::Instant::now() < deadline {
        let _ = node.decide(key, &v2).await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let kw = bus_schemas::KeyWindow {
        key,
        window: window_at(key, 1_000, clock().wall_ms),
    };
    let line = node
        .with_limiter(|l| l.line_for(&kw))
        .expect("a line for the new window");
    assert_eq!(line.allowance, 80);
    node.with_limiter(|l| l.check_invariants()).unwrap();
    stop_tx.send(true).unwrap();
    worker.await.unwrap().unwrap();
}

/// P1 after a JetStream hiccup: when the policy watch's consumer went away (a server
/// restart, a failover), async-nats reported a missed heartbeat and the node's watch task
/// ended on that first error, leaving the node on the old policy for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_watch_outlives_the_loss_of_its_consumer() {
    use bus_schemas::{Envelope, subjects};
    use futures::StreamExt;
    use gateway_node::bus::POLICY_KEY;

    let server = NatsServer::start();
    let url = server.url();
    let clock = clock();
    let (_stop_tx, stop) = tokio::sync::watch::channel(false);
    let kv = foldgate_tests::nats::policy_bucket(&url).await;
    let key = KeyId {
        version: 1,
        digest: 0xabcd_u128 << 64 | 5,
    };
    let snapshot = |version: u64| {
        let windows = [WindowSpec {
            length_ms: 1_000,
            limit: 10 * version,
        }];
        foldgate_tests::nats::one_plan_snapshot(version, &windows, [key])
    };
    kv.put(POLICY_KEY, snapshot(1).encode().into())
        .await
        .unwrap();
    let mut nodes = start_nodes(&url, 1, &clock, &stop).await;
    let node = &mut nodes[0];
    node.watch_policy(subjects::POLICY_BUCKET).await.unwrap();
    let stats = Arc::clone(&node.stats);
    let wait_until = |what: &'static str, secs: u64, done: &dyn Fn() -> bool| {
        let by = std::time::Instant::now() + Duration::from_secs(secs);
        while !done() {
            assert!(std::time::Instant::now() < by, "{what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let applied = || stats.policy_applied.load(Ordering::Relaxed);
    tokio::task::block_in_place(|| wait_until("v1 applied", 5, &|| applied() >= 1));

    let js = async_nats::jetstream::new(async_nats::connect(&url).await.unwrap());
    let stream = js
        .get_stream(format!("KV_{}", subjects::POLICY_BUCKET))
        .await
        .unwrap();
    let names: Vec<String> = stream.consumer_names().map(|n| n.unwrap()).collect().await;
    assert!(!names.is_empty(), "the watch has a consumer");
    for n in &names {
        stream.delete_consumer(n).await.unwrap();
    }
    // async-nats notices at its idle heartbeat (about 10 s).
    let errors = || stats.policy_watch_errors.load(Ordering::Relaxed);
    tokio::task::block_in_place(|| {
        wait_until("the watch saw its consumer go", 30, &|| errors() >= 1)
    });
    kv.put(POLICY_KEY, snapshot(2).encode().into())
        .await
        .unwrap();
    tokio::task::block_in_place(|| {
        wait_until("v2 applied after the hiccup", 15, &|| applied() >= 2)
    });
    assert_eq!(node.policy().borrow().version, 2);
}

/// D5 under concurrency: a burst on a key with no credit here sends one fast-path request
/// to the owner; the requests that arrive while it is in flight wait for its answer
/// instead of each drawing a 429 (they used to: 31 of 32 denied with the pool nearly full).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_on_a_short_key_joins_one_fast_path_instead_of_denying() {
    let server = NatsServer::start();
    let url = server.url();
    let clock = clock();
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let worker = spawn_worker(&url, vec![0], 1, &clock, Arc::default(), &stop).await;
    // The fast path itself: no standing option to admit the first request.
    let nodes = start_nodes_with(&url, 1, &clock, &stop, |c| c.standing_permille = 0).await;
    let node = &nodes[0];
    let policy = KeyPolicy::new(
        &[
            WindowSpec {
                length_ms: 1_000,
                limit: 10_000,
            },
            WindowSpec {
                length_ms: 60_000,
                limit: 600_000,
            },
        ],
        25,
    )
    .unwrap();
    // The owner is heard from before the burst, so the fast path is open (F2).
    let by = std::time::Instant::now() + Duration::from_secs(5);
    while !node.with_limiter(|l| l.shard_contact(ShardId(0), clock()).1.0 > 0) {
        assert!(std::time::Instant::now() < by, "no owner contact");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut admitted = 0;
    let mut joined_total = 0;
    let mut missed_bursts = 0;
    for k in 0..5u128 {
        let missed_before = node.stats.fast_path_deadline_missed.load(Ordering::Relaxed);
        let key = KeyId {
            version: 1,
            digest: 0x5eed_u128 << 64 | k,
        };
        let before = node
            .surface()
            .stats
            .fast_path_joined
            .load(Ordering::Relaxed);
        let burst = (0..32).map(|_| node.decide(key, &policy));
        let decisions = futures::future::join_all(burst).await;
        let burst_admitted = decisions
            .iter()
            .filter(|d| matches!(d, gateway_node::Decision::Admit))
            .count();
        if node.stats.fast_path_deadline_missed.load(Ordering::Relaxed) > missed_before {
            // The owner's answer came after D5's 1 ms (this machine's two cores also run
            // nats-server and the other tests): a real 429 for the burst, counted apart.
            missed_bursts += 1;
        } else {
            assert_eq!(burst_admitted, 32, "burst {k}: every request admitted");
        }
        admitted += burst_admitted;
        joined_total += node
            .surface()
            .stats
            .fast_path_joined
            .load(Ordering::Relaxed)
            - before;
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let requests = node.stats.fast_path_requests.load(Ordering::Relaxed);
    eprintln!(
        "admitted {admitted} of 160; joined {joined_total}; fast-path requests {requests}; \
         bursts whose fast path missed its deadline {missed_bursts}"
    );
    // Each burst's first request wins the round's fast path for both windows; the rest
    // join it. A round boundary inside a burst may start a second one. A burst whose ask
    // missed its deadline (say the round's tick held the limiter past it) was settled
    // at once, and its later requests found nothing to join.
    assert!(
        joined_total >= 25 * (5 - missed_bursts),
        "joined {joined_total}"
    );
    assert!(requests <= 5 * 2 * 2, "{requests} fast-path requests");
    assert!(
        missed_bursts <= 2,
        "{missed_bursts} of 5 bursts missed the deadline"
    );
    stop_tx.send(true).unwrap();
    worker.await.unwrap().unwrap();
}

/// D5's hard deadline holds while the round's tick has the limiter: a fast path does not
/// wait the tick out on a worker thread (it did: its request left after the pass, with
/// its deadline already gone, as late as the pass was long). Here a stand-in for a long
/// pass holds the limiter for 300 ms; the fast path answers a miss well before that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_path_keeps_its_deadline_while_the_tick_holds_the_limiter() {
    use bus_schemas::LimitReason;
    use gateway_node::surface::Decision;

    let server = NatsServer::start();
    let clock = clock();
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let windows = [WindowSpec {
        length_ms: 1_000,
        limit: 100,
    }];
    let policy = KeyPolicy::new(&windows, 25).unwrap();
    let stats = Arc::new(FoldWorkerStats::default());
    let worker = spawn_worker(&server.url(), vec![0], 1, &clock, Arc::clone(&stats), &stop).await;
    // The fast path itself: no standing option to admit the request.
    let node = Arc::new(
        one_node(&server.url(), &clock, &stop, |c| c.standing_permille = 0)
            .await
            .0,
    );
    let held = Arc::clone(&node);
    let (locked_tx, locked_rx) = std::sync::mpsc::channel();
    let holder = tokio::task::spawn_blocking(move || {
        held.with_limiter(|_| {
            locked_tx.send(()).unwrap();
            std::thread::sleep(Duration::from_millis(300));
        })
    });
    locked_rx.recv().unwrap();
    let key = KeyId {
        version: 1,
        digest: 0xdead_u128 << 64 | 1,
    };
    let asked = std::time::Instant::now();
    let decision = node.decide(key, &policy).await;
    let took = asked.elapsed();
    assert!(
        matches!(
            decision,
            Decision::Deny(ref d) if d.reason == LimitReason::FastPathDeadline
        ),
        "{decision:?}"
    );
    // The deadline is 1 ms; 100 ms leaves a noisy machine room and is a third of the hold.
    assert!(took < Duration::from_millis(100), "answered after {took:?}");
    holder.await.unwrap();
    // Once the limiter is free the key's fast path goes through.
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert_eq!(node.decide(key, &policy).await, Decision::Admit);
    stop_tx.send(true).unwrap();
    worker.await.unwrap().unwrap();
}
