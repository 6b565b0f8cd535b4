//! What the reconciler keeps per key: its demand track (`KeyTrack`, `QuietRun`), the
//! book of each of its key-windows (`WindowRecord`, `Place`, `Reported`) and the two
//! together (`KeyState`).
//!
//! These are plain data with their own arithmetic (smoothing, bands, quiet rounds); no
//! method here touches the surface, so the round's steps in the sibling modules can read
//! them while they hold a bucket.

use bus_schemas::limits::PLAN_WINDOWS_MAX;
use bus_schemas::{OwnerEpoch, WindowId};

use super::NodeLimiter;

/// Where a record's credit is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Place {
    /// Not in a credit word (not installed yet, or its bucket was evicted): `credit` units.
    Off { credit: u64 },
    /// In the surface's word for this window; the word holds the remainder.
    Live,
    /// The window is over; what was spent is final.
    Closed { spend: u64 },
}

/// What a line said when it was last reported: a line is due again when any of it changed.
/// Demand counts as changed only when it leaves its band (see `line_band`).
/// A grant applied, and the credit it added to the word, do not make a line due on their
/// own: the owner that issued it knows it (it counts `max(granted, applied)`), a new owner
/// gets every line in a full report (C8), and the refresh re-sends it within
/// `refresh_rounds`. Re-sending each line once per grant would be a third of all report
/// lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(super) struct Reported {
    pub(super) spend: u64,
    pub(super) demand_band: u32,
    pub(super) returned: u64,
    pub(super) self_granted: u64,
}

/// The reconciler's book for one key-window of this node epoch.
#[derive(Clone, Debug)]
pub(super) struct WindowRecord {
    pub(super) slot: u8,
    /// `kw.shard(shards)` and `window_end_ms(kw)`, fixed for the record's life: a round's
    /// passes read them for every line they visit, and each costs a divide.
    pub(super) shard: u32,
    pub(super) end_ms: u64,
    pub(super) allowance: u64,
    pub(super) applied_grant: u64,
    pub(super) self_granted: u64,
    /// Standing credit taken (within `self_granted`, see `standing`).
    pub(super) standing: u64,
    /// This node epoch holds the node's standing option of the key-window.
    pub(super) option: bool,
    /// The owner addressed the key-window before the option was taken: it is given up.
    pub(super) declined: bool,
    /// A fast path asked for this key-window: a deadline loan may follow
    /// (`NodeLimiter::book_loans`).
    pub(super) fast_path_asked: bool,
    /// The deadline loan of this key-window is booked in `self_granted`.
    pub(super) loan_booked: bool,
    pub(super) returned: u64,
    pub(super) owner_epoch: OwnerEpoch,
    pub(super) grant_seq: u64,
    pub(super) exhausted: bool,
    pub(super) place: Place,
    pub(super) last_reported: Option<Reported>,
    /// The round of the last report of this line: it is due again `refresh_rounds` later
    /// (a stamp rather than a count, so a round need not visit a line it does not send).
    pub(super) reported_round: u64,
    pub(super) closed_reports_sent: u32,
    /// Spend as of the last invariant check, to prove it never goes backwards.
    pub(super) spend_floor: u64,
    /// (spend + held, self-granted) as `take_changes` last handed it out: what this line
    /// adds to a fleet-wide sum a checker keeps.
    pub(super) counted: Option<(u64, u64)>,
}

impl WindowRecord {
    pub(super) fn received(&self) -> u64 {
        self.applied_grant + self.self_granted
    }
}

