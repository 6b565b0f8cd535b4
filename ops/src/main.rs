//! `foldgate`: the operator CLI. This file is its arguments; each command runs a function
//! of the `ops` library. `foldgate demo` is the README's main job (the gateway on its
//! embedded defaults) and `foldgate sim` the simulator: neither needs anything installed.

use anyhow::Result;
use clap::{Parser, Subcommand};
use ops::bench_fleet::FleetDrill;
use ops::http_tools::LoadPlan;
use ops::sim::{self, Scenario, SimConfig, SimMode};
use ops::sim_cmd::SimRun;

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
    /// Throttling history from a limit-event archive (E4): the events, or with --top the
    /// keys with most; --sql runs SQL over tables `events` and `rollup` in
    /// `foldgate-history`.
    History(HistoryArgs),
    /// The archive's upkeep (E3): compact closed days, roll up days past the retention,
    /// or write a synthetic day for the benchmark.
    #[command(subcommand)]
    Archive(ArchiveCommand),
    /// The hash-key keyring (P3): add, list or destroy versioned HMAC keys; every add and
    /// destroy is audited in the archive.
    #[command(subcommand)]
    HashKey(HashKeyCommand),
    /// Export a subject's events (raw and roll-up) under every retained hash version.
    SubjectAccess(SubjectAccessArgs),
    /// Erase a subject's rows from every archive file (raw and roll-up), block their
    /// return from Kafka, and append an audit record (E5).
    Erase(EraseArgs),
    /// The archive's audit trail.
    #[command(subcommand)]
    Audit(AuditCommand),
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
    /// Keep the node's limit-event archive here (default: a new temporary folder, named
    /// at the end).
    #[arg(long)]
    archive: Option<std::path::PathBuf>,
}

#[derive(clap::Args)]
struct HistoryArgs {
    /// The archive's root (`events/`, `rollup/` under it).
    #[arg(long)]
    archive: std::path::PathBuf,
    /// SQL over tables `events` and `rollup`, run by `foldgate-history`.
    #[arg(long)]
    sql: Option<String>,
    /// Raw API keys, one a line, from this file or `-` for standard input (never the
    /// command line): only their events. Hashed under every retained version of
    /// --keyring, every key of --node-config, or --hash-key-file.
    #[arg(long)]
    keys_from: Option<std::path::PathBuf>,
    /// The hash-key keyring (`foldgate hash-key`): every retained version.
    #[arg(long)]
    keyring: Option<std::path::PathBuf>,
    /// The node's TOML: its hash key and `other_hash_keys` (every retained version).
    #[arg(long)]
    node_config: Option<std::path::PathBuf>,
    /// A hash key file (hex), instead of --node-config.
    #[arg(long)]
    hash_key_file: Option<std::path::PathBuf>,
    #[arg(long, default_value_t = 1)]
    hash_key_version: u8,
    /// From this time: YYYY-MM-DD (UTC midnight) or RFC 3339.
    #[arg(long)]
    since: Option<String>,
    /// Up to (not including) this time.
    #[arg(long)]
    until: Option<String>,
    /// The N keys with the most events, instead of the events.
    #[arg(long)]
    top: Option<usize>,
    /// table, csv or json (one object a line).
    #[arg(long, default_value = "table")]
    format: ops::history::Format,
}

#[derive(Subcommand)]
enum ArchiveCommand {
    /// Merge each closed day's files (before today UTC) into one file sorted by key id.
    Compact {
        #[arg(long)]
        archive: std::path::PathBuf,
        /// Only this day (YYYY-MM-DD); default: every closed day not compacted yet.
        #[arg(long)]
        day: Option<String>,
    },
    /// Roll days older than the retention up into `rollup/` and remove their raw files.
    Retain {
        #[arg(long)]
        archive: std::path::PathBuf,
        #[arg(long, default_value_t = foldgate_archive::retain::RETENTION_DAYS_DEFAULT)]
        retention_days: u32,
    },
    /// Write a synthetic day of limit events (the benchmark's; 500/s all day = 43.2 M)
    /// for seeded bench keys hashed under the keyring's newest version.
    SynthDay {
        #[arg(long)]
        archive: std::path::PathBuf,
        #[arg(long)]
        keyring: std::path::PathBuf,
        /// YYYY-MM-DD (a closed day, so it can be compacted).
        #[arg(long)]
        day: String,
        #[arg(long, default_value_t = 43_200_000)]
        events: u64,
        #[arg(long, default_value_t = 100_000)]
        keys: u64,
        #[arg(long, default_value_t = 1)]
        key_seed: u64,
        #[arg(long, default_value_t = 20)]
        nodes: u32,
        /// Events per raw file.
        #[arg(long, default_value_t = 500_000)]
        file_events: u64,
    },
}

