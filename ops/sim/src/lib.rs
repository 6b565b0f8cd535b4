//! `foldgate sim`: the deterministic fleet simulator and accuracy harness.
//!
//! It drives the node limiters and fold owners of `gateway-node` and `fold-workers`, the
//! same state machines the services run, unchanged, through a simulated bus (`bus`) on a
//! virtual clock, with seeded traffic (`traffic`) and faults. It checks their invariants
//! as it goes and books every request against an exact oracle (`oracle`). The
//! `global-sync` baseline (`global_sync`) runs on the same bus with the same traffic.
//!
//! What a "step" is: every protocol event (a node or owner tick, a delivered message, a
//! fast-path exchange, a node restart) is followed by a check of the state machine it
//! touched, over the key-windows it changed, and of the fleet-wide truth (admitted + held
//! <= allowance + self-granted, dead epochs included) for those key-windows. The truth's
//! sums are kept per key-window and moved by each step's changes (`fleet::truth`), so a
//! check costs what the step changed, not a walk of every node's books. That is a
//! complete check: a key-window no step changed has the same sum as before. Requests
//! between events only move a unit from a node's held credit to its spend, which leaves
//! the sum alone (the node book, checked on every change, keeps spend + held equal to
//! received less returned), and the atomic words themselves stay non-negative. Every
//! `full_check_rounds` rounds every node and owner is checked whole, and the kept sums
//! are cross-checked against a walk of every node's books.
//!
//! Modules: `config` (what a run is), `fleet` (the simulated fleet and its step loop),
//! `report` (what a run reports).

pub mod bus;
mod config;
mod fleet;
pub mod global_sync;
pub mod offload;
pub mod oracle;
mod report;
pub mod rng;
pub mod traffic;

pub use config::{FULL_CHECK_ROUNDS_DEFAULT, Scenario, SimConfig, SimError, SimMode, WhatIf};
pub use report::{Counts, PlanWindow, RunOutcome, SimReport, write_admissions_csv};

use fleet::Sim;

/// Runs one seed.
pub fn run(cfg: &SimConfig) -> Result<RunOutcome, SimError> {
    Ok(Sim::new(cfg.effective())?.run())
}

/// Runs `seeds` seeds from `cfg.seed` on up to `threads` threads; outcomes in seed order.
pub fn run_seeds(cfg: &SimConfig, seeds: u64, threads: usize) -> Result<Vec<RunOutcome>, SimError> {
    let configs: Vec<SimConfig> = (0..seeds)
        .map(|i| SimConfig {
            seed: cfg.seed + i,
            ..cfg.clone()
        })
        .collect();
    let threads = threads.clamp(1, configs.len().max(1));
    let chunks: Vec<Vec<(usize, SimConfig)>> = (0..threads)
        .map(|t| {
            configs
                .iter()
                .cloned()
                .enumerate()
                .filter(|(i, _)| i % threads == t)
                .collect()
        })
        .collect();
    let mut results: Vec<(usize, Result<RunOutcome, SimError>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = chunks
            .into_iter()
            .map(|chunk| {
                scope.spawn(move || {
                    chunk
                        .into_iter()
                        .map(|(i, c)| (i, run(&c)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a simulator thread panicked"))
            .collect()
    });
    results.sort_by_key(|(i, _)| *i);
    results.into_iter().map(|(_, r)| r).collect()
}
