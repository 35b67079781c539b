//! A persistent worker pool for the CPU backend's data-parallel loops.
//!
//! A decode step dispatches a few hundred short parallel loops (several per layer), so a
//! dispatch must cost microseconds and allocate nothing: the job is a borrowed closure published
//! through a state word, workers spin briefly between jobs and only then park on a condvar.
//!
//! The caller works on the job too. A worker *joins* a job (counted in the state word) before it
//! touches the closure; once every task has finished, the caller closes the job so nobody else
//! can join, and waits only for the workers that joined. A worker that was descheduled and never
//! joined does not hold the step up (this matters on an oversubscribed machine), and no worker
//! can reach the closure after `run` returns, which is what makes lending its borrow sound.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// A job: called once per task index with the id of the thread running it
/// (`0..threads`, 0 is the caller).
type Job<'a> = dyn Fn(usize, usize) + Sync + 'a;

/// Spins before a worker parks; a decode step's next dispatch usually comes far sooner.
const SPIN_ROUNDS: u32 = 1 << 14;

/// State word: `epoch << 32 | OPEN | joined workers`.
const OPEN: u64 = 1 << 31;
const JOINED_MASK: u64 = OPEN - 1;

fn epoch_of(state: u64) -> u32 {
    (state >> 32) as u32
}

struct Shared {
    /// Epoch of the current job, whether it is open for joining, and how many workers joined.
    state: AtomicU64,
    /// The current job. Written by the caller only while the job is closed and nobody is
    /// joined; read by workers only after joining (a successful SeqCst CAS on `state`, which
    /// the write happens-before through the SeqCst store that opened the job).
    job: UnsafeCell<Option<(*const Job<'static>, usize)>>,
    /// Next task index to take.
    next_task: AtomicUsize,
    /// Tasks completed.
    finished: AtomicUsize,
    /// Workers parked (or about to park) on `wake`.
    sleepers: AtomicUsize,
    shutdown: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is the only non-Sync field; the state-word protocol above keeps its writes and
// reads apart (see the field's comment). The pointee is `Sync`.
unsafe impl Sync for Shared {}
// SAFETY: as above; the raw pointer is only dereferenced under that protocol.
unsafe impl Send for Shared {}

/// A fixed set of worker threads that run data-parallel loops.
pub struct WorkerPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for WorkerPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerPool")
            .field("threads", &self.threads())
            .finish()
    }
}

impl WorkerPool {
    /// A pool running jobs on `threads` threads in all (the caller plus `threads - 1` workers).
    pub fn new(threads: usize) -> std::io::Result<Self> {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            state: AtomicU64::new(0),
            job: UnsafeCell::new(None),
            next_task: AtomicUsize::new(0),
            finished: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        // Built up in place so that a failed spawn drops (and so shuts down) the workers
        // already started.
        let mut pool = WorkerPool {
            shared,
            workers: Vec::with_capacity(threads - 1),
        };
        let (ready_tx, ready) = std::sync::mpsc::channel();
        for id in 1..threads {
            let shared = Arc::clone(&pool.shared);
            let ready_tx = ready_tx.clone();
            pool.workers.push(
                std::thread::Builder::new()
                    .name(format!("nerva-cpu-{id}"))
                    .spawn(move || {
                        // The runtime's per-thread set-up (which allocates) is done by now.
                        let _ = ready_tx.send(());
                        drop(ready_tx);
                        worker_loop(&shared, id)
                    })?,
            );
        }
        drop(ready_tx);
        // Return only once every worker runs: the pool is then ready to serve, and a step
        // that follows construction never races a thread's start-up (or its allocations).
        for _ in 1..threads {
            ready
                .recv()
                .map_err(|_| std::io::Error::other("a CPU worker thread exited during start-up"))?;
        }
        Ok(pool)
    }

    /// Threads that run a job, the caller included.
    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Run `job(task, thread)` for every `task in 0..tasks`, spread over the pool; returns when
    /// all have run. Allocates nothing.
    pub fn run(&self, tasks: usize, job: &Job<'_>) {
        if tasks == 0 {
            return;
        }
        if self.workers.is_empty() || tasks == 1 {
            for t in 0..tasks {
                job(t, 0);
            }
            return;
        }
        let shared = &*self.shared;
        let state = shared.state.load(Ordering::Relaxed);
        debug_assert_eq!(state & (OPEN | JOINED_MASK), 0, "previous job not closed");
        // SAFETY: the lifetime is erased only for the duration of this call: workers reach the
        // pointer only after joining, joining is impossible after we close the job below, and
        // we return only once every joined worker left. Nobody is joined now (the previous
        // `run` waited for that), so this write does not race.
        unsafe {
            let erased: *const Job<'static> = std::mem::transmute::<*const Job<'_>, _>(job);
            *shared.job.get() = Some((erased, tasks));
        }
        shared.next_task.store(0, Ordering::Relaxed);
        shared.finished.store(0, Ordering::Relaxed);
        let next_epoch = u64::from(epoch_of(state).wrapping_add(1));
        // SYNC POINT: SeqCst publishes job/next_task/finished to workers (their joining CAS)
        // and orders against the `sleepers` load below (Dekker pair with park()).
        shared
            .state
            .store(next_epoch << 32 | OPEN, Ordering::SeqCst);
        if shared.sleepers.load(Ordering::SeqCst) > 0 {
            let _guard = shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            shared.wake.notify_all();
        }
        run_tasks(shared, job, tasks, 0);
        // SYNC POINT: Acquire pairs with the Release increment after each task, so every
        // task's writes are visible once all are counted.
        wait_until(|| shared.finished.load(Ordering::Acquire) >= tasks);
        // Close: no worker joins from now on.
        shared.state.fetch_and(!OPEN, Ordering::SeqCst);
        // SYNC POINT: Acquire pairs with each joined worker's Release leave.
        wait_until(|| shared.state.load(Ordering::Acquire) & JOINED_MASK == 0);
    }
}

