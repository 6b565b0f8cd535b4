//! D5's fast path, the reconciler's side: a request found no credit, so the node asks
//! the key's owner(s) at once instead of waiting for the next round, and applies the
//! answer (a grant, or word that the window's pool is spent).
//!
//! The request path decides that a fast path is needed (`DecisionSurface::decide`); this
//! module sends it, sizes what it asks for and books the reply.

use std::sync::Arc;

use bus_schemas::limits::PLAN_WINDOWS_MAX;
use bus_schemas::{
    FastPathOutcome, FastPathReply, FastPathRequest, KeyId, KeyWindow, Now, WindowId,
};

use super::links::LinkHealth;
use super::track::Place;
use super::{NodeLimiter, Transmit};
use crate::credit;
use crate::surface::{FastPathNeed, KeyBucket};
use crate::window::{next_window, window_at, window_end_ms};

#[derive(Clone, Copy, Debug)]
pub(super) struct PendingFastPath {
    pub(super) kw: KeyWindow,
    pub(super) sent_mono_ms: u64,
}

impl NodeLimiter {
    /// D5: the request path found no credit and took this round's fast path for `need`.
    /// Returns how many requests went out (one per short window, each to its own owner);
    /// 0 means the caller should decide at once, as no owner is reachable (F2).
    pub fn handle_fast_path_need(&mut self, now: Now, need: FastPathNeed) -> usize {
        if need.join {
            // Another request is already asking for this key this round (D5).
            return 0;
        }
        let Some(bucket) = self.surface.get(&need.key) else {
            return 0;
        };
        let round_ms = u64::from(self.config.round_ms);
        // (slot, length, limit, ask): a window short here, or one holding less than the
        // owner's least fast-path grant (`credit_sizing::round_of_pace`). After an
        // idle spell the reconciler has returned all but a few credits of every window;
        // asking for the empty one alone would leave the other to run dry a moment later,
        // with this round's ask spent: a round of 429s per idle spell (BENCHMARKS.md).
        let windows: Vec<(usize, u32, u64, bool)> = bucket
            .policy()
            .windows()
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let pace = credit_sizing::round_of_pace(
                    w.limit,
                    w.length_ms,
                    self.config.round_ms,
                    self.config.fleet_size,
                );
                let held = bucket.credit_in(i, window_at(need.key, w.length_ms, now.wall_ms));
                let ask = need.short_windows & (1 << i) != 0 || held < pace;
                (i, w.length_ms, w.limit, ask)
            })
            .collect();
        let attempts = bucket.attempts.load(std::sync::atomic::Ordering::Relaxed);
        drop(bucket);
        // The key's, so the same for every window asked for (sending one does not move
        // the demand track).
        let demand = self.fast_path_demand(&need.key, attempts);
        let mut sent = 0;
        for (slot, length_ms, limit, ask) in windows {
            if !ask {
                continue;
            }
            let current = KeyWindow {
                key: need.key,
                window: window_at(need.key, length_ms, now.wall_ms),
            };
            sent += usize::from(self.send_fast_path(now, current, slot, limit, demand));
            if window_end_ms(need.key, current.window).saturating_sub(now.wall_ms) <= round_ms {
                // The window ends before the next round: credit for it alone would leave
                // the next window's first requests short with this round's ask spent
                // (D5), a round of 429s at the boundary. Ask for the next one too, in
                // the same round, as the tick's prefetch would have.
                let next = KeyWindow {
                    key: need.key,
                    window: next_window(current.window),
                };
                sent += usize::from(self.send_fast_path(now, next, slot, limit, demand));
            }
        }
        sent
    }

    /// The demand a fast-path request advertises (C4 sizes its grant from it): the
    /// key's, not only the short window's. The window's own estimate is stale exactly
    /// when a fast path is needed: it decayed while a shorter window stopped every
    /// request, or over a quiet spell whose end this request is the first sign of (the
    /// tick has not seen it yet). Sized from that, the grant would be one round of pace
    /// (one unit), the round's one fast path spent, and the rest of the round's burst
    /// would get 429s with credit left in the owner's pool (the sim's bursty run). At
    /// the end of a quiet spell the recent peak counts too: stray requests between
    /// bursts leave `quiet_from_milli` under one request a round, short of a burst's
    /// first round. The requests of this round so far count as a round's demand too: no
    /// tick has seen them, and a burst's first round is what they are (BENCHMARKS.md
    /// has the measurements). A key not visited for rounds had no decision in them (a
    /// decision makes the next tick visit it), so the attempts since its last visit are
    /// this round's. `attempts`: the key's bucket's attempt counter, read by the caller,
    /// which holds the bucket.
    fn fast_path_demand(&self, key: &KeyId, attempts: u16) -> u64 {
        let Some(track) = self.keys.get(key).and_then(|s| s.track_at(self.round)) else {
            return 0;
        };
        let this_round_milli = u64::from(attempts.wrapping_sub(track.last_attempts)) * 1_000;
        let busiest = (0..PLAN_WINDOWS_MAX)
            .map(|slot| track.demand(slot))
            .max()
            .unwrap_or(0)
            .max(this_round_milli);
        if track.idle_rounds > 0 {
            busiest
                .max(track.quiet_from_milli)
                .max(track.peak(self.round))
        } else {
            busiest
        }
    }

    /// One D5 request for `kw`, advertising at least `key_demand` (`fast_path_demand`);
    /// false when the link is not healthy or the caps are hit.
    fn send_fast_path(
        &mut self,
        now: Now,
        kw: KeyWindow,
        slot: usize,
        limit: u64,
        key_demand: u64,
    ) -> bool {
        let shard = kw.shard(self.config.shards);
        if self.link_health(shard, now) != LinkHealth::Healthy
            || self.pending.len() >= self.config.pending_fast_path_cap
        {
            self.stats.fast_path_unreachable += 1;
            return false;
        }
        if !self.ensure_record(now, kw, slot, limit) {
            return false;
        }
        let surface = Arc::clone(&self.surface);
        if let Some(bucket) = surface.get(&kw.key) {
            self.install(kw.key, &bucket, kw);
        }
        // The record may be new (its line is due) and an install may have closed an
        // older window: the next tick looks at the key.
        self.mark_dirty(kw.key);
        self.arm_loan(now, kw, slot);
        let rec = self.record(&kw).expect("ensured above");
        let mut entry = self.line(&kw, rec);
        entry.demand = entry.demand.max(key_demand);
        let request_id = self.next_request_id;
        self.next_request_id += 1;
        self.pending.insert(
            request_id,
            PendingFastPath {
                kw,
                sent_mono_ms: now.mono_ms,
            },
        );
        self.outbox.push_back(Transmit::FastPath(FastPathRequest {
            node: self.config.node,
            node_epoch: self.epoch,
            shard,
            request_id,
            owner_epoch_seen: self.links[shard.0 as usize].owner_epoch_seen,
            entry,
        }));
        self.stats.fast_path_sent += 1;
        true
    }

    pub fn handle_fast_path_reply(&mut self, now: Now, reply: &FastPathReply) {
        let pending = self.pending.remove(&reply.request_id);
        if reply.shard.0 >= self.config.shards
            || !self.accept_owner_epoch(now, reply.shard, reply.owner_epoch)
        {
            return;
        }
        match reply.outcome {
            FastPathOutcome::Granted(entry) => {
                if entry.key_window.shard(self.config.shards) != reply.shard {
                    self.stats.grants_invalid += 1;
                } else if self.apply_grant(now, reply.owner_epoch, &entry) {
                    self.stats.fast_path_granted += 1;
                }
            }
            FastPathOutcome::Refused { exhausted: true } => {
                self.stats.fast_path_refused_exhausted += 1;
                // The owner has nothing left for the window: later 429s wait for its
                // boundary rather than for the next round (D6).
                if let Some(p) = pending {
                    self.mark_exhausted(p.kw);
                }
            }
            FastPathOutcome::Refused { exhausted: false } => {
                self.stats.fast_path_refused_open += 1;
                if let Some(p) = pending {
                    self.lend_on_refusal(p.kw);
                }
            }
            FastPathOutcome::Withheld => {}
        }
    }

    /// The refusal loan: the owner had nothing for `kw` but may refill (its options are
    /// out, or the reserve), so the pool is not spent. A node that has admitted less
    /// than its 1/fleet share of the window (at least one unit) lends itself one unit,
    /// once per key-window, on the same cell as the deadline loan (`DecisionSurface::
    /// lend`), before the waiting request decides again. It is a self-grant, reported
    /// as F4's: the owner counts it. A node that has spent its share is where the key
    /// concentrates, and there a 429 is the right answer.
    fn lend_on_refusal(&mut self, kw: KeyWindow) {
        let surface = Arc::clone(&self.surface);
        let Some(bucket) = surface.get(&kw.key) else {
            return;
        };
        let Some(rec) = self.record(&kw) else {
            return;
        };
        if rec.loan_booked || rec.exhausted || rec.place != Place::Live {
            return;
        }
        let slot = usize::from(rec.slot);
        if !bucket.take_loan(slot, kw.window.number, false) {
            return;
        }
        let placed = credit::grant(bucket.word(slot, kw.window), kw.window.number, 1, false);
        debug_assert!(placed, "{kw:?}: a live record's word holds its window");
        self.book_loan(kw);
    }

    /// A taken loan of `kw`, booked: a self-grant of its record, which makes the line
    /// due, and a change a fleet-wide sum a checker keeps counts (`take_changes`).
    fn book_loan(&mut self, kw: KeyWindow) {
        let rec = self.record_mut(&kw).expect("a loan is taken on a record");
        rec.loan_booked = true;
        rec.self_granted += 1;
        self.stats.loans_booked += 1;
        self.log.note(kw);
    }

    /// A fast path goes out for `kw`: arm its loan (`DecisionSurface::lend`) if the
    /// window's allowance is under the fleet size (L < N, where the floor makes about
    /// half the requests fast paths; at L >= N they are under 0.5%, and loans there
    /// over-admitted keys near their limit: 5% in the 200-seed run's uniform at 40/s)
    /// and the key is far below its limit as this node sees it: this node has admitted
    /// less than its 1/fleet share of the window (at least one unit), and its smoothed
    /// demand for the window (thousandths of a request a round, `KeyState::demand`), as
    /// if every node saw as much, would spend under half the allowance over the window.
    /// Not the fast path's advertised demand, which counts this round's requests as a
    /// round's rate (`fast_path_demand`): one request times 40 rounds and 20 nodes reads
    /// as 800 a window, and no loan was armed once a key had a track. A missed deadline
    /// may take the loan only while the owner was heard from within two rounds: the
    /// answer is then late, not lost to a bus cut (without that, deadline loans
    /// over-admitted 2.5% in the simulator's shift scenario, seed 1010). A loan of an
    /// older window still unbooked is booked first.
    fn arm_loan(&mut self, now: Now, kw: KeyWindow, slot: usize) {
        let surface = Arc::clone(&self.surface);
        let Some(bucket) = surface.get(&kw.key) else {
            return;
        };
        if bucket
            .loan_taken(slot)
            .is_some_and(|n| n != kw.window.number)
        {
            self.book_loans(kw.key, &bucket);
        }
        let rec = self.record_mut(&kw).expect("ensured by the caller");
        rec.fast_path_asked = true;
        let rec = self.record(&kw).expect("ensured by the caller");
        let share = (rec.allowance / u64::from(self.config.fleet_size.max(1))).max(1);
        let spend = super::report::line_of(Some(&bucket), 0, &kw, rec).cumulative_spend;
        let demand_milli = self
            .keys
            .get(&kw.key)
            .map_or(0, |s| s.demand(slot as u8, self.round));
        let rounds = u64::from(kw.window.length_ms) / u64::from(self.config.round_ms.max(1));
        let fleet_demand_milli = demand_milli * rounds * u64::from(self.config.fleet_size);
        let below_fleet = rec.allowance < u64::from(self.config.fleet_size);
        if below_fleet
            && !rec.loan_booked
            && rec.place == Place::Live
            && spend < share
            && fleet_demand_milli * 2 < rec.allowance * 1_000
        {
            let link = &self.links[kw.shard(self.config.shards).0 as usize];
            let heard = now.mono_ms.saturating_sub(link.last_contact_mono_ms)
                <= 2 * u64::from(self.config.round_ms);
            bucket.arm_loan(slot, kw.window.number, heard);
        }
    }

    /// Book the deadline loans the request path took of `key`'s windows since the last
    /// visit (`DecisionSurface::lend`): each unit is a self-grant of its record, which
    /// makes the line due, so the owner counts it as committed.
    pub(super) fn book_loans(&mut self, key: KeyId, bucket: &KeyBucket) {
        let Some(state) = self.keys.get_mut(&key) else {
            return;
        };
        let taken: smallvec::SmallVec<[WindowId; 2]> = state
            .records
            .iter()
            .filter(|(window, rec)| {
                rec.fast_path_asked
                    && !rec.loan_booked
                    && bucket.loan_taken(usize::from(rec.slot)) == Some(window.number)
            })
            .map(|(window, _)| *window)
            .collect();
        for window in taken {
            self.book_loan(KeyWindow { key, window });
        }
    }

    fn mark_exhausted(&mut self, kw: KeyWindow) {
        let Some(rec) = self
            .keys
            .get_mut(&kw.key)
            .and_then(|s| s.rec_mut(kw.window))
        else {
            return;
        };
        rec.exhausted = true;
        if rec.place == Place::Live
            && let Some(bucket) = self.surface.get(&kw.key)
        {
            credit::mark_exhausted(
                bucket.word(usize::from(rec.slot), kw.window),
                kw.window.number,
            );
        }
    }
}
