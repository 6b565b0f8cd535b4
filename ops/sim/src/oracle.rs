//! The exact oracle and the books the accuracy figures come from. The oracle is one
//! central limiter with the same windows and phase offsets that sees every request in
//! global (true) time order and admits it when every window has allowance left.
//!
//! Every figure of a request is booked in the windows the node that decided it named
//! from its own (possibly skewed) clock: offered, admitted, and the oracle's count and
//! verdict. That is the window whose allowance the limiter spent and enforces (D3: skew
//! moves when a node crosses a boundary, never which window it names), so a row's
//! admissions are a part of its offers, and the oracle holds each named window to its
//! limit just as the fleet must. Without skew a node names the window of true time.

use bus_schemas::{KeyId, WindowSpec};
use node_core::window::{window_at, window_end_ms, window_start_ms};

#[derive(Clone, Copy, Debug, Default)]
struct KwBooks {
    offered: u64,
    admitted: u64,
    oracle_admitted: u64,
    /// Requests the fleet denied while the oracle had used under half the limit of every
    /// window of the plan (booked by `Books::book` only).
    denied_under_half: u64,
}

/// One closed key-window, as the CSV prints it.
#[derive(Clone, Debug)]
pub struct ClosedKw {
    pub key: KeyId,
    pub window_kind: u32,
    pub window_id: u64,
    pub allowance: u64,
    pub offered: u64,
    pub admitted: u64,
    pub oracle_admitted: u64,
    /// Requests of this key-window the fleet denied while every window of the plan had,
    /// per the oracle, used under half its limit (not in the CSV).
    pub denied_under_half: u64,
}

impl ClosedKw {
    pub fn over_pct(&self) -> f64 {
        self.admitted.saturating_sub(self.allowance) as f64 * 100.0 / self.allowance as f64
    }

    pub fn under_pct(&self) -> f64 {
        self.under_requests() as f64 * 100.0 / self.allowance as f64
    }

    /// Requests the oracle admitted here beyond what the fleet admitted.
    pub fn under_requests(&self) -> u64 {
        self.oracle_admitted.saturating_sub(self.admitted)
    }
}

pub struct Books {
    keys: Vec<KeyId>,
    windows: Vec<WindowSpec>,
    /// Every request is booked here, per key and window kind in the order its windows
    /// were first booked: a request almost always books the last or the one before,
    /// where a map of every key-window of the run (600,000 at the speed shape) cost a
    /// cache miss per booking and kept growing. `closed` sorts what it returns, so order
    /// never shows. The oracle's count of a window is its `oracle_admitted`.
    books: Vec<[Vec<(u64, KwBooks)>; 2]>,
}

/// Where window number `n` is in one key's list for one window kind, added if new.
fn booked(list: &mut Vec<(u64, KwBooks)>, n: u64) -> usize {
    match list.iter().rposition(|(m, _)| *m == n) {
        Some(at) => at,
        None => {
            list.push((n, KwBooks::default()));
            list.len() - 1
        }
    }
}

impl Books {
    pub fn new(keys: Vec<KeyId>, windows: Vec<WindowSpec>) -> Self {
        assert!(
            windows.len() <= 2,
            "the simulator books at most two window kinds"
        );
        Self {
            books: vec![[Vec::new(), Vec::new()]; keys.len()],
            keys,
            windows,
        }
    }

    /// Key `k`'s entries for the windows named at `node_wall_ms`, one per window kind.
    fn entries(&mut self, k: u32, node_wall_ms: u64) -> [usize; 2] {
        let key = self.keys[k as usize];
        let mut at = [0; 2];
        for (i, w) in self.windows.iter().enumerate() {
            let n = window_at(key, w.length_ms, node_wall_ms).number;
            at[i] = booked(&mut self.books[k as usize][i], n);
        }
        at
    }

    /// One request of key `k`, in the windows its node named at `node_wall_ms`, which
    /// the fleet admitted or not; returns the oracle's verdict. Requests come in true
    /// time order.
    pub fn book(&mut self, k: u32, node_wall_ms: u64, fleet_admitted: bool) -> bool {
        let at = self.entries(k, node_wall_ms);
        let kinds = self.windows.len();
        let lists = &mut self.books[k as usize];
        let (mut admit, mut under_half) = (true, true);
        for (i, w) in self.windows.iter().enumerate() {
            let used = lists[i][at[i]].1.oracle_admitted;
            admit &= used < w.limit;
            under_half &= used * 2 < w.limit;
        }
        for (list, &at) in lists.iter_mut().zip(&at).take(kinds) {
            let b = &mut list[at].1;
            b.offered += 1;
            b.oracle_admitted += u64::from(admit);
            b.admitted += u64::from(fleet_admitted);
            b.denied_under_half += u64::from(!fleet_admitted && under_half);
        }
        admit
    }

