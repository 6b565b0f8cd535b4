//! P1: a node moves its buckets to a new policy version atomically, without stranding or
//! revoking credit mid-window.

mod support;

use bus_schemas::{KeyWindow, Now, WindowSpec};
use gateway_node::window::{window_at, window_end_ms};
use gateway_node::{Decision, KeyPolicy};
use support::*;

fn w(length_ms: u32, limit: u64) -> WindowSpec {
    WindowSpec { length_ms, limit }
}

fn kw(i: u64, length_ms: u32, wall_ms: u64) -> KeyWindow {
    KeyWindow {
        key: key(i),
        window: window_at(key(i), length_ms, wall_ms),
    }
}

#[test]
fn a_raised_limit_applies_from_the_next_window_and_keeps_held_credit() {
    let (mut node, old) = fixed_node(&[w(1_000, 100), w(60_000, 1_000)], 1_024);
    let surface = node.surface().clone();
    // A key's first request makes its bucket; the tick then installs the fixed shares.
    let _ = surface.decide(key(0), T0.wall_ms, &old);
    node.handle_tick(T0);
    for _ in 0..10 {
        assert_eq!(surface.decide(key(0), T0.wall_ms, &old), Decision::Admit);
    }
    let now = Now {
        wall_ms: T0.wall_ms + 25,
        mono_ms: T0.mono_ms + 25,
    };
    node.handle_tick(now);
    let current = kw(0, 1_000, now.wall_ms);
    let before = node.line_for(&current).unwrap();
    assert_eq!(before.allowance, 100);

    let new = KeyPolicy::new(&[w(1_000, 200), w(60_000, 1_000)], 25).unwrap();
    assert_eq!(node.handle_policy(now, 1, |_| Some(new)), 1);
    assert_eq!(
        node.handle_policy(now, 1, |_| Some(new)),
        0,
        "same version: nothing"
    );
    let after = node.line_for(&current).unwrap();
    assert_eq!(
        after, before,
        "the open window keeps its allowance and its credit"
    );
    node.check_invariants().unwrap();
    assert_eq!(surface.decide(key(0), now.wall_ms, &new), Decision::Admit);

    // The next 1 s window opens under the new plan.
    let end = window_end_ms(key(0), current.window);
    let later = Now {
        wall_ms: end + 1,
        mono_ms: now.mono_ms + (end + 1 - now.wall_ms),
    };
    node.handle_tick(later);
    assert_eq!(surface.decide(key(0), later.wall_ms, &new), Decision::Admit);
    node.handle_tick(later);
    let next = kw(0, 1_000, later.wall_ms);
    assert_eq!(node.line_for(&next).unwrap().allowance, 200);
    node.check_invariants().unwrap();
    assert_eq!(node.policy_version(), 1);
}

#[test]
fn a_dropped_window_hands_its_credit_back_and_stops_denying() {
    let (mut node, old) = fixed_node(&[w(1_000, 100), w(60_000, 20)], 1_024);
    let surface = node.surface().clone();
    let _ = surface.decide(key(0), T0.wall_ms, &old);
    node.handle_tick(T0);
    let mut admitted = 0;
    for _ in 0..40 {
        admitted += u32::from(surface.decide(key(0), T0.wall_ms, &old) == Decision::Admit);
    }
    // The 60 s window (20, 98% held here in fixed mode) is the one that denies.
    assert!(admitted < 40);
    let long = kw(0, 60_000, T0.wall_ms);
    let held = node.line_for(&long).unwrap();

    let new = KeyPolicy::new(&[w(1_000, 100)], 25).unwrap();
    assert_eq!(node.handle_policy(T0, 2, |_| Some(new)), 1);
    let gone = node.line_for(&long).unwrap();
    assert_eq!(gone.held_credit, 0);
    assert_eq!(gone.returned, held.returned + held.held_credit);
    assert_eq!(
        gone.cumulative_spend, held.cumulative_spend,
        "spend is never lost"
    );
    node.check_invariants().unwrap();
    // Only the 1 s window is charged now.
    assert_eq!(surface.decide(key(0), T0.wall_ms, &new), Decision::Admit);
    let short = kw(0, 1_000, T0.wall_ms);
    assert_eq!(
        node.line_for(&short).unwrap().cumulative_spend,
        u64::from(admitted) + 1
    );
}

/// A grant for a window length the new plan dropped (in flight at the switch, or the
/// answer to the dropped line's next report) is never placed in the bucket: its record
/// kept the old plan's slot, which is now another window's, and installing it there
/// drained that window's credit (its number sharing the word's parity), left every
/// decision on it denied and tripped the reconciler's asserts.
#[test]
fn a_grant_for_a_dropped_window_leaves_the_other_windows_credit_alone() {
    // A moment when the key's 1 s and 60 s window numbers share their parity, so the
    // two would share a credit word in one slot, with both windows open a while yet.
    let open_for = |length_ms: u32, ms: u64| {
        window_end_ms(key(0), window_at(key(0), length_ms, ms)) - ms > 200
    };
    let at = (0..2_000u64)
        .map(|i| T0.wall_ms + i * 250)
        .find(|&ms| {
            window_at(key(0), 1_000, ms).number % 2 == window_at(key(0), 60_000, ms).number % 2
                && open_for(1_000, ms)
                && open_for(60_000, ms)
        })
        .expect("parities meet within 500 s");
    let now = Now {
        wall_ms: at,
        mono_ms: T0.mono_ms + (at - T0.wall_ms),
    };
    let old = KeyPolicy::new(&[w(1_000, 100), w(60_000, 1_000)], 25).unwrap();
    let mut node = leasing_node(1);
    let surface = node.surface().clone();
    let _ = surface.decide(key(0), now.wall_ms, &old);
    node.handle_tick(now);
    let grant = |node: &gateway_node::NodeLimiter, length_ms, seq, total| {
        grant_of(node, kw(0, length_ms, now.wall_ms), seq, total)
    };
    let (short, long) = (grant(&node, 1_000, 1, 10), grant(&node, 60_000, 1, 50));
    node.handle_grant_batch(now, &short);
    node.handle_grant_batch(now, &long);
    let new = KeyPolicy::new(&[w(60_000, 1_000)], 25).unwrap();
    assert_eq!(node.handle_policy(now, 1, |_| Some(new)), 1);
    let late = grant(&node, 1_000, 2, 20);
    node.handle_grant_batch(now, &late);
    node.check_invariants().unwrap();
    for _ in 0..5 {
        assert_eq!(surface.decide(key(0), now.wall_ms, &new), Decision::Admit);
    }
    node.handle_tick(Now {
        wall_ms: now.wall_ms + 25,
        mono_ms: now.mono_ms + 25,
    });
    node.check_invariants().unwrap();
    let line = node.line_for(&kw(0, 60_000, now.wall_ms)).unwrap();
    assert_eq!(
        (line.cumulative_spend, line.held_credit + line.returned),
        (5, 45),
        "{line:?}"
    );
}
