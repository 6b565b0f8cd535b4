//! `foldgate bench fleet`: node runtimes in this process and `foldgate-fold` worker
//! processes on a real nats-server, one of the simulator's traffic shapes (`--scenario`,
//! seeded as `foldgate sim` seeds it) in real time, booked against the exact oracle; with
//! optional drills (an owner killed, nodes restarted, the bus stopped) and F7's recovery
//! probe. Prints one JSON object, with the costs also per request (bus messages and bytes,
//! grants, report entries, fast paths, denials the oracle would have admitted) and the
//! fold workers' CPU seconds.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use async_nats::jetstream::kv::Store;
use bus_schemas::WindowSpec;
use fold_workers::service::{LeaseConfig, lease_holder_name, lease_key};
use foldgate_harness::KillOnDrop as Worker;
use foldgate_harness::fleet::{
    Clock, NatsServer, RecoveryProbe, RunBooks, connect, drill_plan_for, drive_pinned, start_nodes,
    system_clock,
};
use foldgate_harness::scenario::{ScenarioPlan, TRAFFIC_SCENARIOS, drive_scenario, key_ids};
use foldgate_sim::Scenario;
use foldgate_sim::oracle::{Accuracy, round4};
use gateway_node::bus::NodeBus;

/// The drill's shape, as `foldgate bench fleet` takes it.
#[derive(Clone, Debug)]
pub struct FleetDrill {
    /// Use this server instead of starting one (it must have JetStream on).
    pub nats: Option<String>,
    pub nodes: u32,
    pub workers: u32,
    pub keys: usize,
    /// Offered requests per second, fleet-wide.
    pub rate: u64,
    /// Real seconds of traffic.
    pub seconds: u64,
    pub lease_ms: u64,
    /// SIGKILL the worker holding shard 0 at this second.
    pub kill_owner_at: Option<f64>,
    /// Restart this many nodes (new epoch, zero credit, C9), 100 ms apart...
    pub restart_nodes: u32,
    /// ...starting at this second (`None`: half-way).
    pub restart_at: Option<f64>,
    /// Stop the nats-server (only one this command started) at this second...
    pub bus_down_at: Option<f64>,
    /// ...for this many seconds.
    pub bus_down_s: f64,
    /// The simulator's traffic shape (one of `TRAFFIC_SCENARIOS`) and its seed; `None`
    /// is the drill's own pinned driver (`drive_pinned`: each key paced on its home nodes),
    /// whose figures BENCHMARKS.md's fleet rows were taken with.
    pub scenario: Option<Scenario>,
    pub seed: u64,
    /// The plan's limits; `None` keeps `drill_plan_for`'s for the offered rate.
    pub limit_1s: Option<u64>,
    pub limit_60s: Option<u64>,
}

impl FleetDrill {
    /// The plan every key is on: `drill_plan_for` the per-key offered rate, with either
    /// limit replaced when given, checked as a node would check it.
    fn windows(&self) -> Result<[WindowSpec; 2]> {
        let rate_per_key_milli = self.rate * 1_000 / self.keys as u64;
        let [mut w1, mut w60] = drill_plan_for(rate_per_key_milli);
        w1.limit = self.limit_1s.unwrap_or(w1.limit);
        w60.limit = self.limit_60s.unwrap_or(w60.limit);
        gateway_node::KeyPolicy::new(&[w1, w60], 25)
            .map_err(|e| anyhow::anyhow!("--limit-1s / --limit-60s: {e:?}"))?;
        Ok([w1, w60])
    }

    fn scenario_plan(&self) -> ScenarioPlan {
        ScenarioPlan {
            scenario: self.scenario.unwrap_or(Scenario::Pinned),
            seed: self.seed,
            keys: self.keys,
            nodes: self.nodes as usize,
            rate: self.rate,
            run: Duration::from_secs(self.seconds),
        }
    }
}

/// Runs the drill and prints its report.
pub fn run(d: FleetDrill) -> Result<()> {
    if d.nodes < 2 || d.workers == 0 || d.keys == 0 || d.seconds == 0 {
        bail!("--nodes >= 2, --workers >= 1, --keys >= 1, --seconds >= 1");
    }
    if let Some(s) = d.scenario.filter(|s| !TRAFFIC_SCENARIOS.contains(s)) {
        bail!("--scenario {} is not a traffic shape", s.name());
    }
    let windows = d.windows()?;
    let worker_bin = worker_binary()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(drill(d, windows, worker_bin))
}

