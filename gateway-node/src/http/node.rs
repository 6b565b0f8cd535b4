//! `foldgate-node`: authenticate (D1, D2), decide (D4-D6), proxy. The limiter runs on the
//! embedded in-process bus when no NATS URL is configured (the single-node default) and on
//! NATS otherwise.
//!
//! Its settings are in [`settings`], re-exported here.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use foldgate_runtime::metrics::{self as prom, Kind};
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use hyper::body::Incoming;
use tokio::sync::watch;

use super::auth::{AuthError, CorrelationIds, KeyHasher, KeyIdText, extract_key};
use super::contract::{self, Body};
use super::metrics::{GatewayMetrics, Outcome, Verdict};
use super::proxy::Upstream;
use super::server::Gateway;
use crate::bus::{Clock, NodeBusStats};
use crate::events::{EventQueue, Limited};
use crate::policy::PolicyIndex;
use crate::surface::Decision;

pub mod settings;

pub use foldgate_runtime::system_clock;
pub use settings::{
    KeySettings, NodeSettings, OtherHashKey, PlanSettings, PolicySettings, SettingsError,
    WindowSettings,
};

pub use crate::runtime::{NodeRuntime, RuntimeError, start as start_runtime};

/// The node's request path and its parts.
pub struct NodeGateway {
    pub runtime: Box<dyn NodeRuntime>,
    pub metrics: GatewayMetrics,
    /// ADR-7: this node's hash key first, then those of other live versions.
    hashers: Vec<KeyHasher>,
    ids: CorrelationIds,
    upstream: Upstream,
    policy: watch::Receiver<Arc<PolicyIndex>>,
    clock: Clock,
    limiter_enabled: bool,
    /// E1, E2: the ring each 429's event goes into, when a sink is configured.
    events: Option<Arc<EventQueue>>,
    /// The plan each key of an embedded policy is on, for its events.
    plan_ids: std::collections::HashMap<bus_schemas::KeyId, u32>,
}

const KEY_ID_HEADER: &str = "x-foldgate-key-id";

impl NodeGateway {
    pub fn new(
        settings: &NodeSettings,
        runtime: Box<dyn NodeRuntime>,
        clock: Clock,
    ) -> Result<Self, SettingsError> {
        Ok(Self {
            policy: runtime.policy(),
            runtime,
            metrics: GatewayMetrics::default(),
            hashers: settings.hashers()?,
            ids: CorrelationIds::default(),
            upstream: settings.upstream.build(&settings.server.limits())?,
            clock,
            limiter_enabled: settings.limiter_enabled,
            events: None,
            plan_ids: settings.policy.plan_ids(),
        })
    }

    /// Makes an event of every 429 from now on, into `queue` (drained by
    /// `events::pump`).
    pub fn with_events(mut self, queue: Arc<EventQueue>) -> Self {
        self.events = Some(queue);
        self
    }

    /// The ring events go into, if any.
    pub fn events(&self) -> Option<&Arc<EventQueue>> {
        self.events.as_ref()
    }

    async fn admit_and_forward(
        &self,
        req: Request<Incoming>,
        peer: SocketAddr,
        cid: &str,
    ) -> Response<Body> {
        // D1: authenticate first; nothing unauthenticated reaches the limiter.
        let raw = match extract_key(req.headers()) {
            Ok(raw) => raw,
            Err(e) => return self.unauthorized(e, cid),
        };
        let Some((key, policy, carry)) = self.resolve(raw) else {
            return self.unauthorized(AuthError::Unknown, cid);
        };
        // Before the limiter: a request shed for overload must not spend the allowance.
        // The price: while the upstream is full, a key over its limit gets this 503 (no
        // Retry-After, no limit event) rather than its 429, and a request holds its place
        // through the limiter's decision (a fast path waits at most D5's deadline).
        let place = match self.upstream.take_place(cid) {
            Ok(place) => place,
            Err(overloaded) => {
                let (resp, outcome) = overloaded.response(cid);
                self.metrics.outcome(outcome);
                return resp;
            }
        };
        let key_text = KeyIdText(key).to_string();
        let surface = self.runtime.surface();
        // A fail-open admit is enforcement degraded as much as F5 is: it says so too.
        let mut failed_open = false;
        if self.limiter_enabled {
            match self.limit(key, carry, &policy, &key_text, cid).await {
                Ok(failed) => failed_open = failed,
                Err(too_many) => return too_many,
            }
        }
        let extra = HeaderValue::from_str(&key_text)
            .map(|v| vec![(HeaderName::from_static(KEY_ID_HEADER), v)])
            .unwrap_or_default();
        let (mut resp, outcome) = self.upstream.forward(place, req, peer, cid, &extra).await;
        self.metrics.outcome(outcome);
        if failed_open || surface.degraded() {
            resp.headers_mut()
                .insert(contract::DEGRADED, HeaderValue::from_static("true"));
        }
        tracing::debug!(correlation_id = cid, key_id = %key_text, status = resp.status().as_u16(), "proxied");
        resp
    }

