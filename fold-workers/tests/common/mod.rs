//! What the owner tests share: one owner of the only shard at a fixed start, a key per
//! number, and report lines and batches with everything not under test at zero.
#![allow(dead_code)] // each test file uses its own part

pub mod workers;

use bus_schemas::{
    KeyId, KeyWindow, NodeEpoch, NodeId, Now, OwnerEpoch, ReportBatch, ReportEntry, ShardId,
    WindowId,
};
use fold_workers::{FoldOwner, OwnerConfig};

pub const START: Now = Now {
    wall_ms: 1_764_720_030_000,
    mono_ms: 10_000,
};

/// The reference owner of shard 0 of 1, for a fleet of `fleet_size`, started at `START`.
pub fn owner(fleet_size: u32) -> FoldOwner {
    FoldOwner::new(config(fleet_size), OwnerEpoch(1), START, false)
}

pub fn config(fleet_size: u32) -> OwnerConfig {
    OwnerConfig {
        shards: 1,
        fleet_size,
        // The demand-driven protocol itself, without standing options.
        standing_permille: 0,
        ..OwnerConfig::reference(ShardId(0))
    }
}

/// Key number `i`, spread over the digest space.
pub fn key(i: u128) -> KeyId {
    KeyId {
        version: 1,
        digest: i.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835) | 1,
    }
}

/// Key `i`'s 60 s window open at `START`, whatever the key's phase.
pub fn minute_window(i: u128) -> KeyWindow {
    KeyWindow {
        key: key(i),
        window: WindowId {
            length_ms: 60_000,
            number: START.wall_ms / 60_000,
        },
    }
}

/// A line for `kw` under `allowance` with every count at zero.
pub fn line(kw: KeyWindow, allowance: u64) -> ReportEntry {
    ReportEntry {
        key_window: kw,
        allowance,
        cumulative_spend: 0,
        demand: 0,
        held_credit: 0,
        applied_grant: 0,
        returned: 0,
        self_granted: 0,
        standing_option: false,
    }
}

/// Node `node`'s (epoch 1) batch of round `seq`, sent at `now`.
pub fn batch(node: u32, seq: u64, now: Now, entries: Vec<ReportEntry>) -> ReportBatch {
    ReportBatch {
        node: NodeId(node),
        node_epoch: NodeEpoch(1),
        seq,
        shard: ShardId(0),
        sent_at_ms: now.wall_ms,
        full_report: Some(bus_schemas::FullReportChunk { index: 0, count: 1 }),
        owner_epoch_seen: OwnerEpoch(1),
        entries,
    }
}
