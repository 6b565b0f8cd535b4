//! Sub-millisecond deadlines for the fast path (D5: a hard 1 ms deadline).
//!
//! tokio's timer wheel ticks in whole milliseconds and rounds a deadline *up* to the next
//! tick, so `timeout_at(now + 1 ms)` fires 1 to 2 ms later before any scheduling delay:
//! `bench fleet` measured fast-path p99 2.5-2.8 ms at 20 nodes (BENCHMARKS.md). Here one
//! process-wide thread sleeps on a condition variable until the earliest pending deadline
//! (the kernel's high-resolution timers, tens of microseconds of slack) and wakes the
//! tasks whose deadline has passed. Only requests that took the fast path use it (0.4% of
//! decisions at the reference load); the decision itself never does.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

/// Deadlines pending at once. At most one fast path per key per round is in flight, plus
/// its joiners; past this many a deadline falls back to tokio's coarser timer rather than
/// growing the heap without bound.
const PENDING_MAX: usize = 1 << 16;

/// What a pending deadline wakes: the latest waker of the future that waits on it.
type Slot = Arc<Mutex<Option<Waker>>>;

/// Pending deadlines in the order they fall due; the sequence number keeps two that fall
/// at the same instant apart.
#[derive(Default)]
struct Heap {
    pending: BTreeMap<(Instant, u64), Slot>,
    seq: u64,
}

struct Timer {
    heap: Mutex<Heap>,
    changed: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding these locks leaves nothing half-done: the heap and a slot
    // are each one push or one take.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn timer() -> &'static Timer {
    static TIMER: OnceLock<&'static Timer> = OnceLock::new();
    TIMER.get_or_init(|| {
        let timer: &'static Timer = Box::leak(Box::new(Timer {
            heap: Mutex::new(Heap::default()),
            changed: Condvar::new(),
        }));
        std::thread::Builder::new()
            .name("foldgate-deadline".into())
            .spawn(move || timer.run())
            .expect("spawn the deadline thread");
        timer
    })
}

impl Timer {
    fn run(&self) -> ! {
        let mut due: Vec<Slot> = Vec::new();
        let mut heap = lock(&self.heap);
        loop {
            let now = Instant::now();
            while let Some(entry) = heap.pending.first_entry()
                && entry.key().0 <= now
            {
                due.push(entry.remove());
            }
            let next = heap.pending.first_key_value().map(|(&(at, _), _)| at);
            if !due.is_empty() {
                // Wake outside the heap's lock: a waker may run code of its own.
                drop(heap);
                for slot in due.drain(..) {
                    if let Some(w) = lock(&slot).take() {
                        w.wake();
                    }
                }
                heap = lock(&self.heap);
                continue;
            }
            heap = match next {
                Some(at) => {
                    self.changed
                        .wait_timeout(heap, at.saturating_duration_since(now))
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
                None => self
                    .changed
                    .wait(heap)
                    .unwrap_or_else(PoisonError::into_inner),
            };
        }
    }

    /// Queues `slot` to be woken at `at`; false if the heap is full.
    fn register(&self, at: Instant, slot: Slot) -> bool {
        let mut heap = lock(&self.heap);
        if heap.pending.len() >= PENDING_MAX {
            return false;
        }
        let earliest = heap
            .pending
            .first_key_value()
            .is_none_or(|(&(first, _), _)| at < first);
        heap.seq += 1;
        let seq = heap.seq;
        heap.pending.insert((at, seq), slot);
        drop(heap);
        if earliest {
            self.changed.notify_one();
        }
        true
    }
}

/// Completes at `at`, to within the kernel's timer slack (not tokio's millisecond).
pub struct Deadline {
    at: Instant,
    slot: Option<Slot>,
    fallback: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Future for Deadline {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if Instant::now() >= self.at {
            return Poll::Ready(());
        }
        if let Some(sleep) = self.fallback.as_mut() {
            return sleep.as_mut().poll(cx);
        }
        match &self.slot {
            Some(slot) => match lock(slot).as_mut() {
                Some(w) => w.clone_from(cx.waker()),
                // The timer takes the waker only once its clock has passed `at`: a race
                // with the check above, and the deadline is over.
                None => return Poll::Ready(()),
            },
            None => self.register(cx),
        }
        Poll::Pending
    }
}

impl Deadline {
    pub fn at(at: Instant) -> Self {
        Self {
            at,
            slot: None,
            fallback: None,
        }
    }

    fn register(&mut self, cx: &mut Context<'_>) {
        let slot: Slot = Arc::new(Mutex::new(Some(cx.waker().clone())));
        if timer().register(self.at, Arc::clone(&slot)) {
            self.slot = Some(slot);
        } else {
            let mut sleep = Box::pin(tokio::time::sleep_until(self.at.into()));
            // Registers the waker with tokio's timer; it cannot be ready, `at` is ahead.
            let _ = sleep.as_mut().poll(cx);
            self.fallback = Some(sleep);
        }
    }
}

/// An answer that beat the deadline leaves its heap entry to lapse on its own (within the
/// deadline); emptying the slot keeps that from waking a task that has moved on.
impl Drop for Deadline {
    fn drop(&mut self) {
        if let Some(slot) = &self.slot {
            lock(slot).take();
        }
    }
}

/// `fut`'s output, or None if `at` passes first. An answer ready at the same poll as the
/// deadline wins: it is in hand, and throwing it away would only turn it into a 429.
pub async fn within<F: Future>(at: Instant, fut: F) -> Option<F::Output> {
    tokio::select! {
        biased;
        out = fut => Some(out),
        () = Deadline::at(at) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Never early, and none lost: a thousand deadlines spread over 2 ms all complete, each
    /// at or after its instant. (How late is a benchmark's question: `bench fleet`.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn deadlines_complete_never_early_and_none_is_lost() {
        let start = Instant::now();
        let tasks: Vec<_> = (0..1_000u64)
            .map(|i| {
                let at = start + Duration::from_micros(200 + (i * 7_919) % 2_000);
                tokio::spawn(async move {
                    Deadline::at(at).await;
                    Instant::now() >= at
                })
            })
            .collect();
        for t in tasks {
            let on_time = tokio::time::timeout(Duration::from_secs(10), t)
                .await
                .expect("a deadline never completed");
            assert!(on_time.unwrap(), "a deadline completed early");
        }
    }

    #[tokio::test]
    async fn an_answer_in_time_wins_and_a_late_one_is_dropped() {
        let soon = Instant::now() + Duration::from_millis(50);
        assert_eq!(within(soon, async { 7 }).await, Some(7));
        let past = Instant::now();
        let never = std::future::pending::<u32>();
        assert_eq!(within(past, never).await, None);
        let at = Instant::now() + Duration::from_micros(300);
        let late = tokio::time::sleep(Duration::from_millis(20));
        assert_eq!(within(at, late).await, None);
        assert!(Instant::now() >= at);
    }
}
