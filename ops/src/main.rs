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
    /// Skip the codec round trip of every envelope (faster; the tests keep it on).
    #[arg(long)]
    no_codec: bool,
    /// Full invariant checks every this many rounds (per-message checks always run).
    #[arg(long, default_value_t = 1)]
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
            "{} / {}: {} nodes, {} keys, {} s x {} seed(s): offered {}, admitted {}, over max {}%, under p99 {}%, fast path {}%, violations {}, {} ms",
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
