//! C4: how long a quiet key keeps its credit on a node before it goes back to the pool.

mod support;

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
        let config = gateway_node::NodeConfig {
            idle_return_rounds: 8,
            idle_return_rounds_thin: 4,
            // Only the idle return moves credit here.
            rest_return: false,
            // The demand-driven protocol itself, without standing options.
            standing_permille: 0,
            ..gateway_node::NodeConfig::reference(bus_schemas::NodeId(0))
        };
        let mut run = WindowRun::new(key(21), limit, config);
        let start_ms = run.end_ms - 1_000;
        run.request(start_ms);
        run.node.handle_tick(WindowRun::at(start_ms));
        run.grant(start_ms, 3, false);
        let mut returned_at = None;
        for round in 1..20u64 {
            run.round(start_ms + round * 25);
            let line = run.line();
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
        run.node.check_invariants().unwrap();
    }
}