#[derive(Clone, Debug, Default)]
pub(super) struct KeyTrack {
    pub(super) last_attempts: u16,
    /// The bucket's short counters at the last round (`KeyBucket::shorts`).
    pub(super) last_shorts: [u32; PLAN_WINDOWS_MAX + 1],
    /// Per plan window, smoothed requests per round that wanted its credit (passed every
    /// window, or were stopped by this one), in thousandths.
    pub(super) demand_milli: [u64; PLAN_WINDOWS_MAX],
    pub(super) last_round_milli: [u64; PLAN_WINDOWS_MAX],
    pub(super) idle_rounds: u32,
    /// The highest smoothed demand when the current quiet spell began (thousandths of a
    /// request per round): how long a spell must last to mean the traffic has gone.
    pub(super) quiet_from_milli: u64,
    /// Per plan window, the last round in which a request wanted its credit (0: not yet
    /// set). A key can be busy while one of its windows is not: see `blocked_return_rounds`.
    pub(super) wanted_round: [u64; PLAN_WINDOWS_MAX],
    /// The highest smoothed demand of any window lately (thousandths of a request per
    /// round) and the round it was seen; read halved for every `PEAK_HALF_LIFE_ROUNDS`
    /// since (`KeyTrack::peak`). A stray request in a quiet spell starts a new spell
    /// from almost nothing, so `quiet_from_milli` forgets a burst that this keeps.
    pub(super) peak_milli: u64,
    pub(super) peak_round: u64,
    /// Which window number each credit word holds (slot, parity).
    pub(super) installed: Installed,
    /// The last round whose decisions this track took in (0: none yet). Rounds a key
    /// is not visited in had no decisions for it, and are taken in as quiet rounds when
    /// it next is (`KeyTrack::observe`).
    pub(super) scanned_round: u64,
    /// The idle wait `scan_key` chose at the key's last visit (`NodeLimiter::idle_cap_for`;
    /// 0: not visited yet), so that `schedule` plans the visit at which it runs out.
    pub(super) idle_cap: u32,
}

/// Per plan slot and parity, the window number a credit word holds, if any. `u64::MAX`
/// stands for none (no window number comes near it), so the table takes 64 bytes instead
/// of 128: it sits in every key's state, which each round's passes walk whole.
#[derive(Clone, Copy, Debug)]
pub(super) struct Installed([[u64; 2]; PLAN_WINDOWS_MAX]);

impl Default for Installed {
    fn default() -> Self {
        Self([[u64::MAX; 2]; PLAN_WINDOWS_MAX])
    }
}

impl Installed {
    pub(super) fn get(&self, slot: usize, parity: usize) -> Option<u64> {
        Some(self.0[slot][parity]).filter(|n| *n != u64::MAX)
    }

    pub(super) fn set(&mut self, slot: usize, parity: usize, number: Option<u64>) {
        debug_assert!(number != Some(u64::MAX));
        self.0[slot][parity] = number.unwrap_or(u64::MAX);
    }
}

/// How fast `KeyTrack::peak` forgets: halved every 4 s at 25 ms rounds, so a key that
/// bursts every few seconds (the sim's bursty keys: 1 s on in every 4) is still known
/// for one at its next burst.
const PEAK_HALF_LIFE_ROUNDS: u64 = 160;

impl KeyTrack {
    pub(super) fn demand(&self, slot: usize) -> u64 {
        reported_demand(&self.demand_milli, &self.last_round_milli, slot)
    }

    /// The recent peak as of `round`, decayed on read so a quiet key costs nothing.
    pub(super) fn peak(&self, round: u64) -> u64 {
        let halvings = round.saturating_sub(self.peak_round) / PEAK_HALF_LIFE_ROUNDS;
        self.peak_milli >> halvings.min(63)
    }

