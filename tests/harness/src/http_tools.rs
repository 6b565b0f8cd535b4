//! HTTP tooling around the gateway: a tiny upstream for local runs
//! (`foldgate upstream`), an open-loop load generator (`foldgate bench http`), bench keys
//! derived from a seed so no raw key is ever written to a file.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use gateway_node::http::auth::{KeyHasher, KeyIdText};
use gateway_node::http::contract::{self, Body};
use gateway_node::http::server::{ServerLimits, serve};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

/// Bench and test keys: `fgk_` and 32 hex digits from a seed and an index. The generator
/// and the gateway's policy both derive them, so the raw keys live only in memory.
pub fn bench_key(seed: u64, i: u64) -> String {
    let mix = |mut z: u64| {
        z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let a = mix(seed ^ mix(i));
    format!("fgk_{:016x}{:016x}", a, mix(a ^ i))
}

/// The `[policy]` table of a node config giving `keys` bench keys one plan of `windows`
/// (`(length_ms, limit)`), as TOML text.
pub fn bench_policy_toml(
    hasher: &KeyHasher,
    seed: u64,
    keys: u64,
    windows: &[(u32, u64)],
) -> String {
    let mut out = String::from(
        "[policy]\nversion = 1\n\n[[policy.plans]]\nid = 1\nname = \"bench\"\nwindows = [",
    );
    let ws: Vec<String> = windows
        .iter()
        .map(|(l, n)| format!("{{ length_ms = {l}, limit = {n} }}"))
        .collect();
    out.push_str(&ws.join(", "));
    out.push_str("]\n");
    for i in 0..keys {
        let id = hasher.key_id(bench_key(seed, i).as_bytes());
        out.push_str(&format!(
            "\n[[policy.keys]]\nkey_id = \"{}\"\nplan = 1\n",
            KeyIdText(id)
        ));
    }
    out
}

/// `foldgate upstream`: answers every request `200 ok` after `delay_ms`, reading the
/// request body to its end first (so streaming through the gateway is exercised).
pub async fn run_upstream(listener: TcpListener, delay_ms: u64, shutdown: watch::Receiver<bool>) {
    serve(
        listener,
        ServerLimits::default(),
        move |req: Request<Incoming>, _| async move {
            let saw = |name: &str| req.headers().get(name).cloned();
            let (request_id, key_id) = (saw("x-request-id"), saw("x-foldgate-key-id"));
            let bytes = req
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes().len())
                .unwrap_or(0);
            if delay_ms > 0 {
                tokio::time::sleep(Duration::from_millis(delay_ms)).await;
            }
            let mut r = upstream_reply(bytes);
            // Echoed so tests can see what the gateway passed on.
            for (name, v) in [("x-saw-request-id", request_id), ("x-saw-key-id", key_id)] {
                if let Some(v) = v {
                    r.headers_mut().insert(name, v);
                }
            }
            r
        },
        || {},
        shutdown,
    )
    .await;
}

fn upstream_reply(request_body_bytes: usize) -> Response<Body> {
    let mut r = contract::plain(
        StatusCode::OK,
        "text/plain",
        format!("ok {request_body_bytes}\n"),
    );
    r.headers_mut()
        .insert("x-upstream", http::HeaderValue::from_static("foldgate"));
    r
}

#[derive(Clone, Debug)]
pub struct LoadPlan {
    /// One or more base URLs. With several, arrivals interleave (request i goes to target
    /// i mod n) and each target gets `rate`: an A/B in which both sides see the same
    /// moments of a noisy machine, instead of one run after the other.
    pub targets: Vec<String>,
    /// Requests per second per target, at constant intervals from the start.
    pub rate: u64,
    pub seconds: f64,
    pub keys: u64,
    pub key_seed: u64,
    pub path: String,
    /// Requests in flight at most; the schedule keeps its times when this binds, so the
    /// wait shows in the latency (no coordinated omission).
    pub max_in_flight: usize,
    pub timeout: Duration,
}

#[derive(Debug, Default, Serialize)]
pub struct LoadReport {
    pub target: String,
    pub rate: u64,
    pub seconds: f64,
    pub sent: u64,
    pub ok: u64,
    pub status_429: u64,
    pub status_401: u64,
    pub errors: u64,
    /// Latency from each request's intended send time to its response head.
    pub latency_us_p50: f64,
    pub latency_us_p99: f64,
    pub latency_us_p999: f64,
    pub latency_us_max: f64,
    /// Requests completed per second of the run.
    pub achieved_rate: f64,
}

