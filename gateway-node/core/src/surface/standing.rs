//! Standing options on the request path: the credit a node may take of a key-window
//! unasked, the first time it needs the window (`credit_sizing::standing_total`).
//!
//! At the reference scale (10^5 keys, 50,000 requests a second over 20 nodes) a node
//! sees a given key about once every 40 s, so a window it has not been granted is the
//! common case, not the exception: without an option, nearly every request would be a
//! fast path. The owner counts the option of every node it has not heard from as
//! committed, so taking one needs no message and keeps sum(outstanding) <= allowance.
//!
//! The option is taken here, on the short path, with one compare-and-swap that opens
//! the window's word (`credit::open_standing`); the reconciler books it at its next
//! visit (`NodeLimiter::adopt_opened`). An owner that wants a node's option back for
//! a key-window (the key is concentrated on other nodes) sends that node a grant for
//! it; a node with no bucket for the key records the refusal here (`decline`), and the
//! request path reads it before it opens anything.

use std::sync::atomic::{Ordering, fence};

use bus_schemas::{KeyId, WindowId};
use dashmap::DashMap;
use smallvec::SmallVec;

use super::DecisionSurface;
use super::bucket::{KeyBucket, KeyIdHasherBuilder};
use crate::credit;
use crate::window::{window_at, window_end_ms};

/// What a node needs to size its own option of any key-window, fixed for a node epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StandingRule {
    pub node: u32,
    pub fleet_size: u32,
    pub reserve_permille: u64,
    /// `credit_sizing::standing_total`'s share of the leasable allowance; 0 is off.
    pub standing_permille: u64,
    /// The node epoch's start: only a window that began at or after it is this epoch's
    /// to take (an earlier epoch of the node may have taken the option of one that
    /// began before, C9).
    pub epoch_start_wall_ms: u64,
}

impl StandingRule {
    /// This node's option for `window` of `key` at allowance `allowance`.
    pub fn share(&self, key: KeyId, window: WindowId, allowance: u64) -> u64 {
        let total = credit_sizing::standing_total(
            allowance,
            self.reserve_permille,
            self.fleet_size,
            self.standing_permille,
        );
        let rotation =
            credit_sizing::standing_rotation(key.hash64(), window.number, self.fleet_size);
        credit_sizing::standing_share(total, self.fleet_size, self.node, rotation)
    }

    /// Whether this node epoch holds the option of `window` of `key` (it began no later).
    pub fn entitled(&self, key: KeyId, window: WindowId) -> bool {
        let start = window_end_ms(key, window) - u64::from(window.length_ms);
        self.standing_permille > 0 && start >= self.epoch_start_wall_ms
    }
}

/// Key-windows whose option this node gave back before it had a bucket for the key.
/// Bounded by `DECLINED_KEYS_MAX` keys; the reconciler prunes ended windows.
pub(super) type DeclinedMap = DashMap<u128, SmallVec<[WindowId; 2]>, KeyIdHasherBuilder>;

/// At most this many keys carry declined windows at once; past it a refusal is not
/// recorded, and the owner goes on counting that option as taken (safe, only slower
/// to free the credit).
pub const DECLINED_KEYS_MAX: usize = 65_536;

impl DecisionSurface {
    /// The rule, once the node limiter has set it (`set_standing_rule`).
    pub fn standing_rule(&self) -> Option<&StandingRule> {
        self.standing.get()
    }

    /// Set once, by the node limiter of this surface, before any decision.
    pub(crate) fn set_standing_rule(&self, rule: StandingRule) {
        let _ = self.standing.set(rule);
    }

    /// Short path (cold): open every window of the bucket's plan that this node epoch
    /// holds an option for, has not opened or been granted yet, and has not declined.
    /// True when any opened: the caller charges again.
    #[cold]
    pub(super) fn open_standing(&self, bucket: &KeyBucket, key: KeyId, wall_ms: u64) -> bool {
        let Some(rule) = self.standing.get() else {
            return false;
        };
        if rule.standing_permille == 0 {
            return false;
        }
        let mut opened = false;
        for (i, spec) in bucket.policy().windows().iter().enumerate() {
            let w = window_at(key, spec.length_ms, wall_ms);
            let words = bucket.words(i);
            if credit::holds_live(credit::word_of(words, w.number), w.number)
                || !rule.entitled(key, w)
            {
                continue;
            }
            let share = rule.share(key, w, spec.limit);
            if share == 0 || self.declined_here(key, w) {
                continue;
            }
            if credit::open_standing(words, w.number, share) {
                self.stats.standing_opened.fetch_add(1, Ordering::Relaxed);
                opened = true;
            }
        }
        opened
    }

    /// Whether the reconciler declined `window` of `key` before this bucket existed.
    /// Read after the bucket is in the map, with a fence, so that of a decline racing a
    /// new bucket at least one side sees the other (`decline`).
    fn declined_here(&self, key: KeyId, window: WindowId) -> bool {
        if self.declined_keys.load(Ordering::Relaxed) == 0 {
            fence(Ordering::SeqCst);
            if self.declined_keys.load(Ordering::Relaxed) == 0 {
                return false;
            }
        }
        fence(Ordering::SeqCst);
        self.declined
            .get(&key.digest)
            .is_some_and(|w| w.contains(&window))
    }

    /// Reconciler: record that this node will not open `window` of `key`, for a key with
    /// no bucket here. Then, with a fence, whether a bucket appeared meanwhile: the
    /// caller must then settle the word instead (`credit::place`), since a request on
    /// it may have read the map before the entry went in. False when the map is full
    /// (nothing recorded).
    pub(crate) fn decline(&self, key: KeyId, window: WindowId) -> Option<bool> {
        if !self.declined.contains_key(&key.digest)
            && self.declined_keys.load(Ordering::Relaxed) >= DECLINED_KEYS_MAX
        {
            return None;
        }
        let mut entry = self.declined.entry(key.digest).or_insert_with(|| {
            self.declined_keys.fetch_add(1, Ordering::Relaxed);
            SmallVec::new()
        });
        if !entry.contains(&window) {
            entry.push(window);
        }
        drop(entry);
        fence(Ordering::SeqCst);
        Some(self.get(&key).is_some())
    }

    /// Reconciler: forget declined windows of `key` that ended by `now_ms`.
    pub(crate) fn prune_declined(&self, key: KeyId, now_ms: u64) {
        let empty = match self.declined.get_mut(&key.digest) {
            Some(mut w) => {
                w.retain(|win| window_end_ms(key, *win) > now_ms);
                w.is_empty()
            }
            None => return,
        };
        if empty && self.declined.remove(&key.digest).is_some() {
            self.declined_keys.fetch_sub(1, Ordering::Relaxed);
        }
    }
}
