//! The gateway over real sockets (issue 5): the 401/429 contract (D1, D6), bad input,
//! HTTP/2, a key limited on one node and not another (on NATS), and degraded enforcement.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use foldgate_harness::http_tools::{get_once, plain_client};
use foldgate_tests::http::{TestGateway, key, policy, start_gateway, start_upstream};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A plan no test's requests come near: 100 a second, 1,000 a minute.
const EASY: &[(u32, u64)] = &[(1_000, 100), (60_000, 1_000)];

/// The gateway's `foldgate_upstream_in_flight` gauge, as its admin listener reports it.
async fn upstream_in_flight(gw: &TestGateway) -> Option<String> {
    get_once(&plain_client(), &gw.admin_url("/metrics"), None)
        .await
        .unwrap()
        .2
        .lines()
        .find_map(|l| l.strip_prefix("foldgate_upstream_in_flight "))
        .map(|v| v.trim().to_string())
}

/// A scripted upstream on a free loopback port: each connection, with what its first
/// read brought (the request, as far as it came), goes to `script` on a task of its own.
async fn scripted_upstream<F, Fut>(script: F) -> std::net::SocketAddr
where
    F: Fn(tokio::net::TcpStream, Vec<u8>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (listener, up) = foldgate_harness::http_tools::loopback().await.unwrap();
    let script = Arc::new(script);
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let script = Arc::clone(&script);
            tokio::spawn(async move {
                let mut request = vec![0u8; 4096];
                let n = s.read(&mut request).await.unwrap_or(0);
                request.truncate(n);
                script(s, request).await;
            });
        }
    });
    up
}

/// Writes `head`, then `chunk` again and again until a write fails: the gateway let the
/// upstream connection go.
async fn stream_until_cut(s: &mut tokio::net::TcpStream, head: &[u8], chunk: &[u8]) {
    let mut sent = s.write_all(head).await;
    while sent.is_ok() {
        sent = s.write_all(chunk).await;
    }
}

/// A raw HTTP/1.1 GET of `/` with key 0.
fn get_with_key_0() -> String {
    format!("GET / HTTP/1.1\r\nhost: x\r\nx-api-key: {}\r\n\r\n", key(0))
}