    /// Round `round` of the demand track: `delta` decisions since the last round,
    /// `shorts` the bucket's short counters now. Returns, per plan window, whether its
    /// smoothed demand left its factor-of-two band. A round with no decisions is
    /// `observe(round, 0, self.last_shorts)`, which is how the rounds a key was not
    /// visited in are taken in.
    pub(super) fn observe(
        &mut self,
        round: u64,
        delta: u64,
        shorts: [u32; PLAN_WINDOWS_MAX + 1],
    ) -> [bool; PLAN_WINDOWS_MAX] {
        let short_delta =
            |i: usize| u64::from(shorts[i].wrapping_sub(self.last_shorts[i])).min(delta);
        let passed = delta - short_delta(PLAN_WINDOWS_MAX);
        let samples: [u64; PLAN_WINDOWS_MAX] =
            std::array::from_fn(|slot| (passed + short_delta(slot)).min(delta) * 1_000);
        self.last_shorts = shorts;
        // Read before this round's decay, and only in the round a quiet spell begins.
        let quiet_from_milli = (delta == 0 && self.idle_rounds == 0)
            .then(|| self.demand_milli.iter().copied().max().unwrap_or(0));
        let mut band_moved = [false; PLAN_WINDOWS_MAX];
        for (slot, sample) in samples.into_iter().enumerate() {
            // Peak-biased smoothing: rises within one round, decays over about eight,
            // so a burst is seen at once and a pause does not strand the next
            // window's grant. The step is at least 1 so integer decay reaches the
            // sample: a residue that never reaches 0 would keep an idle node asking for
            // (and returning) credit forever.
            let d = self.demand_milli[slot];
            self.last_round_milli[slot] = sample;
            self.demand_milli[slot] = smoothed(d, sample);
            band_moved[slot] = demand_band(d) != demand_band(self.demand_milli[slot]);
            if sample > 0 || self.wanted_round[slot] == 0 {
                self.wanted_round[slot] = round;
            }
        }
        let smoothed = self.demand_milli.iter().copied().max().unwrap_or(0);
        if smoothed >= self.peak(round) {
            self.peak_milli = smoothed;
            self.peak_round = round;
        }
        self.idle_rounds = if delta == 0 {
            if let Some(rate_milli) = quiet_from_milli {
                self.quiet_from_milli = rate_milli;
            }
            self.idle_rounds.saturating_add(1)
        } else {
            0
        };
        band_moved
    }

    /// `rounds` rounds with no decisions from round `first`, as that many `observe(r, 0,
    /// ..)` would take them. Once every demand has decayed to 0 (in at most ~150 rounds
    /// from any demand a 16-bit attempt counter allows) a quiet round only counts
    /// itself, so a key back after an hour costs no more than one back after a few
    /// seconds. The rest of the track needs no rounds counted then either: a zero sample
    /// never moves `wanted_round`, and the recent peak reads the same on both sides of
    /// the shortcut (`peak` decays on read, and a settled demand only replaces a peak
    /// that already reads 0).
    pub(super) fn observe_quiet(&mut self, first: u64, rounds: u64) {
        for done in 0..rounds {
            let settled = self.idle_rounds > 0
                && self.demand_milli.iter().all(|d| *d == 0)
                && self.last_round_milli.iter().all(|d| *d == 0);
            if settled {
                let left = u32::try_from(rounds - done).unwrap_or(u32::MAX);
                self.idle_rounds = self.idle_rounds.saturating_add(left);
                return;
            }
            self.observe(first + done, 0, self.last_shorts);
        }
    }

    /// Idle credit goes back every quiet round from `idle_return_after` up to the
    /// configured wait, then only each time a window's decaying demand leaves its
    /// factor-of-two band (down to 0), rounds in which its report line is due anyway
    /// (`demand_band`). The owner re-grants against the demand residue what the node
    /// hands back, and handing it back every quiet round for as long as the residue
    /// lasts would make a report line and a grant per quiet key per round, most of the
    /// protocol's traffic (BENCHMARKS.md, simulator). A busy key that went quiet (its
    /// traffic moved) still hands its credit back every round until the configured wait.
    pub(super) fn idle(
        &self,
        band_moved: [bool; PLAN_WINDOWS_MAX],
        idle_min: u32,
        idle_cap: u32,
    ) -> [bool; PLAN_WINDOWS_MAX] {
        let idle_after = NodeLimiter::idle_return_after(idle_min, idle_cap, self.quiet_from_milli);
        std::array::from_fn(|slot| {
            idle_return_due(self.idle_rounds, idle_after, idle_cap, band_moved[slot])
        })
    }
}

/// A window's demand as a line reports it (`KeyTrack::demand`): the larger of the
/// smoothed rate and the last round's count, so a burst shows in the round it starts.
/// `QuietRun` reads its own copies of the two through this too.
fn reported_demand(
    demand_milli: &[u64; PLAN_WINDOWS_MAX],
    last_round_milli: &[u64; PLAN_WINDOWS_MAX],
    slot: usize,
) -> u64 {
    demand_milli[slot].max(last_round_milli[slot])
}

