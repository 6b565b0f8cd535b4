//! A round (C1): `handle_tick` and the steps it takes each visited key through, in order:
//! close ended windows, take in decisions and place credit (`scan_key`), report (in
//! `report`), schedule the next visit.
//!
//! A round visits only the keys that can need it (`keys_to_visit`), and `schedule` is
//! what makes skipping the others exact: it puts each key on a wheel at the first round
//! it could need a visit with no new decisions.

use std::sync::Arc;

use bus_schemas::hashing::DetMap;
use bus_schemas::limits::PLAN_WINDOWS_MAX;
use bus_schemas::{KeyId, KeyWindow, Now, ReportEntry, WindowId, WindowSpec};

use super::invariants::ChangeLog;
use super::track::{KeyState, KeyTrack, Place, QuietRun, WindowRecord};
use super::{LineChange, NodeLimiter};
use crate::credit;
use crate::surface::KeyBucket;
use crate::window::{next_window, window_at, window_end_ms};

/// Rounds the visit wheel spans; a key due further ahead waits in `NodeLimiter::far`.
pub(super) const WHEEL_ROUNDS: u64 = 32;

impl NodeLimiter {
    /// One reconciliation round (T = `round_ms`, C1).
    ///
    /// A round visits only the keys that can need it: those with decisions since the
    /// last round (their attempt counters moved), those whose records changed outside a
    /// tick, and those due by time (`schedule`: a window ending or about to, a line due
    /// for its refresh or for a demand band, an idle-return round, a closed line's last
    /// reports). A key in none of these would have had every step of the round a no-op
    /// but its demand's decay, which its next visit takes in (`KeyTrack::observe`); so
    /// the round does what a pass over every key and bucket did, at the cost of the keys
    /// that move. A round whose wall time ran more than `round_step_ms` ahead of the last
    /// (a late round) visits every key, since `schedule` counts time in rounds.
    pub fn handle_tick(&mut self, now: Now) {
        self.round += 1;
        self.stats.rounds += 1;
        self.surface.publish_round(
            self.round,
            now.wall_ms,
            now.wall_ms + u64::from(self.config.round_ms),
        );
        self.publish_health(now);
        let late = now.wall_ms.saturating_sub(self.last_tick_wall_ms) > self.round_step_ms();
        self.last_tick_wall_ms = now.wall_ms;
        let mut full_report = false;
        for link in &mut self.links {
            if link.full_report_turn(self.round) {
                self.stats.full_reports_sent += 1;
                full_report = true;
            }
        }
        let all = std::mem::take(&mut self.visit_all) || late || full_report;
        let visit = self.keys_to_visit(all);
        self.stats.keys_visited += visit.len() as u64;
        // One pass, each key taken through every step at once with one bucket lookup:
        // no step reads another key's state, and a key's state and bucket are in cache
        // for its later steps (a pass per step missed on them again).
        let surface = Arc::clone(&self.surface);
        let mut per_shard: Vec<Vec<ReportEntry>> = vec![Vec::new(); self.config.shards as usize];
        for key in &visit {
            let bucket = surface.get(key);
            if let Some(bucket) = bucket.as_deref() {
                // Before closing: a window a request opened may have just ended.
                self.adopt_opened(now, *key, bucket);
                self.book_loans(*key, bucket);
            }
            self.close_ended_windows(now, key, bucket.as_deref());
            surface.prune_declined(*key, now.wall_ms);
            if let Some(bucket) = bucket.as_deref() {
                self.scan_key(now, *key, bucket);
            }
            self.report_key(key, bucket.as_deref(), &mut per_shard);
            self.schedule(now, key);
        }
        self.send_reports(now, per_shard);
        self.evict_if_over_cap(now.wall_ms);
        let expiry_ms = 4 * u64::from(self.config.round_ms);
        self.pending
            .retain(|_, p| now.mono_ms.saturating_sub(p.sent_mono_ms) < expiry_ms);
    }

