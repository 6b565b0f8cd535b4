//! The decision contract (D4, D5, D6) through the public surface.

mod support;

use bus_schemas::{GrantBatch, GrantEntry, KeyWindow, LimitReason, OwnerEpoch, WindowSpec};
use gateway_node::window::{window_at, window_end_ms};
use gateway_node::{Decision, RetryAfter};
use support::*;

#[test]
fn a_request_is_charged_in_every_window_or_none() {
    let (mut node, policy) = fixed_node(&two_windows(100, 3), 100);
    let k = key(1);
    let surface = node.surface().clone();
    // First sight creates the bucket; the tick installs the fixed shares (98 and 2).
    assert!(matches!(
        surface.decide(k, T0.wall_ms, &policy),
        Decision::Deny(_) | Decision::FastPath(_)
    ));
    node.handle_tick(T0);
    assert_eq!(surface.decide(k, T0.wall_ms, &policy), Decision::Admit);
    assert_eq!(surface.decide(k, T0.wall_ms, &policy), Decision::Admit);
    // Short of credit: the round's fast path goes out; with no answer it is a real 429.
    assert!(
        matches!(surface.decide(k, T0.wall_ms, &policy), Decision::FastPath(n) if n.short_windows == 0b10)
    );
    let Decision::Deny(d) = surface.decide_after_fast_path(k, T0.wall_ms, &policy, false) else {
        panic!("60 s share is spent")
    };
    assert_eq!(d.window.length_ms, 60_000);
    let short = KeyWindow {
        key: k,
        window: window_at(k, 1_000, T0.wall_ms),
    };
    let long = KeyWindow {
        key: k,
        window: window_at(k, 60_000, T0.wall_ms),
    };
    // The 1 s window was charged then refunded: its spend is exactly the two admits.
    assert_eq!(node.line_for(&short).unwrap().cumulative_spend, 2);
    assert_eq!(node.line_for(&short).unwrap().held_credit, 96);
    assert_eq!(node.line_for(&long).unwrap().cumulative_spend, 2);
    node.check_invariants().unwrap();
}

/// The general path (a plan of more than two windows, a length without a compact code,
/// or a caller holding another policy than the bucket's: a P1 switch in flight) charges
/// exactly what the inline path charges: the bucket's own windows, all or none.
#[test]
fn every_path_charges_the_buckets_own_windows_all_or_none() {
    let inline = two_windows(100, 3).to_vec();
    let uncoded = vec![
        inline[0],
        WindowSpec {
            length_ms: 16_385,
            limit: 3,
        },
    ];
    let three = vec![
        inline[0],
        WindowSpec {
            length_ms: 10_000,
            limit: 50,
        },
        WindowSpec {
            length_ms: 60_000,
            limit: 3,
        },
    ];
    let stranger = gateway_node::KeyPolicy::new(
        &[WindowSpec {
            length_ms: 2_000,
            limit: 9,
        }],
        25,
    )
    .unwrap();
    for (plan, caller_is_stranger) in [
        (&inline, false),
        (&uncoded, false),
        (&three, false),
        (&inline, true),
    ] {
        let (mut node, policy) = fixed_node(plan, 100);
        let caller = if caller_is_stranger { stranger } else { policy };
        let k = key(7);
        let surface = node.surface().clone();
        let _ = surface.decide(k, T0.wall_ms, &policy);
        node.handle_tick(T0);
        let mut admits = 0u64;
        let short = loop {
            match surface.decide(k, T0.wall_ms, &caller) {
                Decision::Admit => admits += 1,
                Decision::FastPath(n) => break n.short_windows,
                other => panic!("{plan:?}: {other:?}"),
            }
        };
        // The last window's share is 98% of 3: two admits, then it alone is short.
        assert_eq!(admits, 2, "{plan:?} stranger={caller_is_stranger}");
        assert_eq!(short, 1 << (plan.len() - 1), "{plan:?}");
        for spec in plan.iter() {
            let line = node
                .line_for(&KeyWindow {
                    key: k,
                    window: window_at(k, spec.length_ms, T0.wall_ms),
                })
                .unwrap();
            assert_eq!(line.cumulative_spend, 2, "{plan:?} {spec:?}");
            let share = spec.limit * 98 / 100;
            assert_eq!(line.held_credit, share - 2, "{plan:?} {spec:?}");
        }
        node.check_invariants().unwrap();
    }
}

