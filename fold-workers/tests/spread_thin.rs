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
    // Two rounds' lead at h 1.25 plus two Poisson sigmas: 6 units at a request a round,
    // 2 at the eighth of it the node's smoothing would show.
    assert_eq!(to_pinned, 6, "a key on few nodes keeps the burst reading");
    assert_eq!(
        to_thin, 2,
        "a thin key's node is not granted a burst for one request"
    );
}

#[test]
fn near_the_end_of_a_thin_pool_a_node_short_of_a_request_a_round_holds_nothing() {
    let now = common::START;
    let spread = common::config(20).spread_lines as u32;
    let mut owner = common::owner(20);
    let kw = kw(3, now);
    // Busy nodes take most of the 40. From the first report on, the pool is in its
    // endgame (every line's full want is more than half of what is left), so each is
    // granted one round of h x demand: 13, 13 and 8, and 6 are left.
    assert_eq!(report(&mut owner, now, 0, kw, 10_000), 13);
    assert_eq!(report(&mut owner, now, 1, kw, 10_000), 13);
    assert_eq!(report(&mut owner, now, 2, kw, 6_000), 8);
    // While the key is on few nodes, a round's demand is rounded up: a unit each.
    for n in 3..spread - 1 {
        assert_eq!(report(&mut owner, now, n, kw, 500), 1, "node {n}");
    }
    // The line that makes it thin, and every one after it, gets only whole requests
    // of a round: nothing at half a request, 2 (not 3) at two requests a round.
    assert_eq!(report(&mut owner, now, spread - 1, kw, 500), 0);
    assert_eq!(report(&mut owner, now, spread, kw, 500), 0);
    assert_eq!(report(&mut owner, now, spread + 1, kw, 2_000), 2);
    // What it kept goes to the node a request comes to, through the fast path.
    let reply = owner.handle_fast_path_request(
        now,
        &FastPathRequest {
            node: NodeId(spread),
            node_epoch: NodeEpoch(1),
            shard: ShardId(0),
            request_id: 1,
            owner_epoch_seen: OwnerEpoch(1),
            entry: ReportEntry {
                demand: 500,
                ..line(kw, 40)
            },
        },
    );
    match reply.outcome {
        FastPathOutcome::Granted(g) => assert_eq!((g.credit_total, g.exhausted), (1, false)),
        other => panic!("the fast path was refused: {other:?}"),
    }
}
