//! C10 / A57: which keys are hot on this shard right now.
//!
//! Exact per-round counts of the fold work each key causes (report entries merged,
//! fast-path requests answered), in a map capped at `counters` keys so a flood of distinct
//! keys cannot grow it (work for keys beyond the cap is counted as overflow, not lost from
//! the total), carried into the next round at half weight so the set follows the last few
//! rounds rather than the whole window. O(1) per entry, O(n) per round.
//!
//! A key is hot when it is among the `k` heaviest counters *and* carries at least
//! `share_permille` of the shard's work in the last round: on a shard of evenly busy keys
//! nothing is hot, and the owner's lanes (see `FoldOwner`) stay a single fast path.

use bus_schemas::KeyId;
use bus_schemas::hashing::DetMap;

#[derive(Clone, Copy, Debug)]
pub struct HotKeyConfig {
    /// How many keys can be hot at once.
    pub k: usize,
    /// Keys counted per round (>= k).
    pub counters: usize,
    /// Least share of the last round's fold work for a key to count as hot.
    pub share_permille: u64,
    /// Least fold work in the last round: a quiet shard has no hot keys.
    pub min_work: u64,
}

impl HotKeyConfig {
    pub fn reference() -> Self {
        Self {
            k: 8,
            counters: 65_536,
            share_permille: 50,
            min_work: 64,
        }
    }
}

const HOT_COUNTERS_INITIAL: usize = 1_024;

#[derive(Clone, Debug)]
pub struct HotKeys {
    config: HotKeyConfig,
    counts: DetMap<KeyId, u64>,
    round_work: u64,
    overflow: u64,
    hot: Vec<KeyId>,
}

impl HotKeys {
    pub fn new(config: HotKeyConfig) -> Self {
        assert!(config.k > 0 && config.counters >= config.k);
        Self {
            config,
            // Grown on demand up to the cap rather than sized to it: a shard that folds a few
            // hundred keys a round keeps its counters in cache instead of striding a table
            // sized for 65,536 (it was 13% of a simulated fleet's time).
            counts: DetMap::with_capacity_and_hasher(
                config.counters.min(HOT_COUNTERS_INITIAL),
                Default::default(),
            ),
            round_work: 0,
            overflow: 0,
            hot: Vec::with_capacity(config.k),
        }
    }

    /// `work` units of fold work for `key`.
    pub fn record(&mut self, key: KeyId, work: u64) {
        self.round_work += work;
        if let Some(c) = self.counts.get_mut(&key) {
            *c += work;
        } else if self.counts.len() < self.config.counters {
            self.counts.insert(key, work);
        } else {
            self.overflow += work;
        }
    }

    /// Work this round for keys the capped map could not hold.
    pub fn overflow(&self) -> u64 {
        self.overflow
    }

    /// Close a round: pick the hot set from this round's counts, then halve every counter.
    pub fn end_round(&mut self) {
        self.hot.clear();
        let floor =
            (self.round_work * self.config.share_permille / 1_000).max(self.config.min_work);
        let mut heavy: Vec<(u64, KeyId)> = self
            .counts
            .iter()
            .filter(|(_, c)| **c >= floor)
            .map(|(k, c)| (*c, *k))
            .collect();
        heavy.sort_unstable_by(|a, b| b.cmp(a));
        self.hot
            .extend(heavy.into_iter().take(self.config.k).map(|(_, k)| k));
        self.counts.retain(|_, c| {
            *c /= 2;
            *c > 0
        });
        self.round_work = 0;
        self.overflow = 0;
    }

    pub fn is_hot(&self, key: &KeyId) -> bool {
        self.hot.contains(key)
    }

    /// The hot set, heaviest first (at most `k`).
    pub fn hot(&self) -> &[KeyId] {
        &self.hot
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u128) -> KeyId {
        KeyId {
            version: 1,
            digest: i.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835) | 1,
        }
    }

    #[test]
    fn a_flood_key_is_hot_and_even_load_is_not() {
        let mut h = HotKeys::new(HotKeyConfig::reference());
        for i in 0..1_000 {
            h.record(key(i), 1);
        }
        h.end_round();
        assert!(h.hot().is_empty(), "evenly busy keys: nothing is hot");
        for round in 0..3 {
            for i in 0..1_000 {
                h.record(key(i), 1);
            }
            h.record(key(7), 400);
            h.end_round();
            assert_eq!(h.hot(), &[key(7)], "round {round}");
        }
        // The flood stops: halving each round, it cools within four rounds (100 ms).
        for _ in 0..4 {
            for i in 0..1_000 {
                h.record(key(i), 1);
            }
            h.end_round();
        }
        assert!(!h.is_hot(&key(7)));
    }

    #[test]
    fn counters_stay_bounded_under_many_distinct_keys() {
        let config = HotKeyConfig {
            counters: 1_000,
            ..HotKeyConfig::reference()
        };
        let mut h = HotKeys::new(config);
        for i in 0..100_000 {
            h.record(key(3), 5);
            h.record(key(i + 10), 1);
        }
        assert!(h.counts.len() <= config.counters);
        assert!(h.overflow() > 0);
        h.end_round();
        assert_eq!(
            h.hot(),
            &[key(3)],
            "the flood key was counted from its first entry"
        );
    }
}
