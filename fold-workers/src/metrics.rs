//! The fold worker's bus metrics (F6, A48), in Prometheus text format,
//! and the scrape endpoint `foldgate-fold --metrics-listen` serves them on.
//!
//! F6 wants detection that does not depend on the accurate path: a node that stops
//! reporting shows as its `reports_received_per_node_per_round` falling to 0, and a
//! bus that delays reports shows in the fold-age histogram (`reconciliation_freshness`),
//! whatever the limiter itself believes.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::service::FoldWorkerStats;
use foldgate_runtime::metrics::{self as prom, Kind};
pub use foldgate_runtime::metrics::{Histogram, Unit};

/// Node ids counted per node; a fleet is at most this big (the simulator's bound too).
pub const NODE_SLOTS: usize = 1_024;
/// Rounds per `reports_received_per_node_per_round` period (1 s at 25 ms rounds):
/// long enough that one late batch does not read as a missing node.
pub const RATE_PERIOD_ROUNDS: u64 = 40;

/// Why an envelope was dropped whole, in `DecodeError::reason` terms plus the worker's
/// own: a fast-path request without a reply subject cannot be answered.
pub const REJECT_REASONS: [&str; 7] = [
    "too_large",
    "malformed",
    "unknown_version",
    "missing",
    "invalid",
    "too_many",
    "no_reply",
];

/// Reports per node, counted over one period and published at its end.
#[derive(Debug)]
pub struct NodeRates {
    current: Vec<AtomicU64>,
    /// Last complete period, reports per round in thousandths, plus one (0 = never seen).
    last_milli_plus_one: Vec<AtomicU64>,
    rounds: AtomicU64,
}