    /// A request offered at `wall_ms`, booked before the limiter decides; returns the
    /// oracle's verdict. `admitted` books the limiter's admit, at the same time.
    pub fn offer(&mut self, k: u32, wall_ms: u64) -> bool {
        let at = self.entries(k, wall_ms);
        let lists = &mut self.books[k as usize];
        let admit = self
            .windows
            .iter()
            .enumerate()
            .all(|(i, w)| lists[i][at[i]].1.oracle_admitted < w.limit);
        for (list, &at) in lists.iter_mut().zip(&at).take(self.windows.len()) {
            let b = &mut list[at].1;
            b.offered += 1;
            b.oracle_admitted += u64::from(admit);
        }
        admit
    }

    /// A request the limiter admitted, booked in the windows the admitting node named
    /// from its own clock: that is the window whose allowance it spent.
    pub fn admitted(&mut self, k: u32, wall_ms: u64) {
        let at = self.entries(k, wall_ms);
        for (list, &at) in self.books[k as usize]
            .iter_mut()
            .zip(&at)
            .take(self.windows.len())
        {
            list[at].1.admitted += 1;
        }
    }

    /// Every key-window that saw traffic, began at or after `start_wall_ms` (a window
    /// already running when the run began is partial and holds the fleet's cold start) and
    /// closed (in true time) by `end_wall_ms`, in a fixed order.
    pub fn closed(&self, start_wall_ms: u64, end_wall_ms: u64) -> Vec<ClosedKw> {
        let mut out: Vec<ClosedKw> = self
            .books
            .iter()
            .enumerate()
            .flat_map(|(k, kinds)| {
                kinds
                    .iter()
                    .enumerate()
                    .flat_map(move |(i, list)| list.iter().map(move |(n, b)| (k, i, *n, b)))
            })
            .filter_map(|(k, i, n, b)| {
                let key = self.keys[k];
                let w = self.windows[i];
                let id = bus_schemas::WindowId {
                    length_ms: w.length_ms,
                    number: n,
                };
                let full = window_start_ms(key, id) >= start_wall_ms;
                (full && window_end_ms(key, id) <= end_wall_ms).then_some(ClosedKw {
                    key,
                    window_kind: w.length_ms,
                    window_id: n,
                    allowance: w.limit,
                    offered: b.offered,
                    admitted: b.admitted,
                    oracle_admitted: b.oracle_admitted,
                    denied_under_half: b.denied_under_half,
                })
            })
            .collect();
        out.sort_by_key(|c| (c.key, c.window_kind, c.window_id));
        out
    }
}

/// One request as the run tells the books: its key, the node's wall clock when it
/// decided, and whether the fleet admitted it (see `Books::book`).
#[derive(Clone, Copy, Debug)]
struct Booking {
    k: u32,
    node_wall_ms: u64,
    admitted: bool,
}

/// Bookings per batch handed to the books' thread, and batches queued at most (the run
/// waits past that: at most 65,536 bookings in flight).
const BOOKING_BATCH: usize = 4_096;
const BOOKING_BATCHES_QUEUED: usize = 16;

/// The books kept on a second thread. The run only tells them what happened (nothing it
/// does reads them back until the end), so they can take their cache misses beside it;
/// bookings arrive in the run's order, which is all the oracle needs (it sees requests in
/// true-time order because the run offers them so).
pub struct BooksThread(super::offload::Offload<Booking, Books>);

impl BooksThread {
    pub fn start(mut books: Books) -> Self {
        Self(super::offload::Offload::start(
            "sim-books",
            BOOKING_BATCH,
            BOOKING_BATCHES_QUEUED,
            move |batches: super::offload::Batches<Booking>| {
                for batch in batches {
                    for b in batch.iter() {
                        books.book(b.k, b.node_wall_ms, b.admitted);
                    }
                }
                books
            },
        ))
    }

    /// One request, once its node decided it (see `Books::book`).
    pub fn book(&mut self, k: u32, node_wall_ms: u64, admitted: bool) {
        self.0.push(Booking {
            k,
            node_wall_ms,
            admitted,
        });
    }