/// One round of `KeyTrack`'s peak-biased smoothing: rises within one round, decays over
/// about eight (see `KeyTrack::observe`).
fn smoothed(demand_milli: u64, sample_milli: u64) -> u64 {
    if sample_milli >= demand_milli {
        credit_sizing::smoothed_rise(demand_milli, sample_milli)
    } else {
        demand_milli - (demand_milli - sample_milli).div_ceil(8)
    }
}

/// Whether a window's idle credit goes back in a quiet spell's `idle_rounds`-th round
/// (see `KeyTrack::idle`).
fn idle_return_due(idle_rounds: u32, idle_after: u32, idle_cap: u32, band_moved: bool) -> bool {
    idle_rounds >= idle_after && (idle_rounds <= idle_cap || band_moved)
}

/// The part of a `KeyTrack` that quiet rounds move and `schedule` reads: `observe(r, 0,
/// ..)` run forward on a clone of the whole track costs a tenth of the simulator's main
/// thread (BENCHMARKS.md), most of it on fields a quiet round leaves alone or `schedule`
/// never looks at (the short counters, the recent peak, the wanted rounds). Kept exact:
/// `a_quiet_run_finds_the_round_a_forward_run_of_observe_finds` holds it to `observe`.
#[derive(Clone, Copy, Debug)]
pub(super) struct QuietRun {
    demand_milli: [u64; PLAN_WINDOWS_MAX],
    last_round_milli: [u64; PLAN_WINDOWS_MAX],
    idle_rounds: u32,
    quiet_from_milli: u64,
}

impl QuietRun {
    pub(super) fn of(track: &KeyTrack) -> Self {
        Self {
            demand_milli: track.demand_milli,
            last_round_milli: track.last_round_milli,
            idle_rounds: track.idle_rounds,
            quiet_from_milli: track.quiet_from_milli,
        }
    }

    /// The first of the quiet rounds 1..`rounds` after which the key is due: a window
    /// hands idle credit back (`KeyTrack::idle`) or a line's demand (`KeyTrack::demand`)
    /// has left the band it is in now.
    pub(super) fn first_due(mut self, rounds: u64, idle_min: u32, idle_cap: u32) -> Option<u64> {
        let demand =
            |r: &Self, slot: usize| reported_demand(&r.demand_milli, &r.last_round_milli, slot);
        let bands: [u32; PLAN_WINDOWS_MAX] =
            std::array::from_fn(|slot| line_band(demand(&self, slot)));
        for j in 1..rounds {
            if self.idle_rounds == 0 {
                self.quiet_from_milli = self.demand_milli.iter().copied().max().unwrap_or(0);
            }
            let mut moved = [false; PLAN_WINDOWS_MAX];
            for (slot, d) in self.demand_milli.iter_mut().enumerate() {
                let before = *d;
                *d = smoothed(before, 0);
                moved[slot] = demand_band(before) != demand_band(*d);
            }
            self.last_round_milli = [0; PLAN_WINDOWS_MAX];
            self.idle_rounds = self.idle_rounds.saturating_add(1);
            let idle_after =
                NodeLimiter::idle_return_after(idle_min, idle_cap, self.quiet_from_milli);
            let idle = (0..PLAN_WINDOWS_MAX)
                .any(|slot| idle_return_due(self.idle_rounds, idle_after, idle_cap, moved[slot]));
            let band_moved =
                (0..PLAN_WINDOWS_MAX).any(|slot| line_band(demand(&self, slot)) != bands[slot]);
            if idle || band_moved {
                return Some(j);
            }
        }
        None
    }
}

