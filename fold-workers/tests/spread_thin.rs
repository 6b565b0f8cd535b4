//! C4: a key spread thin over the fleet (`OwnerConfig::spread_lines`) is granted from
//! its nodes' smoothed demand, not from the one request a node saw last round.

mod common;

use bus_schemas::{
    FastPathOutcome, FastPathRequest, KeyId, KeyWindow, NodeEpoch, NodeId, Now, OwnerEpoch,
    ReportEntry, ShardId, WindowId,
};
use common::{batch, line};
use fold_workers::FoldOwner;

fn kw(key: u128, now: Now) -> KeyWindow {
    KeyWindow {
        key: KeyId {
            version: 1,
            digest: key,
        },
        window: WindowId {
            length_ms: 1_000,
            // A window that is open now whatever the key's phase.
            number: now.wall_ms / 1_000,
        },
    }
}

/// What node `node` is granted for `kw` in reply to a line advertising `demand`.
fn report(owner: &mut FoldOwner, now: Now, node: u32, kw: KeyWindow, demand: u64) -> u64 {
    let entry = ReportEntry {
        demand,
        ..line(kw, 40)
    };
    owner.handle_report_batch(now, &batch(node, 1, now, vec![entry]));
    let mut granted = 0;
    while let Some(batch) = owner.poll_grant() {
        for g in batch.entries {
            if batch.node == NodeId(node) && g.key_window == kw {
                granted = granted.max(g.credit_total);
            }
        }
    }
    granted
}

#[test]
fn one_request_at_a_node_of_a_thinly_spread_key_is_not_a_request_every_round() {
    let now = common::START;
    let spread = common::config(20).spread_lines as u32;
    let mut owner = common::owner(20);
    // Key 1: as many nodes as make it thin, each seeing a request every few rounds.
    let thin = kw(1, now);
    for n in 0..spread {
        report(&mut owner, now, n, thin, 200);
    }
    // Key 2: two nodes, one of them as slow.
    let pinned = kw(2, now);
    report(&mut owner, now, 0, pinned, 200);
    // Then a node sees one request in a round, which it reports as 1,000 thousandths.
    let to_thin = report(&mut owner, now, spread, thin, 1_000);
    let to_pinned = report(&mut owner, now, 1, pinned, 1_000);
    // Two rounds' lead at h 1.25 plus a Poisson sigma, each rounded up: 3 + 2 units at a
    // request a round, 1 + 1 at the eighth of it the node's smoothing would show.
    assert_eq!(to_pinned, 5, "a key on few nodes keeps the burst reading");
    assert_eq!(
        to_thin, 2,
        "a thin key's node is not granted a burst for one request"
    );
    // Four requests in a node's last round are an eighth of the step too (500): two
    // rounds of it at h 1.25 plus a sigma, 2 + 1, not the 10 + 3 of a burst reading.
    assert_eq!(report(&mut owner, now, spread + 1, thin, 4_000), 3);
}

/// A fresh owner and key `key`'s 40-unit window at `common::START`, in its endgame on
/// five nodes: busy nodes take most of it. From the first report on, every line's full
/// want is more than half of what is left, so each is granted one round of h x demand:
/// 13, 13 and 8. While the key is on few nodes that round is rounded up: nodes 3 and 4,
/// at half a request a round, get a unit each, and 4 are left. The next line with demand
/// makes the key-window spread thin.
fn thin_endgame(key: u128) -> (FoldOwner, Now, KeyWindow) {
    let now = common::START;
    let mut owner = common::owner(20);
    let kw = kw(key, now);
    assert_eq!(common::config(20).spread_lines, 6);
    assert_eq!(report(&mut owner, now, 0, kw, 10_000), 13);
    assert_eq!(report(&mut owner, now, 1, kw, 10_000), 13);
    assert_eq!(report(&mut owner, now, 2, kw, 6_000), 8);
    for n in 3..5 {
        assert_eq!(report(&mut owner, now, n, kw, 500), 1, "node {n}");
    }
    (owner, now, kw)
}

/// Node `node`'s fast path for `kw`, at half a request a round.
fn fast_path(owner: &mut FoldOwner, now: Now, node: u32, kw: KeyWindow) -> FastPathOutcome {
    owner
        .handle_fast_path_request(
            now,
            &FastPathRequest {
                node: NodeId(node),
                node_epoch: NodeEpoch(1),
                shard: ShardId(0),
                request_id: u64::from(node),
                owner_epoch_seen: OwnerEpoch(1),
                entry: ReportEntry {
                    demand: 500,
                    ..line(kw, 40)
                },
            },
        )
        .outcome
}

