//! The round's reports (C1): which of a visited key's lines are due, and the batches,
//! one per shard per round, that carry them to the owners.
//!
//! `line_of` is the one place a record becomes a report line; the invariant checks and
//! the fast path read lines through it too, so what is checked is what is reported.

use bus_schemas::limits::{FULL_REPORT_CHUNKS_MAX, REPORT_ENTRIES_MAX};
use bus_schemas::{FullReportChunk, KeyId, KeyWindow, Now, ReportBatch, ReportEntry, ShardId};

use super::track::{Place, Reported, WindowRecord, line_band};
use super::{NodeLimiter, Transmit};
use crate::surface::KeyBucket;

impl NodeLimiter {
    /// The record's current numbers, as a report line.
    pub(super) fn line(&self, kw: &KeyWindow, rec: &WindowRecord) -> ReportEntry {
        let state = self.keys.get(&kw.key);
        let bucket = match rec.place {
            Place::Live => self.surface.get(&kw.key),
            _ => None,
        };
        line_of(
            bucket.as_deref(),
            state.map_or(0, |s| s.demand(rec.slot, self.round)),
            kw,
            rec,
        )
    }

    /// A visited key's report lines, into its shards' lists: every line that changed, is
    /// due for its refresh, or is a closed line's final report. A key not visited has
    /// none due (`schedule`), and a line's order in its batch does not depend on the
    /// visit order (`send_reports` sorts).
    pub(super) fn report_key(
        &mut self,
        key: &KeyId,
        bucket: Option<&KeyBucket>,
        per_shard: &mut [Vec<ReportEntry>],
    ) {
        let (config, links, round) = (&self.config, &self.links, self.round);
        let Some(state) = self.keys.get_mut(key) else {
            return;
        };
        let demands = state.demands(round);
        // Each record's line, built once: the quiet check and the report both read it.
        let lines: smallvec::SmallVec<[ReportEntry; 4]> = state
            .records
            .iter()
            .map(|(window, rec)| {
                let kw = KeyWindow {
                    key: *key,
                    window: *window,
                };
                line_of(bucket, demands[usize::from(rec.slot)], &kw, rec)
            })
            .collect();
        // Per plan slot: every record of it quiet (`quiet_standing`), or a busy window
        // makes its neighbour report too.
        let mut quiet = [true; bus_schemas::limits::PLAN_WINDOWS_MAX];
        for ((_, rec), line) in state.records.iter().zip(&lines) {
            quiet[usize::from(rec.slot)] &= rec.quiet_standing(line.cumulative_spend);
        }
        for ((_, rec), line) in state.records.iter_mut().zip(lines) {
            let reported = Reported {
                spend: line.cumulative_spend,
                demand_band: line_band(line.demand),
                returned: line.returned,
                self_granted: line.self_granted,
            };
            let closed = matches!(rec.place, Place::Closed { .. });
            let shard = rec.shard as usize;
            let due = if quiet[usize::from(rec.slot)] && rec.quiet_standing(line.cumulative_spend) {
                // The owner counts the option as taken (see `quiet_standing`).
                false
            } else if links[shard].full_report_now {
                true
            } else if closed {
                rec.closed_reports_sent < config.closed_reports
            } else {
                rec.last_reported != Some(reported)
                    || round - rec.reported_round >= u64::from(config.refresh_rounds)
            };
            if due {
                per_shard[shard].push(line);
                rec.last_reported = Some(reported);
                rec.reported_round = round;
                if closed {
                    rec.closed_reports_sent += 1;
                }
            }
        }
    }

    /// The round's report batches from the lines `report_key` collected.
    pub(super) fn send_reports(&mut self, now: Now, per_shard: Vec<Vec<ReportEntry>>) {
        // One batch per shard every round, empty or not: it is also the heartbeat the
        // owner uses to see this node (C8). Only a full report acknowledges its epoch.
        for (shard, mut entries) in per_shard.into_iter().enumerate() {
            entries.sort_unstable_by_key(|e| e.key_window);
            let chunk_count = entries.len().div_ceil(REPORT_ENTRIES_MAX).max(1);
            // `records_cap` keeps a full report within the chunks the wire allows (`new`).
            assert!(chunk_count <= FULL_REPORT_CHUNKS_MAX as usize);
            let full = self.links[shard].full_report_now;
            for i in 0..chunk_count {
                // The first chunk leaves, the rest stays: one batch (the usual case) moves
                // its vector rather than copying it.
                let rest = entries.split_off(entries.len().min(REPORT_ENTRIES_MAX));
                let chunk = std::mem::replace(&mut entries, rest);
                let full_report = full.then_some(FullReportChunk {
                    index: i as u32,
                    count: chunk_count as u32,
                });
                self.push_report(now, shard, chunk, full_report);
            }
        }
    }

    fn push_report(
        &mut self,
        now: Now,
        shard: usize,
        entries: Vec<ReportEntry>,
        full_report: Option<FullReportChunk>,
    ) {
        self.stats.reports_sent += 1;
        self.stats.report_entries_sent += entries.len() as u64;
        self.outbox.push_back(Transmit::Report(ReportBatch {
            node: self.config.node,
            node_epoch: self.epoch,
            seq: self.round,
            shard: ShardId(shard as u32),
            sent_at_ms: now.wall_ms,
            owner_epoch_seen: self.links[shard].owner_epoch_seen,
            entries,
            full_report,
        }));
    }
}

/// A record's current numbers as a report line. `bucket` is the key's bucket on the
/// surface, needed only while the record is live (its word holds the credit).
pub(super) fn line_of(
    bucket: Option<&KeyBucket>,
    demand: u64,
    kw: &KeyWindow,
    rec: &WindowRecord,
) -> ReportEntry {
    let (held, spend) = match rec.place {
        // Saturating: a broken book must reach check_invariants, not panic here.
        Place::Off { credit } => (credit, rec.received().saturating_sub(rec.returned + credit)),
        Place::Live => {
            let held = bucket
                .map(|b| b.credit_in(usize::from(rec.slot), kw.window))
                .unwrap_or(0);
            (held, rec.received().saturating_sub(rec.returned + held))
        }
        Place::Closed { spend } => (0, spend),
    };
    let demand = match rec.place {
        Place::Closed { .. } => 0,
        _ => demand,
    };
    ReportEntry {
        key_window: *kw,
        allowance: rec.allowance,
        cumulative_spend: spend,
        demand,
        held_credit: held,
        applied_grant: rec.applied_grant,
        returned: rec.returned,
        self_granted: rec.self_granted,
        standing_option: rec.option_settled(),
    }
}