/// D6 table: sub-second wait, whole seconds, and two windows that could both deny.
#[test]
fn retry_after_goes_to_the_latest_boundary_of_every_window_that_could_deny() {
    let windows = two_windows(10, 100);
    struct Case {
        name: &'static str,
        credit_1s: u64,
        credit_60s: u64,
        /// Whether the 1 s pool is spent too, or only this node's share of it.
        exhausted_1s: bool,
        expect_window_ms: u32,
        expect_both: bool,
    }
    let cases = [
        Case {
            name: "only 1 s exhausted: sub-second",
            credit_1s: 1,
            credit_60s: 50,
            exhausted_1s: true,
            expect_window_ms: 1_000,
            expect_both: false,
        },
        Case {
            name: "only 60 s exhausted: whole seconds",
            credit_1s: 5,
            credit_60s: 1,
            exhausted_1s: true,
            expect_window_ms: 60_000,
            expect_both: false,
        },
        // The body names the window the wait is for (ADR-6), not the first one short.
        Case {
            name: "both exhausted: the later boundary",
            credit_1s: 1,
            credit_60s: 1,
            exhausted_1s: true,
            expect_window_ms: 60_000,
            expect_both: true,
        },
        Case {
            name: "60 s exhausted, 1 s only empty here: the 60 s window",
            credit_1s: 1,
            credit_60s: 1,
            exhausted_1s: false,
            expect_window_ms: 60_000,
            expect_both: false,
        },
    ];
    for (i, case) in cases.iter().enumerate() {
        let mut node = leasing_node(1);
        let k = key(100 + i as u64);
        let policy = gateway_node::KeyPolicy::new(&windows, 25).unwrap();
        let surface = node.surface().clone();
        let _ = surface.decide(k, T0.wall_ms, &policy);
        node.handle_tick(T0);
        grant_at_t0(
            &mut node,
            k,
            &[
                (1_000, case.credit_1s, case.exhausted_1s),
                (60_000, case.credit_60s, true),
            ],
        );
        let now = T0.wall_ms + 10;
        assert_eq!(
            surface.decide(k, now, &policy),
            Decision::Admit,
            "{}",
            case.name
        );
        let d = loop {
            match surface.decide(k, now, &policy) {
                Decision::Admit => continue,
                Decision::Deny(d) => break d,
                Decision::FastPath(_) => {
                    match surface.decide_after_fast_path(k, now, &policy, false) {
                        Decision::Deny(d) => break d,
                        other => panic!("{}: {other:?}", case.name),
                    }
                }
                other => panic!("{}: {other:?}", case.name),
            }
        };
        assert_eq!(d.reason, LimitReason::Exhausted);
        assert_eq!(
            d.window.length_ms, case.expect_window_ms,
            "{}: denying window",
            case.name
        );
        let end_1s = window_end_ms(k, window_at(k, 1_000, now)) - now;
        let end_60s = window_end_ms(k, window_at(k, 60_000, now)) - now;
        let expected = if case.expect_both || case.expect_window_ms == 60_000 {
            end_60s.max(if case.expect_both { end_1s } else { 0 })
        } else {
            end_1s
        };
        assert_eq!(d.wait_ms, expected, "{}", case.name);
        let ra = RetryAfter::from_wait_ms(d.wait_ms);
        if expected < 1_000 {
            assert_eq!(
                (ra.header_s, ra.reset_ms),
                (0, Some(expected)),
                "{}",
                case.name
            );
        } else {
            assert_eq!(ra.header_s, expected.div_ceil(1_000), "{}", case.name);
            assert!(ra.header_s >= 1 && ra.reset_ms.is_none());
        }
        node.check_invariants().unwrap();
    }
}

/// A plan of one window of 10 requests, 25 ms rounds.
fn one_window_policy(length_ms: u32) -> gateway_node::KeyPolicy {
    gateway_node::KeyPolicy::new(
        &[WindowSpec {
            length_ms,
            limit: 10,
        }],
        25,
    )
    .unwrap()
}

