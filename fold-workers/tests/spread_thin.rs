//! C4: a key spread thin over the fleet (`OwnerConfig::spread_lines`) is granted from
//! its nodes' smoothed demand, not from the one request a node saw last round.

mod common;

use bus_schemas::{KeyId, KeyWindow, NodeId, Now, ReportEntry, WindowId};
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