    /// This round's keys (see `handle_tick`), each once: with `all`, every key the
    /// reconciler or the surface knows.
    fn keys_to_visit(&mut self, all: bool) -> Vec<KeyId> {
        let round = self.round;
        let mut visit = Vec::new();
        // Decisions since the last round. A bucket the pass has not seen at this place
        // in the order (new, or moved by the map's growth) is visited too: a visit is
        // always exact, only skipping one needs a reason.
        let mut moved: Vec<KeyId> = Vec::new();
        if self.config.decisions_hinted {
            moved = std::mem::take(&mut self.hinted);
            moved.sort_unstable();
            moved.dedup();
        }
        let mut i = 0;
        let seen = &mut self.attempts_seen;
        let scan = !self.config.decisions_hinted;
        self.surface
            .for_each_attempts_if(scan, |bucket, digest, attempts| {
                let decided = match seen.get_mut(i) {
                    Some(e) if e.0 == digest => {
                        let changed = e.1 != attempts;
                        e.1 = attempts;
                        changed
                    }
                    Some(e) => {
                        *e = (digest, attempts);
                        true
                    }
                    None => {
                        seen.push((digest, attempts));
                        true
                    }
                };
                if decided {
                    moved.push(bucket.key());
                }
                i += 1;
            });
        if scan {
            seen.truncate(i);
        }
        // Stamps a known key so it is taken once; says whether the key was unknown.
        let take = |keys: &mut DetMap<KeyId, KeyState>, key: KeyId, visit: &mut Vec<KeyId>| {
            if let Some(state) = keys.get_mut(&key) {
                if state.visit_round != round {
                    state.visit_round = round;
                    visit.push(key);
                }
                return false;
            }
            visit.push(key);
            true
        };
        self.stats.keys_visited_for_decisions += moved.len() as u64;
        for key in moved {
            take(&mut self.keys, key, &mut visit);
        }
        let slot = (round % WHEEL_ROUNDS) as usize;
        while let Some(std::cmp::Reverse((due, key))) = self.far.peek().copied()
            && due <= round
        {
            self.far.pop();
            self.wheel[slot].push(key);
        }
        for key in std::mem::take(&mut self.wheel[slot]) {
            if self.keys.get(&key).is_some_and(|s| s.due_round == round) {
                take(&mut self.keys, key, &mut visit);
            }
        }
        // Unknown keys come once each from the pass over the buckets; a second source of
        // them (a dirty key since removed, or `all`) needs the list deduplicated.
        let mut unknown_twice = false;
        for key in std::mem::take(&mut self.dirty) {
            unknown_twice |= take(&mut self.keys, key, &mut visit);
        }
        if all {
            let known: Vec<KeyId> = self.keys.keys().copied().collect();
            for key in known {
                take(&mut self.keys, key, &mut visit);
            }
            let mut fresh = Vec::new();
            self.surface.for_each(|key, _| fresh.push(key));
            for key in fresh {
                take(&mut self.keys, key, &mut visit);
            }
        }
        if all || unknown_twice {
            visit.sort_unstable();
            visit.dedup();
        }
        visit
    }

    /// Close a visited key's windows that have ended, fixing their spend; reap closed
    /// records once their final reports are out (the node-side mirror of C7).
    fn close_ended_windows(&mut self, now: Now, key: &KeyId, bucket: Option<&KeyBucket>) {
        let closed_reports = self.config.closed_reports;
        let mut reaped = 0;
        let Self { keys, log, .. } = self;
        let Some(state) = keys.get_mut(key) else {
            return;
        };
        let KeyState { track, records, .. } = state;
        let ended = records.iter().any(|(_, r)| r.end_ms <= now.wall_ms);
        records.retain_mut(|(window, rec)| {
            if !ended || rec.end_ms > now.wall_ms {
                return true;
            }
            let kw = KeyWindow {
                key: *key,
                window: *window,
            };
            let kept = close_record(kw, rec, bucket, track.as_mut(), closed_reports, log);
            reaped += usize::from(!kept);
            kept
        });
        if records.spilled() && records.len() <= records.inline_size() {
            records.shrink_to_fit();
        }
        if track.is_none() && records.is_empty() {
            keys.remove(key);
        }
        self.records_len -= reaped;
    }