/// A winner whose request is dropped mid-flight (client gone) must not strand its joiners
/// until their deadline: dropping its claim clears the in-flight flag and wakes them once.
/// A settled claim clears and wakes exactly once too.
#[test]
fn a_dropped_fast_path_winner_releases_its_joiners() {
    let mut node = leasing_node(1);
    let policy = one_window_policy(1_000);
    let surface = node.surface().clone();
    let k = key(9);
    node.handle_tick(T0);
    assert!(matches!(surface.decide(k, T0.wall_ms, &policy), Decision::FastPath(n) if !n.join));
    assert!(surface.fast_path_pending(k));
    let mut woken = 0;
    drop(surface.claim_fast_path(k, || woken += 1));
    assert!(
        !surface.fast_path_pending(k),
        "a dropped claim clears the flag"
    );
    assert_eq!(woken, 1);

    let next = bus_schemas::Now {
        wall_ms: T0.wall_ms + 25,
        mono_ms: T0.mono_ms + 25,
    };
    node.handle_tick(next);
    assert!(matches!(surface.decide(k, next.wall_ms, &policy), Decision::FastPath(n) if !n.join));
    let mut woken = 0;
    let d = surface
        .claim_fast_path(k, || woken += 1)
        .settle(next.wall_ms, &policy, true);
    assert!(matches!(d, Decision::Deny(_)));
    assert!(!surface.fast_path_pending(k));
    assert_eq!(
        woken, 1,
        "settling wakes once; the drop after it does nothing"
    );
}

#[test]
fn fast_path_is_taken_once_per_round_then_denies() {
    let mut node = leasing_node(1);
    let policy = one_window_policy(1_000);
    let surface = node.surface().clone();
    let k = key(7);
    node.handle_tick(T0);
    assert!(
        matches!(surface.decide(k, T0.wall_ms, &policy), Decision::FastPath(n) if n.short_windows == 1 && !n.join)
    );
    // While that fast path is in flight, a second request for the key joins it (sends
    // nothing, waits for its answer) rather than drawing a 429 (D5).
    assert!(surface.fast_path_pending(k));
    assert!(matches!(surface.decide(k, T0.wall_ms, &policy), Decision::FastPath(n) if n.join));
    while node.poll_transmit().is_some() {} // the tick's reports
    assert_eq!(node.handle_fast_path_need(T0, need_join(k)), 0);
    assert!(node.poll_transmit().is_none(), "a joiner sends nothing");
    let Decision::Deny(d) = surface.decide_after_fast_path(k, T0.wall_ms, &policy, true) else {
        panic!()
    };
    assert_eq!(d.reason, LimitReason::FastPathDeadline);
    // The answer is in: later requests this round are denied outright, not joined.
    assert!(!surface.fast_path_pending(k));
    assert!(matches!(
        surface.decide(k, T0.wall_ms, &policy),
        Decision::Deny(_)
    ));
    // Not exhausted, only short here: the wait is to the next round, not the boundary.
    assert!(d.wait_ms <= 25);
    let next = bus_schemas::Now {
        wall_ms: T0.wall_ms + 25,
        mono_ms: T0.mono_ms + 25,
    };
    node.handle_tick(next);
    assert!(matches!(
        surface.decide(k, next.wall_ms, &policy),
        Decision::FastPath(_)
    ));
}

#[test]
fn a_full_map_fails_open_within_the_backstop_floor() {
    let (mut node, policy) = fixed_node(
        &[WindowSpec {
            length_ms: 1_000,
            limit: 10,
        }],
        4,
    );
    let surface = node.surface().clone();
    for i in 0..4 {
        let _ = surface.decide(key(i), T0.wall_ms, &policy);
    }
    node.handle_tick(T0);
    // Four buckets holding credit: nothing can be evicted, so a fifth key fails open,
    // up to 4 x its plan rate in a second (D8), then is refused by the backstop.
    let outcomes: Vec<Decision> = (0..50)
        .map(|_| surface.decide(key(99), T0.wall_ms, &policy))
        .collect();
    let opened = outcomes
        .iter()
        .filter(|d| **d == Decision::FailOpen)
        .count();
    assert_eq!(opened, 40);
    assert!(
        matches!(outcomes[49], Decision::Deny(d) if d.reason == LimitReason::Backstop && d.degraded)
    );
}