    /// The limiter's verdict on `key`, counted: whether it failed open, or the 429 to
    /// answer with. `carry`: the key's id under the previous hash key in a rotation
    /// (`PolicyIndex::carry_from`), decided first and binding too.
    async fn limit(
        &self,
        key: bus_schemas::KeyId,
        carry: Option<bus_schemas::KeyId>,
        policy: &crate::KeyPolicy,
        key_text: &str,
        cid: &str,
    ) -> Result<bool, Response<Body>> {
        let t = Instant::now();
        let now = (self.clock)();
        let (key, decision) = self.decide_carried(key, carry, policy, now).await;
        self.metrics.limiter_latency.observe_duration(t.elapsed());
        match decision {
            Decision::Admit => {
                self.metrics.verdict(Verdict::Admit);
                Ok(false)
            }
            Decision::FailOpen => {
                self.metrics.verdict(Verdict::FailOpen);
                tracing::warn!(correlation_id = cid, key_id = %key_text, "fail-open admit (D8)");
                Ok(true)
            }
            Decision::Deny(denial) => {
                self.metrics.verdict(match denial.reason {
                    bus_schemas::LimitReason::Exhausted => Verdict::Exhausted,
                    bus_schemas::LimitReason::FastPathDeadline => Verdict::FastPathDeadline,
                    bus_schemas::LimitReason::Backstop => Verdict::Backstop,
                });
                self.metrics.outcome(Outcome::Limited);
                let degraded = self.runtime.surface().degraded();
                if let Some(events) = &self.events {
                    events.emit(&Limited {
                        key,
                        plan_id: self.plan_ids.get(&key).copied().unwrap_or(0),
                        window: denial.window,
                        at_ms: now.wall_ms,
                        reason: denial.reason,
                        degraded: denial.degraded || degraded,
                        retry_after_ms: denial.wait_ms,
                        correlation_id: cid,
                    });
                }
                tracing::info!(
                    correlation_id = cid,
                    key_id = %KeyIdText(key),
                    window = %contract::window_name(denial.window.length_ms),
                    window_id = denial.window.number,
                    reason = contract::reason_label(denial.reason),
                    wait_ms = denial.wait_ms,
                    degraded = denial.degraded,
                    "rate limited"
                );
                Err(contract::too_many_requests(&denial, cid, degraded))
            }
            // `decide_at` settles the fast path itself; seeing one here is a limiter
            // bug, which D8 answers by failing open within the backstop (not here).
            Decision::FastPath(_) => {
                self.metrics.verdict(Verdict::FailOpen);
                Ok(true)
            }
        }
    }

    /// `key` decided, and in a rotation its old id `carry` first: the old id holds what
    /// the client spent before the switch, so admitting needs both (A1's bound through
    /// a rotation). The old id's 429 is the answer when it denies, with that id (its
    /// window is the one that binds); a new id's denial after the old admitted costs the
    /// old id one unit, a rotation's only under-admission. Returns the id the verdict
    /// is about.
    async fn decide_carried(
        &self,
        key: bus_schemas::KeyId,
        carry: Option<bus_schemas::KeyId>,
        policy: &crate::KeyPolicy,
        now: bus_schemas::Now,
    ) -> (bus_schemas::KeyId, Decision) {
        let Some(old) = carry else {
            return (key, self.runtime.decide_at(key, policy, now).await);
        };
        match self.runtime.decide_at(old, policy, now).await {
            denied @ Decision::Deny(_) => (old, denied),
            first => match self.runtime.decide_at(key, policy, now).await {
                Decision::Admit if first == Decision::FailOpen => (key, Decision::FailOpen),
                second => (key, second),
            },
        }
    }