/// Open-loop load: request i is due at `start + i / rate` whatever happened to the ones
/// before it, and its latency counts from then (as wrk2 measures). One report per target.
pub async fn run_load(plan: &LoadPlan) -> Vec<LoadReport> {
    assert!(!plan.targets.is_empty(), "a load plan has a target");
    let n_targets = plan.targets.len() as u64;
    let shot = Shot::new(plan);
    let total = (plan.rate as f64 * plan.seconds).round() as u64 * n_targets;
    let schedule = Schedule {
        targets: plan.targets.clone(),
        path: plan.path.clone(),
        total,
        interval_ns: 1e9 / (plan.rate.max(1) * n_targets) as f64,
        start: Instant::now(),
    };
    let start = schedule.start;
    let scheduler = schedule.spawn(shot, tokio::runtime::Handle::current());
    let handles = tokio::task::spawn_blocking(move || scheduler.join().expect("scheduler"))
        .await
        .expect("scheduler thread");
    let elapsed = start.elapsed().as_secs_f64();
    let mut tallies: Vec<Tally> = plan
        .targets
        .iter()
        .map(|t| Tally::new(plan, t, total / n_targets))
        .collect();
    for h in handles {
        let Ok(sent) = h.await else {
            // A panicked request task: no target to book it to, so book the first.
            tallies[0].report.errors += 1;
            continue;
        };
        tallies[sent.target].book(&sent);
    }
    tallies.into_iter().map(|t| t.finish(elapsed)).collect()
}

/// What one request needs besides its URI and due time; cloned into every request task.
#[derive(Clone)]
struct Shot {
    client: Client<HttpConnector, Empty<Bytes>>,
    /// `authorization` header values, one per bench key, used round-robin.
    keys: Arc<Vec<String>>,
    slots: Arc<Semaphore>,
    timeout: Duration,
}

/// One request's outcome: its status (0 for a timeout or a transport error), its latency
/// from its due time, and its target's index.
struct Sent {
    status: u16,
    latency: Duration,
    target: usize,
}

impl Shot {
    fn new(plan: &LoadPlan) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(plan.max_in_flight)
            .build(connector);
        let keys: Vec<String> = (0..plan.keys.max(1))
            .map(|i| format!("Bearer {}", bench_key(plan.key_seed, i)))
            .collect();
        Self {
            client,
            keys: Arc::new(keys),
            slots: Arc::new(Semaphore::new(plan.max_in_flight.max(1))),
            timeout: plan.timeout,
        }
    }

    /// Request `i`, sent once a slot is free; its latency counts from `due` all the same.
    async fn fire(self, uri: String, i: u64, due: Instant, target: usize) -> Sent {
        let permit = self
            .slots
            .acquire_owned()
            .await
            .expect("semaphore never closes");
        let req = Request::get(uri)
            .header(
                "authorization",
                &self.keys[(i % self.keys.len() as u64) as usize],
            )
            .body(Empty::<Bytes>::new())
            .expect("valid request");
        let status = match tokio::time::timeout(self.timeout, self.client.request(req)).await {
            Ok(Ok(resp)) => {
                let status = resp.status().as_u16();
                // Read the body so the connection goes back to the pool.
                let _ = resp.into_body().collect().await;
                status
            }
            _ => 0,
        };
        drop(permit);
        Sent {
            status,
            latency: due.elapsed(),
            target,
        }
    }
}

/// When each request is due and where it goes: request i at `start + i * interval_ns`,
/// to target i mod n.
struct Schedule {
    targets: Vec<String>,
    path: String,
    total: u64,
    interval_ns: f64,
    start: Instant,
}

impl Schedule {
    /// Spawns each request on `handle` at its due time, from a thread of its own; the
    /// thread's result is every request's task.
    ///
    /// The schedule runs with the OS sleep, not a tokio timer: tokio's timer wheel has
    /// 1 ms ticks, which would send requests in 1 ms clumps and charge up to a millisecond
    /// of the generator's own lateness to the server under test.
    fn spawn(
        self,
        shot: Shot,
        handle: tokio::runtime::Handle,
    ) -> std::thread::JoinHandle<Vec<tokio::task::JoinHandle<Sent>>> {
        std::thread::spawn(move || {
            let n_targets = self.targets.len() as u64;
            let mut handles = Vec::with_capacity(self.total as usize);
            for i in 0..self.total {
                let due = self.start + Duration::from_nanos((i as f64 * self.interval_ns) as u64);
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
                let target = (i % n_targets) as usize;
                let uri = format!("{}{}", self.targets[target], self.path);
                handles.push(handle.spawn(shot.clone().fire(uri, i, due, target)));
            }
            handles
        })
    }
}

