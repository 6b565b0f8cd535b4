//! C4: how long a quiet key keeps its credit on a node before it goes back to the pool.

mod support;

use bus_schemas::{KeyWindow, WindowSpec};
use gateway_node::window::window_at;
use support::*;

/// A node that sees a key at a small share of the key's pace (under half of it) is one
/// of several the key is spread over: its idle credit goes back after
/// `idle_return_rounds_thin` quiet rounds, not `idle_return_rounds`, since the others
/// would otherwise ask the owner for it while it sits here. The same traffic on a key
/// whose pace it makes up most of keeps the full wait. One request, then quiet: a
/// smoothed demand of 125 thousandths a round, against a pace of 1,000 (40 a second) or
/// of 100 (4 a second).
#[test]
fn a_node_with_a_small_share_of_a_key_hands_its_idle_credit_back_sooner() {
    for (limit, wait_rounds) in [(40, 4u64), (4, 8)] {
        let windows = [WindowSpec {
            length_ms: 1_000,
            limit,
        }];
        let policy = gateway_node::KeyPolicy::new(&windows, 25).unwrap();
        let surface = std::sync::Arc::new(gateway_node::DecisionSurface::new(
            gateway_node::SurfaceConfig::default(),
        ));
        let config = gateway_node::NodeConfig {
            fleet_size: 1,
            shards: 1,
            idle_return_rounds: 8,
            idle_return_rounds_thin: 4,
            // Only the idle return moves credit here.
            rest_return: false,
            ..gateway_node::NodeConfig::reference(bus_schemas::NodeId(0))
        };
        let mut node =
            gateway_node::NodeLimiter::new(config, surface.clone(), bus_schemas::NodeEpoch(1), T0);
        let k = key(21);
        // A window that starts after T0 and lasts past the rounds below.
        let window = window_at(k, 1_000, T0.wall_ms + 1_000);
        let kw = KeyWindow { key: k, window };
        let start_ms = gateway_node::window::window_end_ms(k, window) - 1_000;
        let at = |ms: u64| bus_schemas::Now {
            wall_ms: ms,
            mono_ms: T0.mono_ms + (ms - T0.wall_ms),
        };
        let _ = surface.decide(k, start_ms, &policy);
        node.handle_tick(at(start_ms));
        let grant = bus_schemas::GrantBatch {
            owner_epoch: bus_schemas::OwnerEpoch(1),
            shard: bus_schemas::ShardId(0),
            node: node.node(),
            entries: vec![bus_schemas::GrantEntry {
                key_window: kw,
                node_epoch: node.epoch(),
                grant_seq: 1,
                credit_total: 3,
                exhausted: false,
            }],
        };
        node.handle_grant_batch(at(start_ms), &grant);
        let mut returned_at = None;
        for round in 1..20u64 {
            let now_ms = start_ms + round * 25;
            node.handle_tick(at(now_ms));
            // The owner answers every report (F2: proof of contact), here with nothing.
            let contact = bus_schemas::GrantBatch {
                entries: Vec::new(),
                ..grant.clone()
            };
            node.handle_grant_batch(at(now_ms), &contact);
            let line = node.line_for(&kw).expect("live line");
            if line.returned > 0 && returned_at.is_none() {
                assert_eq!(line.returned, 3, "idle credit goes back whole: {line:?}");
                returned_at = Some(round);
            }
        }
        assert_eq!(
            returned_at,
            Some(wait_rounds),
            "limit {limit}: quiet rounds before the idle credit went back"
        );
        node.check_invariants().unwrap();
    }
}