    /// The most wall time one round may advance without making it late (see
    /// `handle_tick`): a quarter round over, since a timer-driven round task is often a
    /// millisecond or so late, and counting that as late would visit every key each round.
    pub(super) fn round_step_ms(&self) -> u64 {
        let round_ms = u64::from(self.config.round_ms);
        round_ms + round_ms / 4
    }

    /// One key's part of a round: demand from its decisions, then each plan window's
    /// record made and installed (the current window; the next one near the boundary),
    /// and idle credit handed back.
    fn scan_key(&mut self, now: Now, key: KeyId, bucket: &KeyBucket) {
        let mut visit = self.take_in_decisions(key, bucket);
        for (slot, spec) in bucket.policy().windows().iter().enumerate() {
            visit.slot = slot;
            let current = window_at(key, spec.length_ms, now.wall_ms);
            let left_ms = window_end_ms(key, current).saturating_sub(now.wall_ms);
            let kw = KeyWindow {
                key,
                window: current,
            };
            self.visit_current_window(now, bucket, kw, spec, left_ms, &visit);
            let next = KeyWindow {
                key,
                window: next_window(current),
            };
            self.prefetch_next_window(now, bucket, next, spec, left_ms, &visit);
        }
    }

    /// The key's demand track, moved on by the rounds since its last visit and this
    /// round's decisions; what the window steps of `scan_key` need of it.
    fn take_in_decisions(&mut self, key: KeyId, bucket: &KeyBucket) -> Visit {
        let (idle_min, idle_cap) = (
            self.config.idle_return_rounds_min,
            self.config.idle_return_rounds,
        );
        let round = self.round;
        let attempts = bucket.attempts.load(std::sync::atomic::Ordering::Relaxed);
        let track = self
            .keys
            .entry(key)
            .or_default()
            .track
            .get_or_insert_with(KeyTrack::default);
        if track.scanned_round != 0 {
            // The rounds since the last visit had no decisions for this key (the
            // attempts pass would have visited it), and `schedule` chose them as rounds
            // with nothing to do but the decay.
            track.observe_quiet(
                track.scanned_round + 1,
                round.saturating_sub(track.scanned_round + 1),
            );
        }
        track.scanned_round = round;
        let delta = u64::from(attempts.wrapping_sub(track.last_attempts));
        track.last_attempts = attempts;
        // A short counter moves only with a decision, which moves `attempts` too: a
        // visit with none (most are, see `schedule`) need not read them.
        let shorts = if delta == 0 {
            track.last_shorts
        } else {
            bucket.shorts()
        };
        let band_moved = track.observe(round, delta, shorts);
        let wanted_round = track.wanted_round;
        let demands: [u64; PLAN_WINDOWS_MAX] = std::array::from_fn(|slot| track.demand(slot));
        let active = delta > 0 || track.demand_milli.iter().any(|d| *d > 0);
        let idle_cap = Self::idle_cap_for(
            track.quiet_from_milli,
            bucket.policy().windows(),
            self.config.round_ms,
            idle_cap,
            self.config.idle_return_rounds_thin,
        );
        track.idle_cap = idle_cap;
        let idle = track.idle(band_moved, idle_min, idle_cap);
        Visit {
            slot: 0,
            delta,
            active,
            demands,
            wanted_round,
            idle_cap,
            idle,
        }
    }

    /// The current window of a plan slot: placed if the key is in demand or already has
    /// its record, then what it will not spend handed back.
    fn visit_current_window(
        &mut self,
        now: Now,
        bucket: &KeyBucket,
        kw: KeyWindow,
        spec: &WindowSpec,
        left_ms: u64,
        visit: &Visit,
    ) {
        let state = self.keys.get(&kw.key);
        let has_current = state.and_then(|s| s.rec(kw.window)).is_some();
        if visit.active || has_current {
            if unplaced(state, kw.window) {
                self.place(now, bucket, kw, visit.slot, spec.limit);
            }
            self.return_unneeded(now, bucket, kw, left_ms, visit);
        }
    }