/// Everything the reconciler keeps for one key: its demand track and the book of each of
/// its key-windows (the current window of each plan slot, a prefetched next one, closed
/// ones awaiting their final reports: a handful). Grouped by key, a round's passes look a
/// key up once and its bucket on the surface once for all its windows, where one map per
/// key-window cost a lookup in each map per window per pass.
#[derive(Clone, Debug, Default)]
pub(super) struct KeyState {
    /// `None` until a tick or an install sees the key, and again after eviction (D7);
    /// the records outlive it so spend is never forgotten mid-window.
    pub(super) track: Option<KeyTrack>,
    /// Inline: a round's passes walk the map's storage in order instead of chasing a
    /// pointer per key. Two (a plan's two current windows) most of the time; around a
    /// boundary a prefetched or a closed window spills to the heap for a few rounds,
    /// and `close_ended_windows` moves them back inline.
    pub(super) records: smallvec::SmallVec<[(WindowId, WindowRecord); 2]>,
    /// The last round that visited this key (a key is visited once a round at most).
    pub(super) visit_round: u64,
    /// The round this key is next due a visit in with no new decisions (0: none; see
    /// `NodeLimiter::schedule`).
    pub(super) due_round: u64,
}

impl KeyState {
    pub(super) fn rec(&self, window: WindowId) -> Option<&WindowRecord> {
        self.records
            .iter()
            .find(|(w, _)| *w == window)
            .map(|(_, r)| r)
    }

    pub(super) fn rec_mut(&mut self, window: WindowId) -> Option<&mut WindowRecord> {
        self.records
            .iter_mut()
            .find(|(w, _)| *w == window)
            .map(|(_, r)| r)
    }

    pub(super) fn has_live(&self) -> bool {
        self.records.iter().any(|(_, r)| r.place == Place::Live)
    }

    /// Demand for plan window `slot` (see `KeyTrack::demand_milli`) as of `round`.
    pub(super) fn demand(&self, slot: u8, round: u64) -> u64 {
        self.demands(round)[usize::from(slot)]
    }

    /// Every plan window's demand at once as of `round`, for loops that hold the records
    /// mutably. A track not visited since an earlier round is read with those quiet
    /// rounds taken in, on a copy: the line is what a visit every round would show.
    pub(super) fn demands(&self, round: u64) -> [u64; PLAN_WINDOWS_MAX] {
        self.track_at(round).map_or([0; PLAN_WINDOWS_MAX], |t| {
            std::array::from_fn(|slot| t.demand(slot))
        })
    }

    /// The demand track as a visit in every round up to `round` would have left it: the
    /// track itself when it is up to date, else a copy with the quiet rounds since its
    /// last visit taken in.
    pub(super) fn track_at(&self, round: u64) -> Option<std::borrow::Cow<'_, KeyTrack>> {
        let track = self.track.as_ref()?;
        if track.scanned_round == 0 || track.scanned_round >= round {
            return Some(std::borrow::Cow::Borrowed(track));
        }
        let mut t = track.clone();
        t.observe_quiet(track.scanned_round + 1, round - track.scanned_round);
        Some(std::borrow::Cow::Owned(t))
    }
}

/// Smoothed demand moves every round as it decays, and a line re-sent only for that made
/// almost every line of a quiet key due every round (C4 sizes a grant as h x demand, with h
/// = 1.25 of headroom, so the owner gains little from a step of 12%). A band is a power of
/// two: demand has left its band when it halves or doubles, reaches 0 or leaves it. The
/// idle return follows these bands (`KeyTrack::idle`); a line's report follows
/// `line_band`. Any line sent for another reason carries the exact demand.
fn demand_band(demand: u64) -> u32 {
    u64::BITS - demand.leading_zeros()
}

/// Below this demand (thousandths of a request per round: one request in four rounds) a
/// line is not re-sent for a change of band, only for reaching 0 or leaving it. Down
/// there the owner's grant for it is a unit or two whatever the band (C4: h x demand x
/// lead plus `burst_sigmas` standard deviations of Poisson arrivals, rounded up), while
/// the bands cost a line per halving of every quiet key's decaying demand: two thirds of
/// all report lines at the reference load (BENCHMARKS.md, simulator). Idle returns
/// still follow every band, so credit a quiet node holds goes back as before.
const LINE_BAND_FLOOR_MILLI: u64 = 256;