/// Sends `request` (raw HTTP/1.1) to the gateway and reads the head of a 200 back; the
/// connection stays open for the test to hold or drop.
async fn a_200_head(gw: &TestGateway, request: &str) -> tokio::net::TcpStream {
    let mut s = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut head = [0u8; 256];
    let n = s.read(&mut head).await.unwrap();
    assert!(head[..n].starts_with(b"HTTP/1.1 200"));
    s
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

/// The body of a response the gateway made must never carry a limit (D6).
fn assert_no_limit(body: &serde_json::Value, limits: &[u64]) {
    let obj = body.as_object().expect("object body");
    for k in obj.keys() {
        assert!(
            !["limit", "remaining", "allowance", "credit"].contains(&k.as_str()),
            "body names {k}: {body}"
        );
    }
    for (k, v) in obj {
        if k == "window_id" {
            continue;
        }
        if let Some(n) = v.as_u64() {
            assert!(!limits.contains(&n), "body carries {n} ({k}): {body}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_requests_get_401_before_the_limiter() {
    let (up, _up_stop) = start_upstream(0).await;
    let gw = start_gateway(up, "", &policy(2, &[(1_000, 3), (60_000, 100)])).await;
    let c = plain_client();
    let url = gw.url("/x");

    let (status, headers, body) = get_once(&c, &url, None).await.unwrap();
    assert_eq!(status, 401);
    assert_eq!(headers["www-authenticate"], "Bearer");
    let b = json(&body);
    assert_eq!(b["detail"], "missing_key");
    assert_eq!(
        b["correlation_id"],
        headers["x-request-id"].to_str().unwrap()
    );

    let stranger = "fgk_not_a_key_in_the_policy_0000";
    for _ in 0..10 {
        let (status, _, body) = get_once(&c, &url, Some(stranger)).await.unwrap();
        assert_eq!(status, 401, "an unknown key never reaches the limiter (N3)");
        assert_eq!(json(&body)["detail"], "unknown_key");
    }
    for bad in ["short", "has\tcontrol"] {
        let (status, _, body) = get_once(&c, &url, Some(bad)).await.unwrap();
        assert_eq!(status, 401);
        assert_eq!(json(&body)["detail"], "malformed_key");
    }
    // X-Api-Key works as well as Bearer.
    let req = http::Request::get(&url)
        .header("x-api-key", key(1))
        .header("x-request-id", "client-chosen-7")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = c.request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-request-id"], "client-chosen-7");
    assert_eq!(
        resp.headers()["x-saw-request-id"],
        "client-chosen-7",
        "propagated upstream"
    );
    let key_id = resp.headers()["x-saw-key-id"].to_str().unwrap().to_string();
    assert!(key_id.starts_with("v1:") && !key_id.contains(&key(1)));
    // No 401 reached the limiter: it holds a bucket for key 1 only.
    assert_eq!(gw.gateway.runtime.surface().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_429_contract_sub_second_multi_second_and_both_windows() {
    let (up, _up_stop) = start_upstream(0).await;
    // Key 0: a 1 s window that runs out first. Key 1: both windows run out together.
    let mut pol = policy(1, &[(1_000, 4), (60_000, 1_000)]);
    pol.push_str(&format!(
        "\n[[policy.keys]]\nkey_id = \"{}\"\nplan = 1\nwindows = [{{ length_ms = 1000, limit = 3 }}, {{ length_ms = 60000, limit = 3 }}]\n",
        gateway_node::http::auth::KeyIdText(foldgate_tests::http::hasher().key_id(key(1).as_bytes()))
    ));
    let gw = start_gateway(up, "", &pol).await;
    let c = plain_client();
    let url = gw.url("/");

    // Sub-second: the 1 s window denies; the 60 s window could not, so the wait is to the
    // 1 s boundary: Retry-After 0 and the milliseconds beside it.
    let mut statuses = Vec::new();
    let mut denied = None;
    for _ in 0..8 {
        let (s, h, b) = get_once(&c, &url, Some(&key(0))).await.unwrap();
        statuses.push(s.as_u16());
        if s == 429 && denied.is_none() {
            denied = Some((h, b));
        }
    }
    let admitted = statuses.iter().filter(|&&s| s == 200).count();
    assert!(
        admitted <= 4,
        "1 s limit 4, admitted {admitted}: {statuses:?}"
    );
    let (h, body) = denied.expect("a 429 within 8 requests at limit 4");
    assert_eq!(h["retry-after"], "0", "{h:?}");
    let reset_ms: u64 = h["x-ratelimit-reset-ms"].to_str().unwrap().parse().unwrap();
    assert!(reset_ms <= 1_000, "reset {reset_ms} ms");
    assert!(h.get("x-ratelimit-degraded").is_none());
    assert_eq!(h["content-type"], "application/json");
    let b = json(&body);
    assert_eq!(b["error"], "rate_limited");
    assert_eq!(b["window"], "1s");
    assert_eq!(b["reason"], "exhausted");
    assert_eq!(b["correlation_id"], h["x-request-id"].to_str().unwrap());
    assert_no_limit(&b, &[4, 1_000]);

    // Both windows out: once the owner has declared the 60 s window exhausted (a round
    // after its last credit went out; until then the node may get credit next round and
    // says so with a sub-second wait), the wait runs to the later, 60 s, boundary in whole
    // seconds, and the body names the first denying window in plan order.
    let key1 = foldgate_tests::http::hasher().key_id(key(1).as_bytes());
    // The loop below runs up to 2 s: started less than that before key 1's 60 s boundary,
    // it could see two 60 s windows (3 each) and the bound below would not hold: start it
    // in the fresh window then. (A full-suite run on 2026-12-04 failed here with 6
    // admitted; starting the loop 100 ms before the boundary gives exactly that, 1.2 s
    // before it the exhaustion notice comes first and it passes.)
    let wall_ms = || foldgate_runtime::wall_since_epoch().as_millis() as u64;
    let w60 = gateway_node::window::window_at(key1, 60_000, wall_ms());
    let left_ms = gateway_node::window::window_end_ms(key1, w60).saturating_sub(wall_ms());
    if left_ms < 3_000 {
        tokio::time::sleep(Duration::from_millis(left_ms + 100)).await;
    }
    let mut admitted = 0;
    let mut last = None;
    let by = Instant::now() + Duration::from_secs(2);
    while Instant::now() < by {
        let (s, h, b) = get_once(&c, &url, Some(&key(1))).await.unwrap();
        let now_ms = wall_ms();
        match s.as_u16() {
            200 => admitted += 1,
            429 => {
                let retry: u64 = h["retry-after"].to_str().unwrap().parse().unwrap();
                if retry >= 1 {
                    last = Some((h, b, now_ms));
                    break;
                }
                assert!(h.contains_key("x-ratelimit-reset-ms"), "{h:?}");
            }
            other => panic!("status {other}"),
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    assert!(admitted <= 3, "both windows allow 3, admitted {admitted}");
    let (h, body, now_ms) = last.expect("a whole-second Retry-After within 2 s");
    assert!(
        h.get("x-ratelimit-reset-ms").is_none(),
        "whole seconds only: {h:?}"
    );
    let retry: u64 = h["retry-after"].to_str().unwrap().parse().unwrap();
    let w60 = gateway_node::window::window_at(key1, 60_000, now_ms);
    let expected_s = gateway_node::window::window_end_ms(key1, w60)
        .saturating_sub(now_ms)
        .div_ceil(1_000);
    assert!(
        retry.abs_diff(expected_s) <= 1 && retry >= 1,
        "Retry-After {retry}, 60 s boundary in {expected_s} s"
    );
    let b = json(&body);
    assert_eq!(b["correlation_id"], h["x-request-id"].to_str().unwrap());
    assert_no_limit(&b, &[3]);

    // Metrics: verdicts counted, no raw key anywhere.
    let (_, _, metrics) = get_once(&c, &gw.admin_url("/metrics"), None).await.unwrap();
    assert!(metrics.contains("foldgate_decisions_total{outcome=\"deny_exhausted\"}"));
    assert!(!metrics.contains(&key(0)) && !metrics.contains(&key(1)));
    let (s, _, _) = get_once(&c, &gw.admin_url("/readyz"), None).await.unwrap();
    assert_eq!(s, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_bounded_oversized_slow_and_upstream_down() {
    let (up, _up_stop) = start_upstream(0).await;
    let gw = start_gateway(
        up,
        "server.header_read_timeout_ms = 300\nserver.max_header_bytes = 8192",
        &policy(1, &[(1_000, 1_000), (60_000, 60_000)]),
    )
    .await;

    // Oversized headers: 431, not a crash or a hang.
    let mut s = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    let big = "a".repeat(20_000);
    s.write_all(format!("GET / HTTP/1.1\r\nhost: x\r\nx-big: {big}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = vec![0u8; 256];
    let n = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf))
        .await
        .expect("answered")
        .unwrap();
    let head = String::from_utf8_lossy(&buf[..n]);
    assert!(head.starts_with("HTTP/1.1 431"), "{head}");

    // A slow client that never finishes its head is cut off at header_read_timeout_ms.
    let mut s = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n").await.unwrap();
    let t = Instant::now();
    let n = tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf))
        .await
        .expect("closed within the bound")
        .unwrap_or(0);
    let waited = t.elapsed();
    assert!(waited >= Duration::from_millis(250), "cut after {waited:?}");
    if n > 0 {
        let head = String::from_utf8_lossy(&buf[..n]);
        assert!(head.starts_with("HTTP/1.1 408"), "{head}");
    }

    // Upstream down: 502 at once. Upstream slow: 504 at the timeout, never a hang.
    let (dead, dead_stop) = start_upstream(0).await;
    drop(dead_stop);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let down = start_gateway(dead, "", &policy(1, EASY)).await;
    let c = plain_client();
    let t = Instant::now();
    let (status, h, body) = get_once(&c, &down.url("/"), Some(&key(0))).await.unwrap();
    assert_eq!(status, 502, "{body}");
    assert!(t.elapsed() < Duration::from_secs(2));
    assert!(h.contains_key("x-request-id"));
    let (slow, _slow_stop) = start_upstream(3_000).await;
    let slow_gw = start_gateway(slow, "upstream.timeout_ms = 300", &policy(1, EASY)).await;
    let t = Instant::now();
    let (status, _, _) = get_once(&c, &slow_gw.url("/"), Some(&key(0)))
        .await
        .unwrap();
    assert_eq!(status, 504);
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(290) && took < Duration::from_secs(2),
        "{took:?}"
    );
    let (_, _, metrics) = get_once(&c, &slow_gw.admin_url("/metrics"), None)
        .await
        .unwrap();
    assert!(
        metrics.contains("foldgate_requests_total{outcome=\"upstream_timeout\"} 1"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_with_many_streams_on_one_connection() {
    let (up, _up_stop) = start_upstream(0).await;
    let gw = start_gateway(
        up,
        "server.h2_max_concurrent_streams = 64",
        &policy(4, &[(1_000, 100_000), (60_000, 1_000_000)]),
    )
    .await;
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let url = gw.url("/h2");
    // The client may open up to its initial 100 streams before it reads the server's
    // SETTINGS; past the advertised 64 those are REFUSED_STREAM (RFC 9113 5.1.2). A
    // long-lived client has read SETTINGS by its first response, so warm the connection.
    let warm = http::Request::get(&url)
        .header("authorization", format!("Bearer {}", key(0)))
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(client.request(warm).await.unwrap().status(), 200);
    let calls = (0..600).map(|i| {
        let req = http::Request::get(&url)
            .header("authorization", format!("Bearer {}", key(i % 4)))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let c = client.clone();
        async move {
            let resp = c.request(req).await.expect("h2 request");
            assert_eq!(resp.version(), http::Version::HTTP_2);
            let status = resp.status();
            let _ = resp.into_body().collect().await;
            status
        }
    });
    let statuses = futures::future::join_all(calls).await;
    let ok = statuses.iter().filter(|s| s.as_u16() == 200).count();
    let others: Vec<_> = statuses.iter().filter(|s| s.as_u16() != 200).collect();
    assert_eq!(ok, 600, "not 200: {others:?}");
}

/// Two nodes on one NATS bus with one fold owner: key 0 floods node A far over its limit
/// while node B sends it a trickle. A is limited; B's trickle is still served from the
/// owner's fair split; the fleet admits no more than the limit per window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_over_its_limit_on_one_node_and_under_on_another() {
    use foldgate_tests::nats::NatsServer;

    let server = NatsServer::start();
    let url = server.url();
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    put_policy(&url, 1, 200).await;
    let worker = spawn_fold_worker(&url, 2, stop.clone()).await;
    let (up, _up_stop) = start_upstream(0).await;
    let node =
        |id: u32| format!("nats_url = \"{url}\"\nnode_id = {id}\nfleet_size = 2\nshards = 1");
    let a = start_gateway(up, &node(0), "").await;
    let b = start_gateway(up, &node(1), "").await;
    for g in [&a, &b] {
        let by = Instant::now() + Duration::from_secs(5);
        while !get_once(&plain_client(), &g.admin_url("/readyz"), None)
            .await
            .map(|(s, _, _)| s == 200)
            .unwrap_or(false)
        {
            assert!(Instant::now() < by, "node never got the policy");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // A: 400 req/s for 3 s; B: 20 req/s. The plan allows 200 per second.
    let count = |g: &foldgate_tests::http::TestGateway,
                 rate: u64,
                 ok: Arc<AtomicU64>,
                 limited: Arc<AtomicU64>| {
        let url = g.url("/");
        async move {
            let c = plain_client();
            let start = tokio::time::Instant::now();
            let mut tasks = Vec::new();
            for i in 0..rate * 3 {
                tokio::time::sleep_until(start + Duration::from_micros(i * 1_000_000 / rate)).await;
                let (c, url, ok, limited) = (
                    c.clone(),
                    url.clone(),
                    Arc::clone(&ok),
                    Arc::clone(&limited),
                );
                tasks.push(tokio::spawn(async move {
                    match get_once(&c, &url, Some(&key(0)))
                        .await
                        .map(|r| r.0.as_u16())
                    {
                        Ok(200) => ok.fetch_add(1, Ordering::Relaxed),
                        Ok(429) => limited.fetch_add(1, Ordering::Relaxed),
                        other => panic!("unexpected {other:?}"),
                    };
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
        }
    };
    let (a_ok, a_429, b_ok, b_429) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    tokio::join!(
        count(&a, 400, Arc::clone(&a_ok), Arc::clone(&a_429)),
        count(&b, 20, Arc::clone(&b_ok), Arc::clone(&b_429)),
    );
    let (a_ok, a_429, b_ok, b_429) = (
        a_ok.load(Ordering::Relaxed),
        a_429.load(Ordering::Relaxed),
        b_ok.load(Ordering::Relaxed),
        b_429.load(Ordering::Relaxed),
    );
    eprintln!("node A: {a_ok} ok, {a_429} limited; node B: {b_ok} ok, {b_429} limited");
    assert!(
        a_429 > 400,
        "node A is over the limit and must be limited: {a_429}"
    );
    // When the wants exceed what is left, the owner splits it in proportion to demand
    // (C4): B's 20 of 420 req/s is owed at least 20/420 of 200 a second, 47% of what it
    // offered, and more before A's demand builds.
    assert!(
        b_ok >= 27,
        "node B is under its share and must be served: {b_ok} of 60"
    );
    // 3 s of traffic spans at most 4 one-second windows of 200.
    assert!(
        a_ok + b_ok <= 4 * 200,
        "fleet admitted {} in 3 s",
        a_ok + b_ok
    );
    stop_tx.send(true).unwrap();
    worker.await.unwrap().unwrap();
}

async fn put_policy(url: &str, version: u64, per_second: u64) {
    use bus_schemas::{Envelope, WindowSpec};
    let windows = [
        WindowSpec {
            length_ms: 1_000,
            limit: per_second,
        },
        WindowSpec {
            length_ms: 60_000,
            limit: per_second * 60,
        },
    ];
    let keys = (0..4).map(|i| foldgate_tests::http::hasher().key_id(key(i).as_bytes()));
    let snap = foldgate_tests::nats::one_plan_snapshot(version, &windows, keys);
    foldgate_tests::nats::policy_bucket(url)
        .await
        .put(gateway_node::bus::POLICY_KEY, snap.encode().into())
        .await
        .unwrap();
}

/// F5 on a real bus with no fold owner: after `degraded_after_ms` every response says so,
/// 429s and proxied answers alike, and the gauge is up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn degraded_enforcement_is_visible_on_every_response() {
    use foldgate_tests::nats::NatsServer;
    let server = NatsServer::start();
    put_policy(&server.url(), 1, 5).await;
    let (up, _up_stop) = start_upstream(0).await;
    let gw = start_gateway(
        up,
        &format!("nats_url = \"{}\"\ndegraded_after_ms = 300", server.url()),
        "",
    )
    .await;
    let c = plain_client();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let mut seen = Vec::new();
    for _ in 0..12 {
        let (s, h, _) = get_once(&c, &gw.url("/"), Some(&key(0))).await.unwrap();
        assert_eq!(
            h.get("x-ratelimit-degraded").map(|v| v.to_str().unwrap()),
            Some("true"),
            "status {s}"
        );
        seen.push(s.as_u16());
    }
    assert!(seen.contains(&429), "limit 5/s, 12 requests: {seen:?}");
    let (_, _, metrics) = get_once(&c, &gw.admin_url("/metrics"), None).await.unwrap();
    assert!(
        metrics.contains("foldgate_enforcement_degraded 1"),
        "{metrics}"
    );
}

/// A client that connects and sends nothing is let go at `header_read_timeout_ms`: before
/// the protocol is known hyper reads with no timer, and such clients held their slots
/// for good, `max_connections` of them shutting the listener.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_gives_its_slot_back_at_the_head_bound() {
    let (up, _up_stop) = start_upstream(0).await;
    let gw = start_gateway(
        up,
        "[server]\nmax_connections = 1\nheader_read_timeout_ms = 300",
        &policy(1, EASY),
    )
    .await;
    let mut silent = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(2), silent.read(&mut buf))
        .await
        .expect("the silent connection is closed")
        .unwrap_or(0);
    assert_eq!(n, 0, "closed without an answer");
    let (status, _, body) = get_once(&plain_client(), &gw.url("/"), Some(&key(0)))
        .await
        .expect("the slot is free again");
    assert_eq!(status, 200, "{body}");
}

/// Hop-by-hop headers are dropped on arrival, so every gateway decides on the key it
/// forwards. `Connection: authorization` used to strip a malformed decoy only on the way
/// out: the edge saw no usable key (no per-key floor), the node behind it saw a good one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_named_by_connection_cannot_hide_the_key_from_the_edge_floor() {
    use gateway_node::http::edge::{EdgeGuard, EdgeSettings};
    use gateway_node::http::proxy::UpstreamSettings;

    let (up, _up_stop) = start_upstream(0).await;
    let settings = EdgeSettings {
        key_floor_per_s: 1,
        upstream: UpstreamSettings {
            urls: vec![format!("http://{up}")],
            ..EdgeSettings::default().upstream
        },
        ..EdgeSettings::default()
    };
    let edge = Arc::new(EdgeGuard::new(&settings).unwrap());
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let (addr, _) =
        foldgate_harness::http_tools::serve_on_loopback(edge, settings.server.limits(), stop)
            .await
            .unwrap();
    // Three in a row: a second's boundary can fall between two of them, not twice.
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!(
            "GET / HTTP/1.1\r\nhost: x\r\nauthorization: Basic Zm9v\r\nx-api-key: {}\r\n\
             connection: authorization\r\n\r\n",
            key(0)
        );
        s.write_all(req.as_bytes()).await.unwrap();
        let mut buf = vec![0u8; 1024];
        let n = s.read(&mut buf).await.unwrap();
        statuses.push(String::from_utf8_lossy(&buf[..12]).to_string());
        assert!(n >= 12);
    }
    assert!(statuses[0].starts_with("HTTP/1.1 200"), "{statuses:?}");
    assert!(
        statuses.iter().any(|s| s.starts_with("HTTP/1.1 429")),
        "a second request in one second is over the floor of 1: {statuses:?}"
    );
    stop_tx.send(true).unwrap();
}

/// A fail-open admit (D8: a limiter-internal fault) is enforcement degraded and says so,
/// as an F5 response does; it came back as a plain 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fail_open_admit_is_marked_degraded() {
    let (up, _up_stop) = start_upstream(0).await;
    let gw = start_gateway(up, "", &policy(1, EASY)).await;
    gw.gateway.runtime.surface().set_fault(true);
    let (status, headers, body) = get_once(&plain_client(), &gw.url("/"), Some(&key(0)))
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        headers.get("x-ratelimit-degraded").map(|v| v.as_bytes()),
        Some(&b"true"[..]),
        "{headers:?}"
    );
}

/// An upstream that sends a head and then part of its body and stalls: the body is given
/// up once nothing comes for the upstream timeout. The timeout bounded the head only, and
/// such a response held the client's connection and the upstream socket for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_body_that_stalls_is_given_up_at_the_timeout() {
    let up = scripted_upstream(|mut s, _| async move {
        let _ = s
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc")
            .await;
        tokio::time::sleep(Duration::from_secs(30)).await;
    })
    .await;
    let gw = start_gateway(up, "upstream.timeout_ms = 300", &policy(1, EASY)).await;
    let mut s = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(get_with_key_0().as_bytes()).await.unwrap();
    let t = Instant::now();
    let mut got = Vec::new();
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        let mut buf = [0u8; 1024];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(
        ended.is_ok(),
        "the response never ended: {:?}",
        String::from_utf8_lossy(&got)
    );
    let took = t.elapsed();
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"));
}

/// Past `upstream.max_in_flight` exchanges with the upstream, the next request is
/// answered 503 at once rather than opening one more upstream connection (the client
/// pool has no cap of its own), before the limiter charges its key; a finished exchange
/// gives its place back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_max_in_flight_the_upstream_is_spared_with_a_503() {
    let (up, _up_stop) = start_upstream(1_500).await;
    // One request an hour per key: a key charged for its 503 would get a 429 next (a
    // minute's window turned over between the two in ~2% of runs).
    let one_an_hour: &[(u32, u64)] = &[(1_000, 1), (3_600_000, 1)];
    let gw =
        Arc::new(start_gateway(up, "upstream.max_in_flight = 2", &policy(3, one_an_hour)).await);
    let c = plain_client();
    let slow: Vec<_> = (0..2)
        .map(|i| {
            let (c, url) = (c.clone(), gw.url("/"));
            tokio::spawn(async move { get_once(&c, &url, Some(&key(i))).await.unwrap().0 })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(upstream_in_flight(&gw).await.as_deref(), Some("2"));
    let t = Instant::now();
    let (status, _, body) = get_once(&c, &gw.url("/"), Some(&key(2))).await.unwrap();
    assert_eq!(status.as_u16(), 503, "{body}");
    assert!(body.contains("upstream overloaded"), "{body}");
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "{:?}",
        t.elapsed()
    );
    for s in slow {
        assert_eq!(s.await.unwrap().as_u16(), 200);
    }
    let (status, _, body) = get_once(&c, &gw.url("/"), Some(&key(2))).await.unwrap();
    assert_eq!(
        status.as_u16(),
        200,
        "the places came back, and the shed request spent none of key 2's allowance: {body}"
    );
    assert_eq!(upstream_in_flight(&gw).await.as_deref(), Some("0"));
    let metrics = get_once(&c, &gw.admin_url("/metrics"), None)
        .await
        .unwrap()
        .2;
    assert!(
        metrics.contains("foldgate_requests_total{outcome=\"upstream_overloaded\"} 1"),
        "{metrics}"
    );
}

/// A client that asks for a long response and stops reading it is let go at
/// `server.send_timeout_ms`: before, the gateway's write waited for good, and so did the
/// upstream's, pinning its connection and its place under `upstream.max_in_flight`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_let_go_at_the_send_timeout() {
    // An upstream that streams a body far larger than the sockets' buffers; it notes
    // when a write of it fails (the gateway closed the upstream connection).
    let (closed_tx, mut closed_rx) = tokio::sync::mpsc::unbounded_channel::<Instant>();
    let up = scripted_upstream(move |mut s, _| {
        let closed_tx = closed_tx.clone();
        async move {
            let head = b"HTTP/1.1 200 OK\r\ncontent-length: 1073741824\r\n\r\n";
            stream_until_cut(&mut s, head, &[b'x'; 64 * 1024]).await;
            let _ = closed_tx.send(Instant::now());
        }
    })
    .await;
    let gw = start_gateway(up, "server.send_timeout_ms = 300", &policy(1, EASY)).await;
    let s = a_200_head(&gw, &get_with_key_0()).await;
    // The client reads nothing more. The buffers fill, the gateway's write waits, and
    // 300 ms later the connection goes, and the upstream connection with it.
    let t = Instant::now();
    let closed_at = tokio::time::timeout(Duration::from_secs(10), closed_rx.recv())
        .await
        .expect("the upstream connection was let go")
        .unwrap();
    assert!(closed_at.duration_since(t) < Duration::from_secs(5));
    assert_eq!(upstream_in_flight(&gw).await.as_deref(), Some("0"));
    drop(s);
}

/// Over HTTP/2 a client that stops reading one stream stalls it on flow control: nothing
/// is pending on the socket (the connection's `send_timeout` never sees it) and nothing
/// polls the stream's body. The body's relay gives the upstream connection and its place
/// under `upstream.max_in_flight` back at `server.send_timeout_ms` all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_stream_the_client_stops_reading_gives_its_upstream_back() {
    let (closed_tx, mut closed_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let up = scripted_upstream(move |mut s, request| {
        let closed_tx = closed_tx.clone();
        async move {
            if request.starts_with(b"GET /small") {
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    .await;
                return;
            }
            // Far more than the stream's flow-control window and the sockets' buffers,
            // chunked: with no length to fall short of, only the relay's word can tell a
            // cut body from a whole one.
            let head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";
            let mut chunk = b"10000\r\n".to_vec();
            chunk.extend(std::iter::repeat_n(b'x', 64 * 1024));
            chunk.extend_from_slice(b"\r\n");
            stream_until_cut(&mut s, head, &chunk).await;
            let _ = closed_tx.send(());
        }
    })
    .await;
    let gw = start_gateway(
        up,
        "server.send_timeout_ms = 300\nupstream.max_in_flight = 1",
        &policy(2, EASY),
    )
    .await;
    let h2: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let req = http::Request::get(gw.url("/big"))
        .header("authorization", format!("Bearer {}", key(0)))
        .body(Full::new(Bytes::new()))
        .unwrap();
    // The head is read; the body never is, while the response is held.
    let held = h2.request(req).await.unwrap();
    assert_eq!(held.status(), 200);
    assert_eq!(held.version(), http::Version::HTTP_2);
    tokio::time::timeout(Duration::from_secs(10), closed_rx.recv())
        .await
        .expect("the upstream connection was let go")
        .unwrap();
    assert_eq!(upstream_in_flight(&gw).await.as_deref(), Some("0"));
    let (status, _, body) = get_once(&plain_client(), &gw.url("/small"), Some(&key(1)))
        .await
        .unwrap();
    assert_eq!(
        (status.as_u16(), body.as_str()),
        (200, "ok"),
        "its place came back"
    );
    // What the client does read of the cut response ends in an error, not as a whole
    // (shorter) body.
    let read = tokio::time::timeout(Duration::from_secs(10), held.into_body().collect())
        .await
        .expect("the cut stream ends");
    assert!(read.is_err(), "a cut response read as complete");
}

/// Bodies with nothing in them (a 304 that names its resource's length, a 204) pass as
/// the upstream sent them, over HTTP/1 and HTTP/2: the relay must report them ended, or
/// hyper sent an empty DATA frame against the 304's `content-length` (a stream reset)
/// and added `content-length: 0` to the 204.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_bodies_pass_as_the_upstream_sent_them() {
    let up = scripted_upstream(|mut s, mut request| async move {
        // Each request on the connection, kept alive, until the gateway closes it.
        let mut buf = [0u8; 4096];
        while !request.is_empty() {
            let answer: &[u8] = if request.starts_with(b"GET /304") {
                b"HTTP/1.1 304 Not Modified\r\ncontent-length: 5\r\n\r\n"
            } else {
                b"HTTP/1.1 204 No Content\r\n\r\n"
            };
            if s.write_all(answer).await.is_err() {
                return;
            }
            let n = s.read(&mut buf).await.unwrap_or(0);
            request = buf[..n].to_vec();
        }
    })
    .await;
    let gw = start_gateway(up, "", &policy(1, EASY)).await;
    let h1 = plain_client();
    let h2: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    for (name, client) in [("HTTP/1.1", &h1), ("HTTP/2", &h2)] {
        for path in ["/304", "/204"] {
            let req = http::Request::get(gw.url(path))
                .header("authorization", format!("Bearer {}", key(0)))
                .body(Full::new(Bytes::new()))
                .unwrap();
            let resp = tokio::time::timeout(Duration::from_secs(5), client.request(req))
                .await
                .expect("answered")
                .unwrap_or_else(|e| panic!("{name} {path}: {e:?}"));
            let (parts, body) = resp.into_parts();
            let body = body.collect().await;
            assert!(body.is_ok(), "{name} {path}: {body:?}");
            assert_eq!(parts.status.as_str(), &path[1..], "{name}");
            let length = parts.headers.get("content-length").map(|v| v.as_bytes());
            // A 304 may keep its resource's length or drop it; a 204 carries none.
            let want: &[Option<&[u8]>] = if path == "/304" {
                &[Some(b"5"), None]
            } else {
                &[None]
            };
            assert!(want.contains(&length), "{name} {path}: {:?}", parts.headers);
        }
    }
}

/// A client that goes away while the upstream is quiet gives the upstream connection
/// and its place back at once, not at the upstream timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_gives_its_upstream_back_at_once() {
    let up = scripted_upstream(|mut s, _| async move {
        let _ = s
            .write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n")
            .await;
        // Then nothing, as a long poll does.
        let _ = s.read(&mut [0u8; 4096]).await;
    })
    .await;
    let gw = start_gateway(up, "upstream.timeout_ms = 5000", &policy(1, EASY)).await;
    drop(a_200_head(&gw, &get_with_key_0()).await);
    let t = Instant::now();
    while upstream_in_flight(&gw).await.as_deref() != Some("0") {
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "still held after {:?}",
            t.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A client that stops sending its request body holds the exchange's place (the upstream
/// connection is busy with the upload, whatever the response did) until
/// `server.body_read_timeout_ms`, and then the upstream connection goes: before, the
/// place went with the response and the upload held the connection for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_upload_is_given_up_at_the_body_read_timeout() {
    let (closed_tx, mut closed_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let up = scripted_upstream(move |mut s, _| {
        let closed_tx = closed_tx.clone();
        async move {
            // An answer before the body is in, as an upstream that rejects early does.
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                .await;
            let mut buf = [0u8; 4096];
            while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
            let _ = closed_tx.send(());
        }
    })
    .await;
    let gw = start_gateway(up, "server.body_read_timeout_ms = 500", &policy(1, EASY)).await;
    let post = format!(
        "POST / HTTP/1.1\r\nhost: x\r\nx-api-key: {}\r\ncontent-length: 1000\r\n\r\n0123456789",
        key(0)
    );
    let s = a_200_head(&gw, &post).await;
    assert_eq!(
        upstream_in_flight(&gw).await.as_deref(),
        Some("1"),
        "the upload holds its place"
    );
    tokio::time::timeout(Duration::from_secs(5), closed_rx.recv())
        .await
        .expect("the upstream connection was let go")
        .unwrap();
    assert_eq!(upstream_in_flight(&gw).await.as_deref(), Some("0"));
    drop(s);
}

/// ADR-7, a rotation under way: a node whose own hash key is version 2 still finds a key
/// the policy names by its version-1 id, through `other_hash_keys`; without it, the node
/// refused every key the policy had not yet moved to version 2 (401).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_named_by_another_live_hash_version_is_found() {
    use gateway_node::http::auth::KeyHasher;
    let (up, _up_stop) = start_upstream(0).await;
    let v1_hex = "1f".repeat(32);
    let v1_file = std::env::temp_dir().join(format!("foldgate-v1-{}.hex", std::process::id()));
    std::fs::write(&v1_file, &v1_hex).unwrap();
    let v1 = KeyHasher::from_hex(1, &v1_hex).unwrap();
    let v1_policy = foldgate_harness::http_tools::bench_policy_toml(
        &v1,
        foldgate_tests::http::KEY_SEED,
        1,
        EASY,
    );
    let own_v2 = "hash_key_version = 2";
    let rotating = format!(
        "{own_v2}\nother_hash_keys = [{{ version = 1, file = \"{}\" }}]",
        v1_file.display()
    );
    let gw = start_gateway(up, &rotating, &v1_policy).await;
    let c = plain_client();
    let (status, _, body) = get_once(&c, &gw.url("/"), Some(&key(0))).await.unwrap();
    assert_eq!(status.as_u16(), 200, "found under version 1: {body}");
    let (status, _, _) = get_once(&c, &gw.url("/"), Some(&key(1))).await.unwrap();
    assert_eq!(status.as_u16(), 401, "a key the policy does not name");
    let (up, _up_stop2) = start_upstream(0).await;
    let without = start_gateway(up, own_v2, &v1_policy).await;
    let (status, _, _) = get_once(&c, &without.url("/"), Some(&key(0)))
        .await
        .unwrap();
    assert_eq!(status.as_u16(), 401, "version 2 alone does not find it");
    std::fs::remove_file(&v1_file).ok();
}

/// P3, ADR-7: a hash-key rotation does not give a key its allowance twice. The node knows
/// hash keys 1 (its own) and 2 (another live one). The key spends its 60 s allowance
/// under its version-1 id; the policy then switches to its version-2 id, which carries
/// the old one (`carry_from`): the rest of the old window stays denied. A third version
/// without the carry admits at once under the fresh id: what the carry closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hash_key_rotation_does_not_give_a_key_its_allowance_twice() {
    use bus_schemas::{Envelope, KeyAssignment, WindowSpec};
    use foldgate_tests::nats::NatsServer;
    use gateway_node::http::auth::KeyHasher;

    const NEW_HASH_KEY_HEX: &str =
        "5a1e6c0d93b2f4a87e1d2c3b4a5968778695a4b3c2d1e0f11e2d3c4b5a697887";
    const LIMIT_60S: u64 = 6;
    let server = NatsServer::start();
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let new_key_file = dir.path().join("hash-key-2.hex");
    std::fs::write(&new_key_file, NEW_HASH_KEY_HEX).unwrap();
    let raw = key(0);
    let old_id = foldgate_tests::http::hasher().key_id(raw.as_bytes());
    let new_id = KeyHasher::from_hex(2, NEW_HASH_KEY_HEX)
        .unwrap()
        .key_id(raw.as_bytes());
    let windows = [
        WindowSpec {
            length_ms: 1_000,
            limit: 100,
        },
        WindowSpec {
            length_ms: 60_000,
            limit: LIMIT_60S,
        },
    ];
    let put = |version: u64, key: bus_schemas::KeyId, carry_from: Option<bus_schemas::KeyId>| {
        let mut snap = foldgate_tests::nats::one_plan_snapshot(version, &windows, [key]);
        snap.keys = vec![KeyAssignment {
            carry_from,
            ..snap.keys[0].clone()
        }];
        let url = url.clone();
        async move {
            foldgate_tests::nats::policy_bucket(&url)
                .await
                .put(gateway_node::bus::POLICY_KEY, snap.encode().into())
                .await
                .unwrap();
        }
    };
    put(1, old_id, None).await;
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let worker = spawn_fold_worker(&url, 1, stop.clone()).await;
    let (up, _up_stop) = start_upstream(0).await;
    let extra = format!(
        "nats_url = \"{url}\"\nnode_id = 0\nfleet_size = 1\nshards = 1\nother_hash_keys = [{{ version = 2, file = \"{}\" }}]",
        new_key_file.display()
    );
    let gw = start_gateway(up, &extra, "").await;
    let c = plain_client();
    let on_version = |v: u64| {
        let (c, admin) = (c.clone(), gw.admin_url("/metrics"));
        async move {
            let by = Instant::now() + Duration::from_secs(5);
            loop {
                let (_, _, m) = get_once(&c, &admin, None).await.unwrap();
                if m.lines()
                    .any(|l| l == format!("foldgate_policy_version {v}"))
                {
                    return;
                }
                assert!(Instant::now() < by, "the node never took policy {v}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    on_version(1).await;
    // The whole test inside one 60 s window of the old id: both bounds below are per window.
    let wall_ms = || foldgate_runtime::wall_since_epoch().as_millis() as u64;
    let w60 = gateway_node::window::window_at(old_id, 60_000, wall_ms());
    let left_ms = gateway_node::window::window_end_ms(old_id, w60).saturating_sub(wall_ms());
    if left_ms < 15_000 {
        tokio::time::sleep(Duration::from_millis(left_ms + 100)).await;
    }
    let w60 = gateway_node::window::window_at(old_id, 60_000, wall_ms());
    let burst = |n: usize| {
        let (c, url) = (c.clone(), gw.url("/"));
        let raw = raw.clone();
        async move {
            let mut admitted = 0;
            for _ in 0..n {
                match get_once(&c, &url, Some(&raw)).await.unwrap().0.as_u16() {
                    200 => admitted += 1,
                    429 => {}
                    other => panic!("status {other}"),
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            admitted
        }
    };
    let before = burst(10).await;
    assert!(
        (1..=LIMIT_60S).contains(&before),
        "old id: {before} admitted of 10 at a 60 s limit of {LIMIT_60S}"
    );
    put(2, new_id, Some(old_id)).await;
    on_version(2).await;
    let carried = burst(10).await;
    assert!(
        before + carried <= LIMIT_60S,
        "through the switch {before} + {carried} admitted, limit {LIMIT_60S}"
    );
    // Without the carry the new id starts afresh: the gap the carry closes.
    put(3, new_id, None).await;
    on_version(3).await;
    let fresh = burst(10).await;
    assert!(fresh >= 1, "a fresh id admitted nothing");
    assert_eq!(
        gateway_node::window::window_at(old_id, 60_000, wall_ms()),
        w60,
        "the test ran past the old id's 60 s window"
    );
    eprintln!("rotation: {before} before, {carried} carried, {fresh} fresh");
    stop_tx.send(true).unwrap();
    worker.await.unwrap().unwrap();
}

/// The one fold worker of a one-shard fleet of `fleet_size` nodes on `url`, owning shard 0.
async fn spawn_fold_worker(
    url: &str,
    fleet_size: u32,
    stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<Result<(), fold_workers::service::FoldWorkerError>> {
    use bus_schemas::{OwnerEpoch, ShardId};
    use fold_workers::OwnerConfig;
    use fold_workers::service::{Assignment, FoldWorkerStats, run_fold_worker};
    tokio::spawn(run_fold_worker(
        foldgate_tests::nats::connect(url).await,
        Assignment {
            shards: vec![0],
            epoch: OwnerEpoch(1),
            takeover: false,
        },
        move |s| OwnerConfig {
            shards: 1,
            fleet_size,
            ..OwnerConfig::reference(ShardId(s))
        },
        foldgate_tests::nats::system_clock(),
        Arc::new(FoldWorkerStats::default()),
        stop,
    ))
}
