//! `foldgate`: the operator CLI.
//!
//! `foldgate demo` is the embedded default main job: an in-process fleet of node limiters
//! and fold owners (the same sans-IO state machines the services run) on an in-memory bus,
//! driven with pinned traffic on a virtual clock. It prints one JSON object: what was
//! offered, admitted and denied, and the worst over-admission of any closed key-window.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{Result, bail};
use bus_schemas::{KeyId, KeyWindow, NodeEpoch, NodeId, Now, OwnerEpoch, ShardId, WindowSpec};
use clap::{Parser, Subcommand};
use fold_workers::{FoldOwner, OwnerConfig, OwnerMode};
use gateway_node::window::{window_at, window_end_ms};
use gateway_node::{
    Decision, DecisionSurface, KeyPolicy, Mode, NodeConfig, NodeLimiter, SurfaceConfig, Transmit,
};

#[derive(Parser)]
#[command(name = "foldgate", about = "Foldgate operator CLI")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run an in-process fleet with pinned traffic and report its accuracy (needs nothing
    /// installed).
    Demo {
        #[arg(long, default_value_t = 5)]
        nodes: u32,
        #[arg(long, default_value_t = 200)]
        keys: u32,
        /// Simulated seconds.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// Offered requests per second per key (the plan allows 50/s and 2,400/min).
        #[arg(long, default_value_t = 60)]
        rate: u64,
        #[arg(long, value_parser = ["leasing", "fixed"], default_value = "leasing")]
        mode: String,
    },
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Demo {
            nodes,
            keys,
            seconds,
            rate,
            mode,
        } => demo(nodes, keys, seconds, rate, &mode),
    }
}

fn demo(node_count: u32, key_count: u32, seconds: u64, rate: u64, mode: &str) -> Result<()> {
    if node_count < 2 || key_count == 0 || seconds == 0 || rate == 0 {
        bail!("--nodes must be >= 2 and --keys, --seconds, --rate positive");
    }
    let (node_mode, owner_mode) = if mode == "fixed" {
        (Mode::Fixed, OwnerMode::Fixed)
    } else {
        (Mode::Leasing, OwnerMode::Leasing)
    };
    let round_ms = 25u32;
    let shards = node_count;
    let windows = [
        WindowSpec {
            length_ms: 1_000,
            limit: 50,
        },
        WindowSpec {
            length_ms: 60_000,
            limit: 2_400,
        },
    ];
    let policy = KeyPolicy::new(&windows, round_ms)?;
    let mut now = Now {
        wall_ms: 1_764_720_000_000,
        mono_ms: 0,
    };
    let mut nodes: Vec<NodeLimiter> = (0..node_count)
        .map(|i| {
            let config = NodeConfig {
                fleet_size: node_count,
                shards,
                mode: node_mode,
                ..NodeConfig::reference(NodeId(i))
            };
            let surface = Arc::new(DecisionSurface::new(SurfaceConfig::default()));
            NodeLimiter::new(config, surface, NodeEpoch(1), now)
        })
        .collect();
    let mut owners: Vec<FoldOwner> = (0..shards)
        .map(|s| {
            let config = OwnerConfig {
                shards,
                fleet_size: node_count,
                mode: owner_mode,
                ..OwnerConfig::reference(ShardId(s))
            };
            FoldOwner::new(config, OwnerEpoch(1), now, false)
        })
        .collect();
    let keys: Vec<KeyId> = (0..u128::from(key_count))
        .map(|k| KeyId {
            version: 1,
            digest: (k + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835),
        })
        .collect();
    // A55: each key's traffic is pinned to two nodes.
    let home = |k: usize, r: u64| ((k + (r as usize & 1)) % node_count as usize, k);

    let mut admitted_per_kw: BTreeMap<KeyWindow, u64> = BTreeMap::new();
    let (mut offered, mut admitted, mut denied, mut fast_paths) = (0u64, 0u64, 0u64, 0u64);
    let per_round_milli = rate * u64::from(round_ms);
    let mut carry = vec![0u64; keys.len()];
    let rounds = seconds * 1_000 / u64::from(round_ms);
    for round in 0..rounds {
        for (k, key) in keys.iter().enumerate() {
            carry[k] += per_round_milli;
            let n = carry[k] / 1_000;
            carry[k] %= 1_000;
            for r in 0..n {
                let (node, _) = home(k, r);
                offered += 1;
                let surface = Arc::clone(nodes[node].surface());
                let mut d = surface.decide(*key, now.wall_ms, &policy);
                if let Decision::FastPath(need) = d {
                    fast_paths += 1;
                    // The in-memory bus answers within the deadline.
                    nodes[node].handle_fast_path_need(now, need);
                    while let Some(t) = nodes[node].poll_transmit() {
                        if let Transmit::FastPath(req) = t {
                            let reply =
                                owners[req.shard.0 as usize].handle_fast_path_request(now, &req);
                            nodes[node].handle_fast_path_reply(now, &reply);
                        }
                    }
                    d = surface.decide_after_fast_path(*key, now.wall_ms, &policy, false);
                }
                match d {
                    Decision::Admit | Decision::FailOpen => {
                        admitted += 1;
                        for w in &windows {
                            let kw = KeyWindow {
                                key: *key,
                                window: window_at(*key, w.length_ms, now.wall_ms),
                            };
                            *admitted_per_kw.entry(kw).or_default() += 1;
                        }
                    }
                    Decision::Deny(_) => denied += 1,
                    Decision::FastPath(_) => bail!("fast path offered twice in one round"),
                }
            }
        }
        for node in nodes.iter_mut() {
            node.handle_tick(now);
            while let Some(t) = node.poll_transmit() {
                if let Transmit::Report(batch) = t {
                    owners[batch.shard.0 as usize].handle_report_batch(now, &batch);
                }
            }
            node.check_invariants()?;
        }
        for owner in owners.iter_mut() {
            owner.handle_tick(now);
            owner.check_invariants()?;
            while let Some(g) = owner.poll_grant() {
                nodes[g.node.0 as usize].handle_grant_batch(now, &g);
            }
        }
        let _ = round;
        now.wall_ms += u64::from(round_ms);
        now.mono_ms += u64::from(round_ms);
    }
    let mut over_max_pct = 0f64;
    let mut closed = 0u64;
    for (kw, n) in &admitted_per_kw {
        if window_end_ms(kw.key, kw.window) > now.wall_ms {
            continue;
        }
        closed += 1;
        let limit = windows
            .iter()
            .find(|w| w.length_ms == kw.window.length_ms)
            .map(|w| w.limit)
            .unwrap_or(0);
        over_max_pct = over_max_pct.max(n.saturating_sub(limit) as f64 * 100.0 / limit as f64);
    }
    let summary = serde_json::json!({
        "mode": mode,
        "nodes": node_count,
        "keys": key_count,
        "sim_seconds": seconds,
        "offered": offered,
        "admitted": admitted,
        "denied_429": denied,
        "closed_key_windows": closed,
        "over_admission_pct_max": over_max_pct,
        "fast_path_share_pct": fast_paths as f64 * 100.0 / offered.max(1) as f64,
        "invariant_violations": 0,
    });
    println!("{summary}");
    Ok(())
}
