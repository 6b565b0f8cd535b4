//! The exact oracle and the books the accuracy figures come from. The oracle is one
//! central limiter with the same windows and phase offsets that sees every request in
//! global (true) time order and admits it when every window has allowance left.

use bus_schemas::{KeyId, WindowSpec};
use node_core::window::{window_at, window_end_ms, window_start_ms};

#[derive(Clone, Copy, Debug, Default)]
struct KwBooks {
    offered: u64,
    admitted: u64,
    oracle_admitted: u64,
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
}

impl ClosedKw {
    pub fn over_pct(&self) -> f64 {
        self.admitted.saturating_sub(self.allowance) as f64 * 100.0 / self.allowance as f64
    }

    pub fn under_pct(&self) -> f64 {
        self.oracle_admitted.saturating_sub(self.admitted) as f64 * 100.0 / self.allowance as f64
    }
}

pub struct Books {
    keys: Vec<KeyId>,
    windows: Vec<WindowSpec>,
    /// Oracle state per key and window kind: (window number, admitted in it).
    oracle: Vec<[(u64, u64); 2]>,
    /// Every request is booked here twice (offered, admitted), per key and window kind
    /// in the order its windows were first booked: a request almost always books the
    /// last or the one before, where a map of every key-window of the run (600,000 at
    /// the speed shape) cost a cache miss per booking and kept growing. `closed` sorts
    /// what it returns, so order never shows.
    books: Vec<[Vec<(u64, KwBooks)>; 2]>,
}

/// The books of window number `n` in one key's list for one window kind.
fn booked(list: &mut Vec<(u64, KwBooks)>, n: u64) -> &mut KwBooks {
    let at = match list.iter().rposition(|(m, _)| *m == n) {
        Some(at) => at,
        None => {
            list.push((n, KwBooks::default()));
            list.len() - 1
        }
    };
    &mut list[at].1
}

impl Books {
    pub fn new(keys: Vec<KeyId>, windows: Vec<WindowSpec>) -> Self {
        assert!(
            windows.len() <= 2,
            "the simulator books at most two window kinds"
        );
        Self {
            oracle: vec![[(u64::MAX, 0); 2]; keys.len()],
            books: vec![[Vec::new(), Vec::new()]; keys.len()],
            keys,
            windows,
        }
    }

    /// A request offered at true time `wall_ms`; returns the oracle's verdict.
    pub fn offer(&mut self, k: u32, wall_ms: u64) -> bool {
        let key = self.keys[k as usize];
        let mut admit = true;
        let mut numbers = [0u64; 2];
        for (i, w) in self.windows.iter().enumerate() {
            let n = window_at(key, w.length_ms, wall_ms).number;
            numbers[i] = n;
            let slot = &mut self.oracle[k as usize][i];
            if slot.0 != n {
                *slot = (n, 0);
            }
            admit &= slot.1 < w.limit;
        }
        for (i, n) in numbers.iter().enumerate().take(self.windows.len()) {
            if admit {
                self.oracle[k as usize][i].1 += 1;
            }
            let b = booked(&mut self.books[k as usize][i], *n);
            b.offered += 1;
            b.oracle_admitted += u64::from(admit);
        }
        admit
    }

    /// A request the limiter admitted, booked in the windows the admitting node named
    /// from its own (possibly skewed) clock: that is the window whose allowance it spent.
    pub fn admitted(&mut self, k: u32, node_wall_ms: u64) {
        let key = self.keys[k as usize];
        for (i, w) in self.windows.iter().enumerate() {
            let n = window_at(key, w.length_ms, node_wall_ms).number;
            booked(&mut self.books[k as usize][i], n).admitted += 1;
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
                })
            })
            .collect();
        out.sort_by_key(|c| (c.key, c.window_kind, c.window_id));
        out
    }
}

/// What the run tells the books, in the run's order.
#[derive(Clone, Copy, Debug)]
enum Booking {
    Offered { k: u32, wall_ms: u64 },
    Admitted { k: u32, node_wall_ms: u64 },
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
            move |batches| {
                for batch in batches {
                    for b in batch.iter() {
                        match *b {
                            Booking::Offered { k, wall_ms } => {
                                books.offer(k, wall_ms);
                            }
                            Booking::Admitted { k, node_wall_ms } => {
                                books.admitted(k, node_wall_ms);
                            }
                        }
                    }
                }
                books
            },
        ))
    }

    /// A request offered at true time `wall_ms` (see `Books::offer`).
    pub fn offer(&mut self, k: u32, wall_ms: u64) {
        self.0.push(Booking::Offered { k, wall_ms });
    }

    /// A request the limiter admitted (see `Books::admitted`).
    pub fn admitted(&mut self, k: u32, node_wall_ms: u64) {
        self.0.push(Booking::Admitted { k, node_wall_ms });
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

impl Accuracy {
    pub fn of<'a>(closed: impl Iterator<Item = &'a ClosedKw>) -> Self {
        let (mut over, mut under) = (Vec::new(), Vec::new());
        for c in closed {
            over.push(c.over_pct());
            under.push(c.under_pct());
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
        }
    }
}
