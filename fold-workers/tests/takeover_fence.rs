//! C8, the takeover fence: an owner that took over a shard grants nothing until every
//! fleet node has acknowledged its epoch, and a node acknowledges only in a full report
//! (every line it holds for the shard) that reached the owner whole. A partial report
//! that names the epoch is no acknowledgement: it leaves out lines that had not changed,
//! whose credit the owner would count as still in the pool.

mod common;

use bus_schemas::{FullReportChunk, GrantBatch, NodeEpoch, OwnerEpoch, ReportBatch, ReportEntry};
use common::{batch, line};
use fold_workers::FoldOwner;

const EPOCH: OwnerEpoch = OwnerEpoch(2);

/// Node `node`'s report of round `seq`, acknowledging `seen`, as chunk `full` of a full
/// report or (None) a partial one.
fn report(
    node: u32,
    seq: u64,
    seen: OwnerEpoch,
    full: Option<(u32, u32)>,
    entries: Vec<ReportEntry>,
) -> ReportBatch {
    ReportBatch {
        owner_epoch_seen: seen,
        full_report: full.map(|(index, count)| FullReportChunk { index, count }),
        ..batch(node, seq, common::START, entries)
    }
}

/// Hands `report` to the owner and returns its answer.
fn answer(owner: &mut FoldOwner, report: ReportBatch) -> GrantBatch {
    owner.handle_report_batch(common::START, &report);
    let answer = owner.poll_grant().expect("every report is answered");
    assert_eq!(answer.node, report.node);
    answer
}

#[test]
fn a_node_acknowledges_a_new_owner_only_in_a_full_report_it_has_whole() {
    let mut owner = FoldOwner::new(common::config(2), EPOCH, common::START, true);
    let busy = ReportEntry {
        demand: 5_000,
        ..line(common::minute_window(1), 100)
    };
    let node_1 =
        |owner: &mut FoldOwner, seq| answer(owner, report(1, seq, EPOCH, None, vec![busy]));

    // Node 1 acknowledges in a one-chunk full report; node 0 only names the epoch.
    let a = answer(&mut owner, report(1, 1, EPOCH, Some((0, 1)), vec![busy]));
    assert_eq!(a.full_report_taken, Some(NodeEpoch(1)));
    assert!(a.entries.is_empty(), "fenced: node 0 has not acknowledged");
    let a = answer(&mut owner, report(0, 1, EPOCH, None, vec![]));
    assert_eq!(
        a.full_report_taken, None,
        "a partial report is no acknowledgement"
    );
    assert!(node_1(&mut owner, 2).entries.is_empty(), "still fenced");

    // Node 0's full report of round 5 in two chunks. Chunk 1 twice (a duplicate), then a
    // chunk 0 that is no part of it: an older round's, one that disagrees on the count,
    // one that acknowledges an older owner.
    for stray in [
        report(0, 5, EPOCH, Some((1, 2)), vec![]),
        report(0, 5, EPOCH, Some((1, 2)), vec![]),
        report(0, 4, EPOCH, Some((0, 2)), vec![]),
        report(0, 5, EPOCH, Some((0, 3)), vec![]),
        report(0, 5, OwnerEpoch(1), Some((0, 2)), vec![]),
    ] {
        let a = answer(&mut owner, stray.clone());
        assert_eq!(a.full_report_taken, None, "{stray:?}");
        assert!(node_1(&mut owner, 3).entries.is_empty(), "{stray:?}");
    }
    let a = answer(&mut owner, report(0, 5, EPOCH, Some((0, 2)), vec![]));
    assert_eq!(
        a.full_report_taken,
        Some(NodeEpoch(1)),
        "the report is whole"
    );
    assert!(
        !node_1(&mut owner, 4).entries.is_empty(),
        "the fence is down"
    );

    // A restarted node 0 is a new epoch: what the owner took was its previous life's,
    // until the new life's own full report comes in. A delayed chunk of the earlier
    // life after that changes nothing.
    let restarted = |full| ReportBatch {
        node_epoch: NodeEpoch(9),
        ..report(0, 1, EPOCH, full, vec![])
    };
    let a = answer(&mut owner, restarted(None));
    assert_eq!(a.full_report_taken, Some(NodeEpoch(1)));
    let a = answer(&mut owner, restarted(Some((0, 1))));
    assert_eq!(a.full_report_taken, Some(NodeEpoch(9)));
    let a = answer(&mut owner, report(0, 6, EPOCH, Some((0, 1)), vec![]));
    assert_eq!(
        a.full_report_taken,
        Some(NodeEpoch(9)),
        "an earlier life's chunk"
    );
}

/// A full report whose line holding credit the owner could not take in (no room for
/// its ledger) is no acknowledgement: the owner does not know that credit.
#[test]
fn a_full_report_with_a_refused_line_is_no_acknowledgement() {
    let config = fold_workers::OwnerConfig {
        ledgers_cap: 1,
        ..common::config(1)
    };
    let mut owner = FoldOwner::new(config, EPOCH, common::START, true);
    let held = |i| ReportEntry {
        applied_grant: 10,
        held_credit: 10,
        ..line(common::minute_window(i), 100)
    };
    let a = answer(
        &mut owner,
        report(0, 1, EPOCH, Some((0, 1)), vec![held(1), held(2)]),
    );
    assert_eq!(a.full_report_taken, None, "window 2's line was refused");
    assert_eq!(owner.stats().ledgers_refused, 1);
    let a = answer(&mut owner, report(0, 2, EPOCH, Some((0, 1)), vec![held(1)]));
    assert_eq!(a.full_report_taken, Some(NodeEpoch(1)));
}

#[test]
fn an_owner_that_did_not_take_over_needs_no_full_report() {
    let mut owner = common::owner(2);
    let a = answer(&mut owner, report(0, 1, OwnerEpoch(0), None, vec![]));
    assert_eq!(a.full_report_taken, Some(NodeEpoch(1)));
}