    /// ADR-7: the key id the policy names for `raw`, under the first live hash key (this
    /// node's own version, then `other_hash_keys` in order) whose id it names, and that
    /// key's policy. A rotation is then: give every node the new key as an other key
    /// (nothing changes: the policy names the old ids); switch the policy from the old
    /// ids to the new, one version, so every node moves to the new ids as it takes it;
    /// make the new key each node's own and drop the old. No key is refused for being
    /// hashed under a version the policy does not name. The switch names each new id's
    /// old id as its `carry_from`, so a node that has switched charges both
    /// (`decide_carried`) and one that has not charges the old: the old id's windows see
    /// every request throughout and bind, and the new id's start afresh without letting
    /// the key through twice. A later version drops the carries once the longest window
    /// has passed. Returns the key id, its policy and its carry.
    fn resolve(
        &self,
        raw: &[u8],
    ) -> Option<(
        bus_schemas::KeyId,
        crate::KeyPolicy,
        Option<bus_schemas::KeyId>,
    )> {
        let index = self.policy.borrow();
        self.hashers.iter().find_map(|h| {
            let key = h.key_id(raw);
            index.get(&key).map(|p| (key, *p, index.carry_from(&key)))
        })
    }

    fn unauthorized(&self, e: AuthError, cid: &str) -> Response<Body> {
        self.metrics.outcome(Outcome::Unauthorized);
        tracing::info!(correlation_id = cid, reason = e.label(), "unauthorized");
        contract::unauthorized(e.label(), cid)
    }

    pub fn render_metrics(&self) -> String {
        let mut out = String::with_capacity(8 * 1024);
        self.metrics.render(&mut out, "foldgate");
        for (name, help, kind, value) in self.limiter_series() {
            prom::single(&mut out, name, help, kind, value);
        }
        if let Some(b) = self.runtime.bus_stats() {
            render_bus(&mut out, b);
        }
        self.render_events(&mut out);
        out
    }

    /// E2: every event is emitted once, then delivered or dropped; 0s when no sink is set.
    fn render_events(&self, out: &mut String) {
        let c = self.events.as_ref().map(|q| &q.counters);
        let n = |f: fn(&crate::events::EventCounters) -> &AtomicU64| c.map_or(0, |c| load(f(c)));
        for (name, help, value) in [
            (
                "foldgate_limit_events_emitted_total",
                "Limit events made, one per 429 (E1).",
                n(|c| &c.emitted),
            ),
            (
                "foldgate_limit_events_delivered_total",
                "Limit events the sink confirmed: acknowledged by Kafka, or in a renamed archive file.",
                n(|c| &c.delivered),
            ),
            (
                "foldgate_limit_events_dropped_total",
                "Limit events lost: the queue was full, or the sink gave them up (E2).",
                n(|c| &c.dropped),
            ),
        ] {
            prom::counter(out, name, help, value);
        }
        prom::single(
            out,
            "foldgate_limit_events_queued",
            "Limit events waiting for the sink.",
            Kind::Gauge,
            self.events.as_ref().map_or(0, |q| q.len() as u64),
        );
    }

    /// The limiter's and the runtime's series, in the order they are written.
    // Longer than 80 lines as a table of 13 rows, one per series: no logic to split.
    fn limiter_series(&self) -> [Series; 13] {
        let s = self.runtime.surface();
        let st = &s.stats;
        let (full_reports_sent, full_reports_owed) = self
            .runtime
            .with_limiter(|l| (l.stats().full_reports_sent, l.full_reports_owed()));
        [
            (
                "foldgate_enforcement_degraded",
                "1 while enforcement is degraded (F5).",
                Kind::Gauge,
                u64::from(s.degraded()),
            ),
            (
                "foldgate_upstream_in_flight",
                "Places under upstream.max_in_flight in use: exchanges with the upstream, and requests the limiter is deciding.",
                Kind::Gauge,
                self.upstream.in_flight() as u64,
            ),
            (
                "foldgate_buckets",
                "Buckets in the decision surface (D7 caps them).",
                Kind::Gauge,
                s.len() as u64,
            ),
            (
                "foldgate_policy_version",
                "Policy version in force (P1).",
                Kind::Gauge,
                self.policy.borrow().version,
            ),
            (
                "foldgate_bucket_evictions_total",
                "Zero-credit buckets evicted at the cap (D7).",
                Kind::Counter,
                load(&st.evictions),
            ),
            (
                "foldgate_bucket_inserts_refused_total",
                "New keys refused a bucket: the map was full of credit.",
                Kind::Counter,
                load(&st.inserts_refused),
            ),
            (
                "foldgate_fast_path_triggered_total",
                "Decisions that took the fast path (D5).",
                Kind::Counter,
                load(&st.fast_path_triggered),
            ),
            (
                "foldgate_fast_path_joined_total",
                "Decisions that waited on another request's fast path for the same key (D5).",
                Kind::Counter,
                load(&st.fast_path_joined),
            ),
            (
                "foldgate_fail_open_total",
                "Fail-open admissions (D8).",
                Kind::Counter,
                load(&st.fail_open),
            ),
            (
                "foldgate_backstop_denied_total",
                "Fail-open requests over the backstop floor (D8).",
                Kind::Counter,
                load(&st.backstop_denied),
            ),
            (
                "foldgate_full_reports_sent_total",
                "Full reports of a shard sent to a new owner epoch (C8).",
                Kind::Counter,
                full_reports_sent,
            ),
            (
                "foldgate_full_reports_owed_shards",
                "Shards whose owner has not yet said it took this node's full report (C8).",
                Kind::Gauge,
                full_reports_owed as u64,
            ),
            (
                "foldgate_fast_path_deadline_missed_total",
                "Fast paths that missed their deadline (1 ms on NATS; embedded, a round's wait for the books).",
                Kind::Counter,
                self.runtime.fast_path_deadline_missed(),
            ),
        ]
    }
}

