//! The README's main job: a gateway with its embedded defaults earns a 429 only
//! once the plan's 1 s allowance is spent, never before, and the wait it names is true.

use ops::demo::run_demo;

const LIMIT_1S: u64 = 5;

/// Five fresh gateways, each with a fresh key: a false early 429 fails this test (a fresh
/// node holding only one round's pace of credit would give one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_earns_its_429_after_exactly_the_allowance_and_the_named_wait_is_true() {
    for run in 0..5 {
        // run_demo itself fails if the request after the named wait is limited again.
        let dir = tempfile::tempdir().unwrap();
        let (steps, archive) = run_demo(LIMIT_1S, 100, dir.path(), |_| {})
            .await
            .expect("demo run");
        // run_demo fails unless the archive holds one row per 429; the row is the 429's.
        assert_eq!(archive.rows, 1, "run {run}: {}", archive.history);
        let first_429 = steps
            .iter()
            .position(|s| s.status == 429)
            .expect("run_demo fails without a 429")
            + 1;
        assert!(
            steps[..first_429 - 1].iter().all(|s| s.status == 200),
            "run {run}: {steps:?}"
        );
        // The allowance is 5; a window boundary crossed inside the run's few milliseconds
        // can grant at most one window's allowance more.
        assert!(
            (LIMIT_1S as usize + 1..=2 * LIMIT_1S as usize + 1).contains(&first_429),
            "run {run}: first 429 at request {first_429}: {steps:?}"
        );
        let limited = &steps[first_429 - 1];
        assert_eq!(limited.retry_after.as_deref(), Some("0"), "run {run}");
        let reset_ms: u64 = limited.reset_ms.as_deref().unwrap().parse().unwrap();
        assert!((1..=1_000).contains(&reset_ms), "run {run}: {reset_ms}");
        let body = limited.body.as_deref().unwrap();
        assert!(body.contains("\"window\":\"1s\""), "run {run}: {body}");
        assert_eq!(steps.last().unwrap().status, 200, "run {run}");
        let cid = limited.correlation_id.as_deref().unwrap();
        assert!(
            archive.history.contains(cid),
            "run {run}: {}",
            archive.history
        );
        assert!(archive.history.contains("exhausted"), "{}", archive.history);
    }
}
