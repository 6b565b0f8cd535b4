//! C10: a hot key's reports go to the hot lane and are folded at the tick; every other
//! key's grant still leaves in reply to its report.

mod common;

use bus_schemas::{KeyWindow, NodeId, Now, ReportEntry, WindowId};
use common::{batch, key, line};
use fold_workers::FoldOwner;

const NODES: u32 = 20;

fn kw(i: u128, now: Now) -> KeyWindow {
    KeyWindow {
        key: key(i),
        window: WindowId {
            length_ms: 60_000,
            // A window that is open now whatever the key's phase.
            number: now.wall_ms / 60_000,
        },
    }
}

/// A line from a node that has spent every unit of the `spent` credit it was granted.
fn entry(kw: KeyWindow, spent: u64) -> ReportEntry {
    ReportEntry {
        cumulative_spend: spent,
        demand: 10_000,
        applied_grant: spent,
        ..line(kw, 1_000_000)
    }
}

#[test]
fn a_hot_key_is_folded_once_per_round_and_the_others_at_once() {
    let mut now = common::START;
    let mut owner = common::owner(NODES);
    let mut seq = 0;
    let mut hot_total = [0u64; NODES as usize];
    let round = |owner: &mut FoldOwner,
                 now: Now,
                 seq: &mut u64,
                 hot_total: &mut [u64; NODES as usize]|
     -> Vec<(NodeId, KeyWindow)> {
        *seq += 1;
        let mut granted = Vec::new();
        for n in 0..NODES {
            // Key 0 is reported by every node with many lines' worth of work; two new keys
            // per node per round by that node alone (new, so each still wants credit).
            let spent = hot_total[n as usize];
            let mut entries: Vec<ReportEntry> = (0..8).map(|_| entry(kw(0, now), spent)).collect();
            entries.extend(
                (1..=2).map(|j| entry(kw(u128::from(*seq as u32 * 100 + n * 2 + j), now), 0)),
            );
            owner.handle_report_batch(now, &batch(n, *seq, now, entries));
            while let Some(g) = owner.poll_grant() {
                for e in &g.entries {
                    if e.key_window.key == key(0) {
                        hot_total[g.node.0 as usize] = e.credit_total;
                    }
                    granted.push((g.node, e.key_window));
                }
            }
        }
        granted
    };
    let first = round(&mut owner, now, &mut seq, &mut hot_total);
    assert!(
        first.iter().any(|(_, k)| k.key == key(0)),
        "not hot yet: folded at once"
    );
    owner.handle_tick(now);
    assert_eq!(
        owner.hot_keys(),
        &[key(0)],
        "key 0 carries most of the work"
    );
    while owner.poll_grant().is_some() {}
    now.wall_ms += 25;
    now.mono_ms += 25;
    let second = round(&mut owner, now, &mut seq, &mut hot_total);
    assert!(
        second.iter().all(|(_, k)| k.key != key(0)),
        "the hot key waits for the tick"
    );
    assert_eq!(
        second.len(),
        (NODES * 2) as usize,
        "every other key's grant left in reply to its report"
    );
    owner.handle_tick(now);
    let mut hot_grants = Vec::new();
    while let Some(g) = owner.poll_grant() {
        hot_grants.extend(g.entries.iter().map(|e| (g.node, e.key_window.key)));
    }
    assert!(hot_grants.iter().all(|(_, k)| *k == key(0)));
    assert!(!hot_grants.is_empty(), "the hot lane folded at the tick");
    let stats = owner.stats();
    assert!(stats.hot_deferred >= u64::from(NODES));
    assert!(stats.fold_age_rounds_hot.iter().sum::<u64>() > 0);
    owner.check_invariants().unwrap();
}
