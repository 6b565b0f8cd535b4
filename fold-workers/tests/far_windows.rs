//! A report line for a window far ahead of the owner's clock (a bad node, a broken clock)
//! gets no ledger: it would hold a place under `ledgers_cap` until that far-off end.

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