/// Who does it and why: every keyring change is audited.
#[derive(clap::Args)]
struct Audited {
    /// The keyring file (TOML, mode 0600, outside the archive).
    #[arg(long)]
    keyring: std::path::PathBuf,
    /// The archive whose audit trail records the change.
    #[arg(long)]
    archive: std::path::PathBuf,
    #[arg(long)]
    principal: String,
    #[arg(long)]
    reason: String,
}

#[derive(Subcommand)]
enum HashKeyCommand {
    /// Add a version: 32 random bytes, or --import the node's current hash key file.
    Add {
        #[command(flatten)]
        who: Audited,
        /// A hash key file (hex) to bring into the keyring, e.g. the node's hash_key_file.
        #[arg(long)]
        import: Option<std::path::PathBuf>,
    },
    /// Versions and dates (never key bytes).
    List {
        #[arg(long)]
        keyring: std::path::PathBuf,
    },
    /// Destroy a version's secret; refused while the archive holds events under it.
    Destroy {
        version: u8,
        #[command(flatten)]
        who: Audited,
        #[arg(long, default_value_t = foldgate_archive::retain::RETENTION_DAYS_DEFAULT)]
        retention_days: u32,
    },
}

#[derive(clap::Args)]
struct SubjectAccessArgs {
    #[arg(long)]
    archive: std::path::PathBuf,
    #[arg(long)]
    keyring: std::path::PathBuf,
    /// Raw API keys, one a line, from this file or `-` for standard input (never argv).
    #[arg(long)]
    keys_from: std::path::PathBuf,
    /// The export (written with mode 0600).
    #[arg(long)]
    out: std::path::PathBuf,
    /// json (one object a line) or csv.
    #[arg(long, default_value = "json")]
    format: ops::history::Format,
}

#[derive(clap::Args)]
struct EraseArgs {
    #[arg(long)]
    archive: std::path::PathBuf,
    #[arg(long)]
    keyring: std::path::PathBuf,
    /// Raw API keys, one a line, from this file or `-` for standard input (never argv).
    #[arg(long)]
    keys_from: std::path::PathBuf,
    #[arg(long)]
    principal: String,
    #[arg(long)]
    reason: String,
}

