//! `foldgate`: the operator CLI. `foldgate sim` is the embedded default main job: it needs
//! nothing installed (see `ops::sim`).

use std::io::Write;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use ops::sim::{self, Scenario, SimConfig, SimMode, SimReport};

#[derive(Parser)]
#[command(name = "foldgate", about = "Foldgate operator CLI")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Simulate a fleet (node limiters, fold owners, bus) on a virtual clock and measure
    /// over- and under-admission against an exact oracle.
    Sim(SimArgs),
    /// Measure on a real bus, or a gateway over HTTP.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Start an upstream and a gateway node with its embedded defaults (no NATS), and
    /// earn a 429.
    Demo(DemoArgs),
    /// A tiny upstream API for local runs: `200 ok` to everything.
    Upstream(UpstreamArgs),
    /// Print a node config `[policy]` table for seeded bench keys (ids only, never keys).
    BenchPolicy(BenchPolicyArgs),
    /// Read API keys from standard input, one a line, and print each one's key id (D2)
    /// under the node's hash key, for a policy's `key_id`: the ids only, never the keys.
    KeyId(KeyIdArgs),
    /// Print one seeded bench key, for an external load generator's command line.
    BenchKey {
        #[arg(long, default_value_t = 1)]
        key_seed: u64,
        #[arg(long, default_value_t = 0)]
        index: u64,
    },
}

#[derive(clap::Args)]
struct DemoArgs {
    #[arg(long = "limit-1s", default_value_t = 5)]
    limit_1s: u64,
    #[arg(long = "limit-60s", default_value_t = 100)]
    limit_60s: u64,
    /// Print the steps as one JSON array.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct UpstreamArgs {
    #[arg(long, default_value = "127.0.0.1:8081")]
    listen: std::net::SocketAddr,
    /// Answer each request after this long, ms.
    #[arg(long, default_value_t = 0)]
    delay_ms: u64,
}

/// The node's hash key (D2), for the commands that print key ids.
#[derive(clap::Args)]
struct HashKeyArgs {
    /// File holding the node's hash key (hex).
    #[arg(long)]
    hash_key_file: std::path::PathBuf,
    #[arg(long, default_value_t = 1)]
    hash_key_version: u8,
}

#[derive(clap::Args)]
struct KeyIdArgs {
    #[command(flatten)]
    hash_key: HashKeyArgs,
}

#[derive(clap::Args)]
struct BenchPolicyArgs {
    #[command(flatten)]
    hash_key: HashKeyArgs,
    #[arg(long, default_value_t = 100)]
    keys: u64,
    #[arg(long, default_value_t = 1)]
    key_seed: u64,
    #[arg(long = "limit-1s", default_value_t = 1_000_000)]
    limit_1s: u64,
    #[arg(long = "limit-60s", default_value_t = 60_000_000)]
    limit_60s: u64,
}

#[derive(clap::Args)]
struct HttpArgs {
    /// Base URL: `http://127.0.0.1:8080`. Repeat it for an interleaved A/B: arrivals
    /// alternate between targets and each gets `--rate`; one JSON line per target.
    #[arg(long, required = true)]
    target: Vec<String>,
    /// Requests per second per target, open loop.
    #[arg(long, default_value_t = 2_778)]
    rate: u64,
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Bench keys (see `bench-policy`), used round-robin.
    #[arg(long, default_value_t = 100)]
    keys: u64,
    #[arg(long, default_value_t = 1)]
    key_seed: u64,
    #[arg(long, default_value = "/")]
    path: String,
    #[arg(long, default_value_t = 1_024)]
    max_in_flight: usize,
    #[arg(long, default_value_t = 10_000)]
    timeout_ms: u64,
}

#[derive(Subcommand)]
enum BenchCommand {
    /// N node runtimes (in this process) and M `foldgate-fold` worker processes on a real
    /// nats-server, pinned traffic in real time, accuracy against the exact oracle.
    Fleet(FleetArgs),
    /// Open-loop HTTP load at a constant arrival rate; latency from the intended send time.
    Http(HttpArgs),
}

