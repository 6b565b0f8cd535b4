//! Work a run hands to a second thread: consumers that only take in what the run tells
//! them, in the run's order, and answer once at the end (the codec check, the oracle's
//! books). Batched, so a handoff costs a push, and bounded: past `batches_queued` full
//! batches the run waits for the worker.
//!
//! A batch the worker is done with comes back to the run's thread, which drops its
//! items there and refills the same vector. Freed on the worker, the run's allocations
//! went back to the run's malloc arena under that arena's lock, and the two threads
//! queued on it: `perf` put a tenth of the run's samples in the kernel, in the lock's
//! futex waits and wake-ups (the speed run's 10 s cut, BENCHMARKS.md).

use std::sync::mpsc::{IntoIter, Receiver, SyncSender, TryRecvError, sync_channel};
use std::thread::JoinHandle;

pub struct Offload<T: Send + 'static, R: Send + 'static> {
    batch: Vec<T>,
    batch_len: usize,
    tx: SyncSender<Vec<T>>,
    spent: Receiver<Vec<T>>,
    worker: JoinHandle<R>,
}

/// The batches as the worker reads them, in order.
pub struct Batches<T> {
    rx: IntoIter<Vec<T>>,
    back: SyncSender<Vec<T>>,
}

impl<T> Iterator for Batches<T> {
    type Item = Spent<T>;

    fn next(&mut self) -> Option<Spent<T>> {
        let items = self.rx.next()?;
        Some(Spent {
            items,
            back: self.back.clone(),
        })
    }
}

/// One batch on the worker; dropped, it goes back to the run's thread.
pub struct Spent<T> {
    items: Vec<T>,
    back: SyncSender<Vec<T>>,
}

impl<T> std::ops::Deref for Spent<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        &self.items
    }
}

impl<T> Drop for Spent<T> {
    fn drop(&mut self) {
        // Never waits: with the way back full (the run has not pushed for a while), or the
        // run gone, the worker drops the batch itself.
        let _ = self.back.try_send(std::mem::take(&mut self.items));
    }
}

impl<T: Send + 'static, R: Send + 'static> Offload<T, R> {
    /// `work` gets every batch in order and returns the answer `finish` hands back.
    pub fn start(
        name: &str,
        batch_len: usize,
        batches_queued: usize,
        work: impl FnOnce(Batches<T>) -> R + Send + 'static,
    ) -> Self {
        assert!(batch_len > 0 && batches_queued > 0);
        let (tx, rx) = sync_channel::<Vec<T>>(batches_queued);
        // Room for every batch in flight, so a batch comes back unless the run stopped.
        let (back, spent) = sync_channel::<Vec<T>>(batches_queued + 2);
        let worker = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                work(Batches {
                    rx: rx.into_iter(),
                    back,
                })
            })
            .expect("spawn a simulator worker thread");
        Self {
            batch: Vec::with_capacity(batch_len),
            batch_len,
            tx,
            spent,
            worker,
        }
    }

    pub fn push(&mut self, item: T) {
        self.batch.push(item);
        if self.batch.len() >= self.batch_len {
            self.flush();
        }
    }

    fn flush(&mut self) {
        let next = self
            .take_spent()
            .unwrap_or_else(|| Vec::with_capacity(self.batch_len));
        // Any other spent batch is dropped here too, on this thread (see the module doc).
        while self.take_spent().is_some() {}
        let batch = std::mem::replace(&mut self.batch, next);
        // A send fails only once the worker is gone (it panicked): `finish` reports that.
        let _ = self.tx.send(batch);
    }

    /// A batch back from the worker, emptied here.
    fn take_spent(&mut self) -> Option<Vec<T>> {
        match self.spent.try_recv() {
            Ok(mut items) => {
                items.clear();
                Some(items)
            }
            Err(TryRecvError::Empty | TryRecvError::Disconnected) => None,
        }
    }

    /// Everything pushed taken in: the worker's answer, or its panic.
    pub fn finish(mut self) -> std::thread::Result<R> {
        self.flush();
        let Self { tx, worker, .. } = self;
        drop(tx);
        worker.join()
    }
}
