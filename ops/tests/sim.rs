//! The simulator's own guarantees: invariants hold for hundreds of seeds across
//! every scenario, the same seed replays byte for byte, faults really happen, and the
//! global-sync baseline really over-admits where the design says it must.

use ops::sim::{self, RunOutcome, Scenario, SimConfig, SimMode, SimReport, WhatIf};

/// Small enough for the suite, shaped like the reference: 20 nodes, a 1 s and a 60 s
/// window, 50 requests/s per key against a 40/s limit.
fn small(scenario: Scenario, mode: SimMode, seed: u64) -> SimConfig {
    SimConfig {
        keys: 40,
        rate: 2_000,
        seconds: 6,
        seed,
        // Scaled so the bus is cut long enough to degrade inside a short run.
        cut_at_s: Some(1),
        cut_s: Some(3),
        degraded_after_ms: 1_500,
        ..SimConfig::new(scenario, mode)
    }
}

fn report(cfg: &SimConfig, outcome: RunOutcome) -> SimReport {
    SimReport::build(cfg, 1, &[outcome], 0)
}

/// The books agree with themselves: every figure of a request is booked in the windows
/// its deciding node named, so no closed key-window admits more than it was offered,
/// under any scenario or mode, skewed clocks included (at this shape the old books, which
/// booked offers by true time, broke in `skew` on every seed tried).
#[test]
fn no_key_window_admits_more_than_it_was_offered() {
    for scenario in Scenario::ALL {
        for mode in [SimMode::Leasing, SimMode::Fixed, SimMode::GlobalSync] {
            let seeds = if scenario == Scenario::Skew { 3 } else { 1 };
            let cfg = small(scenario, mode, 1);
            for (i, o) in sim::run_seeds(&cfg, seeds, 2)
                .expect("valid config")
                .iter()
                .enumerate()
            {
                let run = format!("{} {} seed {}", scenario.name(), mode.name(), 1 + i);
                assert!(!o.closed.is_empty(), "{run}: no closed key-windows");
                for c in &o.closed {
                    assert!(
                        c.admitted <= c.offered
                            && c.oracle_admitted <= c.offered
                            && c.oracle_admitted <= c.allowance,
                        "{run}: {c:?}"
                    );
                }
            }
        }
    }
}

/// The report's figures in requests come from the same closed key-windows of the 1 s
/// window as the rows: the fleet's shortfall against the oracle, and its denials while
/// the oracle had used under half of every window (a part of all its denials).
#[test]
fn under_admission_in_requests_is_booked_from_the_same_rows() {
    for scenario in [Scenario::Uniform, Scenario::Partition, Scenario::Skew] {
        let cfg = small(scenario, SimMode::Leasing, 3);
        let o = sim::run(&cfg).expect("valid config");
        let one_s: Vec<_> = o.closed.iter().filter(|c| c.window_kind == 1_000).collect();
        let under: u64 = one_s
            .iter()
            .map(|c| c.oracle_admitted.saturating_sub(c.admitted))
            .sum();
        let oracle: u64 = one_s.iter().map(|c| c.oracle_admitted).sum();
        let half: u64 = one_s.iter().map(|c| c.denied_under_half).sum();
        let offered: u64 = one_s.iter().map(|c| c.offered).sum();
        let r = SimReport::build(&cfg, 1, std::slice::from_ref(&o), 0);
        assert_eq!(r.under_admitted_requests, under, "{scenario:?}");
        assert_eq!(r.denied_under_half_limit, half, "{scenario:?}");
        assert!(under <= oracle && half <= offered - one_s.iter().map(|c| c.admitted).sum::<u64>());
        let pct = (under as f64 * 100.0 / oracle as f64 * 10_000.0).round() / 10_000.0;
        assert_eq!(r.under_admitted_pct_of_oracle, pct, "{scenario:?}");
        if scenario == Scenario::Partition {
            // The cut starves nodes of credit from the first second on.
            assert!(r.under_admitted_requests > 0 && r.denied_under_half_limit > 0);
        }
    }
}

