//! `foldgate-edge`: the backstop that lives outside the limiter (D9, ADR-4, A54). A separate
//! process in front of one or more nodes that caps each key at a coarse per-second floor
//! and all traffic at this edge's share of the fleet admission ceiling. It reads no policy,
//! holds no credit and needs neither the nodes, the bus nor the policy store to be alive,
//! so a limiter crash loop behind it leaves both bounds in force.
//!
//! Both caps are fixed one-second counters (the surface's `Backstop` table): coarse and
//! generous on purpose; accuracy is the limiter's job, the edge bounds its failure.

use std::hash::BuildHasher;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use serde::{Deserialize, Serialize};

use super::auth::{CorrelationIds, extract_key};
use super::contract::{self, Body};
use super::metrics::{self, GatewayMetrics, Outcome};
use super::proxy::{Upstream, UpstreamError, UpstreamSettings};
use super::server::{Gateway, ServerSettings};
use crate::surface::Backstop;

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct EdgeSettings {
    pub key_floor_per_s: u64,
    pub fleet_ceiling_per_s: u64,
    pub edge_count: u32,
    pub log_format: String,
    pub log_level: String,
    pub server: ServerSettings,
    /// The nodes behind this edge (`urls`), round-robin.
    pub upstream: UpstreamSettings,
}

impl Default for EdgeSettings {
    fn default() -> Self {
        Self {
            // 4x the busiest key's 150 req/s (S2): D8's generous multiple.
            key_floor_per_s: 600,
            // A49: min(1.5 x peak, backend capacity) for the fleet.
            fleet_ceiling_per_s: 75_000,
            edge_count: 20,
            log_format: "json".into(),
            log_level: "info".into(),
            server: ServerSettings {
                listen: SocketAddr::from(([127, 0, 0, 1], 8000)),
                admin_listen: SocketAddr::from(([127, 0, 0, 1], 9000)),
                max_connections: 20_000,
                ..ServerSettings::default()
            },
            // A node that does not accept within 250 ms is down; say 502 and move on.
            upstream: UpstreamSettings {
                urls: vec!["http://127.0.0.1:8080".into()],
                connect_timeout_ms: 250,
                // A node's 1,024 (`UpstreamSettings`) for each of the reference 20.
                max_in_flight: 20 * 1_024,
                ..UpstreamSettings::default()
            },
        }
    }
}

