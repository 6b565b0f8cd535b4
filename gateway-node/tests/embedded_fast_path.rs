//! D5 in the embedded runtime: a fast path has the same hard 1 ms deadline as over NATS.
//! While the books (node limiter and owners, one mutex) are held past it, a key short of
//! credit gets a 429 for the missed deadline, counted in `fast_path_deadline_missed`,
//! within a small bound rather than after a round; with the books free it is admitted.
//!
//! Timing bounds are "well under a round" (15 ms against 25 ms rounds, 1 s rounds where
//! a round must not end inside the test), not the deadline's microseconds: this machine
//! is shared and noisy. How late the deadline fires is `benches/deadline.rs`'s question.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bus_schemas::{KeyId, LimitReason, NodeEpoch, NodeId, WindowSpec};
use gateway_node::embedded::EmbeddedBus;
use gateway_node::http::node::system_clock;
use gateway_node::{Decision, DecisionSurface, KeyPolicy, NodeConfig, NodeLimiter, SurfaceConfig};
use tokio::sync::watch;

/// Well under one round (25 ms), yet far above the 1 ms deadline.
const WELL_UNDER_A_ROUND: Duration = Duration::from_millis(15);

/// A one-node, one-shard embedded bus on the system clock with `round_ms` rounds; the
/// stop sender keeps it running. No standing options: a fresh key's first request is a
/// fast path, rather than spending the node's unasked share of the window first.
fn started(round_ms: u32) -> (Arc<EmbeddedBus>, watch::Sender<bool>) {
    let surface = Arc::new(DecisionSurface::new(SurfaceConfig::default()));
    let config = NodeConfig {
        fleet_size: 1,
        shards: 1,
        round_ms,
        standing_permille: 0,
        ..NodeConfig::reference(NodeId(0))
    };
    let clock = system_clock();
    let node = NodeLimiter::new(config, surface, NodeEpoch(1), clock());
    let (stop_tx, stop) = watch::channel(false);
    (Arc::new(EmbeddedBus::start(node, clock, stop)), stop_tx)
}

fn key(tag: u64) -> KeyId {
    KeyId {
        version: 1,
        digest: u128::from(tag) << 64 | 1,
    }
}

/// One window of `limit` in `length_ms`, at `round_ms` rounds.
fn one_window(length_ms: u32, limit: u64, round_ms: u32) -> KeyPolicy {
    KeyPolicy::new(&[WindowSpec { length_ms, limit }], round_ms).unwrap()
}

/// The test hook: holds the books for `hold` on a blocking thread, as a round's long
/// pass (or a stalled owner) would; returns once they are held.
fn hold_books(bus: &Arc<EmbeddedBus>, hold: Duration) -> tokio::task::JoinHandle<()> {
    let held = Arc::clone(bus);
    let (locked_tx, locked_rx) = std::sync::mpsc::channel();
    let holder = tokio::task::spawn_blocking(move || {
        held.with_limiter(|_| {
            locked_tx.send(()).unwrap();
            std::thread::sleep(hold);
        })
    });
    locked_rx.recv().unwrap();
    holder
}

fn is_deadline_miss(d: &Decision) -> bool {
    matches!(d, Decision::Deny(d) if d.reason == LimitReason::FastPathDeadline)
}

/// With the books free, a fresh key (no credit held) takes the fast path and the owner in
/// this process grants it: admitted, no miss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedded_fast_path_with_the_books_free_is_admitted() {
    // Second-long rounds: no grant from a round reaches the key within the test, so only
    // its fast path can admit it.
    let (bus, _stop) = started(1_000);
    let policy = one_window(60_000, 1_000, 1_000);
    // Past the start's first round.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let clock = system_clock();
    let k = key(0xa11c);
    let sent = |bus: &EmbeddedBus| bus.with_limiter(|l| l.stats().fast_path_sent);
    let sent_before = sent(&bus);
    assert_eq!(bus.decide_at(k, &policy, clock()).await, Decision::Admit);
    assert_eq!(sent(&bus), sent_before + 1, "admitted by a fast path");
    assert_eq!(bus.fast_path_deadline_missed(), 0);
    // The grant was more than the one request: the next ones spend it locally.
    for _ in 0..5 {
        assert_eq!(bus.decide_at(k, &policy, clock()).await, Decision::Admit);
    }
    assert_eq!(sent(&bus), sent_before + 1, "one fast path");
    assert_eq!(bus.fast_path_deadline_missed(), 0);
}

/// Books held for 300 ms (a round's stand-in, twelve 25 ms rounds long): the fast path
/// is a deadline-miss 429 after its 1 ms, well under a round and far under the hold, and
/// counted once. Once they are free, the next round's fast path (D5: one a round) admits.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_embedded_fast_path_misses_its_1ms_deadline_while_the_books_are_held() {
    let (bus, _stop) = started(25);
    let policy = one_window(1_000, 100, 25);
    let clock = system_clock();
    let k = key(0xdead);
    let holder = hold_books(&bus, Duration::from_millis(300));
    let asked = Instant::now();
    let decision = bus.decide_at(k, &policy, clock()).await;
    let took = asked.elapsed();
    assert!(
        is_deadline_miss(&decision),
        "{decision:?} after {took:?}, missed {}",
        bus.fast_path_deadline_missed()
    );
    assert!(
        took >= Duration::from_millis(1),
        "missed early, after {took:?}"
    );
    assert!(took < WELL_UNDER_A_ROUND, "answered after {took:?}");
    assert_eq!(bus.fast_path_deadline_missed(), 1);
    assert!(!bus.surface().fast_path_pending(k), "the claim was settled");
    holder.await.unwrap();
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert_eq!(bus.decide_at(k, &policy, clock()).await, Decision::Admit);
    assert_eq!(bus.fast_path_deadline_missed(), 1);
}

/// Requests for one key while its fast path waits on held books: one asks, the rest join
/// it (or, if it settled first, find the round's fast path spent); every one is denied
/// well under a round, none admitted for free, and only the ask counts as a miss.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_joining_a_fast_path_on_held_books_are_denied_within_the_deadline() {
    let (bus, _stop) = started(1_000);
    let policy = one_window(60_000, 1_000, 1_000);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let k = key(0x501);
    let holder = hold_books(&bus, Duration::from_millis(300));
    let asked = Instant::now();
    let requests: Vec<_> = (0..4)
        .map(|_| {
            let (bus, policy) = (Arc::clone(&bus), policy);
            tokio::spawn(async move {
                let d = bus.decide_at(k, &policy, system_clock()()).await;
                (d, Instant::now())
            })
        })
        .collect();
    for r in requests {
        let (decision, at) = r.await.unwrap();
        let took = at.duration_since(asked);
        assert!(
            matches!(decision, Decision::Deny(_)),
            "{decision:?} after {took:?}"
        );
        assert!(took < WELL_UNDER_A_ROUND, "answered after {took:?}");
    }
    // One ask; two only if D5's 1 s round turned over between the requests.
    let missed = bus.fast_path_deadline_missed();
    assert!((1..=2).contains(&missed), "{missed} misses");
    holder.await.unwrap();
}
