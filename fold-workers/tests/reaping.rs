//! C7: a key-window's ledger goes two rounds after its window ends, not before, whatever
//! order windows of different lengths and phases end in (the owner pops them from a queue
//! ordered by end time instead of walking every ledger).

mod common;

use bus_schemas::{KeyWindow, Now, ReportEntry, WindowId};
use common::{batch, key, line};

const ROUND_MS: u64 = 25;

/// The window of `length_ms` open at `wall_ms` for key `i`, and when it ends.
fn open_window(i: u128, length_ms: u32, wall_ms: u64) -> (KeyWindow, u64) {
    let k = key(i);
    let len = u64::from(length_ms);
    let number = (wall_ms - k.phase_offset_ms(length_ms)) / len;
    let end_ms = number * len + k.phase_offset_ms(length_ms) + len;
    let kw = KeyWindow {
        key: k,
        window: WindowId { length_ms, number },
    };
    (kw, end_ms)
}

#[test]
fn ledgers_go_two_rounds_after_their_window_ends_in_end_order() {
    let start = common::START;
    let mut owner = common::owner(2);
    // Keys of two lengths at assorted phases, so end times interleave with length.
    let windows: Vec<(KeyWindow, u64)> = (0..40u128)
        .map(|i| open_window(i, if i % 3 == 0 { 60_000 } else { 1_000 }, start.wall_ms))
        .collect();
    let entries: Vec<ReportEntry> = windows
        .iter()
        .map(|(kw, _)| ReportEntry {
            cumulative_spend: 1,
            demand: 1_000,
            ..line(*kw, 100)
        })
        .collect();
    owner.handle_report_batch(start, &batch(0, 1, start, entries));
    for (kw, _) in &windows {
        assert_eq!(owner.merged_spend(kw), Some(1), "{kw:?} folded");
    }
    let keep_ms = 2 * ROUND_MS;
    let last_end_ms = windows.iter().map(|(_, end)| *end).max().expect("some");
    let mut wall_ms = start.wall_ms;
    while wall_ms <= last_end_ms + keep_ms + ROUND_MS {
        wall_ms += ROUND_MS;
        owner.handle_tick(Now {
            wall_ms,
            mono_ms: start.mono_ms + (wall_ms - start.wall_ms),
        });
        for (kw, end_ms) in &windows {
            let kept = owner.merged_spend(kw).is_some();
            assert_eq!(
                kept,
                end_ms + keep_ms > wall_ms,
                "{kw:?} ending at {end_ms}, tick at {wall_ms}"
            );
        }
    }
    assert_eq!(owner.stats().reaped, windows.len() as u64);
}
