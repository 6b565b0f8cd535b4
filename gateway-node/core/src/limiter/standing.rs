//! Standing options, the reconciler's side (see `surface::standing` for the rule and the
//! request path): booking a window a request opened, taking the option when a record is
//! made, giving it back when the owner addresses the key-window, and the line's part.
//!
//! A record's `option` says this node epoch holds the node's option of its key-window;
//! `standing` is what it took of it (the record's `self_granted` includes it). The line
//! says `standing_option` only once the option is settled, taken or given up for good:
//! the word holds the window live (no request can open it any more) or the record gave
//! it back. Until then the owner counts the whole option as taken.

use bus_schemas::{KeyId, KeyWindow, Now, WindowId};

use super::track::{KeyTrack, Place, WindowRecord};
use super::{Mode, NodeLimiter};
use crate::credit;
use crate::surface::{KeyBucket, StandingRule};
use crate::window::window_at;

/// A record made before its key has a bucket has no plan to read its allowance from:
/// it says the largest the wire takes, which lowers nothing at the owner (an owner
/// takes the least allowance any line reports), until the bucket's plan replaces it
/// (`install`).
pub(super) const UNKNOWN_ALLOWANCE: u64 = bus_schemas::limits::WINDOW_LIMIT_MAX;

impl NodeLimiter {
    /// The standing rule this node epoch set on its surface, in leasing mode.
    pub(super) fn standing_rule(&self) -> Option<StandingRule> {
        (self.config.mode == Mode::Leasing)
            .then(|| self.surface.standing_rule().copied())
            .flatten()
            .filter(|r| r.standing_permille > 0)
    }

    /// This node's option of `kw` at `allowance`, if this epoch holds it (0 otherwise).
    pub(super) fn option_of(&self, kw: &KeyWindow, allowance: u64) -> Option<u64> {
        let rule = self.standing_rule()?;
        rule.entitled(kw.key, kw.window)
            .then(|| rule.share(kw.key, kw.window, allowance))
    }

    /// Every window of `key`'s plan that a request opened since the last visit (current
    /// or just ended: a request cannot open a later one), booked: a record made for it,
    /// or its record placed on the word. Runs before the visit closes ended windows.
    pub(super) fn adopt_opened(&mut self, now: Now, key: KeyId, bucket: &KeyBucket) {
        if self.standing_rule().is_none() {
            return;
        }
        // Only a decision opens a window: a key with none since its last visit has none.
        let attempts = bucket.attempts.load(std::sync::atomic::Ordering::Relaxed);
        let last = self
            .keys
            .get(&key)
            .and_then(|s| s.track.as_ref())
            .map(|t| t.last_attempts);
        if last == Some(attempts) {
            return;
        }
        for (slot, spec) in bucket.policy().windows().iter().enumerate() {
            let current = window_at(key, spec.length_ms, now.wall_ms);
            for number in [current.number, current.number.saturating_sub(1)] {
                let window = WindowId {
                    length_ms: spec.length_ms,
                    number,
                };
                if !credit::holds_live(bucket.word(slot, window), number)
                    || self.installed_here(&key, slot, number)
                {
                    continue;
                }
                let kw = KeyWindow { key, window };
                if !self.has_record(&kw) && !self.insert_record(kw, slot, spec.limit, 0) {
                    // The cap refused it: the word stays open, and the next visit tries.
                    self.mark_dirty(key);
                    continue;
                }
                self.settle_opened(bucket, kw, slot);
            }
        }
    }

    fn installed_here(&self, key: &KeyId, slot: usize, number: u64) -> bool {
        self.keys
            .get(key)
            .and_then(|s| s.track.as_ref())
            .and_then(|t| t.installed.get(slot, credit::parity(number)))
            == Some(number)
    }

    /// A record whose word a request opened: its standing is booked, credit it held off
    /// the word goes onto it, and the word is its from now on.
    fn settle_opened(&mut self, bucket: &KeyBucket, kw: KeyWindow, slot: usize) {
        let rec = self.record(&kw).expect("made above");
        let (allowance, place, exhausted) = (rec.allowance, rec.place, rec.exhausted);
        let share = self
            .option_of(&kw, allowance)
            .expect("a request opens only a window this epoch holds");
        match place {
            Place::Off { credit: off } => {
                let placed = credit::place(
                    bucket.word(slot, kw.window),
                    kw.window.number,
                    off,
                    exhausted,
                );
                debug_assert_eq!(placed, credit::Placed::AddedToOpened);
            }
            Place::Live | Place::Closed { .. } => {
                // Live: its word was this window's already (then it was installed here);
                // closed: its marker is not openable. Neither reaches here.
                unreachable!("{kw:?}: a booked word opened again ({place:?})");
            }
        }
        let rec = self.record_mut(&kw).expect("made above");
        rec.slot = slot as u8;
        rec.place = Place::Live;
        self.book_standing(kw, share);
        let track = self
            .keys
            .get_mut(&kw.key)
            .expect("has a record")
            .track
            .get_or_insert_with(KeyTrack::default);
        track.installed.set(
            slot,
            credit::parity(kw.window.number),
            Some(kw.window.number),
        );
        self.log.note(kw);
        self.mark_dirty(kw.key);
    }

