//! End-to-end archiver throughput against a real tansu broker: N events (default
//! 1,000,000; `FOLDGATE_BENCH_EVENTS`) are produced to a 3-partition topic first, then the
//! release `foldgate-archiver` binary, pinned to one core with `taskset -c 0` (librdkafka's
//! threads included), archives them with `--until-caught-up`. The figure is events over
//! the archiver's own time from its first message to its last commit (its `run summary`
//! line), so the group join is left out; the process's CPU seconds (from `/usr/bin/time`)
//! are reported beside it, and the archive's Parquet bytes per million events.
//!
//! `cargo bench -p foldgate-archiver --bench end_to_end`

#[path = "../tests/common/mod.rs"]
mod common;

use std::process::Command;
use std::time::Instant;

use common::*;
use foldgate_harness::kafka::KafkaBroker;

fn parquet_bytes(dir: &std::path::Path) -> u64 {
    let mut total = 0;
    for day in std::fs::read_dir(dir.join("events")).unwrap() {
        for f in std::fs::read_dir(day.unwrap().path()).unwrap() {
            let f = f.unwrap();
            if f.file_name().to_string_lossy().ends_with(".parquet") {
                total += f.metadata().unwrap().len();
            }
        }
    }
    total
}

fn main() {
    // `cargo bench` passes `--bench`; nothing here takes arguments.
    let n: u64 = std::env::var("FOLDGATE_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let kafka = KafkaBroker::start();
    let bootstrap = kafka.bootstrap();
    create_topic(&bootstrap);
    let t = Instant::now();
    produce_events(&bootstrap, n);
    eprintln!("produced {n} events in {:.1} s", t.elapsed().as_secs_f64());

    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("archiver.log");
    let times = dir.path().join("time.txt");
    let run = ArchiverRun {
        bootstrap: &bootstrap,
        archive: dir.path(),
        group: "bench",
        extra: Vec::new(),
        log: log.clone(),
    };
    let inner = run.command();
    let mut c = Command::new("taskset");
    c.args(["-c", "0", "/usr/bin/time", "-f", "%e %U %S", "-o"])
        .arg(&times)
        .arg(inner.get_program())
        .args(inner.get_args())
        .arg("--until-caught-up")
        .stderr(std::fs::File::create(&log).unwrap());
    let status = c.status().expect("taskset and /usr/bin/time");
    assert!(status.success(), "{}", run.log_text());

    let text = std::fs::read_to_string(&log).unwrap();
    let summary = text
        .lines()
        .find(|l| l.contains("run summary"))
        .unwrap_or_else(|| panic!("no run summary:\n{}", run.log_text()))
        .to_string();
    let field = |name: &str| -> f64 {
        summary
            .split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{name}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} in {summary}"))
    };
    let (archived, seconds) = (field("events"), field("seconds"));
    assert_eq!(archived as u64, n, "{}", run.log_text());
    let t = std::fs::read_to_string(&times).unwrap();
    let v: Vec<f64> = t
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    let (wall, cpu) = (v[0], v[1] + v[2]);
    let bytes = parquet_bytes(dir.path());
    println!(
        "end_to_end: {n} events, first message to last commit {seconds:.2} s = {:.0} events/s on one core \
         (process wall {wall:.2} s incl. group join, CPU {cpu:.2} s = {:.0} events per CPU-second); \
         Parquet {bytes} bytes = {:.0} bytes per million events",
        archived / seconds,
        n as f64 / cpu,
        bytes as f64 * 1e6 / n as f64
    );
    drop(kafka);
}