    /// The next window of a plan slot, placed ahead within `prefetch_rounds` of the
    /// boundary (`left_ms` away) for a key in demand, or when a grant already made its
    /// record.
    fn prefetch_next_window(
        &mut self,
        now: Now,
        bucket: &KeyBucket,
        next: KeyWindow,
        spec: &WindowSpec,
        left_ms: u64,
        visit: &Visit,
    ) {
        let prefetch_ms = u64::from(self.config.prefetch_rounds) * u64::from(self.config.round_ms);
        let near_end = left_ms <= prefetch_ms;
        let state = self.keys.get(&next.key);
        let has_next = state.and_then(|s| s.rec(next.window)).is_some();
        if ((near_end && visit.active) || has_next) && unplaced(state, next.window) {
            self.place(now, bucket, next, visit.slot, spec.limit);
        }
    }

    /// Make `kw`'s record if it has none and move its credit into its word.
    fn place(&mut self, now: Now, bucket: &KeyBucket, kw: KeyWindow, slot: usize, limit: u64) {
        let fresh = !self.has_record(&kw);
        if !self.ensure_record(now, kw, slot, limit) {
            // The cap refused it: try again next round, as a pass over every key would.
            self.mark_dirty(kw.key);
        } else if fresh {
            self.take_option(bucket, kw, slot);
        }
        self.install(kw.key, bucket, kw);
    }

    /// After a visit, the round in which `key` next needs one if no decision comes for
    /// it, put on the wheel. Due is the earliest of: a record's window end (closing it,
    /// and a new current window for a key still in demand) and its prefetch point; a
    /// line's refresh; a closed line's next final report or its reaping; a record still
    /// off its word; and, run forward on a copy of the demand track, the first quiet
    /// round that hands idle credit back or moves a line's demand band (which makes it
    /// due). Wall times become rounds at `round_step_ms` a round, which is never late as
    /// long as no round advances the clock by more: such a round visits every key
    /// (`handle_tick`). Anything earlier than needed is harmless, since a visit is exact.
    fn schedule(&mut self, now: Now, key: &KeyId) {
        let round = self.round;
        let round_ms = u64::from(self.config.round_ms);
        let prefetch_ms = u64::from(self.config.prefetch_rounds) * round_ms;
        let refresh = u64::from(self.config.refresh_rounds);
        let (idle_min, idle_cap) = (
            self.config.idle_return_rounds_min,
            self.config.idle_return_rounds,
        );
        let step_ms = self.round_step_ms();
        let at_wall =
            |wall_ms: u64| round + wall_ms.saturating_sub(now.wall_ms).div_ceil(step_ms).max(1);
        let horizon = round + WHEEL_ROUNDS - 1;
        let Some(state) = self.keys.get_mut(key) else {
            return;
        };
        let mut due = u64::MAX;
        for (_, rec) in &state.records {
            match rec.place {
                Place::Closed { .. } => due = due.min(round + 1),
                Place::Off { .. } => {
                    // Off its word: installed in the next round with a bucket.
                    due = due.min(round + 1);
                }
                Place::Live => {}
            }
            if !matches!(rec.place, Place::Closed { .. }) {
                let end = rec.end_ms;
                due = due
                    .min(at_wall(end))
                    .min(at_wall(end.saturating_sub(prefetch_ms)));
                // A quiet standing line is not reported, so it has no refresh to wait
                // for: only a decision (which visits its key) can make it due.
                if !rec.unreported_standing() {
                    due = due.min(rec.reported_round + refresh.max(1));
                }
            }
        }
        // Quiet standing lines only (or none at all): no credit to hand back (standing
        // stays put) and no demand band to report, so the quiet rounds need no visit;
        // the next decision brings one and takes them in. Only with standing options
        // on: without them a key with no record still wants its next window placed.
        let all_quiet_standing = self.config.standing_permille > 0
            && self.config.mode == super::Mode::Leasing
            && state
                .records
                .iter()
                .all(|(_, r)| r.unreported_standing() && r.place == Place::Live);
        if let Some(track) = state.track.as_ref()
            && !all_quiet_standing
            && (track.demand_milli.iter().any(|d| *d > 0) || track.idle_rounds <= idle_cap)
        {
            // The wait the key's last visit chose; never longer than the configured one.
            let idle_cap = match track.idle_cap {
                0 => idle_cap,
                chosen => chosen,
            };
            let limit = due.min(horizon).saturating_sub(round);
            if let Some(j) = QuietRun::of(track).first_due(limit, idle_min, idle_cap) {
                due = due.min(round + j);
            }
        }
        if due == u64::MAX {
            state.due_round = 0;
            return;
        }
        let due = due.max(round + 1);
        if state.due_round != due {
            state.due_round = due;
            if due > horizon {
                self.far.push(std::cmp::Reverse((due, *key)));
            } else {
                self.wheel[(due % WHEEL_ROUNDS) as usize].push(*key);
            }
        }
    }
}