    /// Books `share` of standing credit a request (or this reconciler) took for `kw`.
    /// A second take of one option (the key's bucket evicted and made again within the
    /// window, or a policy switch between an open and its booking) is booked as a
    /// self-grant beyond it and counted: it is what the owner does not know of.
    pub(super) fn book_standing(&mut self, kw: KeyWindow, share: u64) {
        let rec = self.record_mut(&kw).expect("booked on a record");
        rec.self_granted += share;
        if rec.option && rec.standing == 0 {
            rec.standing = share;
            self.stats.standing_taken += 1;
        } else {
            self.stats.standing_retaken += 1;
        }
    }

    /// When a record is made for a window this epoch holds the option of: the option is
    /// taken on the word now (`credit::open_standing`), so the install that follows
    /// books it (`install`, through `credit::place`). A word not openable (a request
    /// opened it, or an older window is still live there) settles at that install.
    pub(super) fn take_option(&mut self, bucket: &KeyBucket, kw: KeyWindow, slot: usize) {
        let Some(rec) = self.record(&kw) else {
            return;
        };
        let Some(share) = self.option_of(&kw, rec.allowance) else {
            return;
        };
        if share > 0 && !self.installed_here(&kw.key, slot, kw.window.number) {
            // Opened or not, the install that follows settles it (`credit::place`).
            credit::open_standing(bucket.words(slot), kw.window.number, share);
        }
    }

    /// The owner sent a grant for `kw`, of which this node has no record: it is managing
    /// the key-window, so this node gives up its option there (`decline`) before it
    /// books the grant. With a bucket, the word settles it at once: the record placed
    /// live (`install`) shuts the option, unless a request opened it first, which is
    /// then booked. Without one, the surface keeps the refusal for the bucket to come.
    /// False when there is to be no record (nothing could be recorded).
    pub(super) fn record_declined(&mut self, kw: KeyWindow) -> bool {
        let option = self
            .standing_rule()
            .is_some_and(|r| r.entitled(kw.key, kw.window));
        let bucket = self.surface.get(&kw.key);
        let slot = bucket.as_deref().and_then(|b| {
            b.policy()
                .windows()
                .iter()
                .position(|w| w.length_ms == kw.window.length_ms)
                .map(|i| (i, b.policy().windows()[i].limit))
        });
        drop(bucket);
        let (slot, allowance) = match slot {
            Some(s) => s,
            None if option => {
                // No bucket: which plan slot is unknown until one comes, and the grant's
                // allowance is checked then (`install` re-reads both).
                match self.surface.decline(kw.key, kw.window) {
                    Some(false) => (0, UNKNOWN_ALLOWANCE),
                    // A bucket appeared: its word settles it at the install.
                    Some(true) => return self.record_declined(kw),
                    None => return false,
                }
            }
            None => return false,
        };
        if !self.insert_record(kw, slot, allowance, 0) {
            return false;
        }
        let rec = self.record_mut(&kw).expect("just made");
        rec.option = option;
        rec.declined = true;
        true
    }
}

impl WindowRecord {
    /// What the line says of the option: held and settled (see the module doc).
    pub(super) fn option_settled(&self) -> bool {
        self.option && (self.declined || !matches!(self.place, Place::Off { .. }))
    }

    /// Self-granted credit beyond the standing option (F4, A-fixed): what a fleet-wide
    /// sum counts above the allowance.
    pub(super) fn self_granted_beyond_option(&self) -> u64 {
        self.self_granted - self.standing
    }

    /// A standing line never reported and untouched by the owner: what `quiet_standing`
    /// can keep quiet, as far as a look at the record alone tells.
    pub(super) fn unreported_standing(&self) -> bool {
        self.standing > 0 && self.last_reported.is_none() && self.grant_seq == 0
    }

    /// A line of standing credit only that nothing has asked about and that is not half
    /// spent: the owner counts the option as taken anyway, so reporting it each window
    /// would cost a line per request at 10^5 keys and tell the owner nothing. (A key
    /// whose window of this length is not quiet here reports its next one too, so the
    /// owner can grant ahead of it: `report_key`.)
    pub(super) fn quiet_standing(&self, spend: u64) -> bool {
        self.standing > 0
            && self.self_granted == self.standing
            && self.applied_grant == 0
            && self.grant_seq == 0
            && self.returned == 0
            && !self.declined
            && spend * 2 <= self.standing
            && self.last_reported.is_none()
    }
}
