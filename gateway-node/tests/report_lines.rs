//! When the reconciler re-sends a line for its demand alone (C4, `line_band`).

mod support;

use bus_schemas::{KeyWindow, WindowSpec};
use gateway_node::Transmit;
use gateway_node::window::window_at;
use support::*;

/// A key that goes quiet after a few requests: its demand decays by an eighth a round.
/// Above a request in four rounds each halving is re-sent; below that only the refresh
/// (every `refresh_rounds`) carries it, and reaching 0 is sent at once. Re-sending every
/// halving down there was two thirds of the protocol's report lines at the reference
/// load, for grants that move by a unit or so (BENCHMARKS.md, simulator).
#[test]
fn a_quiet_line_is_resent_for_each_halving_only_above_the_floor() {
    let windows = [WindowSpec {
        length_ms: 60_000,
        limit: 1_000,
    }];
    let policy = gateway_node::KeyPolicy::new(&windows, 25).unwrap();
    let mut node = leasing_node(1);
    let refresh_rounds = u64::from(node.config().refresh_rounds);
    let surface = node.surface().clone();
    let k = key(7);
    let mut now = T0;
    // (round, demand) of every line of the key's window.
    let mut lines: Vec<(u64, u64)> = Vec::new();
    for round in 0..200u64 {
        if round == 1 {
            // A burst of 8 in one round, then nothing (no owner: each is refused, and
            // each still counts as demand).
            for _ in 0..8 {
                let _ = surface.decide(k, now.wall_ms, &policy);
            }
        }
        node.handle_tick(now);
        while let Some(t) = node.poll_transmit() {
            if let Transmit::Report(batch) = t {
                lines.extend(
                    batch
                        .entries
                        .iter()
                        .filter(|e| e.key_window.key == k)
                        .map(|e| (round, e.demand)),
                );
            }
        }
        now = bus_schemas::Now {
            wall_ms: now.wall_ms + 25,
            mono_ms: now.mono_ms + 25,
        };
    }
    let kw = KeyWindow {
        key: k,
        window: window_at(k, 60_000, T0.wall_ms),
    };
    assert!(node.line_for(&kw).is_some());
    let floor_milli = 256;
    let above = lines.iter().filter(|(_, d)| *d >= floor_milli).count();
    assert!(
        above >= 3,
        "the decay from 8 a round is re-sent band by band: {lines:?}"
    );
    for pair in lines.windows(2) {
        let ((r0, d0), (r1, d1)) = (pair[0], pair[1]);
        if d0 > 0 && d0 < floor_milli && d1 > 0 {
            assert!(
                r1 - r0 >= refresh_rounds,
                "below the floor only the refresh re-sends: {lines:?}"
            );
        }
    }
    let last = lines.last().expect("lines were sent");
    assert_eq!(last.1, 0, "reaching 0 is sent: {lines:?}");
    let below = lines
        .iter()
        .filter(|(_, d)| *d > 0 && *d < floor_milli)
        .count();
    assert!(below >= 2, "the refresh still carries it: {lines:?}");
}

/// C4/A2: in a window's last `end_return_rounds` a node hands back what its demand can
/// no longer spend there, and not before. A quiet key (idle returns off, so only this
/// rule moves credit) keeps its 60 units until then, then returns all it holds; a busy
/// one keeps h x demand x rounds left plus a standard deviation, or once the pool is
/// exhausted just demand x rounds left.
#[test]
fn credit_a_window_cannot_spend_in_its_last_rounds_goes_back() {
    for (busy, exhausted) in [(false, false), (true, false), (true, true)] {
        let windows = [WindowSpec {
            length_ms: 1_000,
            limit: 100,
        }];
        let policy = gateway_node::KeyPolicy::new(&windows, 25).unwrap();
        let surface = std::sync::Arc::new(gateway_node::DecisionSurface::new(
            gateway_node::SurfaceConfig::default(),
        ));
        let config = gateway_node::NodeConfig {
            fleet_size: 1,
            shards: 1,
            idle_return_rounds: u32::MAX,
            idle_return_rounds_min: u32::MAX,
            ..gateway_node::NodeConfig::reference(bus_schemas::NodeId(0))
        };
        let end_rounds = u64::from(config.end_return_rounds);
        let mut node =
            gateway_node::NodeLimiter::new(config, surface.clone(), bus_schemas::NodeEpoch(1), T0);
        let k = key(11);
        // The window after T0's, so the 30 rounds before its end are all after T0.
        let window = window_at(k, 1_000, T0.wall_ms + 1_000);
        let kw = KeyWindow { key: k, window };
        let end_ms = gateway_node::window::window_end_ms(k, window);
        let start_ms = end_ms - 30 * 25;
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
                credit_total: 60,
                exhausted,
            }],
        };
        node.handle_grant_batch(at(start_ms), &grant);
        let mut returned_before_end_rounds = None;
        for round in 1..30u64 {
            let now_ms = start_ms + round * 25;
            if busy {
                // About one request a round, admitted from held credit.
                let _ = surface.decide(k, now_ms, &policy);
            }
            node.handle_tick(at(now_ms));
            // The owner answers every report (F2: proof of contact), here with nothing.
            let contact = bus_schemas::GrantBatch {
                entries: Vec::new(),
                ..grant.clone()
            };
            node.handle_grant_batch(at(now_ms), &contact);
            let now_line = node.line_for(&kw).expect("live line");
            let returned = now_line.returned;
            let left_rounds = (end_ms - now_ms).div_ceil(25);
            if left_rounds > end_rounds {
                assert_eq!(
                    returned, 0,
                    "busy {busy}: nothing goes back {left_rounds} rounds out"
                );
            } else if returned_before_end_rounds.is_none() {
                // (returned, held) at the first of the last rounds.
                returned_before_end_rounds = Some((returned, now_line.held_credit));
            }
        }
        let line = node.line_for(&kw).expect("live line");
        let spent = line.cumulative_spend;
        let held = 60 - spent - line.returned;
        let (first, kept) = returned_before_end_rounds.expect("the last rounds were ticked");
        if busy {
            assert!(first > 0, "a busy node returns the excess: {line:?}");
            // Demand ~1000 a round, 4 rounds left: keeps ceil(1.25 x 4) + ceil(sqrt 4)
            // while the pool has credit, only the 4 it expects to spend once it has none.
            let range = if exhausted { 3..=4 } else { 6..=8 };
            assert!(
                range.contains(&kept),
                "exhausted {exhausted}: kept {kept} at the first of the last rounds: {line:?}"
            );
        } else {
            assert_eq!(first, 60 - spent, "a quiet node returns all it holds");
            assert_eq!(held, 0);
        }
        node.check_invariants().unwrap();
    }
}