/// One target's report as its requests complete, and their latencies.
struct Tally {
    report: LoadReport,
    lat_ns: Vec<u64>,
}

impl Tally {
    fn new(plan: &LoadPlan, target: &str, sent: u64) -> Self {
        let report = LoadReport {
            target: target.to_string(),
            rate: plan.rate,
            seconds: plan.seconds,
            sent,
            ..LoadReport::default()
        };
        Self {
            report,
            lat_ns: Vec::with_capacity(sent as usize),
        }
    }

    fn book(&mut self, sent: &Sent) {
        match sent.status {
            200..=299 => self.report.ok += 1,
            429 => self.report.status_429 += 1,
            401 => self.report.status_401 += 1,
            _ => self.report.errors += 1,
        }
        self.lat_ns.push(sent.latency.as_nanos() as u64);
    }

    /// The report with its latency percentiles and achieved rate over `elapsed` seconds.
    fn finish(self, elapsed: f64) -> LoadReport {
        let Self {
            mut report,
            mut lat_ns,
        } = self;
        lat_ns.sort_unstable();
        let q = |p: f64| {
            lat_ns
                .get(((lat_ns.len() as f64 * p) as usize).min(lat_ns.len().saturating_sub(1)))
                .map(|&n| (n as f64 / 100.0).round() / 10.0)
                .unwrap_or(0.0)
        };
        report.latency_us_p50 = q(0.50);
        report.latency_us_p99 = q(0.99);
        report.latency_us_p999 = q(0.999);
        report.latency_us_max = lat_ns.last().map(|&n| n as f64 / 1_000.0).unwrap_or(0.0);
        report.achieved_rate = (lat_ns.len() as f64 / elapsed * 10.0).round() / 10.0;
        report
    }
}

/// One request, for the demo and for tests: status, the headers that matter, and the body.
pub async fn get_once(
    client: &Client<HttpConnector, Full<Bytes>>,
    url: &str,
    key: Option<&str>,
) -> anyhow::Result<(StatusCode, http::HeaderMap, String)> {
    let mut req = Request::get(url);
    if let Some(k) = key {
        req = req.header("authorization", format!("Bearer {k}"));
    }
    let resp = client.request(req.body(Full::new(Bytes::new()))?).await?;
    let (parts, body) = resp.into_parts();
    let body = body.collect().await?.to_bytes();
    Ok((
        parts.status,
        parts.headers,
        String::from_utf8_lossy(&body).into_owned(),
    ))
}

pub fn plain_client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

/// Serves `gateway` on two fresh loopback ports, API and admin, until `stop` turns true;
/// returns their addresses.
pub async fn serve_on_loopback<G: gateway_node::http::server::Gateway>(
    gateway: Arc<G>,
    limits: ServerLimits,
    stop: watch::Receiver<bool>,
) -> std::io::Result<(SocketAddr, SocketAddr)> {
    let (listener, addr) = loopback().await?;
    let (admin_listener, admin) = loopback().await?;
    tokio::spawn(gateway_node::http::server::run(
        gateway,
        limits,
        listener,
        admin_listener,
        stop,
    ));
    Ok((addr, admin))
}

/// A listener on a free loopback port, and its address.
pub async fn loopback() -> std::io::Result<(TcpListener, SocketAddr)> {
    let l = TcpListener::bind("127.0.0.1:0").await?;
    let a = l.local_addr()?;
    Ok((l, a))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bench_keys_are_stable_distinct_and_well_formed() {
        assert_eq!(bench_key(7, 1), bench_key(7, 1));
        assert_ne!(bench_key(7, 1), bench_key(7, 2));
        assert_ne!(bench_key(7, 1), bench_key(8, 1));
        let k = bench_key(1, 0);
        assert_eq!(k.len(), 36);
        assert!(k.bytes().all(|b| b.is_ascii_graphic()));
    }
}
