//! `foldgate bench http`: open-loop HTTP load at a constant arrival rate against one
//! gateway, or several interleaved; one JSON line per target.

use anyhow::{Result, bail};
use foldgate_harness::http_tools::{self, LoadPlan};

/// Runs `plan` (its targets' trailing slashes dropped) and prints each target's report.
pub fn run(mut plan: LoadPlan) -> Result<()> {
    for t in &mut plan.targets {
        t.truncate(t.trim_end_matches('/').len());
    }
    let n = plan.targets.len() as f64;
    if plan.rate == 0 || plan.rate as f64 * plan.seconds * n > 10_000_000.0 {
        bail!("--rate x --seconds x targets must be 1..=10,000,000 requests");
    }
    for report in crate::runtime()?.block_on(http_tools::run_load(&plan)) {
        println!("{}", serde_json::to_string(&report)?);
    }
    Ok(())
}