/// D7: over the cap, only buckets with no credit are evicted, and an evicted key's spend is
/// not forgotten when it comes back in the same window.
#[test]
fn eviction_takes_only_zero_credit_buckets_and_keeps_spend() {
    let policy = one_window_policy(60_000);
    let mut node = leasing_node(1);
    let surface = node.surface().clone();
    let cap = surface.config().bucket_cap;
    let k0 = key(0);
    let _ = surface.decide(k0, T0.wall_ms, &policy);
    node.handle_tick(T0);
    let kw0 = KeyWindow {
        key: k0,
        window: window_at(k0, 60_000, T0.wall_ms),
    };
    let grant = GrantBatch {
        full_report_taken: None,
        owner_epoch: OwnerEpoch(1),
        shard: bus_schemas::ShardId(0),
        node: node.node(),
        entries: vec![GrantEntry {
            key_window: kw0,
            node_epoch: node.epoch(),
            grant_seq: 1,
            credit_total: 3,
            exhausted: false,
        }],
    };
    node.handle_grant_batch(T0, &grant);
    for _ in 0..3 {
        assert_eq!(surface.decide(k0, T0.wall_ms, &policy), Decision::Admit);
    }
    // k1 holds credit and must survive; the flood of new keys holds none.
    let k1 = key(1);
    let _ = surface.decide(k1, T0.wall_ms, &policy);
    node.handle_tick(T0);
    let kw1 = KeyWindow {
        key: k1,
        window: window_at(k1, 60_000, T0.wall_ms),
    };
    let grant1 = GrantBatch {
        full_report_taken: None,
        entries: vec![GrantEntry {
            key_window: kw1,
            node_epoch: node.epoch(),
            grant_seq: 1,
            credit_total: 5,
            exhausted: false,
        }],
        ..grant.clone()
    };
    node.handle_grant_batch(T0, &grant1);
    for i in 2..cap as u64 {
        let _ = surface.decide(key(i), T0.wall_ms, &policy);
    }
    // Each new key's first request took the fast path, which this test never answers:
    // a round later the flood is still asking (not evictable), two rounds later not.
    let round = |n: u64| bus_schemas::Now {
        wall_ms: T0.wall_ms + 25 * n,
        mono_ms: T0.mono_ms + 25 * n,
    };
    node.handle_tick(round(1));
    assert!(
        node.stats().evictions <= 1,
        "keys asking the owner stay (k0, whose ask predates the first round, may go): {}",
        node.stats().evictions
    );
    let later = round(2);
    node.handle_tick(later);
    assert!(
        surface.len() <= cap - cap / 5 + 1,
        "evicted down to the low-water mark: {}",
        surface.len()
    );
    assert!(node.stats().evictions > 0);
    assert_eq!(
        node.line_for(&kw1).unwrap().held_credit,
        5,
        "a bucket holding credit is never evicted"
    );
    // k0 (zero credit left) may have gone; its spend of 3 is still on the book.
    assert_eq!(node.line_for(&kw0).unwrap().cumulative_spend, 3);
    node.check_invariants().unwrap();
}

fn need_join(key: bus_schemas::KeyId) -> gateway_node::surface::FastPathNeed {
    gateway_node::surface::FastPathNeed {
        key,
        short_windows: 1,
        join: true,
    }
}

/// C4 per window: a window's demand is the decisions that passed every window plus those
/// it stopped. A key offered 40 a round that its 1 s window holds to 5 a second asks its
/// 1 s owner for the 40 and its 60 s owner for about what it can spend; counting every
/// attempt for every window parked the 60 s pool on nodes that could not spend it (the
/// sim's hot-key and zipf scenarios).
#[test]
fn a_window_another_window_holds_back_reports_only_the_demand_it_can_spend() {
    let (mut node, policy) = fixed_node(&two_windows(5, 100_000), 100);
    let k = key(3);
    let surface = node.surface().clone();
    let mut admitted = 0;
    let mut now = T0;
    for _round in 0..60 {
        node.handle_tick(now);
        for _ in 0..40 {
            admitted += u32::from(surface.decide(k, now.wall_ms, &policy) == Decision::Admit);
        }
        now = bus_schemas::Now {
            wall_ms: now.wall_ms + 25,
            mono_ms: now.mono_ms + 25,
        };
    }
    node.handle_tick(now);
    node.check_invariants().unwrap();
    let demand = |length_ms| {
        node.line_for(&KeyWindow {
            key: k,
            window: window_at(k, length_ms, now.wall_ms),
        })
        .unwrap()
        .demand
    };
    // 1.5 s: two or three 1 s windows of 4 (98% of 5) each.
    assert!(admitted <= 15, "{admitted}");
    // Thousandths of a request per round: the 1 s window sees all 40 a round.
    assert!(demand(1_000) >= 30_000, "1 s demand {}", demand(1_000));
    // The 60 s window sees only the admitted few: at most one 1 s window's 5 in a round,
    // where counting every attempt would report the 40.
    assert!(demand(60_000) <= 5_000, "60 s demand {}", demand(60_000));
}