#[test]
fn near_the_end_of_a_thin_pool_a_node_short_of_a_request_a_round_holds_nothing() {
    let (mut owner, now, kw) = thin_endgame(3);
    // The line that makes it thin, and every one after it, gets only whole requests
    // of half a round of h x demand: nothing at half a request, and nothing for two
    // requests in the node's last round, which a key-window spread thin takes in as
    // the node's smoothing would (250 thousandths; 2 units at once before).
    assert_eq!(report(&mut owner, now, 5, kw, 500), 0);
    assert_eq!(report(&mut owner, now, 6, kw, 500), 0);
    assert_eq!(report(&mut owner, now, 7, kw, 2_000), 0);
    // What it kept goes to the node a request comes to, through the fast path.
    match fast_path(&mut owner, now, 6, kw) {
        FastPathOutcome::Granted(g) => assert_eq!((g.credit_total, g.exhausted), (1, false)),
        other => panic!("the fast path was refused: {other:?}"),
    }
}

#[test]
fn near_the_end_of_a_thin_pool_a_busy_node_holds_half_a_round() {
    let (mut owner, now, kw) = thin_endgame(6);
    assert_eq!(report(&mut owner, now, 5, kw, 500), 0);
    // Node 2, at six requests a round, has spent the 8 it held. Half a round of h x
    // demand is 3.75: 3 units of the 4 left (a whole round would take all 4).
    let spent = ReportEntry {
        demand: 6_000,
        cumulative_spend: 8,
        applied_grant: 8,
        ..line(kw, 40)
    };
    owner.handle_report_batch(now, &batch(2, 2, now, vec![spent]));
    assert_eq!(grants(&mut owner, kw), vec![(NodeId(2), 11, false)]);
}

#[test]
fn credit_handed_back_in_a_thin_pool_reopens_the_fast_path_of_the_nodes_told_it_was_spent() {
    let (mut owner, now, kw) = thin_endgame(4);
    for n in 5..9 {
        assert_eq!(report(&mut owner, now, n, kw, 500), 0);
    }
    // Four requests on four nodes take the last 4 units through the fast path; the
    // one that takes the last is told the pool is spent, and stops asking.
    for n in 5..9 {
        match fast_path(&mut owner, now, n, kw) {
            FastPathOutcome::Granted(g) => {
                assert_eq!((g.credit_total, g.exhausted), (1, n == 8), "node {n}")
            }
            other => panic!("node {n}'s fast path was refused: {other:?}"),
        }
    }
    // Node 3 hands its unit back (its idle return). Spread thin, its round's want is
    // nothing, so nothing is granted back to it. In the same step, node 8 is told the
    // pool is open again, and no credit is placed: the node a request comes to asks
    // for it. Nothing goes back to node 3.
    assert_eq!(
        quiet_return(&mut owner, now, 3, kw, 1),
        vec![(NodeId(8), 1, false)]
    );
}

/// Every grant entry for `kw` sent since: (node, credit total, exhausted).
fn grants(owner: &mut FoldOwner, kw: KeyWindow) -> Vec<(NodeId, u64, bool)> {
    let mut got = Vec::new();
    while let Some(b) = owner.poll_grant() {
        for g in b.entries.iter().filter(|g| g.key_window == kw) {
            got.push((b.node, g.credit_total, g.exhausted));
        }
    }
    got
}

