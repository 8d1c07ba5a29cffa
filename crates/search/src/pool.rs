//! The indexing pool: every topic index's indexer takes its steps on a few shared threads,
//! and the index writers open at once are bounded. A tantivy writer is three threads (its
//! indexing worker, its segment updater and one merge thread) and its indexing memory, so a
//! writer per index would not scale to many searchable topics; here an index holds one only
//! while it has something to write, and gives it back once its work is committed and another
//! index waits for one, or once it has been idle a while.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

/// How the pool is sized.
#[derive(Debug, Clone, Copy)]
pub struct PoolSettings {
    /// Threads that take indexing steps.
    pub threads: usize,
    /// Index writers open at once, over every partition.
    pub max_open_writers: usize,
}

type Task = Box<dyn FnOnce() + Send>;

/// A fixed set of threads running indexing steps in the order they are asked for, and the
/// writer slots.
pub struct IndexingPool {
    queue: Mutex<Queue>,
    ready: Condvar,
    workers: Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// Writer slots.
    pub writers: Arc<WriterSlots>,
}

struct Queue {
    tasks: VecDeque<Task>,
    closed: bool,
}

impl IndexingPool {
    /// Starts `settings.threads` threads; each first runs `on_start` (its priority).
    pub fn start(
        settings: PoolSettings,
        on_start: impl Fn() + Send + Sync + 'static,
    ) -> std::io::Result<Arc<Self>> {
        let pool = Arc::new(Self {
            queue: Mutex::new(Queue {
                tasks: VecDeque::new(),
                closed: false,
            }),
            ready: Condvar::new(),
            workers: Mutex::new(Vec::new()),
            writers: Arc::new(WriterSlots::new(settings.max_open_writers.max(1))),
        });
        let on_start = Arc::new(on_start);
        for i in 0..settings.threads.max(1) {
            let (pool2, on_start) = (pool.clone(), on_start.clone());
            let handle = std::thread::Builder::new()
                .name(format!("search-index-{i}"))
                .spawn(move || {
                    on_start();
                    pool2.work();
                })?;
            pool.workers.lock().push(handle);
        }
        Ok(pool)
    }

    fn work(&self) {
        loop {
            let task = {
                let mut q = self.queue.lock();
                loop {
                    if let Some(t) = q.tasks.pop_front() {
                        break t;
                    }
                    if q.closed {
                        return;
                    }
                    self.ready.wait(&mut q);
                }
            };
            task();
        }
    }

    /// Runs `f` on a pool thread after the tasks asked for before it; `None` once the pool
    /// is closed.
    pub async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        {
            let mut q = self.queue.lock();
            if q.closed {
                return None;
            }
            q.tasks.push_back(Box::new(move || {
                let _ = tx.send(f());
            }));
        }
        self.ready.notify_one();
        rx.await.ok()
    }

    /// Lets the threads finish the tasks already asked for, then waits for them to end.
    pub fn close(&self) {
        self.queue.lock().closed = true;
        self.ready.notify_all();
        let workers: Vec<_> = self.workers.lock().drain(..).collect();
        for w in workers {
            let _ = w.join();
        }
    }
}

/// The writers open at once: a slot per open writer, and how many partitions wait for one.
pub struct WriterSlots {
    open: AtomicUsize,
    max: usize,
    waiting: AtomicUsize,
    /// Woken when a slot is given back.
    pub released: tokio::sync::Notify,
}

impl WriterSlots {
    fn new(max: usize) -> Self {
        Self {
            open: AtomicUsize::new(0),
            max,
            waiting: AtomicUsize::new(0),
            released: tokio::sync::Notify::new(),
        }
    }

    /// A slot if one is free.
    pub fn try_take(self: &Arc<Self>) -> Option<WriterSlot> {
        let mut open = self.open.load(Ordering::Acquire);
        loop {
            if open >= self.max {
                return None;
            }
            match self.open.compare_exchange_weak(
                open,
                open + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    return Some(WriterSlot {
                        slots: self.clone(),
                    })
                }
                Err(now) => open = now,
            }
        }
    }

    /// Writers open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// Whether some partition waits for a slot (holders give theirs back once committed).
    pub fn contended(&self) -> bool {
        self.waiting.load(Ordering::Acquire) > 0
    }

    /// Counts the caller as waiting until the returned guard is dropped.
    pub fn wait_guard(self: &Arc<Self>) -> Waiting {
        self.waiting.fetch_add(1, Ordering::AcqRel);
        Waiting {
            slots: self.clone(),
        }
    }
}

/// One open writer's place; given back when dropped.
pub struct WriterSlot {
    slots: Arc<WriterSlots>,
}

impl Drop for WriterSlot {
    fn drop(&mut self) {
        self.slots.open.fetch_sub(1, Ordering::AcqRel);
        self.slots.released.notify_waiters();
    }
}

/// A partition counted as waiting for a writer slot.
pub struct Waiting {
    slots: Arc<WriterSlots>,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.slots.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tasks_run_on_the_pool_threads_and_a_closed_pool_runs_nothing() {
        let pool = IndexingPool::start(
            PoolSettings {
                threads: 1,
                max_open_writers: 1,
            },
            || {},
        )
        .unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        for i in 0..5 {
            let seen = seen.clone();
            let on = pool
                .run(move || {
                    seen.lock().push(i);
                    std::thread::current().name().map(str::to_string)
                })
                .await;
            assert_eq!(on.flatten().as_deref(), Some("search-index-0"));
        }
        assert_eq!(*seen.lock(), vec![0, 1, 2, 3, 4]);
        pool.close();
        assert!(
            pool.run(|| ()).await.is_none(),
            "a closed pool runs nothing"
        );
    }

    #[test]
    fn writer_slots_are_bounded_and_given_back_on_drop() {
        let slots = Arc::new(WriterSlots::new(2));
        let a = slots.try_take().expect("first");
        let b = slots.try_take().expect("second");
        assert!(slots.try_take().is_none(), "a third writer past the bound");
        assert!(!slots.contended());
        let w = slots.wait_guard();
        assert!(slots.contended());
        drop(a);
        assert_eq!(slots.open(), 1);
        let c = slots.try_take().expect("a slot given back is taken again");
        drop(w);
        assert!(!slots.contended());
        drop((b, c));
        assert_eq!(slots.open(), 0);
    }
}
