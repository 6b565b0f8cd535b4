//! D7: when the surface nears its cap, the least recently seen buckets that hold no
//! credit leave it. The reconciler's records of their keys stay, so spend is never
//! forgotten mid-window; credit granted later waits off its word until the key is seen
//! again.

use std::sync::Arc;

use bus_schemas::{KeyId, KeyWindow};

use super::NodeLimiter;
use super::track::Place;
use crate::surface::{DecisionSurface, KeyBucket};

impl NodeLimiter {
    /// D7: when the surface nears its cap, evict the least recently seen buckets that hold
    /// no credit in any word. Their records stay, so spend is never forgotten mid-window.
    pub(super) fn evict_if_over_cap(&mut self, now_ms: u64) {
        let cap = self.surface.config().bucket_cap;
        let high = cap - cap / 10;
        if self.surface.len() <= high {
            return;
        }
        let target = cap - cap / 5;
        let candidates = self.eviction_candidates(now_ms);
        let excess = self.surface.len().saturating_sub(target);
        let evicted = self.evict_idlest(candidates, excess, now_ms);
        if evicted.is_empty() {
            return;
        }
        // Rare (the surface near its cap): the next round visits every key rather than
        // work out which schedules an eviction moved.
        self.visit_all = true;
        self.take_evicted_off_words(&evicted);
    }

    /// Every bucket that could go now, idlest first: no credit in any word and no fast
    /// path in flight.
    fn eviction_candidates(&self, now_ms: u64) -> Vec<(std::cmp::Reverse<u32>, KeyId)> {
        let mut candidates = Vec::new();
        self.surface.for_each(|key, bucket| {
            if bucket.holds_no_credit()
                && !self.surface.fast_path_in_flight(bucket, now_ms)
                && !self.holds_open_option(&key)
            {
                candidates.push((std::cmp::Reverse(self.idle_rounds_now(&key)), key));
            }
        });
        candidates.sort_unstable();
        candidates
    }

    /// Whether a window of `key` whose standing option this epoch took is still open: a
    /// bucket made again within it would find its words empty and take the option twice.
    fn holds_open_option(&self, key: &KeyId) -> bool {
        self.keys.get(key).is_some_and(|s| {
            s.records
                .iter()
                .any(|(_, r)| r.standing > 0 && !matches!(r.place, Place::Closed { .. }))
        })
    }

    /// The key's quiet rounds as of this round. A track is as of its key's last visit;
    /// the rounds since were quiet.
    fn idle_rounds_now(&self, key: &KeyId) -> u32 {
        let round = self.round;
        self.keys
            .get(key)
            .and_then(|s| s.track.as_ref())
            .map(|t| {
                let unseen = if t.scanned_round == 0 {
                    0
                } else {
                    round - t.scanned_round
                };
                t.idle_rounds
                    .saturating_add(u32::try_from(unseen).unwrap_or(u32::MAX))
            })
            // No track yet: a key whose first request came since the last round, the
            // least idle there is (evicting it first would treat it as the most).
            .unwrap_or(0)
    }

    /// Evicts up to `excess` of `candidates` in order, each only if it is still
    /// evictable under its shard's write lock; drops their demand tracks.
    fn evict_idlest(
        &mut self,
        candidates: Vec<(std::cmp::Reverse<u32>, KeyId)>,
        excess: usize,
        now_ms: u64,
    ) -> std::collections::HashSet<KeyId> {
        let surface = Arc::clone(&self.surface);
        let mut evicted = std::collections::HashSet::new();
        for (_, key) in candidates.into_iter().take(excess) {
            // A key whose fast path is in flight stays: evicted, its answer would have no
            // bucket to land in and the request and its joiners would fail open (D7 says
            // reload on next sight, not admit unchecked).
            let gone = self
                .surface
                .evict_if(&key, |b| still_evictable(&surface, b, now_ms));
            if gone {
                self.stats.evictions += 1;
                if let Some(state) = self.keys.get_mut(&key) {
                    state.track = None;
                    if state.records.is_empty() {
                        self.keys.remove(&key);
                    }
                }
                evicted.insert(key);
            }
        }
        evicted
    }

    /// The words went with the bucket and held nothing; the records keep the spend, and
    /// credit granted later waits off-word until the key is seen again.
    fn take_evicted_off_words(&mut self, evicted: &std::collections::HashSet<KeyId>) {
        for key in evicted {
            for (window, rec) in self
                .keys
                .get_mut(key)
                .into_iter()
                .flat_map(|s| &mut s.records)
            {
                if rec.place == Place::Live {
                    rec.place = Place::Off { credit: 0 };
                    self.log.note(KeyWindow {
                        key: *key,
                        window: *window,
                    });
                }
            }
        }
    }
}

/// The check `evict_if` repeats under the shard's write lock, so a fast path or a grant
/// that raced in since the candidates were listed keeps its bucket.
fn still_evictable(surface: &DecisionSurface, bucket: &KeyBucket, now_ms: u64) -> bool {
    !surface.fast_path_in_flight(bucket, now_ms) && bucket.holds_no_credit()
}