/// D5: a node may ask once a round. In a key-window spread thin, while a quarter of
/// its pool is still unissued, the answer covers a second request of the round too;
/// past that (`near_the_end_of_a_thin_pool_..` above), one unit.
#[test]
fn early_in_a_thin_pool_a_fast_path_covers_a_second_request_of_the_round() {
    let now = common::START;
    let mut owner = common::owner(20);
    let kw = kw(5, now);
    assert_eq!(common::config(20).spread_lines, 6);
    // Two busy nodes take 26 of the 40; three slow ones a unit each (one round of h x
    // demand, rounded up, while the key is on few nodes); the sixth line makes the
    // key-window thin and gets nothing. 11 are left: more than a quarter of the pool,
    // less than half (so a new node's 1/fleet share does not apply).
    assert_eq!(report(&mut owner, now, 0, kw, 10_000), 13);
    assert_eq!(report(&mut owner, now, 1, kw, 10_000), 13);
    for n in 2..5 {
        assert_eq!(report(&mut owner, now, n, kw, 200), 1, "node {n}");
    }
    assert_eq!(report(&mut owner, now, 5, kw, 200), 0);
    // A node the key has just reached, with no demand on record: one round of pace is
    // a single unit, and the second request's unit comes with it.
    let reply = owner.handle_fast_path_request(
        now,
        &FastPathRequest {
            node: NodeId(6),
            node_epoch: NodeEpoch(1),
            shard: ShardId(0),
            request_id: 1,
            owner_epoch_seen: OwnerEpoch(1),
            entry: ReportEntry {
                demand: 0,
                ..line(kw, 40)
            },
        },
    );
    match reply.outcome {
        FastPathOutcome::Granted(g) => assert_eq!((g.credit_total, g.exhausted), (2, false)),
        other => panic!("the fast path was refused: {other:?}"),
    }
    owner
        .check_invariants()
        .expect("outstanding credit within the allowance");
}

/// A fast path advertises the key's recent peak; in a key-window spread thin the owner
/// takes a rise in it as it takes a reported one (`one_request_at_a_node_..`), whatever
/// the line held before and however far it jumps.
#[test]
fn a_fast_path_in_a_thin_key_window_is_granted_for_its_request_not_for_a_burst_reading() {
    let now = common::START;
    let mut owner = common::owner(20);
    let kw = kw(7, now);
    // Node 0 at 300 thousandths before the key-window is thin: two units.
    assert_eq!(report(&mut owner, now, 0, kw, 300), 2);
    for n in 1..6 {
        assert_eq!(report(&mut owner, now, n, kw, 200), 2, "node {n}");
    }
    // Node 0 spent both and asks, advertising four requests in its last round. Taken in
    // as an eighth of the step (763), two rounds of it at h 1.25 plus a sigma are 2 + 2
    // units; read at once, 10 + 3.
    let reply = owner.handle_fast_path_request(
        now,
        &FastPathRequest {
            node: NodeId(0),
            node_epoch: NodeEpoch(1),
            shard: ShardId(0),
            request_id: 1,
            owner_epoch_seen: OwnerEpoch(1),
            entry: ReportEntry {
                demand: 4_000,
                cumulative_spend: 2,
                applied_grant: 2,
                ..line(kw, 40)
            },
        },
    );
    match reply.outcome {
        FastPathOutcome::Granted(g) => assert_eq!(g.credit_total, 2 + 4),
        other => panic!("the fast path was refused: {other:?}"),
    }
}

/// Node `node` (its second batch) hands back the `units` it held, its demand gone to
/// nothing: the grant entries for `kw` that come back.
fn quiet_return(
    owner: &mut FoldOwner,
    now: Now,
    node: u32,
    kw: KeyWindow,
    units: u64,
) -> Vec<(NodeId, u64, bool)> {
    let returned = ReportEntry {
        applied_grant: units,
        returned: units,
        ..line(kw, 40)
    };
    owner.handle_report_batch(now, &batch(node, 2, now, vec![returned]));
    grants(owner, kw)
}

#[test]
fn while_half_a_thin_pool_is_unissued_a_quiet_node_is_topped_up_to_two_units() {
    let now = common::START;
    let mut owner = common::owner(20);
    let kw = kw(8, now);
    for n in 0..7 {
        assert_eq!(report(&mut owner, now, n, kw, 200), 2, "node {n}");
    }
    // Node 0 goes quiet and hands its 2 back. Six lines still report demand, so the
    // key-window is thin, and 28 of 40 are unissued: it gets 2 again (its total 4).
    assert_eq!(
        quiet_return(&mut owner, now, 0, kw, 2),
        vec![(NodeId(0), 4, false)]
    );
    // Five more lines: 24 issued. Node 1's 2 back leave 18 unissued, under half, so
    // what it hands back stays in the pool.
    for n in 7..12 {
        assert_eq!(report(&mut owner, now, n, kw, 200), 2, "node {n}");
    }
    assert_eq!(quiet_return(&mut owner, now, 1, kw, 2), vec![]);
}