    /// Every booking taken in: the books, as `Books::closed` reads them.
    pub fn finish(self) -> Books {
        self.0.finish().expect("the books thread does not panic")
    }
}

/// Accuracy over a set of closed key-windows.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct Accuracy {
    pub closed_key_windows: u64,
    pub over_admission_pct_max: f64,
    pub over_admission_pct_p99: f64,
    pub under_admission_pct_p99: f64,
    pub under_admission_pct_mean: f64,
    /// Under-admission as requests: per key-window, what the oracle admitted beyond what
    /// the fleet admitted, summed; and that as a percent of the oracle's admissions there.
    pub under_admitted_requests: u64,
    pub under_admitted_pct_of_oracle: f64,
    /// Requests the fleet denied while the oracle had used under half the limit of every
    /// window of the plan; and that as a percent of the requests offered there.
    pub denied_under_half_limit: u64,
    pub denied_under_half_limit_pct: f64,
}

fn p99(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let idx = ((v.len() as f64 * 0.99).ceil() as usize).clamp(1, v.len()) - 1;
    v[idx]
}

/// Four decimals: enough for the targets, and stable text for byte-identical replays.
pub fn round4(x: f64) -> f64 {
    (x * 10_000.0).round() / 10_000.0
}

/// `part` as a percent of `whole`, to four decimals (0 of nothing is 0).
fn pct(part: u64, whole: u64) -> f64 {
    round4(part as f64 * 100.0 / whole.max(1) as f64)
}

impl Accuracy {
    pub fn of<'a>(closed: impl Iterator<Item = &'a ClosedKw>) -> Self {
        let (mut over, mut under) = (Vec::new(), Vec::new());
        let (mut under_requests, mut oracle_admitted) = (0, 0);
        let (mut denied_under_half, mut offered) = (0, 0);
        for c in closed {
            over.push(c.over_pct());
            under.push(c.under_pct());
            under_requests += c.under_requests();
            oracle_admitted += c.oracle_admitted;
            denied_under_half += c.denied_under_half;
            offered += c.offered;
        }
        let n = over.len();
        Self {
            closed_key_windows: n as u64,
            over_admission_pct_max: round4(over.iter().copied().fold(0.0, f64::max)),
            over_admission_pct_p99: round4(p99(over)),
            under_admission_pct_mean: round4(if n == 0 {
                0.0
            } else {
                under.iter().sum::<f64>() / n as f64
            }),
            under_admission_pct_p99: round4(p99(under)),
            under_admitted_requests: under_requests,
            under_admitted_pct_of_oracle: pct(under_requests, oracle_admitted),
            denied_under_half_limit: denied_under_half,
            denied_under_half_limit_pct: pct(denied_under_half, offered),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A boundary seen by two nodes 20 ms apart: each request is booked, offered and
    /// admitted alike, in the window its node named, and the oracle holds that window to
    /// its limit; a denial while every window was under half used is counted as such.
    #[test]
    fn a_request_is_booked_whole_in_the_window_its_node_named() {
        let key = KeyId {
            version: 1,
            digest: 0x1234_5678_9abc_def1,
        };
        let plan = vec![
            WindowSpec {
                length_ms: 1_000,
                limit: 4,
            },
            WindowSpec {
                length_ms: 60_000,
                limit: 100,
            },
        ];
        let mut books = Books::new(vec![key], plan);
        let first = window_at(key, 1_000, 1_764_720_000_000);
        let boundary = window_end_ms(key, first);
        // A node 20 ms ahead names the next window before true time reaches it.
        assert!(books.book(0, boundary + 10, false));
        assert!(books.book(0, boundary - 10, true));
        for _ in 0..4 {
            books.book(0, boundary + 15, true);
        }
        let rows = books.closed(0, u64::MAX);
        let one_s: Vec<_> = rows.iter().filter(|c| c.window_kind == 1_000).collect();
        assert_eq!(one_s.len(), 2);
        let (before, after) = (one_s[0], one_s[1]);
        assert_eq!(
            (before.offered, before.admitted, before.oracle_admitted),
            (1, 1, 1)
        );
        // The oracle admitted the first four of the next window's five, the fleet the last four.
        assert_eq!(
            (after.offered, after.admitted, after.oracle_admitted),
            (5, 4, 4)
        );
        assert_eq!((after.under_requests(), after.denied_under_half), (0, 1));
        assert!(rows.iter().all(|c| c.admitted <= c.offered));
    }
}
