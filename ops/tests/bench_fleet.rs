//! `foldgate bench fleet` on a real nats-server, tiny: 3 nodes, 200 keys, 3 s of uniform
//! traffic. Its report carries the per-request figures beside the old ones, and they are
//! sane. It needs `foldgate-fold` beside the `foldgate` binary, which a workspace build
//! (`scripts/test.sh`) makes; built alone (`cargo test -p ops`) the test fails saying so.

use std::path::Path;
use std::process::Command;

#[test]
fn a_tiny_uniform_run_reports_its_costs_per_request() {
    let bin = Path::new(env!("CARGO_BIN_EXE_foldgate"));
    let worker = bin.with_file_name("foldgate-fold");
    assert!(
        worker.exists(),
        "{} is not built: run the workspace's tests (`scripts/test.sh`), which build it",
        worker.display()
    );
    let out = Command::new(bin)
        .args(["bench", "fleet", "--scenario", "uniform", "--nodes", "3"])
        .args(["--workers", "1", "--keys", "200", "--rate", "2000"])
        .args(["--seconds", "3", "--limit-1s", "10", "--limit-60s", "200"])
        .output()
        .expect("run foldgate bench fleet");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    assert_eq!(r["scenario"], "uniform");
    assert_eq!(
        (r["limit_1s"].as_u64(), r["limit_60s"].as_u64()),
        (Some(10), Some(200))
    );
    assert!(r["offered"].as_u64().unwrap() > 1_000, "{r}");
    // Requests sent per second of traffic, beside the share of --rate that is.
    let achieved = r["offered_rate_achieved"].as_f64().unwrap_or(0.0);
    assert!((300.0..=2_100.0).contains(&achieved), "{r}");
    assert!(
        r["offered_rate_achieved_pct"].as_f64().unwrap_or(0.0) > 15.0,
        "{r}"
    );
    // Windows that closed after the first second are booked; none over its limit.
    assert!(r["closed_key_windows"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(r["over_admission_pct_max"].as_f64(), Some(0.0), "{r}");
    // Shares of requests; grants and report entries are not (a cold fleet grants every
    // key-window on every node it reaches, and reports each key-window each round).
    for share in ["fast_path_per_request", "deadline_misses_per_request"] {
        let v = r[share].as_f64().unwrap_or(-1.0);
        assert!((0.0..=1.0).contains(&v), "{share}: {r}");
    }
    let pct = r["denied_under_limit_pct"].as_f64().unwrap_or(-1.0);
    assert!((0.0..=100.0).contains(&pct), "{r}");
    assert!(r["denied_under_limit"].as_u64().is_some(), "{r}");
    for cost in ["bus_msgs_per_request", "bus_bytes_per_request"] {
        assert!(r[cost].as_f64().unwrap_or(0.0) > 0.0, "{cost}: {r}");
    }
    assert!(
        r["report_entries_per_request"].as_f64().unwrap_or(-1.0) >= 0.0,
        "{r}"
    );
    assert!(
        r["fold_worker_cpu_s"].as_f64().unwrap_or(-1.0) >= 0.0,
        "{r}"
    );
    for kept in [
        "decision_latency_us_p50",
        "decision_latency_us_p99",
        "decision_latency_us_p999",
    ] {
        assert!(r[kept].is_number(), "{kept}: {r}");
    }
}