#[derive(Subcommand)]
enum AuditCommand {
    /// Check the whole hash chain; exits non-zero naming the first bad record.
    Verify {
        #[arg(long)]
        archive: std::path::PathBuf,
    },
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
    /// nats-server, the simulator's traffic shapes in real time, accuracy against the exact oracle.
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
    /// The simulator's traffic shape: which key each request is for and which node it
    /// reaches, drawn as `foldgate sim` draws them: uniform, zipf, pinned, bursty, hot-key or
    /// all-burst (the simulator's fault scenarios are this command's drills instead).
    /// Without it: the drill's own pinned driver, each key paced on its home nodes.
    #[arg(long, value_parser = foldgate_harness::scenario::traffic_scenario)]
    scenario: Option<Scenario>,
    /// The traffic's seed: the same seed sends the same arrival sequence.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The plan's 1 s limit (default: 80% of a key's mean offered rate).
    #[arg(long = "limit-1s")]
    limit_1s: Option<u64>,
    /// The plan's 60 s limit (default: 30 s of a key's mean offered rate).
    #[arg(long = "limit-60s")]
    limit_60s: Option<u64>,
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
    #[arg(long, default_value_t = sim::FULL_CHECK_ROUNDS_DEFAULT)]
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
    /// Standing options: per mille of each window's leasable allowance that nodes may take
    /// unasked (0: off; default from the reference configs).
    #[arg(long)]
    standing_permille: Option<u64>,
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
        Command::Sim(a) => ops::sim_cmd::run(a.into()),
        Command::Bench(BenchCommand::Fleet(a)) => ops::bench_fleet::run(a.into()),
        Command::Bench(BenchCommand::Http(a)) => ops::bench_http::run(a.into()),
        Command::Demo(a) => ops::demo::run_and_print(a.limit_1s, a.limit_60s, a.json, a.archive),
        Command::History(a) => a.run(),
        Command::Archive(a) => a.run(),
        Command::HashKey(a) => a.run(),
        Command::SubjectAccess(a) => {
            let e = ops::privacy::subject_access(
                &a.archive,
                &a.keyring,
                &a.keys_from,
                &a.out,
                a.format,
            )?;
            eprintln!(
                "{} events and {} roll-up rows for {} key ids (hash versions {:?}) written to {}",
                e.events,
                e.rollup_rows,
                e.key_ids,
                e.versions,
                a.out.display()
            );
            Ok(())
        }
        Command::Erase(a) => {
            let r = ops::privacy::erase(
                &a.archive,
                &a.keyring,
                &a.keys_from,
                &a.principal,
                &a.reason,
            )?;
            println!(
                "erased {} rows; audit record {} ({})",
                r.body.get("rows_removed").cloned().unwrap_or_default(),
                r.seq,
                r.hash
            );
            Ok(())
        }
        Command::Audit(AuditCommand::Verify { archive }) => {
            let v = ops::privacy::audit_verify(&archive)?;
            println!(
                "audit trail verifies: {} records, head {}",
                v.records, v.head
            );
            Ok(())
        }
        Command::Upstream(a) => ops::upstream::run(a.listen, a.delay_ms),
        Command::BenchPolicy(a) => {
            let hasher = a.hash_key.hasher()?;
            print!(
                "{}",
                ops::keys::bench_policy(&hasher, a.key_seed, a.keys, a.limit_1s, a.limit_60s)
            );
            Ok(())
        }
        Command::KeyId(a) => {
            ops::keys::key_id(&a.hash_key.hash_key_file, a.hash_key.hash_key_version)
        }
        Command::BenchKey { key_seed, index } => {
            println!("{}", ops::keys::bench_key(key_seed, index));
            Ok(())
        }
    }
}

impl HistoryArgs {
    fn run(self) -> Result<()> {
        use ops::history::{HistoryQuery, key_ids_of, parse_time_ms};
        if self.sql.is_some() {
            if self.keys_from.is_some()
                || self.since.is_some()
                || self.until.is_some()
                || self.top.is_some()
            {
                anyhow::bail!("--sql takes no shortcut flags: put the filter in the SQL");
            }
            // The SQL engine is its own binary; it gets this command line as it is.
            let status = std::process::Command::new(ops::history::sql_binary()?)
                .args(std::env::args_os().skip(2))
                .status()?;
            std::process::exit(status.code().unwrap_or(1));
        }
        let mut q = HistoryQuery {
            since_ms: self.since.as_deref().map(parse_time_ms).transpose()?,
            until_ms: self.until.as_deref().map(parse_time_ms).transpose()?,
            top: self.top,
            ..HistoryQuery::default()
        };
        if let Some(path) = &self.keys_from {
            let hashers = match (&self.node_config, &self.hash_key_file) {
                _ if self.keyring.is_some() => {
                    let ring = self.keyring.as_deref().expect("checked");
                    ops::keyring::check_outside(ring, &self.archive)?;
                    ops::keyring::retained_hashers(ring)?.0
                }
                (Some(config), _) => {
                    let s: gateway_node::http::node::NodeSettings =
                        gateway_node::http::config::load(
                            Some(config.as_path()),
                            "FOLDGATE_NODE_",
                            &[],
                        )?;
                    s.hashers()?
                }
                (None, Some(file)) => {
                    vec![ops::keys::hasher_from_file(file, self.hash_key_version)?]
                }
                (None, None) => {
                    anyhow::bail!("--keys-from needs --keyring, --node-config or --hash-key-file")
                }
            };
            q.key_ids = if path.as_os_str() == "-" {
                key_ids_of(std::io::stdin().lock(), &hashers)?
            } else {
                key_ids_of(
                    std::io::BufReader::new(std::fs::File::open(path)?),
                    &hashers,
                )?
            };
        }
        ops::history::print(&self.archive, &q, self.format)
    }
}