/// What a visit's window steps need of the key's demand track (`take_in_decisions`).
pub(super) struct Visit {
    /// The plan slot the window steps are at.
    pub(super) slot: usize,
    /// Decisions since the last visit.
    pub(super) delta: u64,
    /// Decisions now, or demand left from earlier ones: the key wants credit.
    pub(super) active: bool,
    pub(super) demands: [u64; PLAN_WINDOWS_MAX],
    /// `KeyTrack::wanted_round`.
    pub(super) wanted_round: [u64; PLAN_WINDOWS_MAX],
    /// The idle wait chosen for the key (`idle_cap_for`).
    pub(super) idle_cap: u32,
    /// Per plan window, whether its idle credit goes back this round (`KeyTrack::idle`).
    pub(super) idle: [bool; PLAN_WINDOWS_MAX],
}

/// Whether `window` still needs its record made or its credit installed: no record, or
/// its credit not in a word. Both steps are no-ops on a live or closed record, the common
/// case, so a visit asks this instead of each looking the key up again.
fn unplaced(state: Option<&KeyState>, window: WindowId) -> bool {
    state
        .and_then(|s| s.rec(window))
        .is_none_or(|r| matches!(r.place, Place::Off { .. }))
}

/// One ended record at a visit: a closed one past its final reports is reaped (false);
/// an open one is closed, its spend fixed from what its word or its book still holds.
fn close_record(
    kw: KeyWindow,
    rec: &mut WindowRecord,
    bucket: Option<&KeyBucket>,
    track: Option<&mut KeyTrack>,
    closed_reports: u32,
    log: &mut ChangeLog,
) -> bool {
    match rec.place {
        Place::Closed { .. } => {
            // A quiet standing line sends no final reports (`quiet_standing`): it goes
            // at the next visit after its close.
            if rec.closed_reports_sent < closed_reports && !rec.unreported_standing() {
                return true;
            }
            if let Some(counted) = rec.counted {
                log.note_reaped(LineChange {
                    key_window: kw,
                    allowance: rec.allowance,
                    before: Some(counted),
                    after: None,
                });
            }
            false
        }
        Place::Off { credit } => {
            rec.place = Place::Closed {
                spend: rec.received() - rec.returned - credit,
            };
            log.note(kw);
            true
        }
        Place::Live => {
            let slot = usize::from(rec.slot);
            let taken = bucket
                .and_then(|b| credit::close(b.word(slot, kw.window), kw.window.number))
                .expect("a live record's word holds its window (checked by check_invariants)");
            rec.place = Place::Closed {
                spend: rec.received() - rec.returned - taken,
            };
            log.note(kw);
            if let Some(track) = track {
                let p = credit::parity(kw.window.number);
                if track.installed.get(slot, p) == Some(kw.window.number) {
                    track.installed.set(slot, p, None);
                }
            }
            true
        }
    }
}
