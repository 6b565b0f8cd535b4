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
        // The demand-driven protocol itself, without standing options.
        standing_permille: 0,
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
        // The demand-driven protocol itself, without standing options.
        standing_permille: 0,
        ..NodeConfig::reference(NodeId(0))
    };
    NodeLimiter::new(config, surface, NodeEpoch(1), T0)
}

/// One leasing node (a fleet of one, one shard) and key `k`'s 1 s window of `limit`
/// that starts after T0: the set-up of the tests that watch what a window's held credit
/// does round by round, with the owner answering every report.
pub struct WindowRun {
    pub node: NodeLimiter,
    pub surface: Arc<DecisionSurface>,
    pub policy: KeyPolicy,
    pub kw: bus_schemas::KeyWindow,
    /// Wall time the window ends.
    pub end_ms: u64,
}

impl WindowRun {
    /// `config` is `NodeConfig::reference` with the test's own settings; the fleet and
    /// shard counts are set to one here.
    pub fn new(k: KeyId, limit: u64, config: NodeConfig) -> Self {
        let windows = [WindowSpec {
            length_ms: 1_000,
            limit,
        }];
        let policy = KeyPolicy::new(&windows, 25).unwrap();
        let surface = Arc::new(DecisionSurface::new(SurfaceConfig::default()));
        let config = NodeConfig {
            fleet_size: 1,
            shards: 1,
            ..config
        };
        let node = NodeLimiter::new(config, surface.clone(), NodeEpoch(1), T0);
        // The window after T0's, so its rounds are all after T0.
        let window = gateway_node::window::window_at(k, 1_000, T0.wall_ms + 1_000);
        let end_ms = gateway_node::window::window_end_ms(k, window);
        Self {
            node,
            surface,
            policy,
            kw: bus_schemas::KeyWindow { key: k, window },
            end_ms,
        }
    }

    /// T0's clocks moved to wall time `ms`.
    pub fn at(ms: u64) -> Now {
        Now {
            wall_ms: ms,
            mono_ms: T0.mono_ms + (ms - T0.wall_ms),
        }
    }

    /// A request for the key at `ms` (admitted or not).
    pub fn request(&self, ms: u64) {
        let _ = self.surface.decide(self.kw.key, ms, &self.policy);
    }

    /// The owner's first grant for the window: `credit_total` in all.
    pub fn grant(&mut self, ms: u64, credit_total: u64, exhausted: bool) {
        let entry = bus_schemas::GrantEntry {
            key_window: self.kw,
            node_epoch: self.node.epoch(),
            grant_seq: 1,
            credit_total,
            exhausted,
        };
        self.node
            .handle_grant_batch(Self::at(ms), &self.batch(vec![entry]));
    }

    /// A round at `ms`: the node ticks, and the owner answers its report (F2: proof of
    /// contact) with nothing.
    pub fn round(&mut self, ms: u64) {
        self.node.handle_tick(Self::at(ms));
        self.node
            .handle_grant_batch(Self::at(ms), &self.batch(Vec::new()));
    }

    /// The window's line as the node would report it now.
    pub fn line(&self) -> bus_schemas::ReportEntry {
        self.node.line_for(&self.kw).expect("live line")
    }

    fn batch(&self, entries: Vec<bus_schemas::GrantEntry>) -> bus_schemas::GrantBatch {
        grant_batch(&self.node, entries)
    }
}

/// The owner's (epoch 1, shard 0) batch of `entries` for `node`.
pub fn grant_batch(
    node: &NodeLimiter,
    entries: Vec<bus_schemas::GrantEntry>,
) -> bus_schemas::GrantBatch {
    bus_schemas::GrantBatch {
        full_report_taken: None,
        owner_epoch: bus_schemas::OwnerEpoch(1),
        shard: bus_schemas::ShardId(0),
        node: node.node(),
        entries,
    }
}

/// The owner's grant of `credit_total` in all for `kw` to `node`'s epoch, at `grant_seq`.
pub fn grant_of(
    node: &NodeLimiter,
    key_window: bus_schemas::KeyWindow,
    grant_seq: u64,
    credit_total: u64,
) -> bus_schemas::GrantBatch {
    let entry = bus_schemas::GrantEntry {
        key_window,
        node_epoch: node.epoch(),
        grant_seq,
        credit_total,
        exhausted: false,
    };
    grant_batch(node, vec![entry])
}