impl ArchiveCommand {
    fn run(self) -> Result<()> {
        match self {
            ArchiveCommand::Compact { archive, day } => {
                ops::archive_cmd::compact(&archive, day.as_deref()).map(drop)
            }
            ArchiveCommand::Retain {
                archive,
                retention_days,
            } => ops::archive_cmd::retain(&archive, retention_days).map(drop),
            ArchiveCommand::SynthDay {
                archive,
                keyring,
                day,
                events,
                keys,
                key_seed,
                nodes,
                file_events,
            } => {
                let spec = ops::archive_cmd::SynthDay {
                    day: ops::archive_cmd::parse_day(&day)?,
                    events,
                    keys,
                    key_seed,
                    nodes,
                    file_events: file_events.max(1),
                };
                let secs = ops::archive_cmd::synth_day(&archive, &keyring, &spec)?;
                let dir = archive.join("events").join(format!("day={day}"));
                println!(
                    "{events} events for {keys} keys written in {secs:.1} s: {} bytes in {}",
                    ops::archive_cmd::du(&dir),
                    dir.display()
                );
                Ok(())
            }
        }
    }
}

impl HashKeyCommand {
    fn run(self) -> Result<()> {
        match self {
            HashKeyCommand::Add { who, import } => {
                let v = ops::privacy::hash_key_add(
                    &who.keyring,
                    &who.archive,
                    &who.principal,
                    &who.reason,
                    import.as_deref(),
                )?;
                println!("added hash key version {v} to {}", who.keyring.display());
                Ok(())
            }
            HashKeyCommand::List { keyring } => {
                print!("{}", ops::privacy::hash_key_list(&keyring)?);
                Ok(())
            }
            HashKeyCommand::Destroy {
                version,
                who,
                retention_days,
            } => {
                ops::privacy::hash_key_destroy(
                    &who.keyring,
                    &who.archive,
                    &who.principal,
                    &who.reason,
                    version,
                    retention_days,
                )?;
                println!("destroyed hash key version {version}");
                Ok(())
            }
        }
    }
}

impl HashKeyArgs {
    fn hasher(&self) -> Result<gateway_node::http::auth::KeyHasher> {
        ops::keys::hasher_from_file(&self.hash_key_file, self.hash_key_version)
    }
}

impl From<SimArgs> for SimRun {
    fn from(a: SimArgs) -> Self {
        let config = SimConfig {
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
            standing_permille: a.standing_permille,
            what_if: a.what_if,
        };
        SimRun {
            config,
            seeds: a.seeds,
            threads: a.threads,
            json: a.json,
            admissions_out: a.admissions_out,
        }
    }
}

impl From<FleetArgs> for FleetDrill {
    fn from(a: FleetArgs) -> Self {
        FleetDrill {
            nats: a.nats,
            nodes: a.nodes,
            workers: a.workers,
            keys: a.keys,
            rate: a.rate,
            seconds: a.seconds,
            lease_ms: a.lease_ms,
            kill_owner_at: a.kill_owner_at,
            restart_nodes: a.restart_nodes,
            restart_at: a.restart_at,
            bus_down_at: a.bus_down_at,
            bus_down_s: a.bus_down_s,
            scenario: a.scenario,
            seed: a.seed,
            limit_1s: a.limit_1s,
            limit_60s: a.limit_60s,
        }
    }
}

impl From<HttpArgs> for LoadPlan {
    fn from(a: HttpArgs) -> Self {
        LoadPlan {
            targets: a.target,
            rate: a.rate,
            seconds: a.seconds,
            keys: a.keys,
            key_seed: a.key_seed,
            path: a.path,
            max_in_flight: a.max_in_flight,
            timeout: std::time::Duration::from_millis(a.timeout_ms),
        }
    }
}
