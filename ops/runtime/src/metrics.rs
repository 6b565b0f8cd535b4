//! A fixed-bucket histogram with atomic counts, and the Prometheus text rendering every
//! Foldgate metric goes through: headers, single counters and gauges, histograms.
//!
//! Plain atomics rather than a registry with label maps: a registry puts a lookup on
//! every observation, and these sit on the request path and the fold path, which only
//! increment.

use std::fmt::{Display, Write as _};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A metric's Prometheus type, as its `# TYPE` line names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// Appends a metric's `# HELP` and `# TYPE` lines; its samples follow.
pub fn header(out: &mut String, name: &str, help: &str, kind: Kind) {
    let kind = kind.as_str();
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// Appends a metric of one unlabelled sample, header included.
pub fn single(out: &mut String, name: &str, help: &str, kind: Kind, value: u64) {
    header(out, name, help, kind);
    let _ = writeln!(out, "{name} {value}");
}

/// Appends a counter of one unlabelled sample.
pub fn counter(out: &mut String, name: &str, help: &str, value: u64) {
    single(out, name, help, Kind::Counter, value);
}

/// Appends a gauge of one unlabelled sample.
pub fn gauge(out: &mut String, name: &str, help: &str, value: u64) {
    single(out, name, help, Kind::Gauge, value);
}

/// Appends one sample of a labelled metric: `name{label="value"} sample`.
pub fn labelled(out: &mut String, name: &str, label: &str, value: &str, sample: impl Display) {
    let _ = writeln!(out, "{name}{{{label}=\"{value}\"}} {sample}");
}

/// How a histogram's values are written out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// As counted: bounds and sum are integers (rounds, entries).
    Count,
    /// Nanoseconds counted, seconds written (Prometheus' base unit for time).
    NanosAsSeconds,
}

/// A histogram over `bounds` (ascending upper bounds, inclusive), with one overflow
/// bucket past the last.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [u64],
    unit: Unit,
    counts: Box<[AtomicU64]>,
    sum: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &'static [u64], unit: Unit) -> Self {
        assert!(bounds.windows(2).all(|w| w[0] < w[1]), "bounds ascend");
        Self {
            bounds,
            unit,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, value: u64) {
        let i = self.bounds.partition_point(|&b| b < value);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(value, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// A duration, in nanoseconds (saturating at `u64::MAX`).
    pub fn observe_duration(&self, d: Duration) {
        self.observe(d.as_nanos().min(u128::from(u64::MAX)) as u64);
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// The upper bound of the bucket holding quantile `q` (`u64::MAX` for the overflow).
    pub fn quantile_bound(&self, q: f64) -> u64 {
        let total = self.count();
        let rank = ((total as f64) * q).ceil() as u64;
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c.load(Ordering::Relaxed);
            if seen >= rank.max(1) {
                return self.bounds.get(i).copied().unwrap_or(u64::MAX);
            }
        }
        u64::MAX
    }

    /// Appends the histogram in the Prometheus text exposition format.
    pub fn render(&self, out: &mut String, name: &str, help: &str) {
        header(out, name, help, Kind::Histogram);
        let mut cumulative = 0;
        for (b, c) in self.bounds.iter().zip(self.counts.iter()) {
            cumulative += c.load(Ordering::Relaxed);
            match self.unit {
                Unit::Count => {
                    let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cumulative}");
                }
                Unit::NanosAsSeconds => {
                    let le = *b as f64 / 1e9;
                    let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {cumulative}");
                }
            }
        }
        let count = self.count();
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let sum = self.sum.load(Ordering::Relaxed);
        match self.unit {
            Unit::Count => {
                let _ = writeln!(out, "{name}_sum {sum}");
            }
            Unit::NanosAsSeconds => {
                let _ = writeln!(out, "{name}_sum {}", sum as f64 / 1e9);
            }
        }
        let _ = writeln!(out, "{name}_count {count}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_and_quantiles_land_in_their_bucket() {
        let h = Histogram::new(&[1, 5, 25], Unit::Count);
        for v in [0, 1, 2, 5, 6, 30] {
            h.observe(v);
        }
        let mut out = String::new();
        h.render(&mut out, "x", "help");
        assert!(out.contains("x_bucket{le=\"1\"} 2\n"));
        assert!(out.contains("x_bucket{le=\"5\"} 4\n"));
        assert!(out.contains("x_bucket{le=\"25\"} 5\n"));
        assert!(out.contains("x_bucket{le=\"+Inf\"} 6\n"));
        assert!(out.contains("x_sum 44\nx_count 6\n"));
        assert_eq!(h.quantile_bound(0.5), 5);
        assert_eq!(h.quantile_bound(0.99), u64::MAX);
    }

    #[test]
    fn single_series_and_labelled_samples_follow_their_header() {
        let mut out = String::new();
        counter(&mut out, "c_total", "Counted.", 3);
        gauge(&mut out, "g", "Gauged.", 4);
        header(&mut out, "l_total", "By reason.", Kind::Counter);
        labelled(&mut out, "l_total", "reason", "bad", 5);
        assert_eq!(
            out,
            "# HELP c_total Counted.\n# TYPE c_total counter\nc_total 3\n\
             # HELP g Gauged.\n# TYPE g gauge\ng 4\n\
             # HELP l_total By reason.\n# TYPE l_total counter\nl_total{reason=\"bad\"} 5\n"
        );
    }

    #[test]
    fn writes_nanoseconds_as_seconds() {
        static BOUNDS: [u64; 1] = [250];
        let h = Histogram::new(&BOUNDS, Unit::NanosAsSeconds);
        h.observe_duration(Duration::from_nanos(200));
        let mut out = String::new();
        h.render(&mut out, "t", "help");
        assert!(out.contains("t_bucket{le=\"0.00000025\"} 1\n"));
        assert!(out.contains("t_sum 0.0000002\n"));
    }
}