#[test]
fn two_hundred_seeds_across_every_scenario_keep_the_invariants() {
    const SEEDS_PER_SCENARIO: u64 = 17; // 12 scenarios x 17 = 204 leasing runs
    let mut runs = 0;
    for scenario in Scenario::ALL {
        let cfg = small(scenario, SimMode::Leasing, 1_000);
        let outcomes = sim::run_seeds(&cfg, SEEDS_PER_SCENARIO, 2).expect("valid config");
        for (i, o) in outcomes.iter().enumerate() {
            runs += 1;
            assert!(
                o.violations.is_empty(),
                "{} seed {}: {:?}",
                scenario.name(),
                cfg.seed + i as u64,
                o.violations
            );
            let r = report(
                &SimConfig {
                    seed: cfg.seed + i as u64,
                    ..cfg.clone()
                },
                RunOutcome {
                    counts: o.counts,
                    closed: o.closed.clone(),
                    violations: Vec::new(),
                },
            );
            // A1: ~0 at steady state, <= 2% with faults.
            let bound = if scenario.is_fault() { 2.0 } else { 0.5 };
            assert!(
                r.over_admission_pct_max <= bound,
                "{}: over-admission {}% > {bound}%\n  replay: {}",
                scenario.name(),
                r.over_admission_pct_max,
                r.replay
            );
            assert!(r.offered > 0 && r.admitted > 0);
        }
    }
    assert!(runs >= 200);
}

#[test]
fn fixed_and_global_sync_keep_running_on_the_same_traffic() {
    for scenario in Scenario::ALL {
        for mode in [SimMode::Fixed, SimMode::GlobalSync] {
            let cfg = small(scenario, mode, 7);
            let o = sim::run(&cfg).expect("valid config");
            assert!(
                o.violations.is_empty(),
                "{scenario:?} {mode:?}: {:?}",
                o.violations
            );
        }
        // Same seed, same traffic, whatever the mode.
        let offered: Vec<u64> = [SimMode::Leasing, SimMode::Fixed, SimMode::GlobalSync]
            .map(|m| sim::run(&small(scenario, m, 7)).unwrap().counts.offered)
            .to_vec();
        assert!(
            offered.windows(2).all(|w| w[0] == w[1]),
            "{scenario:?}: {offered:?}"
        );
    }
}

fn csv_of(outcomes: &[RunOutcome]) -> Vec<u8> {
    let mut out = Vec::new();
    sim::write_admissions_csv(&mut out, outcomes).unwrap();
    out
}

#[test]
fn the_same_seed_gives_byte_identical_output() {
    for scenario in [Scenario::Lossy, Scenario::OwnerCrash, Scenario::Skew] {
        let cfg = small(scenario, SimMode::Leasing, 42);
        let a = sim::run_seeds(&cfg, 2, 2).unwrap();
        let b = sim::run_seeds(&cfg, 2, 1).unwrap();
        assert_eq!(
            csv_of(&a),
            csv_of(&b),
            "{scenario:?}: admissions CSV differs"
        );
        let json =
            |o: &[RunOutcome]| serde_json::to_string(&SimReport::build(&cfg, 2, o, 0)).unwrap();
        assert_eq!(json(&a), json(&b), "{scenario:?}: summary differs");
        let other = sim::run(&SimConfig {
            seed: 43,
            ..cfg.clone()
        })
        .unwrap();
        assert_ne!(
            csv_of(&a[..1]),
            csv_of(&[other]),
            "another seed, other traffic"
        );
    }
}

#[test]
fn faults_are_really_injected() {
    let o = sim::run(&small(Scenario::Partition, SimMode::Leasing, 3)).unwrap();
    assert!(o.counts.bus_cut > 0, "the bus was cut");
    assert!(
        o.counts.degraded_node_rounds > 0,
        "nodes reported degraded (F5)"
    );
    assert!(
        o.counts.self_grants > 0,
        "nodes self-granted at boundaries (F4)"
    );
    let o = sim::run(&small(Scenario::Restarts, SimMode::Leasing, 3)).unwrap();
    assert_eq!(
        o.counts.node_restarts, 3,
        "A46: 3 of 20 nodes restart in one window"
    );
    let o = sim::run(&small(Scenario::OwnerCrash, SimMode::Leasing, 3)).unwrap();
    assert_eq!(
        o.counts.owner_changes, 10,
        "half of 20 shards lose their owner"
    );
    let o = sim::run(&small(Scenario::Lossy, SimMode::Leasing, 3)).unwrap();
    assert!(o.counts.bus_lost > 0);
}