#[derive(clap::Args)]
struct FleetArgs {
    /// Use this server instead of starting one (it must have JetStream on).
    #[arg(long)]
    nats: Option<String>,
    #[arg(long, default_value_t = 20)]
    nodes: u32,
    #[arg(long, default_value_t = 3)]
    workers: u32,
    #[arg(long, default_value_t = 1_000)]
    keys: usize,
    /// Offered requests per second, fleet-wide.
    #[arg(long, default_value_t = 50_000)]
    rate: u64,
    /// Real seconds of traffic.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Fold worker lease, ms.
    #[arg(long, default_value_t = 500)]
    lease_ms: u64,
    /// Drill: SIGKILL the worker holding shard 0 at this second.
    #[arg(long)]
    kill_owner_at: Option<f64>,
    /// Drill: restart this many nodes (new epoch, zero credit, C9), 100 ms apart...
    #[arg(long, default_value_t = 0)]
    restart_nodes: u32,
    /// ...starting at this second (default: half-way).
    #[arg(long)]
    restart_at: Option<f64>,
    /// Drill: stop the nats-server (only one this command started) at this second...
    #[arg(long)]
    bus_down_at: Option<f64>,
    /// ...for this many seconds.
    #[arg(long, default_value_t = 5.0)]
    bus_down_s: f64,
}

#[derive(clap::Args)]
struct SimArgs {
    #[arg(long, value_enum, default_value = "pinned")]
    scenario: Scenario,
    #[arg(long, value_enum, default_value = "leasing")]
    mode: SimMode,
    #[arg(long, default_value_t = 20)]
    nodes: u32,
    #[arg(long, default_value_t = 1_000)]
    keys: u32,
    /// Simulated seconds.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Run this many seeds from --seed and aggregate them.
    #[arg(long, default_value_t = 1)]
    seeds: u64,
    /// Offered requests per second, fleet-wide.
    #[arg(long, default_value_t = 5_000)]
    rate: u64,
    /// Bus message loss, percent.
    #[arg(long = "loss", default_value_t = 0.0)]
    loss_pct: f64,
    /// Bus message duplication, percent.
    #[arg(long = "dup", default_value_t = 0.0)]
    dup_pct: f64,
    /// Bus messages held back past later ones (up to 2 rounds), percent.
    #[arg(long = "reorder", default_value_t = 0.0)]
    reorder_pct: f64,
    /// Largest difference between two nodes' clocks, ms.
    #[arg(long, default_value_t = 0)]
    skew_ms: u64,
    /// The plan's 1 s limit (default: 80% of a key's mean offered rate).
    #[arg(long = "limit-1s")]
    limit_1s: Option<u64>,
    /// The plan's 60 s limit (default: 30 s of a key's mean offered rate).
    #[arg(long = "limit-60s")]
    limit_60s: Option<u64>,
    /// `partition`: when the bus is cut, s (default: 20% into the run).
    #[arg(long)]
    cut_at_s: Option<u64>,
    /// `partition`: how long it stays cut, s (default: 35 s, at most 60% of the run).
    #[arg(long)]
    cut_s: Option<u64>,
    /// F5: how long a node waits before it reports degraded, ms.
    #[arg(long, default_value_t = 30_000)]
    degraded_after_ms: u64,
    /// Skip the codec round-trip check of every envelope (it runs on a second thread;
    /// the tests keep it on).
    #[arg(long)]
    no_codec: bool,
    /// Full invariant checks, and a cross-check of the kept fleet-truth sums against a
    /// walk of every node, every this many rounds (every step's own checks always run).
    #[arg(long, default_value_t = ops::sim::FULL_CHECK_ROUNDS_DEFAULT)]
    full_check_rounds: u64,
    /// Key-windows that begin before this many seconds are not booked (cold start).
    #[arg(long, default_value_t = 1)]
    warmup_s: u64,
    /// Owner: rounds of demand a node may hold ahead (C4; default from the reference config).
    #[arg(long)]
    lead_rounds: Option<u64>,
    /// Owner: headroom over demand, per mille (C4).
    #[arg(long)]
    headroom_permille: Option<u64>,
    /// Owner: Poisson standard deviations of burst allowance per grant (C4).
    #[arg(long)]
    burst_sigmas: Option<u64>,
    /// Lift rules of the design for this run, to measure what they cost (comma-separated;
    /// never a production setting; the report and its replay command name them).
    #[arg(long, value_enum, value_delimiter = ',')]
    what_if: Vec<sim::WhatIf>,
    /// Threads for --seeds.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Print one JSON object instead of a short text summary.
    #[arg(long)]
    json: bool,
    /// Write one CSV row per closed key-window.
    #[arg(long)]
    admissions_out: Option<std::path::PathBuf>,
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Sim(args) => run_sim(args),
        Command::Bench(BenchCommand::Fleet(args)) => bench::fleet(args),
        Command::Bench(BenchCommand::Http(args)) => http_cmd::bench(args),
        Command::Demo(args) => http_cmd::demo(args),
        Command::Upstream(args) => http_cmd::upstream(args),
        Command::BenchPolicy(args) => http_cmd::bench_policy(args),
        Command::KeyId(args) => http_cmd::key_id(args),
        Command::BenchKey { key_seed, index } => {
            println!("{}", ops::http_tools::bench_key(key_seed, index));
            Ok(())
        }
    }
}

