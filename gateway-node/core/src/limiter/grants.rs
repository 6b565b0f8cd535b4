//! Credit arriving from the owners (C6) and its move into the surface's words.
//!
//! A grant is booked in its record first; `install` is the one step that moves a
//! record's credit onto its word, closing whatever older window the word still held. The
//! tick and the fast path place credit through it too.

use std::sync::Arc;

use bus_schemas::{GrantBatch, GrantEntry, KeyId, KeyWindow, Now, OwnerEpoch, WindowId};

use super::standing::UNKNOWN_ALLOWANCE;
use super::track::{KeyState, KeyTrack, Place};
use super::{Mode, NodeLimiter};
use crate::credit;
use crate::surface::KeyBucket;
use crate::window::window_end_ms;

impl NodeLimiter {
    /// C6: apply a grant batch. Each entry is a whole-bucket total, applied as
    /// `max(applied, total)` in (owner epoch, grant_seq) order, so a duplicate or a
    /// reordered older grant changes nothing.
    pub fn handle_grant_batch(&mut self, now: Now, batch: &GrantBatch) {
        if batch.node != self.config.node || batch.shard.0 >= self.config.shards {
            self.stats.batches_misrouted += 1;
            return;
        }
        if !self.accept_owner_epoch(now, batch.shard, batch.owner_epoch) {
            return;
        }
        if batch.full_report_taken == Some(self.epoch) {
            // From the owner epoch just accepted, about this node epoch's report: neither
            // an older owner nor an answer to this node's previous life can clear it.
            self.links[batch.shard.0 as usize].full_report_owed = false;
        }
        for entry in &batch.entries {
            if entry.key_window.shard(self.config.shards) != batch.shard {
                self.stats.grants_invalid += 1;
                continue;
            }
            self.apply_grant(now, batch.owner_epoch, entry);
        }
        self.publish_health(now);
    }

    /// One grant entry (C6): a whole-window total applied as `max(applied, total)`, in
    /// (owner epoch, grant_seq) order. Returns whether it was applied.
    pub(super) fn apply_grant(
        &mut self,
        now: Now,
        owner_epoch: OwnerEpoch,
        entry: &GrantEntry,
    ) -> bool {
        if entry.node_epoch != self.epoch {
            // For an earlier incarnation of this node: that credit is orphaned (C9).
            self.stats.grants_other_epoch += 1;
            return false;
        }
        let kw = entry.key_window;
        let fresh = !self.has_record(&kw);
        if fresh && window_end_ms(kw.key, kw.window) <= now.wall_ms {
            // A late or repeated grant for a window that has ended and whose record is
            // reaped: a new record would start from nothing and take the cumulative total
            // as fresh credit, although the reaped one had returned or spent part of it.
            self.stats.grants_orphaned += 1;
            return false;
        }
        let made = if !fresh {
            true
        } else if self.standing_rule().is_some() {
            // The owner manages this key-window for this node: the option goes.
            self.record_declined(kw)
        } else {
            self.record_for_grant(kw)
        };
        if !made {
            if fresh {
                self.stats.grants_orphaned += 1;
            }
            return false;
        }
        let Some(off) = self.book_grant(owner_epoch, entry) else {
            return false;
        };
        let surface = Arc::clone(&self.surface);
        if off && let Some(bucket) = surface.get(&kw.key) {
            self.install(kw.key, &bucket, kw);
        }
        if fresh || off {
            // A new line is due, and an install may have closed an older window: the
            // next tick looks at the key. A grant to a record in place changes nothing
            // a round would act on (it is not a reason to report, see `Reported`).
            self.mark_dirty(kw.key);
        }
        true
    }

    /// A record for a grant that arrived before any tick saw its key-window (the fast
    /// path on a new key, or a pre-grant for the next window). False when there is to be
    /// none: the window has ended, or the key has no bucket to say which slot it is.
    fn record_for_grant(&mut self, kw: KeyWindow) -> bool {
        let slot = self.surface.get(&kw.key).and_then(|b| {
            let windows = b.policy().windows();
            windows
                .iter()
                .position(|w| w.length_ms == kw.window.length_ms)
                .map(|i| (i, windows[i].limit))
        });
        let Some((slot, allowance)) = slot else {
            return false;
        };
        let self_granted = if self.config.mode == Mode::Fixed {
            self.config.fixed_share(allowance)
        } else {
            0
        };
        self.insert_record(kw, slot, allowance, self_granted)
    }

