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