/// D5 with two windows: a window the owner declared exhausted denies until its boundary,
/// so a request short there spends no fast path on the other window's owner, and its
/// wait names the exhausted window's boundary (D6).
#[test]
fn no_fast_path_while_a_short_window_is_exhausted() {
    let windows = two_windows(10, 100);
    let mut node = leasing_node(1);
    let k = key(200);
    let policy = gateway_node::KeyPolicy::new(&windows, 25).unwrap();
    let surface = node.surface().clone();
    let _ = surface.decide(k, T0.wall_ms, &policy);
    node.handle_tick(T0);
    // 1 s: one unit, more to come; 60 s: one unit and the pool is spent.
    grant_at_t0(&mut node, k, &[(1_000, 1, false), (60_000, 1, true)]);
    let now = T0.wall_ms + 10;
    let fast_paths = || {
        surface
            .stats
            .fast_path_triggered
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let before = fast_paths();
    assert_eq!(surface.decide(k, now, &policy), Decision::Admit);
    let Decision::Deny(d) = surface.decide(k, now, &policy) else {
        panic!("the 60 s pool is spent: a fast path could not help")
    };
    assert_eq!(fast_paths(), before);
    let end_60s = window_end_ms(k, window_at(k, 60_000, now)) - now;
    assert_eq!(d.wait_ms, end_60s);
    node.check_invariants().unwrap();
}

/// A plan of a 1 s and a 60 s window.
fn two_windows(limit_1s: u64, limit_60s: u64) -> [WindowSpec; 2] {
    [
        WindowSpec {
            length_ms: 1_000,
            limit: limit_1s,
        },
        WindowSpec {
            length_ms: 60_000,
            limit: limit_60s,
        },
    ]
}

/// Applies one owner grant at T0 per `(window length, credit total, exhausted)` for `k`'s
/// windows current at T0.
fn grant_at_t0(
    node: &mut gateway_node::NodeLimiter,
    k: bus_schemas::KeyId,
    grants: &[(u32, u64, bool)],
) {
    let entries = grants
        .iter()
        .map(|&(len, credit, exhausted)| GrantEntry {
            key_window: KeyWindow {
                key: k,
                window: window_at(k, len, T0.wall_ms),
            },
            node_epoch: node.epoch(),
            grant_seq: 1,
            credit_total: credit,
            exhausted,
        })
        .collect();
    let batch = GrantBatch {
        full_report_taken: None,
        owner_epoch: OwnerEpoch(1),
        shard: bus_schemas::ShardId(0),
        node: node.node(),
        entries,
    };
    node.handle_grant_batch(T0, &batch);
}

/// D5/C4: a fast path advertises at least the requests its key has had this round,
/// which no tick has seen yet: the first round of a burst sizes its grant.
#[test]
fn a_fast_path_advertises_the_requests_of_the_round_so_far() {
    let k = key(11);
    let mut run = WindowRun::new(
        k,
        40,
        gateway_node::NodeConfig {
            // The demand-driven protocol itself, without standing options.
            standing_permille: 0,
            ..gateway_node::NodeConfig::reference(bus_schemas::NodeId(0))
        },
    );
    let start = run.end_ms - 1_000;
    // One request makes the key known (its fast path unanswered), a round tracks it, and
    // the owner grants 2.
    assert!(matches!(
        run.surface.decide(k, start, &run.policy),
        Decision::FastPath(_)
    ));
    let _ = run
        .surface
        .decide_after_fast_path(k, start, &run.policy, true);
    run.round(start);
    run.grant(start, 2, false);
    // The next round: a burst of three. Two spend the grant; the third asks.
    let ms = start + 30;
    run.round(start + 25);
    while run.node.poll_transmit().is_some() {}
    run.request(ms);
    run.request(ms);
    let Decision::FastPath(need) = run.surface.decide(k, ms, &run.policy) else {
        panic!("two units, three requests")
    };
    assert_eq!(run.node.handle_fast_path_need(WindowRun::at(ms), need), 1);
    let mut advertised = None;
    while let Some(t) = run.node.poll_transmit() {
        if let gateway_node::Transmit::FastPath(f) = t {
            advertised = Some(f.entry.demand);
        }
    }
    assert_eq!(advertised, Some(3_000), "three requests this round");
}

/// A grant for a window long over (a backlog a reconnecting bus client flushes late)
/// for a key-window whose record is gone: it shares the live window's word (same slot,
/// same parity) but must not close it. It used to: the live credit was drained, later
/// grants for it were dropped, and the key was denied for the rest of its window.
#[test]
fn a_stale_grant_for_an_old_window_leaves_the_live_window_alone() {
    let policy = one_window_policy(1_000);
    let mut node = leasing_node(1);
    let surface = node.surface().clone();
    let k = key(7);
    let _ = surface.decide(k, T0.wall_ms, &policy);
    node.handle_tick(T0);
    let live = window_at(k, 1_000, T0.wall_ms);
    let at = |number: u64| KeyWindow {
        key: k,
        window: bus_schemas::WindowId {
            length_ms: 1_000,
            number,
        },
    };
    let live_grant = grant_of(&node, at(live.number), 1, 5);
    node.handle_grant_batch(T0, &live_grant);
    assert_eq!(surface.decide(k, T0.wall_ms, &policy), Decision::Admit);
    // Four windows back: the same parity, so the same word.
    let stale = grant_of(&node, at(live.number - 4), 1, 9);
    node.handle_grant_batch(T0, &stale);
    for _ in 0..4 {
        assert_eq!(surface.decide(k, T0.wall_ms, &policy), Decision::Admit);
    }
    let kw = KeyWindow {
        key: k,
        window: live,
    };
    assert_eq!(node.line_for(&kw).unwrap().cumulative_spend, 5);
    node.check_invariants().unwrap();
    // The next round closes the stale record, whose window has ended, and the books hold.
    node.handle_tick(bus_schemas::Now {
        wall_ms: T0.wall_ms + 25,
        mono_ms: T0.mono_ms + 25,
    });
    node.check_invariants().unwrap();
    assert_eq!(node.line_for(&kw).unwrap().cumulative_spend, 5);
}

/// D7 near the bucket cap: a key whose fast path is in flight is not evicted under it
/// (its answer would find no bucket and the request fail open), and a key whose first
/// request came since the last round is not the first to go.
#[test]
fn eviction_spares_a_key_whose_fast_path_is_in_flight() {
    use gateway_node::{DecisionSurface, NodeConfig, NodeLimiter, SurfaceConfig};

    let surface = std::sync::Arc::new(DecisionSurface::new(SurfaceConfig {
        bucket_cap: 10,
        ..SurfaceConfig::default()
    }));
    let mut node = NodeLimiter::new(
        NodeConfig {
            fleet_size: 1,
            shards: 1,
            // The demand-driven protocol itself, without standing options.
            standing_permille: 0,
            ..NodeConfig::reference(bus_schemas::NodeId(0))
        },
        surface.clone(),
        bus_schemas::NodeEpoch(1),
        T0,
    );
    let policy = one_window_policy(60_000);
    node.handle_tick(T0);
    let needs: Vec<_> = (0..10)
        .map(|i| match surface.decide(key(i), T0.wall_ms, &policy) {
            Decision::FastPath(need) => need,
            d => panic!("a fresh key asks the owner: {d:?}"),
        })
        .collect();
    node.handle_tick(bus_schemas::Now {
        wall_ms: T0.wall_ms + 25,
        mono_ms: T0.mono_ms + 25,
    });
    for need in needs {
        let d = surface.decide_after_fast_path(need.key, T0.wall_ms + 25, &policy, true);
        assert!(
            !matches!(d, Decision::FailOpen),
            "{:?}: its bucket went while it asked",
            need.key
        );
    }
}
