//! Shared set-up for the gateway-node integration tests and the benchmark.
#![allow(dead_code)]

use std::sync::Arc;

use bus_schemas::{KeyId, NodeEpoch, NodeId, Now, WindowSpec};
use gateway_node::{DecisionSurface, KeyPolicy, Mode, NodeConfig, NodeLimiter, SurfaceConfig};

pub const T0: Now = Now {
    wall_ms: 1_764_720_000_000,
    mono_ms: 5_000,
};

pub fn key(i: u64) -> KeyId {
    KeyId {
        version: 1,
        digest: u128::from(i).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835) | 1,
    }
}

/// A one-node fleet in fixed mode: every tick installs 98% of each window's allowance,
/// so decisions run against credit held locally, as in steady state.
pub fn fixed_node(windows: &[WindowSpec], bucket_cap: usize) -> (NodeLimiter, KeyPolicy) {
    let surface = Arc::new(DecisionSurface::new(SurfaceConfig {
        bucket_cap,
        ..SurfaceConfig::default()
    }));
    let config = NodeConfig {
        fleet_size: 1,
        shards: 1,
        mode: Mode::Fixed,
        ..NodeConfig::reference(NodeId(0))
    };
    let limiter = NodeLimiter::new(config, surface, NodeEpoch(1), T0);
    (limiter, KeyPolicy::new(windows, 25).unwrap())
}

pub fn leasing_node(shards: u32) -> NodeLimiter {
    let surface = Arc::new(DecisionSurface::new(SurfaceConfig::default()));
    let config = NodeConfig {
        fleet_size: 1,
        shards,
        ..NodeConfig::reference(NodeId(0))
    };
    NodeLimiter::new(config, surface, NodeEpoch(1), T0)
}