/// The band a line's demand is reported in (see `LINE_BAND_FLOOR_MILLI`).
pub(super) fn line_band(demand: u64) -> u32 {
    if demand >= LINE_BAND_FLOOR_MILLI {
        demand_band(demand)
    } else {
        u32::from(demand > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::KeyTrack;

    /// `QuietRun` is `schedule`'s shortcut for running `observe(r, 0, ..)` forward on a
    /// clone of the track: for tracks left by varied traffic (a burst per short window
    /// and a one-window key included), at every quiet round count and idle setting, both
    /// name the same first due round.
    #[test]
    fn a_quiet_run_finds_the_round_a_forward_run_of_observe_finds() {
        let forward = |track: &KeyTrack, rounds: u64, idle_min: u32, idle_cap: u32| {
            let bands: [u32; super::PLAN_WINDOWS_MAX] =
                std::array::from_fn(|slot| super::line_band(track.demand(slot)));
            let mut t = track.clone();
            (1..rounds).find(|j| {
                let moved = t.observe(100 + j, 0, t.last_shorts);
                let idle = t.idle(moved, idle_min, idle_cap);
                idle.iter().any(|i| *i)
                    || (0..super::PLAN_WINDOWS_MAX)
                        .any(|slot| super::line_band(t.demand(slot)) != bands[slot])
            })
        };
        let mut checked = 0;
        let mut found = 0;
        for seed in 0..400u64 {
            let mut track = KeyTrack::default();
            let mut shorts = [0u32; super::PLAN_WINDOWS_MAX + 1];
            let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let mut next = |m: u64| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x % m
            };
            let busy = 1 + next(30);
            for round in 1..=busy {
                let delta = if next(3) == 0 { 0 } else { next(12) };
                // Some decisions stopped by one window only: its demand differs.
                shorts[0] = shorts[0].wrapping_add(u32::try_from(next(delta + 1)).unwrap());
                track.observe(round, delta, shorts);
            }
            for (idle_min, idle_cap) in [(2u32, 8u32), (8, 8), (1, 30)] {
                for rounds in [1u64, 2, 5, 31] {
                    let want = forward(&track, rounds, idle_min, idle_cap);
                    let got = super::QuietRun::of(&track).first_due(rounds, idle_min, idle_cap);
                    assert_eq!(
                        got, want,
                        "seed {seed} idle {idle_min}/{idle_cap} rounds {rounds}"
                    );
                    checked += 1;
                    found += usize::from(want.is_some());
                }
            }
        }
        // Both outcomes are exercised, or the test proves nothing.
        assert!(
            found > checked / 10 && found < checked,
            "{found} of {checked}"
        );
    }

    /// A key not visited for n rounds takes them in at its next visit: the shortcut
    /// once demand has settled at 0 must equal n quiet rounds one by one.
    #[test]
    fn quiet_rounds_taken_in_at_once_equal_one_by_one() {
        for (sample, busy, n) in [(1u64, 1u64, 1u64), (3, 4, 7), (40, 2, 200), (1, 9, 5_000)] {
            let mut a = KeyTrack::default();
            let mut attempts = [0u32; super::PLAN_WINDOWS_MAX + 1];
            for round in 1..=busy {
                attempts[0] += 1;
                a.observe(round, sample, attempts);
            }
            let mut b = a.clone();
            for round in busy + 1..=busy + n {
                a.observe(round, 0, a.last_shorts);
            }
            b.observe_quiet(busy + 1, n);
            let end = busy + n;
            for later in [end, end + 1, end + 10_000] {
                assert_eq!(a.peak(later), b.peak(later), "{sample} {busy} {n} {later}");
            }
            assert_eq!(
                (
                    a.demand_milli,
                    a.last_round_milli,
                    a.idle_rounds,
                    a.quiet_from_milli,
                    a.wanted_round
                ),
                (
                    b.demand_milli,
                    b.last_round_milli,
                    b.idle_rounds,
                    b.quiet_from_milli,
                    b.wanted_round
                ),
                "{sample} {busy} {n}"
            );
        }
    }
}
