//! `foldgate-node`: authenticate (D1, D2), decide (D4-D6), proxy. The limiter runs on the
//! embedded in-process bus when no NATS URL is configured (the single-node default) and on
//! NATS otherwise (issue 4's runtime, unchanged).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use bus_schemas::{KeyAssignment, NodeId, Plan, PolicySnapshot, WindowSpec};
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::auth::{AuthError, CorrelationIds, KeyHasher, KeyIdText, extract_key, parse_key_id};
use super::contract::{self, Body};
use super::metrics::{self, GatewayMetrics, Outcome, Verdict};
use super::proxy::Upstream;
use super::proxy::UpstreamSettings;
use super::server::{Gateway, ServerSettings};
use crate::bus::Clock;
use crate::limiter::{Mode, NodeConfig};
use crate::policy::{PolicyError, PolicyIndex};
use crate::surface::{Decision, SurfaceConfig};

/// Every knob of `foldgate-node`, with its unit in its name. `foldgate-node.example.toml`
/// documents each one, and a test keeps the two in step.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeSettings {
    pub limiter_enabled: bool,
    pub node_id: u32,
    pub fleet_size: u32,
    pub shards: u32,
    pub round_ms: u32,
    pub mode: String,
    pub bucket_cap: usize,
    pub degraded_after_ms: u64,
    pub backstop_multiple: u64,
    pub hash_key_version: u8,
    pub hash_key_file: Option<PathBuf>,
    pub hash_key_hex: Option<String>,
    /// ADR-7: hash keys of other versions, still live (a rotation under way).
    pub other_hash_keys: Vec<OtherHashKey>,
    pub nats_url: String,
    pub nats_ca_file: Option<PathBuf>,
    pub nats_cert_file: Option<PathBuf>,
    pub nats_key_file: Option<PathBuf>,
    pub log_format: String,
    pub log_level: String,
    pub server: ServerSettings,
    pub upstream: UpstreamSettings,
    pub policy: PolicySettings,
}

fn read_hash_key(path: &std::path::Path) -> Result<String, SettingsError> {
    std::fs::read_to_string(path).map_err(|e| SettingsError::HashKeyFile(path.to_path_buf(), e))
}

/// A hash key of another version (ADR-7), read from its own file.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OtherHashKey {
    pub version: u8,
    pub file: PathBuf,
}

impl Default for NodeSettings {
    fn default() -> Self {
        let reference = NodeConfig::reference(NodeId(0));
        let surface = SurfaceConfig::default();
        Self {
            limiter_enabled: true,
            node_id: 0,
            fleet_size: 1,
            shards: 1,
            round_ms: reference.round_ms,
            mode: "leasing".into(),
            bucket_cap: surface.bucket_cap,
            degraded_after_ms: reference.degraded_after_ms,
            backstop_multiple: surface.backstop_multiple,
            hash_key_version: 1,
            hash_key_file: None,
            hash_key_hex: None,
            other_hash_keys: Vec::new(),
            nats_url: String::new(),
            nats_ca_file: None,
            nats_cert_file: None,
            nats_key_file: None,
            log_format: "json".into(),
            log_level: "info".into(),
            server: ServerSettings::default(),
            upstream: UpstreamSettings::default(),
            policy: PolicySettings::default(),
        }
    }
}

