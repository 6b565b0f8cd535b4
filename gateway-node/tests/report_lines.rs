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

/// C4/A2: at every visit a node hands back what its demand can no longer spend before
/// the window ends. A quiet key (idle returns off, so only this rule moves credit)
/// returns nearly all of its 60 units at once and the rest as its demand decays; a busy one keeps h x demand x rounds left plus a
/// standard deviation, or once the pool is exhausted just demand x rounds left, from
/// its first round on (not only in the window's last rounds).
#[test]
fn credit_a_window_cannot_spend_before_its_end_goes_back() {
    for (busy, exhausted) in [(false, false), (true, false), (true, true)] {
        let config = gateway_node::NodeConfig {
            idle_return_rounds: u32::MAX,
            idle_return_rounds_thin: u32::MAX,
            idle_return_rounds_min: u32::MAX,
            // The demand-driven protocol itself, without standing options.
            standing_permille: 0,
            ..gateway_node::NodeConfig::reference(bus_schemas::NodeId(0))
        };
        // Where the test reads what was kept, and what the keep rule allows then at a
        // request a round: 29 rounds left at the first, 4 at the last.
        let late_rounds = 4u64;
        let mut run = WindowRun::new(key(11), 100, config);
        let end_ms = run.end_ms;
        let start_ms = end_ms - 30 * 25;
        run.request(start_ms);
        run.node.handle_tick(WindowRun::at(start_ms));
        run.grant(start_ms, 60, exhausted);
        let mut first_round = None;
        let mut late = None;
        for round in 1..30u64 {
            let now_ms = start_ms + round * 25;
            if busy {
                // About one request a round, admitted from held credit.
                run.request(now_ms);
            }
            run.round(now_ms);
            let now_line = run.line();
            let returned = now_line.returned;
            let left_rounds = (end_ms - now_ms).div_ceil(25);
            if round == 1 {
                first_round = Some((returned, now_line.held_credit));
            }
            if left_rounds <= late_rounds && late.is_none() {
                late = Some(now_line.held_credit);
            }
        }
        let line = run.line();
        let spent = line.cumulative_spend;
        let held = 60 - spent - line.returned;
        let (first_returned, first_kept) = first_round.expect("round 1 was ticked");
        let late_kept = late.expect("the last rounds were ticked");
        if busy {
            // Demand ~1000 a round. 29 rounds left: at most ceil(1.25 x 29) +
            // ceil(sqrt 29) = 43 while the pool has credit, 29 once it has none; the
            // rest of the 60 goes back in the first round.
            let most = if exhausted { 29 } else { 43 };
            assert!(
                first_returned > 0 && first_kept <= most,
                "exhausted {exhausted}: returned {first_returned}, kept {first_kept} in round 1"
            );
            // 4 rounds left: ceil(1.25 x 4) + ceil(sqrt 4), or the 4 it expects to spend.
            let range = if exhausted { 3..=4 } else { 6..=8 };
            assert!(
                range.contains(&late_kept),
                "exhausted {exhausted}: kept {late_kept} with 4 rounds left: {line:?}"
            );
        } else {
            // One request before the grant, none since: in round 1 all but what that
            // request's decaying demand may still spend goes back, the rest as it decays.
            assert!(
                first_returned >= 50 && first_kept <= 10,
                "a quiet node returns its credit at once: returned {first_returned}, kept {first_kept}"
            );
            assert_eq!(held, 0);
        }
        run.node.check_invariants().unwrap();
    }
}

/// C8: a node owes an owner a full report of the shard (every line it holds) from the
/// first word it hears from that owner epoch, and re-sends one until a grant batch from
/// the epoch says it took one from this node epoch: after 8 rounds, then twice as long
/// each time, up to 256 (an owner that never says so, one from before the field, must
/// not cost a full report every 200 ms for good). A batch of it may be lost, and the
/// owner's fence waits for one it has whole.
#[test]
fn a_full_report_is_resent_until_the_owner_says_it_took_one() {
    let mut node = leasing_node(1);
    let kw = KeyWindow {
        key: key(3),
        window: window_at(key(3), 60_000, T0.wall_ms),
    };
    let batch = |node: &gateway_node::NodeLimiter, epoch: u64, taken: Option<u64>| {
        bus_schemas::GrantBatch {
            owner_epoch: bus_schemas::OwnerEpoch(epoch),
            full_report_taken: taken.map(bus_schemas::NodeEpoch),
            ..grant_batch(node, Vec::new())
        }
    };
    let windows = [WindowSpec {
        length_ms: 60_000,
        limit: 100,
    }];
    let policy = gateway_node::KeyPolicy::new(&windows, 25).unwrap();
    let _ = node.surface().decide(kw.key, T0.wall_ms, &policy);
    node.handle_grant_batch(T0, &grant_of(&node, kw, 1, 10));
    let own_epoch = node.epoch().0;
    // (round, the batch the owner sends before that round's tick)
    let words = [
        (12, batch(&node, 1, Some(own_epoch + 1))), // about another life of this node
        (510, batch(&node, 1, Some(own_epoch))),
        (520, batch(&node, 2, None)),            // a new owner
        (521, batch(&node, 1, Some(own_epoch))), // the old one, refused whole
        (522, batch(&node, 2, Some(own_epoch))),
    ];
    let mut full_rounds = Vec::new();
    let mut now = T0;
    for round in 1..=600u64 {
        for (_, b) in words.iter().filter(|(r, _)| *r == round) {
            node.handle_grant_batch(now, b);
        }
        node.handle_tick(now);
        while let Some(t) = node.poll_transmit() {
            if let Transmit::Report(r) = t
                && let Some(chunk) = r.full_report
            {
                assert_eq!((chunk.index, chunk.count), (0, 1));
                assert!(r.entries.iter().any(|e| e.key_window == kw), "{r:?}");
                full_rounds.push(round);
            }
        }
        now = bus_schemas::Now {
            wall_ms: now.wall_ms + 25,
            mono_ms: now.mono_ms + 25,
        };
    }
    assert_eq!(full_rounds, [1, 9, 25, 57, 121, 249, 505, 520]);
    assert_eq!(node.stats().full_reports_sent, 8);
    assert_eq!(node.full_reports_owed(), 0);
}