impl EdgeSettings {
    /// This edge's share of the fleet ceiling, per second.
    pub fn ceiling_share_per_s(&self) -> u64 {
        self.fleet_ceiling_per_s
            .div_ceil(u64::from(self.edge_count.max(1)))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EdgeError {
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    /// A floor of 0 did not refuse everything: the first request of each second passed.
    #[error("key_floor_per_s and fleet_ceiling_per_s must be at least 1")]
    ZeroFloor,
}

pub struct EdgeGuard {
    pub metrics: GatewayMetrics,
    upstream: Upstream,
    ids: CorrelationIds,
    /// Keys are told apart by a per-process keyed SipHash of the raw key: the edge needs
    /// no shared identity with the nodes, only a stable bucket for this process's life.
    key_hash: std::collections::hash_map::RandomState,
    floor: Backstop,
    ceiling: Backstop,
    key_floor_per_s: u64,
    ceiling_per_s: u64,
    pub capped_key_floor: AtomicU64,
    pub capped_ceiling: AtomicU64,
}

fn wall_ms() -> u64 {
    foldgate_runtime::wall_since_epoch().as_millis() as u64
}

impl EdgeGuard {
    pub fn new(settings: &EdgeSettings) -> Result<Self, EdgeError> {
        if settings.key_floor_per_s == 0 || settings.fleet_ceiling_per_s == 0 {
            return Err(EdgeError::ZeroFloor);
        }
        Ok(Self {
            metrics: GatewayMetrics::default(),
            upstream: settings.upstream.build(&settings.server.limits())?,
            ids: CorrelationIds::default(),
            key_hash: std::collections::hash_map::RandomState::new(),
            floor: Backstop::new(),
            ceiling: Backstop::new(),
            key_floor_per_s: settings.key_floor_per_s,
            ceiling_per_s: settings.ceiling_share_per_s(),
            capped_key_floor: AtomicU64::new(0),
            capped_ceiling: AtomicU64::new(0),
        })
    }

    fn limited(&self, cap: &str, now_ms: u64, wait_ms: u64, cid: &str) -> Response<Body> {
        self.metrics.outcome(Outcome::Limited);
        tracing::info!(correlation_id = cid, cap, "edge cap");
        // The edge only caps when something behind it failed or traffic is abusive, so
        // its 429 always says enforcement is degraded.
        contract::too_many(
            &format!("edge_{cap}"),
            now_ms / 1_000,
            cap,
            wait_ms,
            cid,
            true,
        )
    }
}

impl Gateway for EdgeGuard {
    async fn handle(&self, req: Request<Incoming>, peer: SocketAddr) -> Response<Body> {
        let started = Instant::now();
        let cid = self.ids.for_request(req.headers());
        let now_ms = wall_ms();
        let wait_ms = 1_000 - now_ms % 1_000;
        // A request without a usable key is the node's to refuse (401); it still counts
        // against the ceiling, so keyless floods are bounded too.
        if let Ok(raw) = extract_key(req.headers()) {
            let h = self.key_hash.hash_one(raw);
            if !self.floor.try_admit_hash(h, now_ms, self.key_floor_per_s) {
                self.capped_key_floor.fetch_add(1, Ordering::Relaxed);
                return self.limited("key_floor", now_ms, wait_ms, &cid);
            }
        }
        if !self.ceiling.try_admit_hash(0, now_ms, self.ceiling_per_s) {
            self.capped_ceiling.fetch_add(1, Ordering::Relaxed);
            return self.limited("ceiling", now_ms, wait_ms, &cid);
        }
        // After the floors, unlike the node's place (taken before its limiter charges the
        // key): the floors bound floods and are no client's allowance, so a flood keeps
        // its 429 and its count while the upstream is full.
        let place = match self.upstream.take_place(&cid) {
            Ok(place) => place,
            Err(overloaded) => {
                let (resp, outcome) = overloaded.response(&cid);
                self.metrics.outcome(outcome);
                self.metrics
                    .request_latency
                    .observe_duration(started.elapsed());
                return resp;
            }
        };
        let (resp, outcome) = self.upstream.forward(place, req, peer, &cid, &[]).await;
        self.metrics.outcome(outcome);
        self.metrics
            .request_latency
            .observe_duration(started.elapsed());
        resp
    }

    fn admin(&self, req: &Request<Incoming>) -> Response<Body> {
        match req.uri().path() {
            "/metrics" => {
                let mut out = String::new();
                self.metrics.render(&mut out, "foldgate_edge");
                metrics::counter(
                    &mut out,
                    "foldgate_edge_capped_key_floor_total",
                    "Requests over the per-key floor (D8, D9).",
                    self.capped_key_floor.load(Ordering::Relaxed),
                );
                metrics::counter(
                    &mut out,
                    "foldgate_edge_capped_ceiling_total",
                    "Requests over this edge's share of the fleet ceiling (D9).",
                    self.capped_ceiling.load(Ordering::Relaxed),
                );
                metrics::gauge(
                    &mut out,
                    "foldgate_edge_upstream_in_flight",
                    "Exchanges with the nodes in flight (upstream.max_in_flight caps them).",
                    self.upstream.in_flight() as u64,
                );
                contract::plain(StatusCode::OK, "text/plain; version=0.0.4", out)
            }
            // The edge is ready whenever it runs: it depends on nothing behind it.
            "/healthz" | "/readyz" => contract::plain(StatusCode::OK, "text/plain", "ok\n".into()),
            _ => contract::plain(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
        }
    }

    fn metrics(&self) -> &GatewayMetrics {
        &self.metrics
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A floor of 0 passed the first request of every second; it is refused at start.
    #[test]
    fn a_zero_floor_or_ceiling_is_refused() {
        assert!(EdgeGuard::new(&EdgeSettings::default()).is_ok());
        for bad in [
            EdgeSettings {
                key_floor_per_s: 0,
                ..EdgeSettings::default()
            },
            EdgeSettings {
                fleet_ceiling_per_s: 0,
                ..EdgeSettings::default()
            },
        ] {
            assert!(matches!(EdgeGuard::new(&bad), Err(EdgeError::ZeroFloor)));
        }
    }
}
