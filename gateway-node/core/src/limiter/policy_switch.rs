//! P1: a new policy version reaching this node. A key whose plan changed gets a new
//! bucket; the credit its live windows hold moves with it, window length by window
//! length, and credit for a length the new plan drops goes back to the owner.
//!
//! Rare and whole-surface, so it favours plain steps over speed: list who changes, list
//! their records, then per key swap the bucket and rebook the records.

use bus_schemas::hashing::DetMap;
use bus_schemas::{KeyId, KeyWindow, Now};

use super::NodeLimiter;
use super::track::{Installed, KeyState, KeyTrack, Place};
use crate::credit;
use crate::policy::KeyPolicy;

/// One record of a switching key: its key-window, the plan slot it holds now and the
/// slot its window length has in the new plan (`None`: the new plan has no window of
/// that length).
type Move = (KeyWindow, usize, Option<usize>);

impl NodeLimiter {
    /// P1: policy version `version` is now in force; `resolve` gives each key's policy in
    /// it (`None`: the key is not in it, and keeps what it has). Versions only move
    /// forward, so a late or repeated switch changes nothing.
    ///
    /// What changes when: a window already open keeps the allowance it started with, here
    /// and at the owner (a switch must not strand or revoke credit mid-window); every
    /// window that opens after the switch uses the new plan. A key whose windows changed
    /// gets a new bucket; credit held for a window length both plans share moves into it,
    /// and credit for a length the new plan drops goes back to the owner as returned.
    /// Returns how many keys switched.
    pub fn handle_policy(
        &mut self,
        now: Now,
        version: u64,
        resolve: impl Fn(&KeyId) -> Option<KeyPolicy>,
    ) -> usize {
        if version <= self.policy_version {
            return 0;
        }
        self.policy_version = version;
        let changed = self.policies_changed(resolve);
        if changed.is_empty() {
            return 0;
        }
        // Rare: the next round visits every key rather than work out whose schedule
        // the switch moved.
        self.visit_all = true;
        // A window a request opened since the last round has no record yet: booked now,
        // it moves with the others instead of staying behind in the old bucket.
        let surface = std::sync::Arc::clone(&self.surface);
        for (key, _) in &changed {
            if let Some(bucket) = surface.get(key) {
                self.adopt_opened(now, *key, &bucket);
                self.book_loans(*key, &bucket);
            }
        }
        let mut moves = self.records_to_move(&changed);
        let mut switched = 0;
        for (key, policy) in changed {
            let list = moves.remove(&key).unwrap_or_default();
            if self.switch_key(key, policy, list) {
                switched += 1;
            }
        }
        self.stats.policy_switched += switched as u64;
        switched
    }

    /// The keys on the surface whose policy in the new version differs from their
    /// bucket's, in key order.
    fn policies_changed(
        &self,
        resolve: impl Fn(&KeyId) -> Option<KeyPolicy>,
    ) -> Vec<(KeyId, KeyPolicy)> {
        let mut changed: Vec<(KeyId, KeyPolicy)> = Vec::new();
        self.surface.for_each(|key, bucket| {
            if let Some(new) = resolve(&key)
                && new != *bucket.policy()
            {
                changed.push((key, new));
            }
        });
        changed.sort_unstable_by_key(|(k, _)| *k);
        changed
    }

    /// Every record of a switching key, with the slot its window length has in the new
    /// plan.
    fn records_to_move(&self, changed: &[(KeyId, KeyPolicy)]) -> DetMap<KeyId, Vec<Move>> {
        let switching: DetMap<KeyId, KeyPolicy> = changed.iter().copied().collect();
        let mut moves: DetMap<KeyId, Vec<Move>> = DetMap::default();
        for (key, state) in &self.keys {
            let Some(policy) = switching.get(key) else {
                continue;
            };
            for (window, rec) in &state.records {
                let kw = KeyWindow {
                    key: *key,
                    window: *window,
                };
                let new_slot = policy
                    .windows()
                    .iter()
                    .position(|w| w.length_ms == kw.window.length_ms);
                moves
                    .entry(kw.key)
                    .or_default()
                    .push((kw, usize::from(rec.slot), new_slot));
            }
        }
        moves
    }

    /// Gives `key` a bucket for `policy`, moving its live windows' credit across; then
    /// rebooks its records. False if the key has no bucket.
    fn switch_key(&mut self, key: KeyId, policy: KeyPolicy, mut list: Vec<Move>) -> bool {
        list.sort_unstable_by_key(|(kw, _, _)| *kw);
        let live: Vec<bool> = list
            .iter()
            .map(|(kw, _, _)| self.record(kw).expect("listed").place == Place::Live)
            .collect();
        let exhausted: Vec<bool> = list
            .iter()
            .map(|(kw, _, _)| self.record(kw).expect("listed").exhausted)
            .collect();
        let mut taken = vec![0u64; list.len()];
        let replaced = self.surface.replace_bucket(key, policy, |old, new| {
            for (i, (kw, old_slot, new_slot)) in list.iter().enumerate() {
                if !live[i] {
                    continue;
                }
                let number = kw.window.number;
                taken[i] = credit::close(old.word(*old_slot, kw.window), number).unwrap_or(0);
                if let Some(slot) = new_slot {
                    credit::fill(new.word(*slot, kw.window), number, taken[i], exhausted[i]);
                }
            }
        });
        if !replaced {
            return false;
        }
        self.rebook(key, &list, &live, &taken);
        true
    }

    /// A switched key's records after the move: each keeps its place under the new
    /// plan's slot, and credit for a length the new plan drops (`taken` from the word,
    /// or held off it) goes back to the owner (C4).
    fn rebook(&mut self, key: KeyId, list: &[Move], live: &[bool], taken: &[u64]) {
        let KeyState { track, records, .. } = self.keys.entry(key).or_default();
        let track = track.get_or_insert_with(KeyTrack::default);
        track.installed = Installed::default();
        for (i, (kw, _, new_slot)) in list.iter().enumerate() {
            self.log.note(*kw);
            let rec = records
                .iter_mut()
                .find(|(w, _)| *w == kw.window)
                .map(|(_, r)| r)
                .expect("listed from records");
            match (new_slot, live[i], rec.place) {
                (Some(slot), true, _) => {
                    rec.slot = *slot as u8;
                    track.installed.set(
                        *slot,
                        credit::parity(kw.window.number),
                        Some(kw.window.number),
                    );
                }
                (Some(slot), false, _) => rec.slot = *slot as u8,
                (None, true, _) => {
                    // The new plan has no such window: hand its credit back (C4).
                    rec.returned += taken[i];
                    self.stats.credit_returned += taken[i];
                    rec.place = Place::Off { credit: 0 };
                }
                (None, false, Place::Off { credit }) => {
                    rec.returned += credit;
                    self.stats.credit_returned += credit;
                    rec.place = Place::Off { credit: 0 };
                }
                (None, false, _) => {}
            }
        }
    }
}
