//! C4/A48: a node told its window is exhausted stops asking the fast path, so credit
//! another node hands back later reaches it in the same owner step as the report that
//! handed it back, not at its own next report rounds later.

mod common;

use bus_schemas::{GrantEntry, KeyId, KeyWindow, NodeId, Now, ReportEntry, WindowId};
use common::{batch, line};
use fold_workers::FoldOwner;

fn kw(now: Now) -> KeyWindow {
    KeyWindow {
        key: KeyId {
            version: 1,
            digest: 7,
        },
        window: WindowId {
            length_ms: 1_000,
            // A window that is open now whatever the key's phase.
            number: now.wall_ms / 1_000,
        },
    }
}

/// Node `node`'s report of round `seq`; the grant entries it got back for `kw`.
fn report(
    owner: &mut FoldOwner,
    now: Now,
    node: u32,
    seq: u64,
    entry: ReportEntry,
) -> Vec<GrantEntry> {
    owner.handle_report_batch(now, &batch(node, seq, now, vec![entry]));
    drain(owner, node)
}

fn drain(owner: &mut FoldOwner, node: u32) -> Vec<GrantEntry> {
    drain_all(owner)
        .into_iter()
        .filter(|(n, _)| *n == NodeId(node))
        .map(|(_, g)| g)
        .collect()
}

/// Every grant entry sent since, with the node it went to.
fn drain_all(owner: &mut FoldOwner) -> Vec<(NodeId, GrantEntry)> {
    let mut got = Vec::new();
    while let Some(b) = owner.poll_grant() {
        got.extend(b.entries.into_iter().map(|g| (b.node, g)));
    }
    got
}

#[test]
fn credit_returned_after_a_node_was_told_exhausted_reaches_it_with_the_report_that_returned_it() {
    let now = common::START;
    let kw = kw(now);
    // A 1 s window of 40: its 2% reserve rounds to 0, so the pool touching 0 is
    // exhaustion and the nodes are told so.
    let allowance = 40;
    let mut owner = common::owner(20);
    // Node 1 at two requests a round gets its lead.
    let first = report(
        &mut owner,
        now,
        1,
        1,
        ReportEntry {
            demand: 2_000,
            ..line(kw, allowance)
        },
    );
    let held = first[0].credit_total;
    assert!(held > 0 && !first[0].exhausted);
    // Node 0, far busier, takes the rest of the pool.
    let busy = report(
        &mut owner,
        now,
        0,
        1,
        ReportEntry {
            demand: 40_000,
            ..line(kw, allowance)
        },
    );
    assert_eq!(busy[0].credit_total, allowance - held);
    // Node 1 has spent what it held; nothing is left, and it is told so.
    let told = report(
        &mut owner,
        now,
        1,
        2,
        ReportEntry {
            demand: 2_000,
            cumulative_spend: held,
            applied_grant: held,
            ..line(kw, allowance)
        },
    );
    assert_eq!(told.len(), 1);
    assert!(told[0].exhausted && told[0].credit_total == held);
    // Node 0 goes quiet and hands 20 back; it wants nothing, so its own report places
    // none of it.
    let returned = 20;
    let entry = ReportEntry {
        applied_grant: allowance - held,
        returned,
        ..line(kw, allowance)
    };
    owner.handle_report_batch(now, &batch(0, 2, now, vec![entry]));
    // Node 1 sends no report (its line is not due), so the owner offers it the
    // returned credit, and reopens its fast path, in the step that took the return:
    // no tick comes between.
    let sent = drain_all(&mut owner);
    assert!(
        sent.iter().all(|(n, _)| *n == NodeId(1)),
        "{sent:?}: node 0 wants nothing, so none of it goes back there"
    );
    assert_eq!(sent.len(), 1, "node 1 is offered the returned credit");
    let g = sent[0].1;
    assert_eq!(g.key_window, kw);
    assert!(
        g.credit_total > held && g.credit_total <= held + returned,
        "{g:?}: from the returned credit and no more"
    );
    assert!(
        !g.exhausted,
        "{g:?}: credit is left, so the fast path is open"
    );
    owner
        .check_invariants()
        .expect("outstanding credit within the allowance");
    // The line is no longer starved: a tick sends nothing.
    owner.handle_tick(now);
    assert!(drain(&mut owner, 1).is_empty());
}