    /// Books `entry` in its record and adds what it grants to the record's credit, on
    /// the word or off it. `None` when it is refused (a duplicate, or above the
    /// allowance); else whether the record's credit is off its word.
    fn book_grant(&mut self, owner_epoch: OwnerEpoch, entry: &GrantEntry) -> Option<bool> {
        let kw = entry.key_window;
        let rec = self
            .keys
            .get_mut(&kw.key)
            .and_then(|s| s.rec_mut(kw.window))
            .expect("just ensured");
        if (owner_epoch, entry.grant_seq) <= (rec.owner_epoch, rec.grant_seq) {
            self.stats.grants_duplicate += 1;
            return None;
        }
        if entry.credit_total > rec.allowance + rec.returned {
            // Both sides assert the allowance: a grant above it is refused, not clamped.
            // Totals are cumulative, so credit handed back may be granted again.
            self.stats.grants_invalid += 1;
            return None;
        }
        self.log.note(kw);
        rec.owner_epoch = owner_epoch;
        rec.grant_seq = entry.grant_seq;
        rec.exhausted = entry.exhausted;
        let delta = entry.credit_total.saturating_sub(rec.applied_grant);
        rec.applied_grant = rec.applied_grant.max(entry.credit_total);
        self.stats.grants_applied += 1;
        match rec.place {
            Place::Off { credit } => {
                rec.place = Place::Off {
                    credit: credit + delta,
                }
            }
            Place::Live => {
                let slot = usize::from(rec.slot);
                if let Some(bucket) = self.surface.get(&kw.key) {
                    let added = credit::grant(
                        bucket.word(slot, kw.window),
                        kw.window.number,
                        delta,
                        entry.exhausted,
                    );
                    assert!(added, "{kw:?}: live record's word holds another window");
                }
            }
            Place::Closed { .. } => {}
        }
        Some(matches!(rec.place, Place::Off { .. }))
    }

    /// Move a record's credit into its credit word, closing whatever older window the word
    /// still held (that window ended at least one window ago: parity alternates).
    pub(super) fn install(&mut self, key: KeyId, bucket: &KeyBucket, kw: KeyWindow) {
        let Some(state) = self.keys.get_mut(&key) else {
            return;
        };
        let KeyState { track, records, .. } = state;
        let Some(rec) = records
            .iter_mut()
            .find(|(w, _)| *w == kw.window)
            .map(|(_, r)| r)
        else {
            return;
        };
        let Place::Off { credit: off_credit } = rec.place else {
            return;
        };
        // The slot is where the bucket's own plan has this window's length, not the one
        // the record was made with: a policy switch (P1) can drop or move a length, and a
        // key evicted before it keeps records from the old plan. Placed by a stale slot,
        // the credit would land in another window's word and drain it (same parity).
        let Some(slot) = bucket
            .policy()
            .windows()
            .iter()
            .position(|w| w.length_ms == kw.window.length_ms)
        else {
            // The plan has no such window now: the credit stays off the word, for the
            // record to hand back as its window closes.
            return;
        };
        rec.slot = slot as u8;
        if rec.allowance == UNKNOWN_ALLOWANCE {
            rec.allowance = bucket.policy().windows()[slot].limit;
        }
        let (exhausted, p) = (rec.exhausted, credit::parity(kw.window.number));
        let track = track.get_or_insert_with(KeyTrack::default);
        let in_word = track.installed.get(slot, p);
        if in_word.is_some_and(|n| n > kw.window.number) {
            // Credit for a window older than the one in the word (a grant backlog flushed
            // late, its record long reaped): it stays off the word, and its record closes
            // at the key's next visit, as its window has ended. Installed, it would close
            // the live window and drain its credit.
            return;
        }
        if let Some(older) = in_word.filter(|n| *n != kw.window.number) {
            let older_window = WindowId {
                length_ms: kw.window.length_ms,
                number: older,
            };
            let taken = credit::close(bucket.word(slot, older_window), older).unwrap_or(0);
            if let Some((_, old)) = records.iter_mut().find(|(w, _)| *w == older_window)
                && old.place == Place::Live
            {
                old.place = Place::Closed {
                    spend: old.received() - old.returned - taken,
                };
                self.log.note(KeyWindow {
                    key,
                    window: older_window,
                });
            }
        }
        track.installed.set(slot, p, Some(kw.window.number));
        let placed = credit::place(
            bucket.word(slot, kw.window),
            kw.window.number,
            off_credit,
            exhausted,
        );
        let allowance = match records.iter_mut().find(|(w, _)| *w == kw.window) {
            Some((_, rec)) => {
                rec.place = Place::Live;
                rec.allowance
            }
            None => return,
        };
        if placed == credit::Placed::AddedToOpened {
            // A request opened the window with this node's standing option first.
            let share = self.option_of(&kw, allowance).unwrap_or(0);
            self.book_standing(kw, share);
        }
        self.log.note(kw);
    }
}
