//! P1 mid-window: a node on a tightened policy reports a lower allowance for a window the
//! owner has already issued credit in. The owner takes it as far as the credit out
//! allows, and goes on granting the shard's other key-windows: before, it lowered the
//! ledger below what it had issued, read its own invariant as broken and halted the
//! whole shard.

mod common;

use bus_schemas::{KeyWindow, ReportEntry};
use common::{batch, line};
use fold_workers::FoldOwner;

fn grants_to(owner: &mut FoldOwner, node: u32, kw: KeyWindow) -> u64 {
    let mut total = 0;
    while let Some(b) = owner.poll_grant() {
        for g in b.entries {
            if b.node.0 == node && g.key_window == kw {
                total = total.max(g.credit_total);
            }
        }
    }
    total
}

#[test]
fn a_lower_allowance_mid_window_bounds_the_rest_of_it_without_halting_the_owner() {
    let now = common::START;
    let mut owner = common::owner(4);
    let window = common::minute_window;
    let (busy, other) = (window(1), window(2));
    // Node 0, on the old policy (1,000 a window), is granted plenty.
    let demand = |kw, allowance, demand| ReportEntry {
        demand,
        ..line(kw, allowance)
    };
    owner.handle_report_batch(now, &batch(0, 1, now, vec![demand(busy, 1_000, 50_000)]));
    let issued = grants_to(&mut owner, 0, busy);
    assert!(issued > 50, "the old policy's grant: {issued}");
    // Node 1, on the new policy (50 a window), reports the same key-window.
    owner.handle_report_batch(now, &batch(1, 1, now, vec![demand(busy, 50, 5_000)]));
    assert_eq!(grants_to(&mut owner, 1, busy), 0, "nothing left under it");
    assert_eq!(owner.check_invariants(), Ok(()));
    assert!(owner.halted().is_none());
    // The shard's other keys are still served.
    owner.handle_report_batch(now, &batch(1, 2, now, vec![demand(other, 50, 5_000)]));
    assert!(
        grants_to(&mut owner, 1, other) > 0,
        "the shard still grants"
    );
    assert_eq!(owner.check_invariants(), Ok(()));
}
