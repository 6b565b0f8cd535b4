//! What the tests and the simulator check the reconciler by: the node-side invariants
//! (ARCHITECTURE.md, "Invariants and where each is kept"), the lines as they would be reported now, and the log
//! of books changed since a checker last looked (`ChangeLog`).
//!
//! Nothing here is on a round's path except `ChangeLog::note`, which is a no-op until a
//! caller asks for changes (`track_changes`).

use bus_schemas::{KeyWindow, ReportEntry};

use super::report::line_of;
use super::track::{Place, WindowRecord};
use super::{LineChange, NodeInvariantError, NodeLimiter};
use crate::credit;
use crate::surface::KeyBucket;

/// Key-windows whose books changed, and lines reaped, since the caller last took them
/// (`NodeLimiter::track_changes`, `take_changes`). Both logs are `None` until a caller
/// asks, and hold at most `cap` entries each; past that, `overflowed` says they are
/// incomplete, and the caller checks every record instead.
pub(super) struct ChangeLog {
    changed: Option<Vec<KeyWindow>>,
    /// Lines reaped, with what they last counted.
    reaped: Option<Vec<LineChange>>,
    overflowed: bool,
    cap: usize,
}

impl ChangeLog {
    pub(super) fn new(cap: usize) -> Self {
        Self {
            changed: None,
            reaped: None,
            overflowed: false,
            cap,
        }
    }

    /// Note a key-window whose book changed, for a caller that checks them.
    pub(super) fn note(&mut self, kw: KeyWindow) {
        push_bounded(&mut self.changed, &mut self.overflowed, self.cap, kw);
    }

    /// Note a reaped line with what it last counted.
    pub(super) fn note_reaped(&mut self, change: LineChange) {
        push_bounded(&mut self.reaped, &mut self.overflowed, self.cap, change);
    }
}

/// Push onto a change log if one is kept, up to `cap` entries; past that, `overflowed`
/// says the log is incomplete.
fn push_bounded<T>(log: &mut Option<Vec<T>>, overflowed: &mut bool, cap: usize, item: T) {
    if let Some(entries) = log.as_mut() {
        if entries.len() < cap {
            entries.push(item);
        } else {
            *overflowed = true;
        }
    }
}

impl NodeLimiter {
    /// From now on, remember every key-window whose book changes (a record made,
    /// granted, installed, returned, closed or reaped), for a caller that checks each
    /// step's changes instead of every record (the simulator). Bounded by `records_cap`.
    pub fn track_changes(&mut self) {
        self.log.changed.get_or_insert_with(Vec::new);
        self.log.reaped.get_or_insert_with(Vec::new);
    }

    /// The node-side invariants for every key-window changed since the last call, and
    /// each changed line's part of a fleet-wide sum, before and now, into `out` (a
    /// reaped line first, then at most one per line). A record no change touched keeps
    /// its part: only decisions touched it, and a decision moves a unit from held to
    /// spend. `Ok(false)`: more
    /// changed than the bound holds, and `out` is not complete.
    pub fn take_changes(&mut self, out: &mut Vec<LineChange>) -> Result<bool, NodeInvariantError> {
        let complete = !std::mem::take(&mut self.log.overflowed);
        let mut kws = self
            .log
            .changed
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default();
        if let Some(reaped) = self.log.reaped.as_mut() {
            out.append(reaped);
        }
        kws.sort_unstable();
        kws.dedup();
        let mut result = Ok(complete);
        for kw in &kws {
            let Some(state) = self.keys.get_mut(&kw.key) else {
                continue;
            };
            // Neither the checks nor the sums read demand: skip catching the track up.
            let demand = 0;
            let has_bucket_need = state.rec(kw.window).is_some_and(|r| r.place == Place::Live);
            let bucket = if has_bucket_need {
                self.surface.get(&kw.key)
            } else {
                None
            };
            let Some(rec) = state.rec_mut(kw.window) else {
                continue;
            };
            match check_record(bucket.as_deref(), demand, kw, rec) {
                Ok(spend) => rec.spend_floor = spend,
                Err(e) => {
                    if result.is_ok() {
                        result = Err(e);
                    }
                    continue;
                }
            }
            let line = line_of(bucket.as_deref(), demand, kw, rec);
            // Standing credit is the owner's to count (it counts every node's option as
            // taken until it hears otherwise), so only credit beyond it is a self-grant.
            let now = Some((
                line.cumulative_spend + line.held_credit,
                rec.self_granted_beyond_option(),
            ));
            if rec.counted != now {
                out.push(LineChange {
                    key_window: *kw,
                    allowance: rec.allowance,
                    before: rec.counted,
                    after: now,
                });
                rec.counted = now;
            }
        }
        if let Some(c) = self.log.changed.as_mut()
            && c.capacity() < kws.capacity()
        {
            // Hand the larger buffer back: the log is refilled every step.
            kws.clear();
            *c = kws;
        }
        result
    }

    /// This epoch's line for a key-window, as it would be reported now (tests and the
    /// simulator use it to check fleet-wide truth).
    pub fn line_for(&self, kw: &KeyWindow) -> Option<ReportEntry> {
        self.record(kw).map(|rec| self.line(kw, rec))
    }

