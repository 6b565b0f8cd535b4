//! `foldgate sim`: runs the simulator for one or more seeds and prints its report, a
//! short text summary or one JSON object, with an optional CSV of every closed
//! key-window. Any invariant violation is printed and fails the command.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use foldgate_sim::{self as sim, RunOutcome, SimConfig, SimReport};

/// One `foldgate sim` invocation.
#[derive(Clone, Debug)]
pub struct SimRun {
    /// The first seed's configuration; the others differ only in their seed.
    pub config: SimConfig,
    pub seeds: u64,
    pub threads: usize,
    /// One JSON object instead of the text summary.
    pub json: bool,
    /// Where to write one CSV row per closed key-window.
    pub admissions_out: Option<PathBuf>,
}

pub fn run(r: SimRun) -> Result<()> {
    if r.seeds == 0 || r.config.full_check_rounds == 0 {
        bail!("--seeds and --full-check-rounds must be at least 1");
    }
    let mut cfg = r.config;
    // The report and the replay command name each lifted rule once, in a fixed order.
    cfg.what_if.sort_unstable();
    cfg.what_if.dedup();
    let started = Instant::now();
    let outcomes = sim::run_seeds(&cfg, r.seeds, r.threads)?;
    let wall_ms = started.elapsed().as_millis() as u64;
    for o in &outcomes {
        for v in &o.violations {
            eprintln!("invariant violation: {v}");
        }
    }
    if let Some(path) = &r.admissions_out {
        write_admissions(path, &outcomes)?;
    }
    let report = SimReport::build(&cfg, r.seeds, &outcomes, wall_ms);
    if r.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!("{}", summary(&report));
    }
    if report.invariant_violations > 0 {
        bail!("{} invariant violation(s)", report.invariant_violations);
    }
    Ok(())
}

fn write_admissions(path: &Path, outcomes: &[RunOutcome]) -> Result<()> {
    let file = std::fs::File::create(path).with_context(|| format!("{}", path.display()))?;
    let mut w = std::io::BufWriter::new(file);
    sim::write_admissions_csv(&mut w, outcomes)?;
    w.flush()?;
    Ok(())
}

/// The text summary: one line.
fn summary(report: &SimReport) -> String {
    format!(
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
    )
}