mod bench {
    use std::process::{Command, Stdio};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    use anyhow::{Context, Result, bail};
    use ops::fleet::{NatsServer, connect, drive_pinned, start_nodes, system_clock};
    use ops::sim::oracle::{Accuracy, round4};

    use super::FleetArgs;

    use foldgate_harness::KillOnDrop as Worker;

    fn percentile_us(v: &mut [u64], p: f64) -> f64 {
        if v.is_empty() {
            return 0.0;
        }
        v.sort_unstable();
        let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1;
        round4(v[i] as f64 / 1_000.0)
    }

    pub fn fleet(a: FleetArgs) -> Result<()> {
        if a.nodes < 2 || a.workers == 0 || a.keys == 0 || a.seconds == 0 {
            bail!("--nodes >= 2, --workers >= 1, --keys >= 1, --seconds >= 1");
        }
        let worker_bin = std::env::current_exe()?
            .parent()
            .context("the binary's directory")?
            .join("foldgate-fold");
        if !worker_bin.exists() {
            bail!(
                "{} is missing: build it with `cargo build --release -p fold-workers`",
                worker_bin.display()
            );
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        rt.block_on(async move {
            if a.bus_down_at.is_some() && a.nats.is_some() {
                bail!("--bus-down-at needs the server this command starts (no --nats)");
            }
            let mut server = a.nats.is_none().then(NatsServer::start);
            let url = a
                .nats
                .clone()
                .unwrap_or_else(|| server.as_ref().expect("started").url());
            let mut workers: Vec<Option<Worker>> = (0..a.workers)
                .map(|w| {
                    Command::new(&worker_bin)
                        .args(["--nats", &url, "--name", &format!("w{w}")])
                        .args([
                            "--shards",
                            &a.nodes.to_string(),
                            "--fleet",
                            &a.nodes.to_string(),
                        ])
                        .args(["--lease-ms", &a.lease_ms.to_string()])
                        .stdout(Stdio::null())
                        .spawn()
                        .map(|c| Some(Worker(c)))
                })
                .collect::<std::io::Result<_>>()?;
            let js = async_nats::jetstream::new(connect(&url).await);
            let bucket = fold_workers::service::LeaseConfig::reference().bucket;
            let up_by = Instant::now() + Duration::from_secs(15);
            let store = loop {
                if let Ok(s) = js.get_key_value(bucket.clone()).await {
                    let mut all = true;
                    for shard in 0..a.nodes {
                        all &= matches!(
                            s.get(fold_workers::service::lease_key(shard)).await,
                            Ok(Some(_))
                        );
                    }
                    if all {
                        break s;
                    }
                }
                if Instant::now() > up_by {
                    bail!("the fold workers did not take every shard's lease");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            let clock = system_clock();
            let (stop_tx, stop) = tokio::sync::watch::channel(false);
            let nodes = start_nodes(&url, a.nodes, &clock, &stop).await;
            tokio::time::sleep(Duration::from_millis(300)).await;

            // Owner changes: every time a shard's lease holder differs from the last seen.
            let changes = Arc::new(AtomicU64::new(0));
            // When each change was seen, to place lease moves on F7's timeline.
            let change_times = Arc::new(std::sync::Mutex::new(Vec::<Instant>::new()));
            let watcher = {
                let (store, changes, shards) = (store.clone(), Arc::clone(&changes), a.nodes);
                let change_times = Arc::clone(&change_times);
                tokio::spawn(async move {
                    let mut last: Vec<Option<Vec<u8>>> = vec![None; shards as usize];
                    loop {
                        for s in 0..shards {
                            if let Ok(Some(v)) =
                                store.get(fold_workers::service::lease_key(s)).await
                            {
                                let slot = &mut last[s as usize];
                                if slot.as_deref().is_some_and(|old| old != &v[..]) {
                                    changes.fetch_add(1, Ordering::Relaxed);
                                    if let Ok(mut t) = change_times.lock() {
                                        t.push(Instant::now());
                                    }
                                }
                                *slot = Some(v.to_vec());
                            }
                        }
                        tokio::time::sleep(Duration::from_millis(25)).await;
                    }
                })
            };
            // Workers are named w0, w1, ...; the lease holds the name and a process token.
            let victim = match store.get(fold_workers::service::lease_key(0)).await {
                Ok(Some(v)) => fold_workers::service::lease_holder_name(&v)
                    .strip_prefix('w')
                    .and_then(|n| n.parse::<usize>().ok()),
                _ => None,
            };
            if a.kill_owner_at.is_some() && victim.is_none() {
                bail!("--kill-owner-at: no worker named in shard 0's lease");
            }
            let rate_per_key_milli = a.rate * 1_000 / a.keys as u64;
            let windows = ops::fleet::drill_plan_for(rate_per_key_milli);
            let kill_at = a.kill_owner_at.map(Duration::from_secs_f64);
            let bus_down = a.bus_down_at.map(|at| {
                let at = Duration::from_secs_f64(at);
                (at, at + Duration::from_secs_f64(a.bus_down_s))
            });
            let restart_from =
                Duration::from_secs_f64(a.restart_at.unwrap_or(a.seconds as f64 / 2.0));
            let mut restarted = 0u32;
            let mut bus_state = 0u8; // 0 up, 1 down, 2 back
            let (mut back_at, mut recovery_probe_ms) = (None::<Instant>, None::<u64>);
            let mut degraded_max = 0usize;
            // F7's breakdown: when, after the bus came back, each of the probe's three
            // conditions first held; and how often the whole probe held before the outage
            // (steady state), sampled every 50 ms after the first second.
            let mut first_unanimous_ms = None::<u64>;
            let mut first_fresh_ms = None::<u64>;
            let mut first_fresh_25ms = None::<u64>;
            let mut first_reconciled_ms = None::<u64>;
            let (mut steady_samples, mut steady_passes) = (0u64, 0u64);
            let mut steady_passes_25ms = 0u64;
            let mut next_steady_sample = Duration::from_secs(1);
            let started = Instant::now();
            let mut run = drive_pinned(
                &nodes,
                a.keys,
                &windows,
                rate_per_key_milli,
                Duration::from_secs(a.seconds),
                &clock,
                |t| {
                    while restarted < a.restart_nodes.min(a.nodes)
                        && t >= restart_from + Duration::from_millis(100 * u64::from(restarted))
                    {
                        nodes[restarted as usize].restart(bus_schemas::NodeEpoch(2));
                        restarted += 1;
                        if restarted == a.restart_nodes.min(a.nodes) {
                            back_at = Some(Instant::now());
                        }
                    }
                    if kill_at.is_some_and(|k| t >= k)
                        && let Some(i) = victim
                    {
                        drop(workers[i].take());
                    }
                    if let (Some((down, up)), Some(srv)) = (bus_down, server.as_mut()) {
                        if bus_state == 0 && t >= down {
                            srv.stop();
                            bus_state = 1;
                        } else if bus_state == 1 && t >= up {
                            srv.restart();
                            bus_state = 2;
                            back_at = Some(Instant::now());
                        }
                    }
                    // F7: the first moment the probe finds the fleet recovered.
                    if let (Some(back), None) = (back_at, recovery_probe_ms) {
                        let p = ops::fleet::RecoveryProbe::take(&nodes, clock());
                        let since_ms = back.elapsed().as_millis() as u64;
                        if p.shards > 0 && p.shards_confirmed == p.shards {
                            first_unanimous_ms.get_or_insert(since_ms);
                        }
                        if p.max_fold_age_rounds <= 1 {
                            first_fresh_ms.get_or_insert(since_ms);
                        }
                        if p.max_fold_age_ms < 25 {
                            first_fresh_25ms.get_or_insert(since_ms);
                        }
                        if p.key_windows_unreconciled == 0 {
                            first_reconciled_ms.get_or_insert(since_ms);
                        }
                        if p.recovered(25) {
                            recovery_probe_ms = Some(since_ms);
                        }
                    } else if back_at.is_none()
                        && bus_state == 0
                        && kill_at.is_none_or(|k| t < k)
                        && t >= next_steady_sample
                    {
                        next_steady_sample = t + Duration::from_millis(50);
                        steady_samples += 1;
                        let p = ops::fleet::RecoveryProbe::take(&nodes, clock());
                        steady_passes += u64::from(p.recovered(25));
                        steady_passes_25ms += u64::from(p.recovered(25) && p.max_fold_age_ms < 25);
                    }
                    degraded_max =
                        degraded_max.max(nodes.iter().filter(|n| n.surface().degraded()).count());
                },
            )
            .await;
            let elapsed = started.elapsed().as_secs_f64();
            let _ = stop_tx.send(true);
            watcher.abort();
            let mut violations = 0u64;
            let (mut fail_open, mut fast, mut msgs, mut bytes) = (0u64, 0u64, 0u64, 0u64);
            let mut fast_missed = 0u64;
            for n in &nodes {
                violations += u64::from(n.with_limiter(|l| l.check_invariants()).is_err());
                fail_open += n.surface().stats.fail_open.load(Ordering::Relaxed);
                let s = &n.stats;
                fast += s.fast_path_requests.load(Ordering::Relaxed);
                fast_missed += s.fast_path_deadline_missed.load(Ordering::Relaxed);
                bytes += s.bytes_out.load(Ordering::Relaxed) + s.bytes_in.load(Ordering::Relaxed);
                msgs += s.reports_published.load(Ordering::Relaxed)
                    + s.grant_batches.load(Ordering::Relaxed)
                    + 2 * s.fast_path_requests.load(Ordering::Relaxed);
            }
            let closed = run.books.closed(run.started_ms + 1_000, run.ended_ms);
            let all = Accuracy::of(closed.iter());
            let one_s = Accuracy::of(closed.iter().filter(|c| c.window_kind == 1_000));
            let report = serde_json::json!({
                "scenario": "pinned",
                "mode": "leasing",
                "nodes": a.nodes,
                "workers": a.workers,
                "keys": a.keys,
                "sim_seconds": a.seconds,
                "rate": a.rate,
                "offered_rate_per_s": round4(run.offered as f64 / elapsed),
                "offered": run.offered,
                "admitted": run.admitted,
                "fail_open_admitted": fail_open,
                "over_admission_pct_max": all.over_admission_pct_max,
                "over_admission_pct_p99": all.over_admission_pct_p99,
                "under_admission_pct_p99": all.under_admission_pct_p99,
                "under_admission_pct_mean": all.under_admission_pct_mean,
                "under_admission_pct_p99_1s": one_s.under_admission_pct_p99,
                "closed_key_windows": all.closed_key_windows,
                "fast_path_share_pct": round4(fast as f64 * 100.0 / run.offered.max(1) as f64),
                "invariant_violations": violations,
                "recovery_probe_ms": recovery_probe_ms,
                "recovery_breakdown_ms": {
                    "epochs_unanimous": first_unanimous_ms,
                    "fold_age_under_round": first_fresh_ms,
                    "every_contact_under_25_ms": first_fresh_25ms,
                    "reconciled": first_reconciled_ms,
                },
                // Lease moves seen after the bus came back (or the drill's event), ms:
                // first and last (the watcher polls every 25 ms).
                "owner_changes_after_ms": back_at.map(|back| {
                    let t = change_times.lock().map(|t| t.clone()).unwrap_or_default();
                    let after: Vec<u64> = t
                        .iter()
                        .filter(|i| **i >= back)
                        .map(|i| i.duration_since(back).as_millis() as u64)
                        .collect();
                    serde_json::json!({
                        "count": after.len(),
                        "first": after.iter().min(),
                        "last": after.iter().max(),
                    })
                }),
                "probe_steady_pass_pct": (steady_samples > 0)
                    .then(|| round4(steady_passes as f64 * 100.0 / steady_samples as f64)),
                "probe_steady_pass_pct_contact_under_25_ms": (steady_samples > 0)
                    .then(|| round4(steady_passes_25ms as f64 * 100.0 / steady_samples as f64)),
                "restarted_nodes": restarted,
                "wall_ms": (elapsed * 1_000.0) as u64,
                "decision_latency_us_p50": percentile_us(&mut run.decision_ns, 0.50),
                "decision_latency_us_p99": percentile_us(&mut run.decision_ns, 0.99),
                "decision_latency_us_p999": percentile_us(&mut run.decision_ns, 0.999),
                "fast_path_latency_us_p50": percentile_us(&mut run.fast_path_ns, 0.50),
                "fast_path_latency_us_p99": percentile_us(&mut run.fast_path_ns, 0.99),
                "fast_path_latency_us_max": percentile_us(&mut run.fast_path_ns, 1.0),
                "fast_path_requests": fast,
                "fast_path_deadline_misses": fast_missed,
                "bus_msgs_per_s": round4(msgs as f64 / elapsed),
                // Envelope payload bytes seen by the nodes, both directions.
                "bus_bytes_per_s": round4(bytes as f64 / elapsed),
                "degraded_nodes_max": degraded_max,
                "owner_changes": changes.load(Ordering::Relaxed),
            });
            println!("{report}");
            drop(workers);
            drop(server);
            Ok(())
        })
    }
}

fn run_sim(a: SimArgs) -> Result<()> {
    if a.seeds == 0 || a.full_check_rounds == 0 {
        bail!("--seeds and --full-check-rounds must be at least 1");
    }
    let cfg = SimConfig {
        scenario: a.scenario,
        mode: a.mode,
        nodes: a.nodes,
        keys: a.keys,
        seconds: a.seconds,
        seed: a.seed,
        rate: a.rate,
        loss_pct: a.loss_pct,
        dup_pct: a.dup_pct,
        reorder_pct: a.reorder_pct,
        skew_ms: a.skew_ms,
        limit_1s: a.limit_1s,
        limit_60s: a.limit_60s,
        cut_at_s: a.cut_at_s,
        cut_s: a.cut_s,
        codec: !a.no_codec,
        full_check_rounds: a.full_check_rounds,
        degraded_after_ms: a.degraded_after_ms,
        warmup_s: a.warmup_s,
        lead_rounds: a.lead_rounds,
        headroom_permille: a.headroom_permille,
        burst_sigmas: a.burst_sigmas,
        what_if: {
            let mut w = a.what_if.clone();
            w.sort_unstable();
            w.dedup();
            w
        },
    };
    let started = Instant::now();
    let outcomes = sim::run_seeds(&cfg, a.seeds, a.threads)?;
    let wall_ms = started.elapsed().as_millis() as u64;
    for o in &outcomes {
        for v in &o.violations {
            eprintln!("invariant violation: {v}");
        }
    }
    if let Some(path) = &a.admissions_out {
        let file = std::fs::File::create(path).with_context(|| format!("{}", path.display()))?;
        let mut w = std::io::BufWriter::new(file);
        sim::write_admissions_csv(&mut w, &outcomes)?;
        w.flush()?;
    }
    let report = SimReport::build(&cfg, a.seeds, &outcomes, wall_ms);
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "{}{} / {}: {} nodes, {} keys, {} s x {} seed(s): offered {}, admitted {}, over max {}%, under p99 {}%, fast path {}%, violations {}, {} ms",
            if report.what_if.is_empty() {
                String::new()
            } else {
                let lifts: Vec<_> = report.what_if.iter().map(|w| w.name()).collect();
                format!("[what-if: {}] ", lifts.join(", "))
            },
            report.scenario.name(),
            report.mode.name(),
            report.nodes,
            report.keys,
            report.sim_seconds,
            report.seeds,
            report.offered,
            report.admitted,
            report.over_admission_pct_max,
            report.under_admission_pct_p99,
            report.fast_path_share_pct,
            report.invariant_violations,
            report.wall_ms
        );
    }
    if report.invariant_violations > 0 {
        bail!("{} invariant violation(s)", report.invariant_violations);
    }
    Ok(())
}

mod http_cmd {
    use super::*;
    use ops::http_tools::{self, LoadPlan};