impl Default for NodeRates {
    fn default() -> Self {
        Self {
            current: (0..NODE_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            last_milli_plus_one: (0..NODE_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            rounds: AtomicU64::new(0),
        }
    }
}

impl NodeRates {
    pub fn report_from(&self, node: u32) {
        if let Some(c) = self.current.get(node as usize) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Called once per round by the worker's round task.
    pub fn end_round(&self) {
        let rounds = self.rounds.fetch_add(1, Ordering::Relaxed) + 1;
        if rounds < RATE_PERIOD_ROUNDS {
            return;
        }
        self.rounds.store(0, Ordering::Relaxed);
        for (c, last) in self.current.iter().zip(&self.last_milli_plus_one) {
            let n = c.swap(0, Ordering::Relaxed);
            if n > 0 || last.load(Ordering::Relaxed) > 0 {
                // A node seen once stays listed: its gauge at 0 is the alert.
                last.store(n * 1_000 / rounds + 1, Ordering::Relaxed);
            }
        }
    }

    /// `(node, reports per round)` for every node seen, from the last complete period.
    pub fn last(&self) -> Vec<(u32, f64)> {
        self.last_milli_plus_one
            .iter()
            .enumerate()
            .filter_map(|(n, v)| match v.load(Ordering::Relaxed) {
                0 => None,
                m => Some((n as u32, (m - 1) as f64 / 1_000.0)),
            })
            .collect()
    }
}

/// The worker's single counters, in the order they are written: (name, help, value).
fn counters(stats: &FoldWorkerStats) -> [(&'static str, &'static str, &AtomicU64); 12] {
    [
        (
            "foldgate_fold_reports_total",
            "Report batches folded.",
            &stats.reports,
        ),
        (
            "foldgate_fold_fast_path_requests_total",
            "Fast-path requests answered (D5).",
            &stats.fast_path_requests,
        ),
        (
            "foldgate_fold_grant_batches_total",
            "Grant batches published.",
            &stats.grant_batches_published,
        ),
        (
            "foldgate_fold_publish_errors_total",
            "Publishes the NATS client refused.",
            &stats.publish_errors,
        ),
        (
            "foldgate_fold_invariant_breaches_total",
            "Owners that found their books broken and stopped issuing credit.",
            &stats.invariant_breaches,
        ),
        (
            "foldgate_fold_shards_given_up_total",
            "Shards whose owner found its invariant broken, handed back and not taken again.",
            &stats.shards_given_up,
        ),
        (
            "foldgate_fold_leases_taken_total",
            "Shard leases won (owner changes toward this worker).",
            &stats.leases_taken,
        ),
        (
            "foldgate_fold_leases_lost_total",
            "Shard leases lost or given up (owner changes away from it).",
            &stats.leases_lost,
        ),
        (
            "foldgate_fold_policy_applied_total",
            "Policy snapshots taken into force (P1).",
            &stats.policy_applied,
        ),
        (
            "foldgate_fold_policy_refused_total",
            "Policy snapshots refused whole: bad, or not newer.",
            &stats.policy_refused,
        ),
        (
            "foldgate_fold_policy_watch_errors_total",
            "Errors and ends of the policy watch, each followed by watching on.",
            &stats.policy_watch_errors,
        ),
        (
            "foldgate_fold_not_owned_total",
            "Valid envelopes for a shard this worker does not own.",
            &stats.not_owned,
        ),
    ]
}

/// Prometheus text for one worker's stats.
pub fn render(stats: &FoldWorkerStats) -> String {
    let mut out = String::with_capacity(4_096);
    for (name, help, value) in counters(stats) {
        prom::counter(&mut out, name, help, value.load(Ordering::Relaxed));
    }
    let name = "foldgate_fold_rejected_envelopes_total";
    let help = "Envelopes dropped whole, by reason (B2).";
    prom::header(&mut out, name, help, Kind::Counter);
    for (reason, v) in REJECT_REASONS.iter().zip(&stats.rejected_by_reason) {
        prom::labelled(&mut out, name, "reason", reason, v.load(Ordering::Relaxed));
    }
    prom::gauge(
        &mut out,
        "foldgate_fold_shards_owned",
        "Shards this worker owns now.",
        stats.shards_owned.load(Ordering::Relaxed),
    );
    let name = "foldgate_fold_reports_received_per_node_per_round";
    let help = "Report batches per round from each node over the last second (F6: 0 is a \
                node gone quiet; one per owned shard is normal).";
    prom::header(&mut out, name, help, Kind::Gauge);
    for (node, rate) in stats.node_rates.last() {
        prom::labelled(&mut out, name, "node", &node.to_string(), rate);
    }
    stats.fold_age_ms.render(
        &mut out,
        "foldgate_fold_reconciliation_freshness_ms",
        "Fold age: a report's send time (its node's wall clock) to its fold here, ms (F6).",
    );
    stats.grant_latency_us.render(
        &mut out,
        "foldgate_fold_grant_latency_us",
        "A report's arrival to its grant batch handed to the NATS client, us.",
    );
    out
}

/// Serves `GET /metrics` (anything else: 404) until `shutdown` turns true. HTTP/1.1 via
/// hyper, one task per connection; a scrape endpoint, so no limits beyond hyper's own.
pub async fn serve(
    listener: TcpListener,
    stats: std::sync::Arc<FoldWorkerStats>,
    mut shutdown: watch::Receiver<bool>,
) {
    use http_body_util::Full;
    use hyper::body::Bytes;
    use hyper::{Response, StatusCode};
    loop {
        let (stream, _) = tokio::select! {
            _ = shutdown.changed() => return,
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(_) => continue,
            },
        };
        let stats = std::sync::Arc::clone(&stats);
        tokio::spawn(async move {
            let svc =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let stats = std::sync::Arc::clone(&stats);
                    async move {
                        if req.uri().path() == "/metrics" {
                            Response::builder()
                                .header("content-type", "text/plain; version=0.0.4")
                                .body(Full::new(Bytes::from(render(&stats))))
                        } else {
                            Response::builder()
                                .status(StatusCode::NOT_FOUND)
                                .body(Full::new(Bytes::new()))
                        }
                    }
                });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_that_goes_quiet_reads_zero_not_absent() {
        let r = NodeRates::default();
        for _ in 0..RATE_PERIOD_ROUNDS {
            r.report_from(3);
            r.report_from(3);
            r.end_round();
        }
        assert_eq!(r.last(), vec![(3, 2.0)]);
        for _ in 0..RATE_PERIOD_ROUNDS {
            r.end_round();
        }
        assert_eq!(r.last(), vec![(3, 0.0)]);
        r.report_from(NODE_SLOTS as u32); // beyond the slots: ignored, not a panic
    }
}
