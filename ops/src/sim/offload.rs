//! Work a run hands to a second thread: consumers that only take in what the run tells
//! them, in the run's order, and answer once at the end (the codec check, the oracle's
//! books). Batched, so a handoff costs a push, and bounded: past `batches_queued` full
//! batches the run waits for the worker.

use std::sync::mpsc::{IntoIter, SyncSender, sync_channel};
use std::thread::JoinHandle;

pub struct Offload<T: Send + 'static, R: Send + 'static> {
    batch: Vec<T>,
    batch_len: usize,
    tx: SyncSender<Vec<T>>,
    worker: JoinHandle<R>,
}

impl<T: Send + 'static, R: Send + 'static> Offload<T, R> {
    /// `work` gets every batch in order and returns the answer `finish` hands back.
    pub fn start(
        name: &str,
        batch_len: usize,
        batches_queued: usize,
        work: impl FnOnce(IntoIter<Vec<T>>) -> R + Send + 'static,
    ) -> Self {
        assert!(batch_len > 0 && batches_queued > 0);
        let (tx, rx) = sync_channel::<Vec<T>>(batches_queued);
        let worker = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || work(rx.into_iter()))
            .expect("spawn a simulator worker thread");
        Self {
            batch: Vec::with_capacity(batch_len),
            batch_len,
            tx,
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
        let batch = std::mem::replace(&mut self.batch, Vec::with_capacity(self.batch_len));
        // A send fails only once the worker is gone (it panicked): `finish` reports that.
        let _ = self.tx.send(batch);
    }

    /// Everything pushed taken in: the worker's answer, or its panic.
    pub fn finish(mut self) -> std::thread::Result<R> {
        self.flush();
        let Self { tx, worker, .. } = self;
        drop(tx);
        worker.join()
    }
}
