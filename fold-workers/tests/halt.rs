//! An owner that finds its invariant broken stops issuing credit rather than guess: the
//! report that shows the breach halts it before anything is sized from it, and from then
//! on it sends nothing at all, so its nodes see the shard's owner as gone (F1-F5).

mod common;

use bus_schemas::{FastPathOutcome, FastPathRequest, NodeEpoch, NodeId};
use common::{batch, line};

#[test]
fn a_report_showing_more_credit_out_than_the_allowance_halts_the_owner_silently() {
    let now = common::START;
    let mut owner = common::owner(4);
    let window = common::minute_window;
    let (sound, broken) = (window(1), window(2));
    let busy = |kw| bus_schemas::ReportEntry {
        demand: 5_000,
        ..line(kw, 100)
    };
    owner.handle_report_batch(now, &batch(0, 1, now, vec![busy(sound)]));
    assert!(owner.poll_grant().is_some(), "a sound report is answered");
    assert!(owner.poll_grant().is_none());
    // Node 1 holds 500 of a 100 window by its own account (say a previous owner's
    // grants): the books cannot both be right, and the owner will not guess which.
    let over = bus_schemas::ReportEntry {
        applied_grant: 500,
        ..busy(broken)
    };
    owner.handle_report_batch(now, &batch(1, 1, now, vec![busy(sound), over]));
    assert!(
        owner.halted().is_some(),
        "the breach is found in the report's step"
    );
    assert!(
        owner.poll_grant().is_none(),
        "nothing of the step goes out, not even the empty answer"
    );
    // Later reports go unanswered and fast paths are refused.
    owner.handle_report_batch(now, &batch(0, 2, now, vec![busy(sound)]));
    assert!(owner.poll_grant().is_none());
    let reply = owner.handle_fast_path_request(
        now,
        &FastPathRequest {
            node: NodeId(0),
            node_epoch: NodeEpoch(1),
            shard: bus_schemas::ShardId(0),
            request_id: 1,
            owner_epoch_seen: bus_schemas::OwnerEpoch(1),
            entry: busy(sound),
        },
    );
    assert_eq!(reply.outcome, FastPathOutcome::Withheld);
    assert!(owner.check_invariants().is_err());
}