    fn runtime() -> Result<tokio::runtime::Runtime> {
        Ok(tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?)
    }

    pub fn bench(a: HttpArgs) -> Result<()> {
        let plan = LoadPlan {
            targets: a
                .target
                .iter()
                .map(|t| t.trim_end_matches('/').to_string())
                .collect(),
            rate: a.rate,
            seconds: a.seconds,
            keys: a.keys,
            key_seed: a.key_seed,
            path: a.path,
            max_in_flight: a.max_in_flight,
            timeout: std::time::Duration::from_millis(a.timeout_ms),
        };
        let n = plan.targets.len() as f64;
        if plan.rate == 0 || plan.rate as f64 * plan.seconds * n > 10_000_000.0 {
            bail!("--rate x --seconds x targets must be 1..=10,000,000 requests");
        }
        for report in runtime()?.block_on(http_tools::run_load(&plan)) {
            println!("{}", serde_json::to_string(&report)?);
        }
        Ok(())
    }

    pub fn demo(a: DemoArgs) -> Result<()> {
        let json = a.json;
        if !json {
            println!(
                "Gateway with embedded defaults (in-process bus and fold owner, no NATS); \
                 one key, plan {} per 1 s and {} per 60 s.",
                a.limit_1s, a.limit_60s
            );
        }
        let steps = runtime()?.block_on(ops::demo::run_demo(a.limit_1s, a.limit_60s, |s| {
            if json {
                return;
            }
            match s.status {
                429 => println!(
                    "request {:>2}: 429  Retry-After: {}  X-RateLimit-Reset-Ms: {}  X-Request-Id: {}\n            body: {}\n            (waiting the time it named)",
                    s.request,
                    s.retry_after.as_deref().unwrap_or("-"),
                    s.reset_ms.as_deref().unwrap_or("-"),
                    s.correlation_id.as_deref().unwrap_or("-"),
                    s.body.as_deref().unwrap_or("")
                ),
                st => println!("request {:>2}: {st}", s.request),
            }
        }))?;
        if json {
            println!("{}", serde_json::to_string(&steps)?);
        }
        Ok(())
    }

