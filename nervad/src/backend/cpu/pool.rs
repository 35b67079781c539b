//! A persistent worker pool for the CPU backend's data-parallel loops.
//!
//! A decode step dispatches a few hundred short parallel loops (several per layer), so a
//! dispatch must cost microseconds and allocate nothing: the job is a borrowed closure published
//! through an epoch counter, workers spin briefly between jobs and only then park on a condvar.
//! The caller works on the job too and returns once every worker has acknowledged it, which is
//! what makes lending the closure's borrow to other threads sound.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// A job: called once per task index with the id of the thread running it
/// (`0..threads`, 0 is the caller).
type Job<'a> = dyn Fn(usize, usize) + Sync + 'a;

/// Spins before a worker parks; a decode step's next dispatch usually comes far sooner.
const SPIN_ROUNDS: u32 = 1 << 14;

struct Shared {
    /// Bumped once per job (SeqCst: pairs with `sleepers` in the park protocol).
    epoch: AtomicU64,
    /// The current job. Written by the caller only while no worker can read it (every worker
    /// acknowledged the previous epoch); read by workers after they observe the new epoch.
    job: UnsafeCell<Option<(*const Job<'static>, usize)>>,
    /// Next task index to take.
    next_task: AtomicUsize,
    /// Workers that finished with the current epoch.
    acks: AtomicUsize,
    /// Workers parked (or about to park) on `wake`.
    sleepers: AtomicUsize,
    shutdown: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is the only non-Sync field; it is written by the dispatching thread only between
// jobs (all workers acknowledged, so none reads it) and read by workers only after an Acquire
// load of the epoch that the write happens-before (Release/SeqCst bump). The pointee is `Sync`.
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
            epoch: AtomicU64::new(0),
            job: UnsafeCell::new(None),
            next_task: AtomicUsize::new(0),
            acks: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let mut workers = Vec::with_capacity(threads - 1);
        for id in 1..threads {
            let shared = Arc::clone(&shared);
            workers.push(
                std::thread::Builder::new()
                    .name(format!("nerva-cpu-{id}"))
                    .spawn(move || worker_loop(&shared, id))?,
            );
        }
        Ok(WorkerPool { shared, workers })
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
        // SAFETY: the lifetime is erased only for the duration of this call: we return after
        // every worker acknowledged this epoch, and a worker never touches the pointer after
        // acknowledging. No worker reads `job` now: all acknowledged the previous epoch (the
        // wait at the end of the previous `run`), so this write does not race.
        unsafe {
            let erased: *const Job<'static> = std::mem::transmute::<*const Job<'_>, _>(job);
            *shared.job.get() = Some((erased, tasks));
        }
        shared.next_task.store(0, Ordering::Relaxed);
        shared.acks.store(0, Ordering::Relaxed);
        // SYNC POINT: SeqCst publishes job/next_task/acks to workers (their Acquire epoch load)
        // and orders against the `sleepers` load below (Dekker pair with park()).
        shared.epoch.fetch_add(1, Ordering::SeqCst);
        if shared.sleepers.load(Ordering::SeqCst) > 0 {
            let _guard = shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            shared.wake.notify_all();
        }
        run_tasks(shared, job, tasks, 0);
        let want = self.workers.len();
        let mut spins = 0u32;
        // SYNC POINT: Acquire pairs with each worker's Release ack, so their task writes are
        // visible to the caller after this loop.
        while shared.acks.load(Ordering::Acquire) < want {
            spins += 1;
            if spins < SPIN_ROUNDS {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
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
    }
}

fn worker_loop(shared: &Shared, id: usize) {
    let mut seen = 0u64;
    loop {
        let mut spins = 0u32;
        let epoch = loop {
            let e = shared.epoch.load(Ordering::Acquire);
            if e != seen {
                break e;
            }
            if shared.shutdown.load(Ordering::Acquire) {
                return;
            }
            spins += 1;
            if spins < SPIN_ROUNDS {
                std::hint::spin_loop();
            } else {
                park(shared, seen);
                spins = 0;
            }
        };
        seen = epoch;
        if shared.shutdown.load(Ordering::Acquire) {
            return;
        }
        // SAFETY: the epoch load (Acquire) saw the bump that follows the caller's write of
        // `job`; the caller keeps the closure alive until we acknowledge below.
        let current = unsafe { *shared.job.get() };
        if let Some((job, tasks)) = current {
            // SAFETY: see above: the pointee outlives this use.
            let job = unsafe { &*job };
            run_tasks(shared, job, tasks, id);
        }
        // SYNC POINT: Release pairs with the caller's Acquire wait on `acks`.
        shared.acks.fetch_add(1, Ordering::Release);
    }
}

fn park(shared: &Shared, seen: u64) {
    let mut guard = shared.lock.lock().unwrap_or_else(|e| e.into_inner());
    // SeqCst increment before re-checking the epoch: either the caller's SeqCst bump is visible
    // here, or our increment is visible to its `sleepers` load and it notifies under the lock
    // (which it cannot take before we wait).
    shared.sleepers.fetch_add(1, Ordering::SeqCst);
    while shared.epoch.load(Ordering::SeqCst) == seen && !shared.shutdown.load(Ordering::SeqCst) {
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