/// `foldgate-fold`, expected beside this binary.
fn worker_binary() -> Result<PathBuf> {
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
    Ok(worker_bin)
}

async fn drill(d: FleetDrill, windows: [WindowSpec; 2], worker_bin: PathBuf) -> Result<()> {
    if d.bus_down_at.is_some() && d.nats.is_some() {
        bail!("--bus-down-at needs the server this command starts (no --nats)");
    }
    let mut server = d.nats.is_none().then(NatsServer::start);
    let url = d
        .nats
        .clone()
        .unwrap_or_else(|| server.as_ref().expect("started").url());
    let mut workers = spawn_workers(&worker_bin, &url, &d)?;
    let store = wait_for_leases(&url, d.nodes).await?;
    let clock = system_clock();
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let nodes = Arc::new(start_nodes(&url, d.nodes, &clock, &stop).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let leases = LeaseWatch::start(store.clone(), d.nodes);
    let victim = shard0_holder(&store).await;
    if d.kill_owner_at.is_some() && victim.is_none() {
        bail!("--kill-owner-at: no worker named in shard 0's lease");
    }
    let timeline = Timeline::of(&d, victim);
    let mut seen = Observed::default();
    let cpu_from = worker_cpu_ticks(&workers);
    let started = Instant::now();
    let steady = SteadyProbes::start(
        Arc::clone(&nodes),
        Arc::clone(&clock),
        SteadySample::of(d.keys, &windows),
        started,
    );
    let at = |t| {
        let mut fleet = Fleet {
            nodes: &nodes,
            clock: &clock,
            workers: &mut workers,
            server: server.as_mut(),
        };
        seen.at(&timeline, t, &mut fleet);
        if seen.faulted(&timeline, t) {
            steady.stop();
        }
    };
    let mut run = match d.scenario {
        Some(_) => drive_scenario(&nodes, &windows, &d.scenario_plan(), &clock, at).await,
        None => {
            let rate_per_key_milli = d.rate * 1_000 / d.keys as u64;
            let run_for = Duration::from_secs(d.seconds);
            drive_pinned(
                &nodes,
                d.keys,
                &windows,
                rate_per_key_milli,
                run_for,
                &clock,
                at,
            )
            .await
        }
    };
    let elapsed = started.elapsed().as_secs_f64();
    seen.steady = steady.finish();
    let _ = stop_tx.send(true);
    leases.task.abort();
    let mut totals = NodeTotals::of(&nodes);
    totals.add_restarted(&seen);
    totals.fold_worker_cpu_s = fold_worker_cpu_s(&cpu_from, &workers, &seen.killed_cpu_ticks);
    let mut out = report(&d, &mut run, &seen, &totals, &leases, elapsed);
    add_plan_and_per_request(&mut out, &d, &windows, &run, &totals);
    println!("{out}");
    drop(workers);
    drop(server);
    Ok(())
}

/// Workers named w0, w1, ..., each competing for every shard's lease.
fn spawn_workers(worker_bin: &Path, url: &str, d: &FleetDrill) -> Result<Vec<Option<Worker>>> {
    let workers = (0..d.workers)
        .map(|w| {
            Command::new(worker_bin)
                .args(["--nats", url, "--name", &format!("w{w}")])
                .args([
                    "--shards",
                    &d.nodes.to_string(),
                    "--fleet",
                    &d.nodes.to_string(),
                ])
                .args(["--lease-ms", &d.lease_ms.to_string()])
                .stdout(Stdio::null())
                .spawn()
                .map(|c| Some(Worker(c)))
        })
        .collect::<std::io::Result<_>>()?;
    Ok(workers)
}

/// The lease bucket, once every shard's lease is held (15 s at most).
async fn wait_for_leases(url: &str, shards: u32) -> Result<Store> {
    let js = async_nats::jetstream::new(connect(url).await);
    let bucket = LeaseConfig::reference().bucket;
    let up_by = Instant::now() + Duration::from_secs(15);
    loop {
        if let Ok(s) = js.get_key_value(bucket.clone()).await {
            let mut all = true;
            for shard in 0..shards {
                all &= matches!(s.get(lease_key(shard)).await, Ok(Some(_)));
            }
            if all {
                return Ok(s);
            }
        }
        if Instant::now() > up_by {
            bail!("the fold workers did not take every shard's lease");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The index of the worker holding shard 0's lease: the lease holds the worker's name
/// (`w<index>`) and a process token.
async fn shard0_holder(store: &Store) -> Option<usize> {
    match store.get(lease_key(0)).await {
        Ok(Some(v)) => lease_holder_name(&v)
            .strip_prefix('w')
            .and_then(|n| n.parse::<usize>().ok()),
        _ => None,
    }
}

/// Owner changes: every time a shard's lease holder differs from the last one seen,
/// polled every 25 ms.
struct LeaseWatch {
    changes: Arc<AtomicU64>,
    /// When each change was seen, to place lease moves on F7's timeline.
    change_times: Arc<Mutex<Vec<Instant>>>,
    task: tokio::task::JoinHandle<()>,
}

impl LeaseWatch {
    fn start(store: Store, shards: u32) -> Self {
        let changes = Arc::new(AtomicU64::new(0));
        let change_times = Arc::new(Mutex::new(Vec::<Instant>::new()));
        let task = {
            let (changes, change_times) = (Arc::clone(&changes), Arc::clone(&change_times));
            tokio::spawn(async move {
                let mut last: Vec<Option<Vec<u8>>> = vec![None; shards as usize];
                loop {
                    for s in 0..shards {
                        if let Ok(Some(v)) = store.get(lease_key(s)).await {
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
        Self {
            changes,
            change_times,
            task,
        }
    }

    /// Lease moves seen at or after `back`, ms from it: how many, the first and the last.
    fn moves_after(&self, back: Instant) -> serde_json::Value {
        let t = self
            .change_times
            .lock()
            .map(|t| t.clone())
            .unwrap_or_default();
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
    }
}

/// When the drill's events are due, in time since traffic began.
struct Timeline {
    /// How many nodes restart (at most the fleet), 100 ms apart from `restart_from`.
    restarts: u32,
    restart_from: Duration,
    kill_at: Option<Duration>,
    victim: Option<usize>,
    /// The bus goes down at the first and comes back at the second.
    bus_down: Option<(Duration, Duration)>,
}

impl Timeline {
    fn of(d: &FleetDrill, victim: Option<usize>) -> Self {
        Self {
            restarts: d.restart_nodes.min(d.nodes),
            restart_from: Duration::from_secs_f64(d.restart_at.unwrap_or(d.seconds as f64 / 2.0)),
            kill_at: d.kill_owner_at.map(Duration::from_secs_f64),
            victim,
            bus_down: d.bus_down_at.map(|at| {
                let at = Duration::from_secs_f64(at);
                (at, at + Duration::from_secs_f64(d.bus_down_s))
            }),
        }
    }
}

/// What the drill acts on while traffic runs.
struct Fleet<'a> {
    nodes: &'a [NodeBus],
    clock: &'a Clock,
    workers: &'a mut [Option<Worker>],
    server: Option<&'a mut NatsServer>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum BusState {
    #[default]
    Up,
    Down,
    Back,
}

/// Fleets of up to this many keys are probed whole in steady state, as the recovery probe
/// always is: every node's every key-window.
const STEADY_PROBE_ALL_KEYS_UP_TO: usize = 2_000;

/// Past that, each steady-state sample checks reconciliation on this many keys, the next
/// slice of the key list each time (fold ages and owner epochs are checked in full).
/// Walking every key-window of 20 nodes (10^6 at 10^5 keys) under their limiter locks
/// every 50 ms took most of the driver's thread, so the bench measured its own probe.
const STEADY_PROBE_KEYS: usize = 64;

/// The keys a steady-state sample checks: all (`None`), or the next slice of `ids`.
#[derive(Default)]
struct SteadySample {
    keys: Option<Vec<bus_schemas::KeyId>>,
    lengths: Vec<u32>,
    next: usize,
}

impl SteadySample {
    fn of(keys: usize, windows: &[WindowSpec]) -> Self {
        Self {
            keys: (keys > STEADY_PROBE_ALL_KEYS_UP_TO).then(|| key_ids(keys)),
            lengths: windows.iter().map(|w| w.length_ms).collect(),
            next: 0,
        }
    }

    /// The probe now: whole, or over the next `STEADY_PROBE_KEYS` keys.
    fn take(&mut self, nodes: &[NodeBus], now: bus_schemas::Now) -> RecoveryProbe {
        let Some(ids) = &self.keys else {
            return RecoveryProbe::take(nodes, now);
        };
        let from = self.next;
        let to = (from + STEADY_PROBE_KEYS).min(ids.len());
        self.next = if to == ids.len() { 0 } else { to };
        RecoveryProbe::take_keys(nodes, now, &ids[from..to], &self.lengths)
    }

    /// Keys per sample, for the report: `None` when every key is.
    fn keys_per_sample(&self) -> Option<usize> {
        self.keys.as_ref().map(|_| STEADY_PROBE_KEYS)
    }
}

/// What the drill did and saw, as traffic runs.
///
/// F7's breakdown: when, after the bus came back (or the last node restarted), each of the
/// probe's conditions first held; and how often the whole probe held before any fault
/// (steady state), sampled every 50 ms after the first second (`SteadyProbes`).
#[derive(Default)]
struct Observed {
    restarted: u32,
    bus: BusState,
    back_at: Option<Instant>,
    recovery_probe_ms: Option<u64>,
    degraded_max: usize,
    first_unanimous_ms: Option<u64>,
    first_fresh_ms: Option<u64>,
    first_fresh_25ms: Option<u64>,
    first_reconciled_ms: Option<u64>,
    steady: SteadyCounts,
    /// The killed worker's CPU ticks just before the kill, as (worker index, ticks): its
    /// `/proc` entry is gone by the end of the run.
    killed_cpu_ticks: Vec<(usize, u64)>,
    /// Limiter counters of restarted nodes' old epochs, which a restart replaces:
    /// (grants applied, report entries sent).
    restarted_stats: (u64, u64),
}

impl Observed {
    /// Called every millisecond of traffic with the time since it began.
    fn at(&mut self, timeline: &Timeline, t: Duration, fleet: &mut Fleet<'_>) {
        self.restart_due(timeline, t, fleet.nodes);
        if timeline.kill_at.is_some_and(|k| t >= k)
            && let Some(i) = timeline.victim
        {
            if let Some(ticks) = fleet.workers[i].as_ref().and_then(|w| cpu_ticks(w.0.id())) {
                self.killed_cpu_ticks.push((i, ticks));
            }
            drop(fleet.workers[i].take());
        }
        if let (Some(window), Some(srv)) = (timeline.bus_down, fleet.server.as_deref_mut()) {
            self.bus_due(window, t, srv);
        }
        if let (Some(back), None) = (self.back_at, self.recovery_probe_ms) {
            self.probe_recovery(back, fleet);
        }
        let degraded = fleet
            .nodes
            .iter()
            .filter(|n| n.surface().degraded())
            .count();
        self.degraded_max = self.degraded_max.max(degraded);
    }

    /// A fault has begun (a restart, the bus down, the owner killed): steady state is over.
    fn faulted(&self, timeline: &Timeline, t: Duration) -> bool {
        self.back_at.is_some()
            || self.bus != BusState::Up
            || timeline.kill_at.is_some_and(|k| t >= k)
    }

    fn restart_due(&mut self, timeline: &Timeline, t: Duration, nodes: &[NodeBus]) {
        while self.restarted < timeline.restarts
            && t >= timeline.restart_from + Duration::from_millis(100 * u64::from(self.restarted))
        {
            let node = &nodes[self.restarted as usize];
            let old = node.with_limiter(|l| {
                let s = l.stats();
                (s.grants_applied, s.report_entries_sent)
            });
            self.restarted_stats.0 += old.0;
            self.restarted_stats.1 += old.1;
            node.restart(bus_schemas::NodeEpoch(2));
            self.restarted += 1;
            if self.restarted == timeline.restarts {
                self.back_at = Some(Instant::now());
            }
        }
    }

    fn bus_due(&mut self, (down, up): (Duration, Duration), t: Duration, srv: &mut NatsServer) {
        if self.bus == BusState::Up && t >= down {
            srv.stop();
            self.bus = BusState::Down;
        } else if self.bus == BusState::Down && t >= up {
            srv.restart();
            self.bus = BusState::Back;
            self.back_at = Some(Instant::now());
        }
    }

    /// F7: the first moment the probe finds the fleet recovered, and when each of its
    /// conditions first held on the way.
    fn probe_recovery(&mut self, back: Instant, fleet: &Fleet<'_>) {
        let p = RecoveryProbe::take(fleet.nodes, (fleet.clock)());
        let since_ms = back.elapsed().as_millis() as u64;
        if p.shards > 0 && p.shards_confirmed == p.shards {
            self.first_unanimous_ms.get_or_insert(since_ms);
        }
        if p.max_fold_age_rounds <= 1 {
            self.first_fresh_ms.get_or_insert(since_ms);
        }
        if p.max_fold_age_ms < 25 {
            self.first_fresh_25ms.get_or_insert(since_ms);
        }
        if p.key_windows_unreconciled == 0 {
            self.first_reconciled_ms.get_or_insert(since_ms);
        }
        if p.recovered(25) {
            self.recovery_probe_ms = Some(since_ms);
        }
    }
}

/// The steady-state probe's tally.
#[derive(Clone, Copy, Debug, Default)]
struct SteadyCounts {
    samples: u64,
    passes: u64,
    passes_25ms: u64,
    /// Keys per sample (`SteadySample::keys_per_sample`).
    keys_per_sample: Option<usize>,
}

impl SteadyCounts {
    /// The share of samples that passed, percent; none without samples.
    fn pct(&self, passes: u64) -> Option<f64> {
        (self.samples > 0).then(|| round4(passes as f64 * 100.0 / self.samples as f64))
    }
}

/// F7's steady-state samples, taken on a thread of their own every 50 ms from the first
/// second of traffic until a fault begins or the run ends. The probe takes each node's
/// limiter lock, which a round's tick holds for its whole pass: on the driver's thread it
/// stalled every request in flight until it was done.
struct SteadyProbes {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<SteadyCounts>>,
}

impl SteadyProbes {
    fn start(
        nodes: Arc<Vec<NodeBus>>,
        clock: Clock,
        mut sample: SteadySample,
        started: Instant,
    ) -> Self {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("steady-probe".into())
            .spawn(move || {
                let mut counts = SteadyCounts {
                    keys_per_sample: sample.keys_per_sample(),
                    ..SteadyCounts::default()
                };
                let mut next = started + Duration::from_secs(1);
                loop {
                    std::thread::sleep(next.saturating_duration_since(Instant::now()));
                    if stopped.load(Ordering::Relaxed) {
                        return counts;
                    }
                    let p = sample.take(&nodes, clock());
                    // A fault that began during the sample voids it.
                    if stopped.load(Ordering::Relaxed) {
                        return counts;
                    }
                    counts.samples += 1;
                    counts.passes += u64::from(p.recovered(25));
                    counts.passes_25ms += u64::from(p.recovered(25) && p.max_fold_age_ms < 25);
                    next = (next + Duration::from_millis(50)).max(Instant::now());
                }
            })
            .expect("spawn the steady-state probe");
        Self {
            stop,
            thread: Some(thread),
        }
    }

    fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    fn finish(mut self) -> SteadyCounts {
        self.stop();
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

/// The nodes' own counters at the end of the run, summed over the fleet.
#[derive(Default)]
struct NodeTotals {
    /// Nodes whose invariant check fails.
    violations: u64,
    fail_open: u64,
    fast: u64,
    fast_missed: u64,
    /// Bus messages: reports, grant batches, and fast paths both ways.
    msgs: u64,
    /// Envelope payload bytes seen by the nodes, both directions.
    bytes: u64,
    /// Grants the nodes applied from the owners' grant batches (`NodeStats::grants_applied`;
    /// fast-path grants are counted by `fast`), and report entries they sent (C1).
    grants: u64,
    report_entries: u64,
    /// User + system CPU seconds of the `foldgate-fold` workers over the traffic.
    fold_worker_cpu_s: f64,
}

impl NodeTotals {
    fn of(nodes: &[NodeBus]) -> Self {
        let mut t = Self::default();
        for n in nodes {
            t.violations += u64::from(n.with_limiter(|l| l.check_invariants()).is_err());
            t.fail_open += n.surface().stats.fail_open.load(Ordering::Relaxed);
            n.with_limiter(|l| {
                t.grants += l.stats().grants_applied;
                t.report_entries += l.stats().report_entries_sent;
            });
            let s = &n.stats;
            t.fast += s.fast_path_requests.load(Ordering::Relaxed);
            t.fast_missed += s.fast_path_deadline_missed.load(Ordering::Relaxed);
            t.bytes += s.bytes_out.load(Ordering::Relaxed) + s.bytes_in.load(Ordering::Relaxed);
            t.msgs += s.reports_published.load(Ordering::Relaxed)
                + s.grant_batches.load(Ordering::Relaxed)
                + 2 * s.fast_path_requests.load(Ordering::Relaxed);
        }
        t
    }

    /// Adds what restarted nodes counted before their restart.
    fn add_restarted(&mut self, seen: &Observed) {
        self.grants += seen.restarted_stats.0;
        self.report_entries += seen.restarted_stats.1;
    }
}

/// Clock ticks per second for `/proc/<pid>/stat`: `getconf CLK_TCK` (this crate has no
/// libc binding for `sysconf(_SC_CLK_TCK)`), else 100, Linux's value on every mainstream
/// architecture.
fn clock_ticks_per_s() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .filter(|&t| t > 0)
        .unwrap_or(100)
}

/// A process's user + system CPU ticks: fields 14 and 15 of `/proc/<pid>/stat`. Fields
/// are counted after the command name's closing parenthesis, since the name may hold
/// spaces; the state (field 3) is the first one after it.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    cpu_ticks_of(&stat)
}

fn cpu_ticks_of(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(14 - 3);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some(user + system)
}

/// Every worker's CPU ticks now (0 for one gone or unreadable), by worker index.
fn worker_cpu_ticks(workers: &[Option<Worker>]) -> Vec<u64> {
    workers
        .iter()
        .map(|w| w.as_ref().and_then(|w| cpu_ticks(w.0.id())).unwrap_or(0))
        .collect()
}

/// The workers' CPU seconds since `from`: a killed worker's as read just before its kill.
fn fold_worker_cpu_s(from: &[u64], workers: &[Option<Worker>], killed: &[(usize, u64)]) -> f64 {
    let mut to = worker_cpu_ticks(workers);
    for &(i, ticks) in killed {
        to[i] = ticks;
    }
    let ticks: u64 = to.iter().zip(from).map(|(t, f)| t.saturating_sub(*f)).sum();
    round4(ticks as f64 / clock_ticks_per_s() as f64)
}

/// `count` per offered request, six decimals (a fast path per ten thousand requests
/// still shows); 0 without requests.
fn per_request(count: u64, offered: u64) -> f64 {
    if offered == 0 {
        return 0.0;
    }
    (count as f64 / offered as f64 * 1e6).round() / 1e6
}

/// The report's added fields: the seed and plan, and each cost per offered request. They
/// cover the whole run, cold start included, as the other totals do.
fn add_plan_and_per_request(
    out: &mut serde_json::Value,
    d: &FleetDrill,
    windows: &[WindowSpec; 2],
    run: &RunBooks,
    totals: &NodeTotals,
) {
    let n = run.offered;
    let added = serde_json::json!({
        "seed": d.seed,
        "limit_1s": windows[0].limit,
        "limit_60s": windows[1].limit,
        "fast_path_per_request": per_request(totals.fast, n),
        "denied_under_limit": run.denied_under_limit,
        "denied_under_limit_pct": round4(run.denied_under_limit as f64 * 100.0 / n.max(1) as f64),
        "deadline_misses_per_request": per_request(totals.fast_missed, n),
        "bus_msgs_per_request": per_request(totals.msgs, n),
        "bus_bytes_per_request": per_request(totals.bytes, n),
        "grants_per_request": per_request(totals.grants, n),
        "report_entries_per_request": per_request(totals.report_entries, n),
        "fold_worker_cpu_s": totals.fold_worker_cpu_s,
    });
    if let (Some(out), serde_json::Value::Object(added)) = (out.as_object_mut(), added) {
        out.extend(added);
    }
}

/// The `p` quantile of `v`, ns in, µs out.
fn percentile_us(v: &mut [u64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_unstable();
    let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1;
    round4(v[i] as f64 / 1_000.0)
}

/// The report, one JSON object; its fields are the interface the benchmark notes read.
fn report(
    d: &FleetDrill,
    run: &mut RunBooks,
    seen: &Observed,
    totals: &NodeTotals,
    leases: &LeaseWatch,
    elapsed: f64,
) -> serde_json::Value {
    let closed = run.books.closed(run.started_ms + 1_000, run.ended_ms);
    let all = Accuracy::of(closed.iter());
    let one_s = Accuracy::of(closed.iter().filter(|c| c.window_kind == 1_000));
    serde_json::json!({
        "scenario": d.scenario.unwrap_or(Scenario::Pinned).name(),
        "mode": "leasing",
        "nodes": d.nodes,
        "workers": d.workers,
        "keys": d.keys,
        "sim_seconds": d.seconds,
        "rate": d.rate,
        "offered_rate_per_s": round4(run.offered as f64 / elapsed),
        // Requests sent per second of traffic (`--seconds`), and that as a share of
        // `--rate`: below 100% the driver, not the limiter, set the load.
        "offered_rate_achieved": round4(run.offered as f64 / d.seconds as f64),
        "offered_rate_achieved_pct": round4(
            run.offered as f64 * 100.0 / (d.rate * d.seconds).max(1) as f64
        ),
        "offered": run.offered,
        "admitted": run.admitted,
        "fail_open_admitted": totals.fail_open,
        "over_admission_pct_max": all.over_admission_pct_max,
        "over_admission_pct_p99": all.over_admission_pct_p99,
        "under_admission_pct_p99": all.under_admission_pct_p99,
        "under_admission_pct_mean": all.under_admission_pct_mean,
        "under_admission_pct_p99_1s": one_s.under_admission_pct_p99,
        "closed_key_windows": all.closed_key_windows,
        "fast_path_share_pct": round4(totals.fast as f64 * 100.0 / run.offered.max(1) as f64),
        "invariant_violations": totals.violations,
        "recovery_probe_ms": seen.recovery_probe_ms,
        "recovery_breakdown_ms": {
            "epochs_unanimous": seen.first_unanimous_ms,
            "fold_age_under_round": seen.first_fresh_ms,
            "every_contact_under_25_ms": seen.first_fresh_25ms,
            "reconciled": seen.first_reconciled_ms,
        },
        // Lease moves seen after the bus came back (or the drill's event), ms: first and
        // last (the watcher polls every 25 ms).
        "owner_changes_after_ms": seen.back_at.map(|back| leases.moves_after(back)),
        "probe_steady_pass_pct": seen.steady.pct(seen.steady.passes),
        "probe_steady_pass_pct_contact_under_25_ms": seen.steady.pct(seen.steady.passes_25ms),
        // Keys whose key-windows each steady-state sample reconciled; null: all of them.
        "probe_steady_keys_per_sample": seen.steady.keys_per_sample,
        "restarted_nodes": seen.restarted,
        "wall_ms": (elapsed * 1_000.0) as u64,
        "decision_latency_us_p50": percentile_us(&mut run.decision_ns, 0.50),
        "decision_latency_us_p99": percentile_us(&mut run.decision_ns, 0.99),
        "decision_latency_us_p999": percentile_us(&mut run.decision_ns, 0.999),
        "fast_path_latency_us_p50": percentile_us(&mut run.fast_path_ns, 0.50),
        "fast_path_latency_us_p99": percentile_us(&mut run.fast_path_ns, 0.99),
        "fast_path_latency_us_max": percentile_us(&mut run.fast_path_ns, 1.0),
        "fast_path_requests": totals.fast,
        "fast_path_deadline_misses": totals.fast_missed,
        "bus_msgs_per_s": round4(totals.msgs as f64 / elapsed),
        "bus_bytes_per_s": round4(totals.bytes as f64 / elapsed),
        "degraded_nodes_max": seen.degraded_max,
        "owner_changes": leases.changes.load(Ordering::Relaxed),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_request_divides_and_rounds() {
        assert_eq!(per_request(0, 0), 0.0);
        assert_eq!(per_request(5, 0), 0.0);
        assert_eq!(per_request(1, 4), 0.25);
        assert_eq!(per_request(3, 10_000), 0.0003);
        assert_eq!(per_request(2, 3), 0.666667);
        assert_eq!(per_request(1_500, 1_000), 1.5);
    }

    #[test]
    fn cpu_ticks_read_fields_14_and_15() {
        // Fields 14 (utime) = 7 and 15 (stime) = 5; the name holds a space and a ')'.
        let stat = "42 (fold (w0) x) S 1 42 42 0 -1 4194560 100 0 0 0 7 5 0 0 20 0 3 0";
        assert_eq!(cpu_ticks_of(stat), Some(12));
        assert_eq!(cpu_ticks_of("42 (short) S 1"), None);
        assert!(
            cpu_ticks(std::process::id()).is_some(),
            "this process's own stat"
        );
        assert!(clock_ticks_per_s() > 0);
    }

    fn drill() -> FleetDrill {
        FleetDrill {
            nats: None,
            nodes: 3,
            workers: 1,
            keys: 100,
            rate: 5_000,
            seconds: 1,
            lease_ms: 500,
            kill_owner_at: None,
            restart_nodes: 0,
            restart_at: None,
            bus_down_at: None,
            bus_down_s: 5.0,
            scenario: Some(Scenario::Uniform),
            seed: 1,
            limit_1s: None,
            limit_60s: None,
        }
    }

    #[test]
    fn limits_default_to_the_drill_plan_and_override_one_by_one() {
        let d = drill();
        let base = drill_plan_for(50_000);
        assert_eq!(d.windows().unwrap(), base);
        let w = FleetDrill {
            limit_1s: Some(10),
            ..drill()
        }
        .windows()
        .unwrap();
        assert_eq!((w[0].limit, w[1].limit), (10, base[1].limit));
        let w = FleetDrill {
            limit_1s: Some(10),
            limit_60s: Some(200),
            ..drill()
        }
        .windows()
        .unwrap();
        assert_eq!((w[0].limit, w[1].limit), (10, 200));
    }

    #[test]
    fn added_fields_sit_beside_the_old_ones() {
        let d = drill();
        let windows = d.windows().unwrap();
        let run = RunBooks {
            offered: 1_000,
            admitted: 900,
            denied_under_limit: 25,
            decision_ns: Vec::new(),
            fast_path_ns: Vec::new(),
            books: foldgate_sim::oracle::Books::new(Vec::new(), windows.to_vec()),
            started_ms: 0,
            ended_ms: 0,
        };
        let totals = NodeTotals {
            fast: 10,
            fast_missed: 1,
            msgs: 2_000,
            bytes: 64_000,
            grants: 300,
            report_entries: 400,
            fold_worker_cpu_s: 0.5,
            ..NodeTotals::default()
        };
        let mut out = serde_json::json!({ "offered": 1_000 });
        add_plan_and_per_request(&mut out, &d, &windows, &run, &totals);
        assert_eq!(out["offered"], 1_000);
        assert_eq!(out["fast_path_per_request"], 0.01);
        assert_eq!(out["denied_under_limit"], 25);
        assert_eq!(out["denied_under_limit_pct"], 2.5);
        assert_eq!(out["deadline_misses_per_request"], 0.001);
        assert_eq!(out["bus_msgs_per_request"], 2.0);
        assert_eq!(out["bus_bytes_per_request"], 64.0);
        assert_eq!(out["grants_per_request"], 0.3);
        assert_eq!(out["report_entries_per_request"], 0.4);
        assert_eq!(out["fold_worker_cpu_s"], 0.5);
        assert_eq!(out["limit_1s"], windows[0].limit);
    }
}
