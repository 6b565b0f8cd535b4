//! What bounds the owner's state besides `ledgers_cap`: no ledger for a window far ahead
//! of its clock (a bad node, a broken clock: it would hold a place under the cap until
//! that far-off end), no node id outside the fleet, and no end of empty lines per ledger.

mod common;

use bus_schemas::{KeyWindow, ReportEntry, WindowId};
use common::{batch, line};

#[test]
fn a_line_for_a_window_far_ahead_gets_no_ledger_and_no_credit() {
    let now = common::START;
    let mut owner = common::owner(4);
    let at = |ahead: u64| KeyWindow {
        key: common::key(u128::from(ahead)),
        window: WindowId {
            length_ms: 1_000,
            number: now.wall_ms / 1_000 + ahead,
        },
    };
    let busy = |kw| ReportEntry {
        demand: 5_000,
        ..line(kw, 40)
    };
    // The next window (a prefetch) is granted; one a minute ahead is refused.
    owner.handle_report_batch(now, &batch(0, 1, now, vec![busy(at(1)), busy(at(60))]));
    let mut granted = Vec::new();
    while let Some(b) = owner.poll_grant() {
        granted.extend(b.entries.iter().map(|g| g.key_window));
    }
    assert_eq!(granted, vec![at(1)]);
    assert_eq!(owner.stats().ledgers_refused, 1);
}

/// The owner's maps of nodes, and each ledger's lines, are bounded by the fleet: a node id
/// outside it is refused, and a restart storm's new epochs past four a node are taken in
/// only while they carry credit.
#[test]
fn node_ids_outside_the_fleet_and_a_restart_storms_empty_lines_are_refused() {
    let now = common::START;
    let mut owner = common::owner(4);
    let kw = common::minute_window(9);
    let busy = ReportEntry {
        demand: 1_000,
        ..line(kw, 1_000)
    };
    owner.handle_report_batch(now, &batch(4, 1, now, vec![busy]));
    assert!(
        owner.poll_grant().is_none(),
        "node 4 of a fleet of 4 is not answered"
    );
    assert_eq!(owner.stats().batches_misrouted, 1);
    // Node 0 restarts again and again: 16 epochs fill the ledger's lines.
    let from_epoch = |epoch: u64, entry: ReportEntry| bus_schemas::ReportBatch {
        node_epoch: bus_schemas::NodeEpoch(epoch),
        ..batch(0, 1, now, vec![entry])
    };
    for epoch in 1..=16 {
        owner.handle_report_batch(now, &from_epoch(epoch, busy));
    }
    while owner.poll_grant().is_some() {}
    assert_eq!(owner.stats().ledgers_refused, 0);
    owner.handle_report_batch(now, &from_epoch(17, busy));
    assert_eq!(
        owner.stats().ledgers_refused,
        1,
        "an empty 17th line is refused"
    );
    let spent = ReportEntry {
        cumulative_spend: 2,
        self_granted: 2,
        standing_option: false,
        ..busy
    };
    owner.handle_report_batch(now, &from_epoch(18, spent));
    assert_eq!(
        owner.stats().ledgers_refused,
        1,
        "one that spent is counted"
    );
    assert_eq!(owner.check_invariants(), Ok(()));
}