    pub fn upstream(a: UpstreamArgs) -> Result<()> {
        runtime()?.block_on(async move {
            let listener = tokio::net::TcpListener::bind(a.listen)
                .await
                .with_context(|| format!("binding {}", a.listen))?;
            eprintln!("foldgate upstream on {}", listener.local_addr()?);
            let (stop_tx, stop) = tokio::sync::watch::channel(false);
            tokio::spawn(async move {
                let _ = tokio::signal::ctrl_c().await;
                let _ = stop_tx.send(true);
            });
            http_tools::run_upstream(listener, a.delay_ms, stop).await;
            Ok(())
        })
    }

    /// The node's hash key, from its file (hex).
    fn hasher_from(a: &HashKeyArgs) -> Result<gateway_node::http::auth::KeyHasher> {
        let hex = std::fs::read_to_string(&a.hash_key_file)
            .with_context(|| format!("reading {}", a.hash_key_file.display()))?;
        Ok(gateway_node::http::auth::KeyHasher::from_hex(
            a.hash_key_version,
            &hex,
        )?)
    }

    pub fn key_id(a: KeyIdArgs) -> Result<()> {
        use std::io::BufRead;
        let hasher = hasher_from(&a.hash_key)?;
        let mut out = std::io::stdout().lock();
        for (n, line) in std::io::stdin().lock().lines().enumerate() {
            // The error names the line, never its text: that is a key.
            let line = line.with_context(|| format!("reading line {} of standard input", n + 1))?;
            if line.trim().is_empty() {
                continue;
            }
            // Taken as the gateway takes it, or refused: an id for a key the gateway
            // would trim differently or refuse would be a dead policy entry.
            let Some(raw) = gateway_node::http::auth::well_formed_key(line.as_bytes()) else {
                bail!(
                    "line {} of standard input is not a well-formed API key (8 to 256 \
                     printable ASCII bytes)",
                    n + 1
                );
            };
            let id = gateway_node::http::auth::KeyIdText(hasher.key_id(raw));
            writeln!(out, "{id}")?;
        }
        Ok(())
    }

    pub fn bench_policy(a: BenchPolicyArgs) -> Result<()> {
        let hasher = hasher_from(&a.hash_key)?;
        print!(
            "{}",
            http_tools::bench_policy_toml(
                &hasher,
                a.key_seed,
                a.keys,
                &[(1_000, a.limit_1s), (60_000, a.limit_60s)]
            )
        );
        Ok(())
    }
}
