//! `foldgate-node` and `foldgate-edge` as real processes (issue 5): the edge guard keeps
//! capping while the node behind it crash-loops (D9, O3), and after a load run no raw key
//! is in any log line or metric (D2, G1).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use foldgate_harness::http_tools::{LoadPlan, get_once, plain_client, run_load};
use foldgate_tests::http::{HASH_KEY_HEX, KEY_SEED, key, policy, start_upstream};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

use foldgate_harness::KillOnDrop as Proc;

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("foldgate-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A `foldgate-node` config in `dir/node.toml`: listening on `port` and `admin`, proxying
/// to `up`, with the test hash key, then `extra` settings and `policy`.
fn write_node_config(
    dir: &Path,
    (port, admin): (u16, u16),
    up: impl std::fmt::Display,
    extra: &str,
    policy: &str,
) -> PathBuf {
    let cfg = dir.join("node.toml");
    std::fs::write(
        &cfg,
        format!(
            "server.listen = \"127.0.0.1:{port}\"\nserver.admin_listen = \"127.0.0.1:{admin}\"\n\
             upstream.urls = [\"http://{up}\"]\nhash_key_hex = \"{HASH_KEY_HEX}\"\n{extra}\n{policy}"
        ),
    )
    .unwrap();
    cfg
}

fn spawn(bin: &str, config: &Path, log: Option<&Path>) -> Proc {
    let stderr = match log {
        Some(p) => Stdio::from(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .unwrap(),
        ),
        None => Stdio::null(),
    };
    Proc(
        Command::new(bin)
            .arg("--config")
            .arg(config)
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn"),
    )
}

async fn wait_ready(admin_port: u16) {
    let c = plain_client();
    let url = format!("http://127.0.0.1:{admin_port}/readyz");
    let by = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok((s, _, _)) = get_once(&c, &url, None).await
            && s == 200
        {
            return;
        }
        assert!(Instant::now() < by, "not ready: {url}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn now_s() -> u64 {
    foldgate_runtime::wall_since_epoch().as_secs()
}

/// O3's third drill: the limiter middleware in a crash loop with the edge alone in the
/// path. The node runs with its limiter off (what a crash-looping limiter amounts to) and
/// is killed with SIGKILL and restarted over and over; the edge's per-key floor and its
/// ceiling share keep bounding what reaches the upstream, and no request hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_keeps_capping_while_the_node_crash_loops() {
    const FLOOR: u64 = 30;
    const CEILING: u64 = 60;
    let dir = temp_dir("edge-drill");
    let (up, _up_stop) = start_upstream(0).await;
    let (node_port, node_admin) = (free_port(), free_port());
    let node_cfg = write_node_config(
        &dir,
        (node_port, node_admin),
        up,
        "limiter_enabled = false\nlog_level = \"warn\"",
        &policy(3, &[(1_000, 1_000), (60_000, 60_000)]),
    );
    let (edge_port, edge_admin) = (free_port(), free_port());
    let edge_cfg = dir.join("edge.toml");
    std::fs::write(
        &edge_cfg,
        format!(
            "server.listen = \"127.0.0.1:{edge_port}\"\nserver.admin_listen = \"127.0.0.1:{edge_admin}\"\n\
             upstream.urls = [\"http://127.0.0.1:{node_port}\"]\nkey_floor_per_s = {FLOOR}\n\
             fleet_ceiling_per_s = {CEILING}\nedge_count = 1\nupstream.timeout_ms = 2000\n\
             log_level = \"warn\"\n"
        ),
    )
    .unwrap();
    let node = Arc::new(Mutex::new(Some(spawn(
        env!("CARGO_BIN_EXE_foldgate-node"),
        &node_cfg,
        None,
    ))));
    let _edge = spawn(env!("CARGO_BIN_EXE_foldgate-edge"), &edge_cfg, None);
    wait_ready(node_admin).await;
    wait_ready(edge_admin).await;

    // The crash loop: up ~500 ms, SIGKILL, down ~250 ms, again.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let killer = {
        let (node, stop, cfg) = (Arc::clone(&node), Arc::clone(&stop), node_cfg.clone());
        tokio::spawn(async move {
            let mut kills = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(500)).await;
                drop(node.lock().unwrap().take());
                kills += 1;
                tokio::time::sleep(Duration::from_millis(250)).await;
                *node.lock().unwrap() =
                    Some(spawn(env!("CARGO_BIN_EXE_foldgate-node"), &cfg, None));
            }
            kills
        })
    };

    // Three keys at 50 req/s each for 4 s through the edge.
    let c = plain_client();
    let url = format!("http://127.0.0.1:{edge_port}/");
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for i in 0..600u64 {
        tokio::time::sleep_until(start + Duration::from_micros(i * 4_000_000 / 600)).await;
        let (c, url) = (c.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            let k = i % 3;
            let sent_s = now_s();
            let t = Instant::now();
            let status = get_once(&c, &url, Some(&key(k)))
                .await
                .map(|r| r.0.as_u16())
                .unwrap_or(0);
            (k, sent_s, status, t.elapsed())
        }));
    }
    let mut per_key_s: HashMap<(u64, u64), u64> = HashMap::new();
    let mut per_s: HashMap<u64, u64> = HashMap::new();
    let mut by_status: HashMap<u16, u64> = HashMap::new();
    let mut slowest = Duration::ZERO;
    for t in tasks {
        let (k, s, status, took) = t.await.unwrap();
        *by_status.entry(status).or_default() += 1;
        slowest = slowest.max(took);
        if status == 200 {
            *per_key_s.entry((k, s)).or_default() += 1;
            *per_s.entry(s).or_default() += 1;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let kills = killer.await.unwrap();
    eprintln!("statuses {by_status:?}, kills {kills}, slowest {slowest:?}");
    assert!(kills >= 3, "the node was killed {kills} times");
    // A request decided at a second's edge may be booked by its send time in the one
    // before: one request of slack per second.
    for ((k, s), n) in &per_key_s {
        assert!(*n <= FLOOR + 1, "key {k} got {n} through in second {s}");
    }
    for (s, n) in &per_s {
        assert!(*n <= CEILING + 1, "{n} through in second {s}");
    }
    assert!(
        by_status.get(&429).copied().unwrap_or(0) > 0,
        "the edge capped"
    );
    assert!(
        by_status.get(&502).copied().unwrap_or(0) > 0,
        "some requests met the node down: {by_status:?}"
    );
    assert!(by_status.get(&200).copied().unwrap_or(0) > 0);
    assert_eq!(
        by_status.get(&0),
        None,
        "no request failed at the transport"
    );
    assert!(
        slowest < Duration::from_secs(3),
        "a request took {slowest:?}"
    );
    let (_, _, m) = get_once(&c, &format!("http://127.0.0.1:{edge_admin}/metrics"), None)
        .await
        .unwrap();
    assert!(m.contains("foldgate_edge_capped_key_floor_total"), "{m}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// After a load run with admits, 429s and 401s, at debug level, no raw key (known or
/// unknown) and not the hash secret is in the node's log or its metrics; the log does
/// carry the hashed key ids and correlation ids, so the scan looked at real lines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_raw_key_in_logs_or_metrics_after_a_load_run() {
    let dir = temp_dir("key-scan");
    let (up, _up_stop) = start_upstream(0).await;
    let (port, admin) = (free_port(), free_port());
    // Keys 0..8 are known (and limited to 20/s); the load also uses 9..11, unknown.
    let cfg = write_node_config(
        &dir,
        (port, admin),
        up,
        "log_level = \"debug\"",
        &policy(9, &[(1_000, 20), (60_000, 600)]),
    );
    let log = dir.join("node.log");
    let node = spawn(env!("CARGO_BIN_EXE_foldgate-node"), &cfg, Some(&log));
    wait_ready(admin).await;
    let [report] = &run_load(&LoadPlan {
        targets: vec![format!("http://127.0.0.1:{port}")],
        rate: 600,
        seconds: 2.0,
        keys: 12,
        key_seed: KEY_SEED,
        path: "/scan".into(),
        max_in_flight: 256,
        timeout: Duration::from_secs(5),
    })
    .await[..] else {
        panic!("one target, one report")
    };
    eprintln!("{report:?}");
    assert!(report.ok > 0 && report.status_429 > 0 && report.status_401 > 0);
    let c = plain_client();
    let (_, _, metrics) = get_once(&c, &format!("http://127.0.0.1:{admin}/metrics"), None)
        .await
        .unwrap();
    drop(node);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("key_id") && text.contains("correlation_id"),
        "{text}"
    );
    assert!(text.contains("rate limited") && text.contains("unauthorized"));
    for i in 0..12 {
        let k = key(i);
        assert!(!text.contains(&k), "raw key {i} in the log");
        assert!(!metrics.contains(&k), "raw key {i} in the metrics");
        // Nor a long piece of one (a truncated key is still a leak).
        let piece = &k[4..20];
        assert!(!text.contains(piece), "part of raw key {i} in the log");
    }
    assert!(!text.contains(HASH_KEY_HEX) && !metrics.contains(HASH_KEY_HEX));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A bad configuration stops the binary at start, naming the file and line, the key, and
/// what was expected; so does a bad environment override, and a missing secret.
#[test]
fn a_bad_config_fails_fast_with_file_key_and_expectation() {
    let dir = temp_dir("bad-config");
    let cfg = dir.join("node.toml");
    std::fs::write(&cfg, "log_level = \"warn\"\nround_ms = \"fast\"\n").unwrap();
    let run = |extra_env: &[(&str, &str)], file: &Path| {
        let out = Command::new(env!("CARGO_BIN_EXE_foldgate-node"))
            .arg("--config")
            .arg(file)
            .envs(extra_env.iter().copied())
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, err) = run(&[], &cfg);
    assert!(!ok);
    assert!(err.contains(&format!("{}:2", cfg.display())), "{err}");
    assert!(
        err.contains("key `round_ms`") && err.contains("expected u32"),
        "{err}"
    );

    std::fs::write(&cfg, "log_level = \"warn\"\n").unwrap();
    let (ok, err) = run(&[("FOLDGATE_NODE_MAX_CONNECTIONS", "many")], &cfg);
    assert!(!ok);
    assert!(
        err.contains("env FOLDGATE_NODE_MAX_CONNECTIONS: key `max_connections`"),
        "{err}"
    );

    let (ok, err) = run(&[], &cfg);
    assert!(!ok, "no hash key configured");
    assert!(err.contains("no hash key"), "{err}");

    let edge = dir.join("edge.toml");
    std::fs::write(&edge, "[upstream]\nurls = \"http://127.0.0.1:1\"\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_foldgate-edge"))
        .arg("--config")
        .arg(&edge)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("key `urls`") && err.contains("expected a sequence"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// SIGTERM (what systemd, Kubernetes and `docker stop` send) drains: a request in flight
/// when it comes is answered, and the process exits 0. It was killed by the signal, the
/// request cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_the_requests_in_flight() {
    let dir = temp_dir("sigterm");
    let (up, _up_stop) = start_upstream(500).await;
    let (port, admin) = (free_port(), free_port());
    let cfg = write_node_config(
        &dir,
        (port, admin),
        up,
        "server.drain_ms = 3000",
        &policy(1, &[(1_000, 20), (60_000, 600)]),
    );
    let mut node = spawn(env!("CARGO_BIN_EXE_foldgate-node"), &cfg, None);
    wait_ready(admin).await;
    let request = tokio::spawn(async move {
        get_once(
            &plain_client(),
            &format!("http://127.0.0.1:{port}/slow"),
            Some(&key(0)),
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let pid = node.0.id().to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(killed.success());
    let (status, _, body) = request.await.unwrap().expect("answered, not cut");
    assert_eq!(status, 200, "{body}");
    let by = Instant::now() + Duration::from_secs(5);
    let exit = loop {
        if let Some(exit) = node.0.try_wait().unwrap() {
            break exit;
        }
        assert!(Instant::now() < by, "still running 5 s after SIGTERM");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(exit.success(), "exit {exit:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