    /// Every key-window this epoch has a record for.
    pub fn key_windows(&self) -> impl Iterator<Item = KeyWindow> + '_ {
        self.keys.iter().flat_map(|(key, state)| {
            state.records.iter().map(|(window, _)| KeyWindow {
                key: *key,
                window: *window,
            })
        })
    }

    /// Every record's line, as `line_for` gives it, in one pass: a key's bucket is read
    /// once for all its windows (the simulator checks fleet truth every round with it).
    pub fn for_each_line(&self, mut f: impl FnMut(&ReportEntry)) {
        let round = self.round;
        for (key, state) in &self.keys {
            let bucket = if state.has_live() {
                self.surface.get(key)
            } else {
                None
            };
            let demands = state.demands(round);
            for (window, rec) in &state.records {
                let kw = KeyWindow {
                    key: *key,
                    window: *window,
                };
                f(&line_of(
                    bucket.as_deref(),
                    demands[usize::from(rec.slot)],
                    &kw,
                    rec,
                ));
            }
        }
    }

    /// Every line as `for_each_line` gives it, with `self_granted` only the credit taken
    /// beyond the standing option: a line's part of a fleet-wide sum, as
    /// `take_changes` counts it (the owner counts standing options within the allowance).
    pub fn for_each_truth_line(&self, mut f: impl FnMut(&ReportEntry)) {
        for (key, state) in &self.keys {
            for (window, rec) in &state.records {
                let kw = KeyWindow {
                    key: *key,
                    window: *window,
                };
                if let Some(mut line) = self.line_for(&kw) {
                    line.self_granted = rec.self_granted_beyond_option();
                    f(&line);
                }
            }
        }
    }

    /// The node-side safety properties (ARCHITECTURE.md, "Invariants and where each is kept"), checked after
    /// every step by the tests and the simulator.
    pub fn check_invariants(&mut self) -> Result<(), NodeInvariantError> {
        // Each floor moves as its record passes; a failed check puts back every floor it
        // moved, so it leaves them all where they were, as checking whole first would.
        let mut moved = Vec::with_capacity(self.records_len);
        let mut failure = None;
        let round = self.round;
        'keys: for (key, state) in self.keys.iter_mut() {
            let bucket = if state.has_live() {
                self.surface.get(key)
            } else {
                None
            };
            let demands = state.demands(round);
            for (window, rec) in state.records.iter_mut() {
                let kw = KeyWindow {
                    key: *key,
                    window: *window,
                };
                match check_record(bucket.as_deref(), demands[usize::from(rec.slot)], &kw, rec) {
                    Ok(spend) => moved.push(std::mem::replace(&mut rec.spend_floor, spend)),
                    Err(e) => {
                        failure = Some(e);
                        break 'keys;
                    }
                }
            }
        }
        let Some(e) = failure else {
            return Ok(());
        };
        // The map has not changed since, so it iterates in the same order.
        let mut moved = moved.into_iter();
        'restore: for state in self.keys.values_mut() {
            for (_, rec) in state.records.iter_mut() {
                let Some(floor) = moved.next() else {
                    break 'restore;
                };
                rec.spend_floor = floor;
            }
        }
        Err(e)
    }

    /// The same properties for the named key-windows only (those a message just touched),
    /// so a simulator can check after every message without a full scan each time.
    pub fn check_key_windows<'a>(
        &mut self,
        kws: impl IntoIterator<Item = &'a KeyWindow>,
    ) -> Result<(), NodeInvariantError> {
        let mut floors = Vec::new();
        for kw in kws {
            let Some(state) = self.keys.get(&kw.key) else {
                continue;
            };
            if let Some(rec) = state.rec(kw.window) {
                let bucket = match rec.place {
                    Place::Live => self.surface.get(&kw.key),
                    _ => None,
                };
                floors.push((
                    *kw,
                    check_record(
                        bucket.as_deref(),
                        state.demand(rec.slot, self.round),
                        kw,
                        rec,
                    )?,
                ));
            }
        }
        for (kw, spend) in floors {
            if let Some(rec) = self.record_mut(&kw) {
                rec.spend_floor = spend;
            }
        }
        Ok(())
    }
}

/// Checks one record; returns its cumulative spend, which must never go backwards.
fn check_record(
    bucket: Option<&KeyBucket>,
    demand: u64,
    kw: &KeyWindow,
    rec: &WindowRecord,
) -> Result<u64, NodeInvariantError> {
    if rec.applied_grant > rec.allowance + rec.returned {
        return Err(NodeInvariantError::GrantAboveAllowance {
            kw: *kw,
            applied: rec.applied_grant,
            allowance: rec.allowance,
        });
    }
    if rec.place == Place::Live {
        let ours = bucket.is_some_and(|b| {
            credit::read(b.word(usize::from(rec.slot), kw.window), kw.window.number).is_some()
        });
        if !ours {
            return Err(NodeInvariantError::WordMismatch { kw: *kw });
        }
    }
    let line = line_of(bucket, demand, kw, rec);
    let used = line.cumulative_spend + line.held_credit + line.returned;
    if used > rec.received() || line.returned > rec.received() {
        return Err(NodeInvariantError::CreditOverspent {
            kw: *kw,
            spend: line.cumulative_spend,
            held: line.held_credit,
            returned: line.returned,
            received: rec.received(),
        });
    }
    if line.cumulative_spend < rec.spend_floor {
        return Err(NodeInvariantError::SpendWentBackwards {
            kw: *kw,
            before: rec.spend_floor,
            after: line.cumulative_spend,
        });
    }
    Ok(line.cumulative_spend)
}