/// The policy of an embedded (no NATS) node: plans and keys by hashed id, never raw keys.
/// On NATS the policy comes from the key-value bucket instead (P1), and this is ignored.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicySettings {
    pub version: u64,
    pub plans: Vec<PlanSettings>,
    pub keys: Vec<KeySettings>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PlanSettings {
    pub id: u32,
    #[serde(default)]
    pub name: String,
    pub windows: Vec<WindowSettings>,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WindowSettings {
    pub length_ms: u32,
    pub limit: u64,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KeySettings {
    /// `v1:` and 32 hex digits, as `foldgate key-id` prints it.
    pub key_id: String,
    pub plan: u32,
    /// Replaces the plan's windows for this key when present.
    #[serde(default)]
    pub windows: Vec<WindowSettings>,
}

#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("`mode` must be \"leasing\" or \"fixed\", got {0:?}")]
    Mode(String),
    #[error("no hash key: set `hash_key_file` (a file holding 64+ hex digits) or `hash_key_hex`")]
    NoHashKey,
    #[error("`hash_key_file` {0}: {1}")]
    HashKeyFile(PathBuf, std::io::Error),
    #[error("hash key: {0}")]
    HashKey(#[from] super::auth::HashKeyError),
    #[error("hash key version {0} is given twice (`hash_key_version`, `other_hash_keys`)")]
    HashKeyVersionTwice(u8),
    #[error("`policy.keys[{0}].key_id` is not a key id (v<version>:<32 hex>)")]
    KeyId(usize),
    #[error("policy: {0}")]
    Policy(#[from] PolicyError),
    #[error("upstream: {0}")]
    Upstream(#[from] super::proxy::UpstreamError),
    #[error(
        "`fleet_size`, `shards` and `bucket_cap` must be at least 1, `round_ms` 1 to 1000, and `node_id` below `fleet_size`"
    )]
    Fleet,
    #[error("policy: {0} (the checks a policy snapshot from the bus gets)")]
    PolicyWire(#[from] bus_schemas::DecodeError),
    #[error(
        "`policy.version` must be at least 1 when the policy names plans or keys (0 is \"no policy yet\")"
    )]
    PolicyVersion,
}

/// The longest round a node may be configured with: C1's round is 25 ms, and the fast
/// path's once-a-round budget (D5) and every bound counted in rounds assume a short one.
const MAX_ROUND_MS: u32 = 1_000;

impl NodeSettings {
    pub fn hasher(&self) -> Result<KeyHasher, SettingsError> {
        let hex = match (&self.hash_key_hex, &self.hash_key_file) {
            (Some(h), _) => h.clone(),
            (None, Some(p)) => read_hash_key(p)?,
            (None, None) => return Err(SettingsError::NoHashKey),
        };
        Ok(KeyHasher::from_hex(self.hash_key_version, &hex)?)
    }

    /// Every live hash key, this node's own version first, then `other_hash_keys` in order
    /// (ADR-7, `NodeGateway::resolve`).
    pub fn hashers(&self) -> Result<Vec<KeyHasher>, SettingsError> {
        let mut all = vec![self.hasher()?];
        let mut versions = vec![self.hash_key_version];
        for other in &self.other_hash_keys {
            if versions.contains(&other.version) {
                return Err(SettingsError::HashKeyVersionTwice(other.version));
            }
            versions.push(other.version);
            all.push(KeyHasher::from_hex(
                other.version,
                &read_hash_key(&other.file)?,
            )?);
        }
        Ok(all)
    }

    pub fn node_config(&self) -> Result<NodeConfig, SettingsError> {
        let mode = match self.mode.as_str() {
            "leasing" => Mode::Leasing,
            "fixed" => Mode::Fixed,
            other => return Err(SettingsError::Mode(other.into())),
        };
        if self.fleet_size == 0
            || self.shards == 0
            || self.bucket_cap == 0
            || !(1..=MAX_ROUND_MS).contains(&self.round_ms)
            || self.node_id >= self.fleet_size
        {
            return Err(SettingsError::Fleet);
        }
        Ok(NodeConfig {
            fleet_size: self.fleet_size,
            shards: self.shards,
            round_ms: self.round_ms,
            mode,
            degraded_after_ms: self.degraded_after_ms,
            ..NodeConfig::reference(NodeId(self.node_id))
        })
    }

    pub fn surface_config(&self) -> SurfaceConfig {
        let defaults = SurfaceConfig::default();
        SurfaceConfig {
            bucket_cap: self.bucket_cap,
            round_ms: self.round_ms,
            backstop_multiple: self.backstop_multiple,
            // A reconciler is stalled when it misses rounds, not when a long round is
            // simply not over yet: at a second's round the default bound failed the
            // node open for part of every round.
            reconciler_stall_ms: defaults
                .reconciler_stall_ms
                .max(4 * u64::from(self.round_ms)),
            ..defaults
        }
    }
}

impl PolicySettings {
    pub fn index(&self, round_ms: u32) -> Result<PolicyIndex, SettingsError> {
        let windows = |ws: &[WindowSettings]| -> Vec<WindowSpec> {
            ws.iter()
                .map(|w| WindowSpec {
                    length_ms: w.length_ms,
                    limit: w.limit,
                })
                .collect()
        };
        let keys = self
            .keys
            .iter()
            .enumerate()
            .map(|(i, k)| {
                Ok(KeyAssignment {
                    key: parse_key_id(&k.key_id).ok_or(SettingsError::KeyId(i))?,
                    plan_id: k.plan,
                    override_windows: windows(&k.windows),
                })
            })
            .collect::<Result<Vec<_>, SettingsError>>()?;
        if self.version == 0 && !(self.plans.is_empty() && self.keys.is_empty()) {
            // The runtime refuses a policy no newer than the one in force (none: 0), so
            // this one would be dropped without a word and every key get a 401.
            return Err(SettingsError::PolicyVersion);
        }
        let snapshot = PolicySnapshot {
            version: self.version,
            plans: self
                .plans
                .iter()
                .map(|p| Plan {
                    id: p.id,
                    name: p.name.clone(),
                    windows: windows(&p.windows),
                })
                .collect(),
            keys,
        };
        // Through the wire codec: a file's policy gets every check one from the bus does
        // (limits within the 40-bit credit word, windows of at most a day), which the
        // state machines' arithmetic relies on.
        let snapshot = <PolicySnapshot as bus_schemas::Envelope>::decode(
            &bus_schemas::Envelope::encode(&snapshot),
        )?;
        Ok(PolicyIndex::from_snapshot(&snapshot, round_ms)?)
    }
}

pub use foldgate_runtime::system_clock;

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
        })
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
        let Some((key, policy)) = self.resolve(raw) else {
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
            let t = Instant::now();
            let decision = self.runtime.decide_at(key, &policy, (self.clock)()).await;
            self.metrics.limiter_latency.observe_duration(t.elapsed());
            match decision {
                Decision::Admit => self.metrics.verdict(Verdict::Admit),
                Decision::FailOpen => {
                    failed_open = true;
                    self.metrics.verdict(Verdict::FailOpen);
                    tracing::warn!(correlation_id = cid, key_id = %key_text, "fail-open admit (D8)");
                }
                Decision::Deny(denial) => {
                    self.metrics.verdict(match denial.reason {
                        bus_schemas::LimitReason::Exhausted => Verdict::Exhausted,
                        bus_schemas::LimitReason::FastPathDeadline => Verdict::FastPathDeadline,
                        bus_schemas::LimitReason::Backstop => Verdict::Backstop,
                    });
                    self.metrics.outcome(Outcome::Limited);
                    tracing::info!(
                        correlation_id = cid,
                        key_id = %key_text,
                        window = %contract::window_name(denial.window.length_ms),
                        window_id = denial.window.number,
                        reason = contract::reason_label(denial.reason),
                        wait_ms = denial.wait_ms,
                        degraded = denial.degraded,
                        "rate limited"
                    );
                    return contract::too_many_requests(&denial, cid, surface.degraded());
                }
                // `decide_at` settles the fast path itself; seeing one here is a limiter
                // bug, which D8 answers by failing open within the backstop (not here).
                Decision::FastPath(_) => {
                    failed_open = true;
                    self.metrics.verdict(Verdict::FailOpen)
                }
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

    /// ADR-7: the key id the policy names for `raw`, under the first live hash key (this
    /// node's own version, then `other_hash_keys` in order) whose id it names, and that
    /// key's policy. A rotation is then: give every node the new key as an other key
    /// (nothing changes: the policy names the old ids); switch the policy from the old
    /// ids to the new, one version, so every node moves to the new ids as it takes it;
    /// make the new key each node's own and drop the old. No key is refused for being
    /// hashed under a version the policy does not name. A key is counted under two ids
    /// only while the switch reaches the nodes, and its new id starts its windows afresh:
    /// in the window of the switch it may be admitted up to twice its allowance.
    fn resolve(&self, raw: &[u8]) -> Option<(bus_schemas::KeyId, crate::KeyPolicy)> {
        let index = self.policy.borrow();
        self.hashers.iter().find_map(|h| {
            let key = h.key_id(raw);
            index.get(&key).map(|p| (key, *p))
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
        let s = self.runtime.surface();
        let st = &s.stats;
        metrics::gauge(
            &mut out,
            "foldgate_enforcement_degraded",
            "1 while enforcement is degraded (F5).",
            u64::from(s.degraded()),
        );
        metrics::gauge(
            &mut out,
            "foldgate_upstream_in_flight",
            "Places under upstream.max_in_flight in use: exchanges with the upstream, and requests the limiter is deciding.",
            self.upstream.in_flight() as u64,
        );
        metrics::gauge(
            &mut out,
            "foldgate_buckets",
            "Buckets in the decision surface (D7 caps them).",
            s.len() as u64,
        );
        metrics::gauge(
            &mut out,
            "foldgate_policy_version",
            "Policy version in force (P1).",
            self.policy.borrow().version,
        );
        metrics::counter(
            &mut out,
            "foldgate_bucket_evictions_total",
            "Zero-credit buckets evicted at the cap (D7).",
            st.evictions.load(Ordering::Relaxed),
        );
        metrics::counter(
            &mut out,
            "foldgate_bucket_inserts_refused_total",
            "New keys refused a bucket: the map was full of credit.",
            st.inserts_refused.load(Ordering::Relaxed),
        );
        metrics::counter(
            &mut out,
            "foldgate_fast_path_triggered_total",
            "Decisions that took the fast path (D5).",
            st.fast_path_triggered.load(Ordering::Relaxed),
        );
        metrics::counter(
            &mut out,
            "foldgate_fast_path_joined_total",
            "Decisions that waited on another request's fast path for the same key (D5).",
            st.fast_path_joined.load(Ordering::Relaxed),
        );
        metrics::counter(
            &mut out,
            "foldgate_fail_open_total",
            "Fail-open admissions (D8).",
            st.fail_open.load(Ordering::Relaxed),
        );
        metrics::counter(
            &mut out,
            "foldgate_backstop_denied_total",
            "Fail-open requests over the backstop floor (D8).",
            st.backstop_denied.load(Ordering::Relaxed),
        );
        let (full_reports_sent, full_reports_owed) = self
            .runtime
            .with_limiter(|l| (l.stats().full_reports_sent, l.full_reports_owed()));
        metrics::counter(
            &mut out,
            "foldgate_full_reports_sent_total",
            "Full reports of a shard sent to a new owner epoch (C8).",
            full_reports_sent,
        );
        metrics::gauge(
            &mut out,
            "foldgate_full_reports_owed_shards",
            "Shards whose owner has not yet said it took this node's full report (C8).",
            full_reports_owed as u64,
        );
        metrics::counter(
            &mut out,
            "foldgate_fast_path_deadline_missed_total",
            "Fast paths that missed their deadline (1 ms on NATS; embedded, a round's wait for the books).",
            self.runtime.fast_path_deadline_missed(),
        );
        if let Some(b) = self.runtime.bus_stats() {
            let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
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
                metrics::counter(&mut out, name, help, load(c));
            }
            let name = "foldgate_bus_rejected_total";
            out.push_str(&format!(
                "# HELP {name} Envelopes rejected whole, by reason (B2).\n# TYPE {name} counter\n"
            ));
            for (reason, c) in [
                ("too_large", &b.rejected_too_large),
                ("malformed", &b.rejected_malformed),
                ("unknown_version", &b.rejected_unknown_version),
                ("invalid", &b.rejected_invalid),
            ] {
                out.push_str(&format!("{name}{{reason=\"{reason}\"}} {}\n", load(c)));
            }
        }
        out
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

#[cfg(test)]
mod tests {
    use super::*;

    /// ADR-7: each live version once; two keys claiming one version would hash a key two
    /// ways under one name.
    #[test]
    fn two_hash_keys_of_one_version_are_refused() {
        let file = std::env::temp_dir().join(format!("foldgate-hk-{}.hex", std::process::id()));
        std::fs::write(&file, "2e".repeat(32)).unwrap();
        let settings = |version| NodeSettings {
            hash_key_hex: Some("1f".repeat(32)),
            other_hash_keys: vec![OtherHashKey {
                version,
                file: file.clone(),
            }],
            ..NodeSettings::default()
        };
        assert_eq!(settings(2).hashers().unwrap().len(), 2);
        assert!(matches!(
            settings(1).hashers(),
            Err(SettingsError::HashKeyVersionTwice(1))
        ));
        std::fs::remove_file(&file).ok();
    }

    /// Every knob is in the example file, which parses to the defaults.
    fn documented<T: Serialize + serde::de::DeserializeOwned>(example: &str, default: &T) {
        let parsed: T = toml::from_str(example).expect("example parses");
        assert_eq!(
            toml::to_string(&parsed).unwrap(),
            toml::to_string(default).unwrap(),
            "the example's values are the defaults"
        );
        let table = toml::Table::try_from(default).unwrap();
        let nested = table
            .values()
            .filter_map(|v| v.as_table())
            .flat_map(|t| t.keys());
        for key in table.keys().chain(nested) {
            assert!(
                example.contains(&format!("\n{key} ="))
                    || example.contains(&format!("# {key} ="))
                    || example.contains(&format!("[{key}]")),
                "`{key}` is not documented in the example"
            );
        }
        for key in [
            "hash_key_file",
            "hash_key_hex",
            "nats_ca_file",
            "nats_cert_file",
            "nats_key_file",
        ] {
            if example.contains("nats_url") {
                assert!(example.contains(&format!("# {key} =")), "`{key}`");
            }
        }
    }

    #[test]
    fn every_knob_is_documented_in_the_examples() {
        documented(
            include_str!("../../foldgate-node.example.toml"),
            &NodeSettings::default(),
        );
        documented(
            include_str!("../../foldgate-edge.example.toml"),
            &super::super::edge::EdgeSettings::default(),
        );
    }

    #[test]
    fn policy_settings_become_an_index() {
        let s: NodeSettings = toml::from_str(
            r#"
            [policy]
            version = 3
            [[policy.plans]]
            id = 1
            windows = [{ length_ms = 1000, limit = 10 }, { length_ms = 60000, limit = 300 }]
            [[policy.keys]]
            key_id = "v1:000000000000000000000000000000ff"
            plan = 1
            [[policy.keys]]
            key_id = "v1:000000000000000000000000000000fe"
            plan = 1
            windows = [{ length_ms = 1000, limit = 50 }]
            "#,
        )
        .unwrap();
        let idx = s.policy.index(25).unwrap();
        assert_eq!(idx.version, 3);
        let k = parse_key_id("v1:000000000000000000000000000000fe").unwrap();
        assert_eq!(idx.get(&k).unwrap().windows().len(), 1);
        let mut bad = s.clone();
        bad.policy.keys[0].key_id = "fgk_raw_key".into();
        assert!(matches!(bad.policy.index(25), Err(SettingsError::KeyId(0))));
        bad = s.clone();
        bad.policy.keys[0].plan = 9;
        assert!(matches!(
            bad.policy.index(25),
            Err(SettingsError::Policy(_) | SettingsError::PolicyWire(_))
        ));
        // A file's policy gets the bus's checks: a limit past the 40-bit credit word.
        bad = s.clone();
        bad.policy.plans[0].windows[0].limit = 1 << 41;
        assert!(matches!(
            bad.policy.index(25),
            Err(SettingsError::PolicyWire(_))
        ));
        // Version 0 is "no policy yet": such a policy was dropped without a word.
        bad = s.clone();
        bad.policy.version = 0;
        assert!(matches!(
            bad.policy.index(25),
            Err(SettingsError::PolicyVersion)
        ));
        for broken in [
            NodeSettings {
                bucket_cap: 0,
                ..s.clone()
            },
            NodeSettings {
                round_ms: 2_000,
                ..s.clone()
            },
        ] {
            assert!(matches!(broken.node_config(), Err(SettingsError::Fleet)));
        }
        let slow = NodeSettings {
            round_ms: 1_000,
            ..s.clone()
        };
        assert!(slow.surface_config().reconciler_stall_ms >= 4_000);
        bad = s;
        bad.mode = "fast".into();
        assert!(matches!(bad.node_config(), Err(SettingsError::Mode(_))));
    }
}
