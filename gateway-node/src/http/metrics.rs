//! Prometheus metrics for the gateway (O2: RED on the limiter path), as plain atomics
//! rendered in the text exposition format on demand. A registry with label maps would put
//! a lookup on every request; these are fixed counters, so a request only increments.

use std::sync::atomic::{AtomicU64, Ordering};

use foldgate_runtime::metrics::{self as prom, Kind};
pub use foldgate_runtime::metrics::{Histogram, Unit, counter, gauge};

/// Bucket upper bounds of the latency histograms, in nanoseconds: the decision is
/// expected in the first few; the rest catch fast paths and stalls.
const BOUNDS_NS: [u64; 14] = [
    250,
    500,
    1_000,
    2_000,
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    1_000_000,
    2_500_000,
    10_000_000,
    100_000_000,
];

/// A latency histogram over [`BOUNDS_NS`], written in seconds.
fn latency_histogram() -> Histogram {
    Histogram::new(&BOUNDS_NS, Unit::NanosAsSeconds)
}

/// What happened to a request, one counter each (`foldgate_requests_total{outcome}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Admitted and proxied (whatever the upstream answered).
    Proxied,
    /// 429 from the limiter (or the edge's caps).
    Limited,
    /// 401: missing, malformed or unknown key (D1).
    Unauthorized,
    /// 502: the upstream could not be reached or broke the exchange.
    UpstreamError,
    /// 504: the upstream did not answer within `upstream_timeout_ms`.
    UpstreamTimeout,
    /// 503: `upstream.max_in_flight` exchanges were in flight.
    UpstreamOverloaded,
}

const OUTCOMES: [(Outcome, &str); 6] = [
    (Outcome::Proxied, "proxied"),
    (Outcome::Limited, "limited"),
    (Outcome::Unauthorized, "unauthorized"),
    (Outcome::UpstreamError, "upstream_error"),
    (Outcome::UpstreamTimeout, "upstream_timeout"),
    (Outcome::UpstreamOverloaded, "upstream_overloaded"),
];

/// The limiter's verdicts (`foldgate_decisions_total{outcome}`), counted by the gateway so
/// the surface's common path stays free of shared counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Admit,
    FailOpen,
    Exhausted,
    FastPathDeadline,
    Backstop,
}

const VERDICTS: [(Verdict, &str); 5] = [
    (Verdict::Admit, "admit"),
    (Verdict::FailOpen, "fail_open"),
    (Verdict::Exhausted, "deny_exhausted"),
    (Verdict::FastPathDeadline, "deny_fast_path_deadline"),
    (Verdict::Backstop, "deny_backstop"),
];

pub struct GatewayMetrics {
    outcomes: [AtomicU64; OUTCOMES.len()],
    verdicts: [AtomicU64; VERDICTS.len()],
    /// Time spent in the limiter per request (the decision, fast path included).
    pub limiter_latency: Histogram,
    /// Time from request head to response head, as the gateway saw it.
    pub request_latency: Histogram,
    /// Connections refused because `max_connections` were open.
    pub connections_refused: AtomicU64,
}

impl Default for GatewayMetrics {
    fn default() -> Self {
        Self {
            outcomes: Default::default(),
            verdicts: Default::default(),
            limiter_latency: latency_histogram(),
            request_latency: latency_histogram(),
            connections_refused: AtomicU64::new(0),
        }
    }
}

impl GatewayMetrics {
    pub fn outcome(&self, o: Outcome) {
        let i = OUTCOMES.iter().position(|(x, _)| *x == o).unwrap_or(0);
        self.outcomes[i].fetch_add(1, Ordering::Relaxed);
    }

    pub fn verdict(&self, v: Verdict) {
        let i = VERDICTS.iter().position(|(x, _)| *x == v).unwrap_or(0);
        self.verdicts[i].fetch_add(1, Ordering::Relaxed);
    }

    pub fn outcome_count(&self, o: Outcome) -> u64 {
        let i = OUTCOMES.iter().position(|(x, _)| *x == o).unwrap_or(0);
        self.outcomes[i].load(Ordering::Relaxed)
    }

    /// The gateway's own series; the caller appends the limiter's and the bus's gauges.
    pub fn render(&self, out: &mut String, prefix: &str) {
        render_family(
            out,
            &format!("{prefix}_requests_total"),
            "Requests by what the gateway did with them.",
            OUTCOMES.iter().map(|(_, label)| *label).zip(&self.outcomes),
        );
        render_family(
            out,
            &format!("{prefix}_decisions_total"),
            "Limiter verdicts.",
            VERDICTS.iter().map(|(_, label)| *label).zip(&self.verdicts),
        );
        self.limiter_latency.render(
            out,
            &format!("{prefix}_limiter_added_latency_seconds"),
            "Time a request spent in the limiter.",
        );
        self.request_latency.render(
            out,
            &format!("{prefix}_request_duration_seconds"),
            "Request head to response head.",
        );
        counter(
            out,
            &format!("{prefix}_connections_refused_total"),
            "Connections closed at accept because max_connections were open.",
            self.connections_refused.load(Ordering::Relaxed),
        );
    }
}

/// A counter with one sample per `outcome` label.
fn render_family<'a>(
    out: &mut String,
    name: &str,
    help: &str,
    samples: impl Iterator<Item = (&'a str, &'a AtomicU64)>,
) {
    prom::header(out, name, help, Kind::Counter);
    for (label, n) in samples {
        prom::labelled(out, name, "outcome", label, n.load(Ordering::Relaxed));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn renders_cumulative_buckets_and_counters() {
        let m = GatewayMetrics::default();
        m.limiter_latency
            .observe_duration(Duration::from_nanos(300));
        m.limiter_latency.observe_duration(Duration::from_micros(3));
        m.limiter_latency.observe_duration(Duration::from_secs(1));
        m.outcome(Outcome::Limited);
        m.verdict(Verdict::Exhausted);
        let mut out = String::new();
        m.render(&mut out, "fg");
        assert!(
            out.contains("fg_requests_total{outcome=\"limited\"} 1"),
            "{out}"
        );
        assert!(out.contains("fg_decisions_total{outcome=\"deny_exhausted\"} 1"));
        assert!(out.contains("fg_limiter_added_latency_seconds_bucket{le=\"0.00000025\"} 0"));
        assert!(out.contains("fg_limiter_added_latency_seconds_bucket{le=\"0.0000005\"} 1"));
        assert!(out.contains("fg_limiter_added_latency_seconds_bucket{le=\"0.000005\"} 2"));
        assert!(out.contains("fg_limiter_added_latency_seconds_bucket{le=\"+Inf\"} 3"));
        assert!(out.contains("fg_limiter_added_latency_seconds_count 3"));
    }
}