#[test]
fn global_sync_over_admits_when_every_node_bursts_one_key() {
    // A40: the peers' approach admits from stale copies on every node at once.
    let cfg = SimConfig {
        seconds: 12,
        ..small(Scenario::AllBurst, SimMode::GlobalSync, 5)
    };
    let gs = report(&cfg, sim::run(&cfg).unwrap());
    let cfg_l = SimConfig {
        mode: SimMode::Leasing,
        ..cfg.clone()
    };
    let leasing = report(&cfg_l, sim::run(&cfg_l).unwrap());
    assert!(
        gs.over_admission_pct_max > 10.0,
        "global-sync over-admission {}%",
        gs.over_admission_pct_max
    );
    assert!(
        leasing.over_admission_pct_max <= 2.0,
        "leasing {}%",
        leasing.over_admission_pct_max
    );
}

#[test]
fn the_cli_prints_the_interface_fields_and_the_csv() {
    let dir = std::env::temp_dir().join(format!("foldgate-sim-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let csv = dir.join("admissions.csv");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_foldgate"))
        .args([
            "sim",
            "--scenario",
            "pinned",
            "--mode",
            "leasing",
            "--nodes",
            "20",
        ])
        .args([
            "--keys",
            "40",
            "--seconds",
            "4",
            "--seed",
            "9",
            "--rate",
            "2000",
            "--json",
        ])
        .arg("--admissions-out")
        .arg(&csv)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for field in [
        "scenario",
        "mode",
        "seed",
        "nodes",
        "keys",
        "sim_seconds",
        "offered",
        "admitted",
        "fail_open_admitted",
        "over_admission_pct_max",
        "over_admission_pct_p99",
        "under_admission_pct_p99",
        "under_admission_pct_mean",
        "fast_path_share_pct",
        "invariant_violations",
        "wall_ms",
        "under_admitted_requests",
        "under_admitted_pct_of_oracle",
        "denied_under_half_limit",
        "denied_under_half_limit_pct",
    ] {
        assert!(v.get(field).is_some(), "missing {field}");
    }
    assert_eq!(v["scenario"], "pinned");
    assert_eq!(v["invariant_violations"], 0);
    let text = std::fs::read_to_string(&csv).unwrap();
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some("key,window_kind,window_id,allowance,offered,admitted,oracle_admitted")
    );
    let rows: Vec<&str> = lines.collect();
    assert!(!rows.is_empty());
    for row in rows {
        let cols: Vec<&str> = row.split(',').collect();
        assert_eq!(cols.len(), 7, "{row}");
        assert!(cols[0].starts_with("k1:"), "keys appear only hashed: {row}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// `--what-if` lifts a rule of the design for one run, to measure what the rule costs
/// (BENCHMARKS.md, "What the 60 s targets would take"): each lift moves what it names, on
/// the same traffic; a run names its lifts in its report and its replay command, and a
/// run of the design as built names none.
#[test]
fn what_if_runs_lift_what_they_name_and_say_so() {
    let base = SimConfig {
        seconds: 8,
        ..small(Scenario::Zipf, SimMode::Leasing, 5)
    };
    let run = |what_if: &[WhatIf]| {
        let cfg = SimConfig {
            what_if: what_if.to_vec(),
            ..base.clone()
        };
        let o = sim::run(&cfg).unwrap();
        assert!(o.violations.is_empty(), "{what_if:?}: {:?}", o.violations);
        report(&cfg, o)
    };
    let built = run(&[]);
    let no_misses = run(&[WhatIf::NoFastPathMisses]);
    let every = run(&[WhatIf::FastPathEveryRequest]);
    let central = run(&[WhatIf::CentralEndgame]);
    assert!(built.counts.fast_path_deadline_missed > 0);
    assert_eq!(no_misses.counts.fast_path_deadline_missed, 0);
    // D5's one ask per key per round turned requests away that now ask.
    assert!(
        every.counts.fast_path > built.counts.fast_path,
        "{} vs {}",
        every.counts.fast_path,
        built.counts.fast_path
    );
    // The endgame's credit now goes out one unit per fast path.
    assert!(
        central.counts.fast_path > built.counts.fast_path,
        "{} vs {}",
        central.counts.fast_path,
        built.counts.fast_path
    );
    for r in [&no_misses, &every, &central] {
        assert_eq!(r.offered, built.offered, "the same traffic");
    }
    let json = serde_json::to_value(&built).unwrap();
    assert!(json.get("what_if").is_none(), "{json}");
    assert!(!built.replay.contains("--what-if"), "{}", built.replay);
    let json = serde_json::to_value(&central).unwrap();
    assert_eq!(json["what_if"], serde_json::json!(["central-endgame"]));
    assert!(
        central.replay.ends_with(" --what-if central-endgame"),
        "{}",
        central.replay
    );
}

/// The reference shape scaled down (issue 26): 20 nodes, keys offered 0.5 requests/s
/// each, spread over every node, so a node sees a key about once in 40 s. With plans far
/// above the offered rate and L >= 5N, a decision must stay a memory read: standing options
/// make the first request of a window at a node an admit, not a fast path. Bounds are the
/// issue's targets (fast path < 0.5%, no denial of a key under half its limit). With
/// L < N (10 per second over 20 nodes) the floor is about 51% (ARCHITECTURE.md,
/// "Standing options"): the fast path is held within 1.2x of it (about 57% here), and a
/// fast path that brings nothing for a key far below its limit (refused while the pool
/// may refill, or past D5's deadline) is a loan, not a 429 ("Loans"): denials of keys
/// under half their limit stay within the 0.1% (0.06% here over 20 s), with no
/// over-admission.
#[test]
fn spread_keys_far_below_their_limit_decide_from_held_credit() {
    let spread = |limit_1s: u64, limit_60s: u64| SimConfig {
        keys: 2_000,
        rate: 1_000,
        seconds: 5,
        seed: 7,
        limit_1s: Some(limit_1s),
        limit_60s: Some(limit_60s),
        ..SimConfig::new(Scenario::Uniform, SimMode::Leasing)
    };
    let cfg = spread(100, 3_000);
    let r = report(&cfg, sim::run(&cfg).expect("valid config"));
    assert_eq!(r.invariant_violations, 0, "{}", r.replay);
    assert!(
        r.fast_path_share_pct < 0.5,
        "L >= 5N: fast path {}% of requests\n  replay: {}",
        r.fast_path_share_pct,
        r.replay
    );
    assert_eq!(
        r.denied_under_half_limit, 0,
        "L >= 5N: a key under half its limit was denied\n  replay: {}",
        r.replay
    );
    // 20 s, not 5: a loan guard that misread demand once keys had a history let the
    // denials grow with the run (0.07% at 5 s, 0.77% at 60 s).
    let cfg = SimConfig {
        seconds: 20,
        ..spread(10, 200)
    };
    let r = report(&cfg, sim::run(&cfg).expect("valid config"));
    assert_eq!(r.invariant_violations, 0, "{}", r.replay);
    assert_eq!(r.over_admission_pct_max, 0.0, "{}", r.replay);
    assert!(
        r.fast_path_share_pct < 61.2,
        "L < N: fast path {}% of requests\n  replay: {}",
        r.fast_path_share_pct,
        r.replay
    );
    assert!(
        r.denied_under_half_limit_pct < 0.1,
        "L < N: {}% of requests denied under half the limit\n  replay: {}",
        r.denied_under_half_limit_pct,
        r.replay
    );
}

/// Loans under faults (ARCHITECTURE.md, "Loans"): at L < N, where a missed fast-path
/// deadline may take a loan, a 3 s bus cut in the scenarios that move, lose or cut
/// traffic must keep every invariant and A1's fault bound (2%). Deadline loans without
/// their guards over-admitted 2.5% in shift under a cut.
#[test]
fn loans_at_l_below_n_keep_the_fault_bound_under_a_bus_cut() {
    for scenario in [
        Scenario::Uniform,
        Scenario::Shift,
        Scenario::Lossy,
        Scenario::Partition,
        Scenario::OwnerCrash,
    ] {
        for seed in 1..=2 {
            let cfg = SimConfig {
                keys: 400,
                rate: 200,
                seconds: 8,
                seed,
                limit_1s: Some(10),
                limit_60s: Some(200),
                cut_at_s: Some(2),
                cut_s: Some(3),
                ..SimConfig::new(scenario, SimMode::Leasing)
            };
            let r = report(&cfg, sim::run(&cfg).expect("valid config"));
            assert_eq!(r.invariant_violations, 0, "{}", r.replay);
            assert!(
                r.over_admission_pct_max <= 2.0,
                "over-admission {}%\n  replay: {}",
                r.over_admission_pct_max,
                r.replay
            );
        }
    }
}