fn wait_until(done: impl Fn() -> bool) {
    let mut spins = 0u32;
    while !done() {
        spins += 1;
        if spins < SPIN_ROUNDS {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

fn run_tasks(shared: &Shared, job: &Job<'_>, tasks: usize, thread: usize) {
    loop {
        let t = shared.next_task.fetch_add(1, Ordering::Relaxed);
        if t >= tasks {
            break;
        }
        job(t, thread);
        shared.finished.fetch_add(1, Ordering::Release);
    }
}

fn worker_loop(shared: &Shared, id: usize) {
    let mut seen = 0u32;
    let mut spins = 0u32;
    loop {
        if shared.shutdown.load(Ordering::Acquire) {
            return;
        }
        let state = shared.state.load(Ordering::Acquire);
        if epoch_of(state) == seen {
            spins += 1;
            if spins < SPIN_ROUNDS {
                std::hint::spin_loop();
            } else {
                park(shared, seen);
                spins = 0;
            }
            continue;
        }
        if state & OPEN == 0 {
            // That job closed before we got to it.
            seen = epoch_of(state);
            continue;
        }
        // Join (SeqCst CAS: acquires the caller's publication of the job).
        if shared
            .state
            .compare_exchange_weak(state, state + 1, Ordering::SeqCst, Ordering::Relaxed)
            .is_err()
        {
            continue;
        }
        seen = epoch_of(state);
        spins = 0;
        // SAFETY: we joined an open job, so the caller wrote `job` before opening it and keeps
        // the closure alive until we leave below.
        let current = unsafe { *shared.job.get() };
        if let Some((job, tasks)) = current {
            // SAFETY: see above: the pointee outlives this use.
            let job = unsafe { &*job };
            run_tasks(shared, job, tasks, id);
        }
        // Leave. SYNC POINT: Release pairs with the caller's Acquire wait for zero joined.
        shared.state.fetch_sub(1, Ordering::Release);
    }
}

fn park(shared: &Shared, seen: u32) {
    let mut guard = shared.lock.lock().unwrap_or_else(|e| e.into_inner());
    // SeqCst increment before re-checking the state: either the caller's SeqCst store is
    // visible here, or our increment is visible to its `sleepers` load and it notifies under
    // the lock (which it cannot take before we wait).
    shared.sleepers.fetch_add(1, Ordering::SeqCst);
    while epoch_of(shared.state.load(Ordering::SeqCst)) == seen
        && !shared.shutdown.load(Ordering::SeqCst)
    {
        guard = shared.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
    }
    shared.sleepers.fetch_sub(1, Ordering::SeqCst);
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _guard = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// A mutable slice shared by tasks that each write a disjoint part of it.
pub struct SharedMut<'a, T> {
    ptr: *mut T,
    len: usize,
    _borrow: std::marker::PhantomData<&'a mut [T]>,
}

// SAFETY: tasks only reach the data through `slice_mut`, whose contract requires disjoint
// ranges; `T: Send` lets the parts move between threads.
unsafe impl<T: Send> Sync for SharedMut<'_, T> {}

impl<'a, T> SharedMut<'a, T> {
    /// Borrow `data` for disjoint writes from several tasks.
    pub fn new(data: &'a mut [T]) -> Self {
        SharedMut {
            ptr: data.as_mut_ptr(),
            len: data.len(),
            _borrow: std::marker::PhantomData,
        }
    }

    /// The sub-slice `start..start + len`.
    ///
    /// # Safety
    /// No two live results of this call (on any thread) may overlap.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut(&self, start: usize, len: usize) -> &mut [T] {
        assert!(
            start <= self.len && len <= self.len - start,
            "range out of bounds"
        );
        // SAFETY: in bounds (checked above) of a slice mutably borrowed for 'a; the caller
        // guarantees no other live reference overlaps.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), len) }
    }

    /// Store `value` at `index`.
    ///
    /// # Safety
    /// No other thread may access `index` concurrently, and no live slice from `slice_mut`
    /// may cover it.
    #[inline(always)]
    pub unsafe fn write(&self, index: usize, value: T) {
        assert!(index < self.len, "index out of bounds");
        // SAFETY: in bounds (checked above); exclusive access is the caller's obligation.
        unsafe { self.ptr.add(index).write(value) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_once() {
        let pool = WorkerPool::new(4).unwrap();
        for round in 0..200 {
            let tasks = 1 + round % 37;
            let counts: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
            pool.run(tasks, &|t, thread| {
                assert!(thread < 4);
                counts[t].fetch_add(1, Ordering::Relaxed);
            });
            assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1));
        }
    }

    #[test]
    fn disjoint_writes_are_visible() {
        let pool = WorkerPool::new(3).unwrap();
        let mut data = vec![0u32; 1000];
        {
            let shared = SharedMut::new(&mut data);
            pool.run(10, &|t, _| {
                // SAFETY: task t owns 100*t .. 100*t+100 alone.
                let part = unsafe { shared.slice_mut(t * 100, 100) };
                for (i, v) in part.iter_mut().enumerate() {
                    *v = (t * 100 + i) as u32;
                }
            });
        }
        assert!(data.iter().enumerate().all(|(i, &v)| v as usize == i));
    }
}
