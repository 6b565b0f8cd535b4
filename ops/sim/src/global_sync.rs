//! The baseline most peers use (Gubernator's GLOBAL behaviour, Limitador's cached
//! counters), as plain state machines on the same simulated bus: each node answers from
//! its last known remaining count, decrementing its own copy, and sends its hits to the
//! key's owner every sync interval; the owner adds them up and broadcasts what remains.
//! Nothing bounds what several nodes admit from the same stale copy: that is the point of
//! measuring it beside leasing.

use std::collections::{BTreeMap, BTreeSet};

/// (key index, window length ms, window number).
pub type GsKw = (u32, u32, u64);

#[derive(Clone, Debug)]
pub struct GsHits {
    pub shard: u32,
    pub hits: Vec<(GsKw, u64)>,
}

#[derive(Clone, Debug)]
pub struct GsRemaining {
    pub node: u32,
    pub remaining: Vec<(GsKw, u64)>,
}

#[derive(Default)]
pub struct GsNode {
    /// The owner's last broadcast, less what this node admitted since.
    cache: BTreeMap<GsKw, u64>,
    /// Hits not yet sent to the owner.
    pending: BTreeMap<GsKw, u64>,
}

impl GsNode {
    /// Admit if every window has count left in this node's copy.
    pub fn decide(&mut self, kws: &[(GsKw, u64)]) -> bool {
        let ok = kws
            .iter()
            .all(|(kw, limit)| self.cache.get(kw).copied().unwrap_or(*limit) > 0);
        if ok {
            for (kw, limit) in kws {
                let left = self.cache.entry(*kw).or_insert(*limit);
                *left -= 1;
                *self.pending.entry(*kw).or_default() += 1;
            }
        }
        ok
    }

    /// Every sync interval: the hits since the last one, one message per owner shard.
    pub fn flush(&mut self, shard_of: impl Fn(u32) -> u32) -> Vec<GsHits> {
        let mut by_shard: BTreeMap<u32, Vec<(GsKw, u64)>> = BTreeMap::new();
        for (kw, hits) in std::mem::take(&mut self.pending) {
            by_shard.entry(shard_of(kw.0)).or_default().push((kw, hits));
        }
        by_shard
            .into_iter()
            .map(|(shard, hits)| GsHits { shard, hits })
            .collect()
    }

    pub fn handle_remaining(&mut self, msg: &GsRemaining) {
        for (kw, left) in &msg.remaining {
            let unsent = self.pending.get(kw).copied().unwrap_or(0);
            self.cache.insert(*kw, left.saturating_sub(unsent));
        }
    }

    /// Forget windows that have ended (`ended` says which).
    pub fn reap(&mut self, ended: impl Fn(&GsKw) -> bool) {
        self.cache.retain(|kw, _| !ended(kw));
    }
}

#[derive(Default)]
pub struct GsOwner {
    counts: BTreeMap<GsKw, (u64, u64)>,
    dirty: BTreeSet<GsKw>,
}

impl GsOwner {
    pub fn handle_hits(&mut self, msg: &GsHits, limit_of: impl Fn(u32) -> u64) {
        for (kw, hits) in &msg.hits {
            let c = self.counts.entry(*kw).or_insert((0, limit_of(kw.1)));
            c.0 += hits;
            self.dirty.insert(*kw);
        }
    }

    /// Every sync interval: what remains of every window that changed, for every node.
    pub fn broadcast(&mut self, nodes: u32) -> Vec<GsRemaining> {
        if self.dirty.is_empty() {
            return Vec::new();
        }
        let remaining: Vec<(GsKw, u64)> = std::mem::take(&mut self.dirty)
            .into_iter()
            .map(|kw| {
                let (used, limit) = self.counts[&kw];
                (kw, limit.saturating_sub(used))
            })
            .collect();
        (0..nodes)
            .map(|node| GsRemaining {
                node,
                remaining: remaining.clone(),
            })
            .collect()
    }

    pub fn reap(&mut self, ended: impl Fn(&GsKw) -> bool) {
        self.counts.retain(|kw, _| !ended(kw));
    }
}