/// One single-sample series: (name, help, type, value).
type Series = (&'static str, &'static str, Kind, u64);

fn load(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

/// The NATS runtime's bus counters (F6, A48).
fn render_bus(out: &mut String, b: &NodeBusStats) {
    for (name, help, c) in [
        (
            "foldgate_bus_reports_published_total",
            "Report batches published (C1).",
            &b.reports_published,
        ),
        (
            "foldgate_bus_reports_dropped_total",
            "Report batches dropped: queue full or bus down.",
            &b.reports_dropped,
        ),
        (
            "foldgate_bus_grant_batches_total",
            "Grant batches applied (C2).",
            &b.grant_batches,
        ),
        (
            "foldgate_fast_path_requests_total",
            "Fast-path requests sent (D5).",
            &b.fast_path_requests,
        ),
        (
            "foldgate_policy_applied_total",
            "Policy snapshots taken into force from key-value (P1).",
            &b.policy_applied,
        ),
        (
            "foldgate_policy_refused_total",
            "Policy snapshots refused whole: bad, or not newer.",
            &b.policy_refused,
        ),
        (
            "foldgate_policy_watch_errors_total",
            "Errors and ends of the policy watch, each followed by watching on.",
            &b.policy_watch_errors,
        ),
        (
            "foldgate_bus_bytes_in_total",
            "Envelope bytes received.",
            &b.bytes_in,
        ),
        (
            "foldgate_bus_bytes_out_total",
            "Envelope bytes sent.",
            &b.bytes_out,
        ),
    ] {
        prom::counter(out, name, help, load(c));
    }
    let name = "foldgate_bus_rejected_total";
    prom::header(
        out,
        name,
        "Envelopes rejected whole, by reason (B2).",
        Kind::Counter,
    );
    for (reason, c) in [
        ("too_large", &b.rejected_too_large),
        ("malformed", &b.rejected_malformed),
        ("unknown_version", &b.rejected_unknown_version),
        ("invalid", &b.rejected_invalid),
    ] {
        prom::labelled(out, name, "reason", reason, load(c));
    }
}

impl Gateway for NodeGateway {
    async fn handle(&self, req: Request<Incoming>, peer: SocketAddr) -> Response<Body> {
        let started = Instant::now();
        let cid = self.ids.for_request(req.headers());
        let resp = self.admit_and_forward(req, peer, &cid).await;
        self.metrics
            .request_latency
            .observe_duration(started.elapsed());
        resp
    }

    /// `/metrics`, `/healthz`, `/readyz` on the admin listener.
    fn admin(&self, req: &Request<Incoming>) -> Response<Body> {
        match req.uri().path() {
            "/metrics" => contract::plain(
                StatusCode::OK,
                "text/plain; version=0.0.4",
                self.render_metrics(),
            ),
            "/healthz" => contract::plain(StatusCode::OK, "text/plain", "ok\n".into()),
            "/readyz" => {
                // Ready once a policy is in force: before it, every key would be a 401.
                if self.policy.borrow().version > 0 {
                    contract::plain(StatusCode::OK, "text/plain", "ready\n".into())
                } else {
                    contract::plain(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "text/plain",
                        "no policy yet\n".into(),
                    )
                }
            }
            _ => contract::plain(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
        }
    }

    fn metrics(&self) -> &GatewayMetrics {
        &self.metrics
    }
}
