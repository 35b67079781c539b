//! The boundary every C entry point crosses: no panic unwinds into C, every error becomes a
//! `nerva_status` code, calls on one client serialize (a sleeping wait excepted), and close
//! waits for the calls inside.

use core::ffi::c_int;
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::os::fd::{AsFd, BorrowedFd};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;

use nerva_rings::EventFd;

use super::status::nerva_status;

/// Result of the safe body of an entry point.
pub(crate) type FfiResult = Result<(), nerva_status>;

/// Run the body of an entry point that takes no client: panics become `NERVA_E_INTERNAL`.
pub(crate) fn guard(body: impl FnOnce() -> FfiResult) -> c_int {
    // AssertUnwindSafe: the body only touches state it creates, or state it reaches through a
    // `Shared` (which poisons itself on a panic), so nothing half-updated is observed later.
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => nerva_status::NERVA_OK.code(),
        Ok(Err(status)) => status.code(),
        Err(_) => nerva_status::NERVA_E_INTERNAL.code(),
    }
}

/// State that C holds through an opaque pointer and may use from several threads at once.
///
/// Calls serialize on a mutex held only for the short, non-blocking part of a call (submit,
/// poll, cancel, the bookkeeping of a wait); a waiter sleeps *outside* it
/// ([`Shared::enter_unlocked`]), so a submitter never waits behind a sleeping reaper. Every
/// call counts itself in `users`, so `close` can wake the sleepers and wait until the last
/// call has left before it frees the state ([`Shared::close`]).
pub(crate) struct Shared<T> {
    state: Mutex<T>,
    /// Set once a call panicked: the state may be half-updated and is never used again.
    poisoned: AtomicBool,
    /// Calls inside the library on this handle right now.
    users: AtomicUsize,
    /// Set by `close`: calls that find it return `NERVA_E_CLOSED`.
    closing: AtomicBool,
    /// Written by `close` to wake calls sleeping outside the lock.
    close_bell: EventFd,
}

impl<T> Shared<T> {
    /// Wrap freshly created state.
    pub(crate) fn new(state: T) -> std::io::Result<Self> {
        Ok(Shared {
            state: Mutex::new(state),
            poisoned: AtomicBool::new(false),
            users: AtomicUsize::new(0),
            closing: AtomicBool::new(false),
            close_bell: EventFd::new()?,
        })
    }

    /// Count a call in for its whole duration (see `close`).
    fn count_in<R>(&self, body: impl FnOnce() -> R) -> R {
        // SYNC: SeqCst pairs with `close`: either close sees this call counted (and waits for
        // it), or this call sees `closing` below.
        self.users.fetch_add(1, Ordering::SeqCst);
        let out = body();
        // SYNC: Release pairs with the Acquire load in `close`: everything this call did to
        // the state happens before close frees it.
        self.users.fetch_sub(1, Ordering::Release);
        out
    }

    fn is_closing(&self) -> bool {
        self.closing.load(Ordering::SeqCst)
    }

    /// Run `body` with the lock held, turning poison, close and panics into status codes.
    pub(crate) fn enter(&self, body: impl FnOnce(&mut T) -> FfiResult) -> c_int {
        self.count_in(|| {
            if self.is_closing() {
                return nerva_status::NERVA_E_CLOSED.code();
            }
            let mut guard = match self.state.lock() {
                Ok(guard) => guard,
                Err(_) => return nerva_status::NERVA_E_INTERNAL.code(),
            };
            if self.poisoned.load(Ordering::Relaxed) {
                return nerva_status::NERVA_E_INTERNAL.code();
            }
            match catch_unwind(AssertUnwindSafe(|| body(&mut guard))) {
                Ok(Ok(())) => nerva_status::NERVA_OK.code(),
                Ok(Err(status)) => status.code(),
                Err(_) => {
                    // The state may be half-updated (a ring index advanced, an event half
                    // copied); using it again could misreport, so poison it.
                    self.poisoned.store(true, Ordering::Relaxed);
                    nerva_status::NERVA_E_INTERNAL.code()
                }
            }
        })
    }

    /// Run `body` counted in but without the lock: for a call that sleeps (it takes the lock
    /// itself through `locked` for its short steps). `body` also gets the descriptor `close`
    /// writes, to put in its poll set.
    pub(crate) fn enter_unlocked(
        &self,
        body: impl FnOnce(
            &dyn Fn(&mut dyn FnMut(&mut T) -> FfiResult) -> FfiResult,
            BorrowedFd<'_>,
        ) -> FfiResult,
    ) -> c_int {
        self.count_in(|| {
            let locked = |step: &mut dyn FnMut(&mut T) -> FfiResult| -> FfiResult {
                if self.is_closing() {
                    return Err(nerva_status::NERVA_E_CLOSED);
                }
                let mut guard = self
                    .state
                    .lock()
                    .map_err(|_| nerva_status::NERVA_E_INTERNAL)?;
                if self.poisoned.load(Ordering::Relaxed) {
                    return Err(nerva_status::NERVA_E_INTERNAL);
                }
                match catch_unwind(AssertUnwindSafe(|| step(&mut guard))) {
                    Ok(result) => result,
                    Err(_) => {
                        self.poisoned.store(true, Ordering::Relaxed);
                        Err(nerva_status::NERVA_E_INTERNAL)
                    }
                }
            };
            match catch_unwind(AssertUnwindSafe(|| body(&locked, self.close_bell.as_fd()))) {
                Ok(Ok(())) => nerva_status::NERVA_OK.code(),
                Ok(Err(status)) => status.code(),
                Err(_) => nerva_status::NERVA_E_INTERNAL.code(),
            }
        })
    }

    /// Close, in place (the other threads' calls hold references to *this* memory, so it
    /// must not move before they left): refuse new entries, wake sleepers, and wait until
    /// every call inside has returned (they return promptly: only waits sleep, and the bell
    /// wakes them). Afterwards the owner may drop the handle.
    pub(crate) fn close_and_wait(&self) {
        // SYNC: SeqCst pairs with `count_in` (see there).
        self.closing.store(true, Ordering::SeqCst);
        let _ = self.close_bell.signal();
        // SYNC: Acquire pairs with the Release decrement in `count_in`.
        while self.users.load(Ordering::Acquire) != 0 {
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
    }

    /// The state, after `close_and_wait` (or when no other thread can hold a reference).
    pub(crate) fn into_inner(self) -> Option<T> {
        self.state.into_inner().ok()
    }
}

/// Turn a C pointer argument into a reference, or `NERVA_E_INVALID_ARGUMENT` when it is NULL.
///
/// # Safety
/// A non-NULL `ptr` must be valid for reads of one `T`, properly aligned, and the `T` must not
/// be written by anyone else for the lifetime `'a` chosen by the caller.
pub(crate) unsafe fn arg_ref<'a, T>(ptr: *const T) -> Result<&'a T, nerva_status> {
    // SAFETY: the caller guarantees a non-NULL pointer is valid and aligned for `'a`.
    unsafe { ptr.as_ref() }.ok_or(nerva_status::NERVA_E_INVALID_ARGUMENT)
}

/// Turn a C (pointer, length) pair into a slice. A NULL pointer is accepted only with length 0.
///
/// # Safety
/// A non-NULL `ptr` must be valid for reads of `len` consecutive `T`, properly aligned, and not
/// written by anyone else for the lifetime `'a` chosen by the caller.
pub(crate) unsafe fn arg_slice<'a, T>(ptr: *const T, len: usize) -> Result<&'a [T], nerva_status> {
    if ptr.is_null() {
        return if len == 0 {
            Ok(&[])
        } else {
            Err(nerva_status::NERVA_E_INVALID_ARGUMENT)
        };
    }
    if !ptr.is_aligned()
        || len
            .checked_mul(size_of::<T>())
            .is_none_or(|bytes| bytes > isize::MAX as usize)
    {
        return Err(nerva_status::NERVA_E_INVALID_ARGUMENT);
    }
    // SAFETY: non-NULL, aligned and not larger than isize::MAX bytes (checked above); validity
    // for `len` reads and the absence of writers are the caller's obligations.
    Ok(unsafe { core::slice::from_raw_parts(ptr, len) })
}

/// A writable out-parameter, or `NERVA_E_INVALID_ARGUMENT` when it is NULL.
///
/// # Safety
/// A non-NULL `ptr` must be valid for writes of one `T` and properly aligned for `'a`.
pub(crate) unsafe fn arg_out<'a, T>(ptr: *mut T) -> Result<&'a mut T, nerva_status> {
    if !ptr.is_aligned() {
        return Err(nerva_status::NERVA_E_INVALID_ARGUMENT);
    }
    // SAFETY: the caller guarantees a non-NULL pointer is valid for writes and aligned.
    unsafe { ptr.as_mut() }.ok_or(nerva_status::NERVA_E_INVALID_ARGUMENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panics_become_internal_and_poison_the_state() {
        let cell = Shared::new(0u32).expect("eventfd");
        assert_eq!(
            cell.enter(|n| {
                *n += 1;
                Ok(())
            }),
            0
        );
        assert_eq!(
            cell.enter(|_| Err(nerva_status::NERVA_E_TIMEOUT)),
            nerva_status::NERVA_E_TIMEOUT.code()
        );
        assert_eq!(
            cell.enter(|_| panic!("bug")),
            nerva_status::NERVA_E_INTERNAL.code()
        );
        assert_eq!(
            cell.enter(|_| Ok(())),
            nerva_status::NERVA_E_INTERNAL.code()
        );
        cell.close_and_wait();
        assert_eq!(cell.into_inner(), Some(1));
        assert_eq!(
            guard(|| panic!("bug")),
            nerva_status::NERVA_E_INTERNAL.code()
        );
    }

    #[test]
    fn close_wakes_a_sleeper_and_waits_for_it() {
        use std::sync::Arc;
        use std::sync::atomic::AtomicBool;
        let cell: &'static Shared<u32> = Box::leak(Box::new(Shared::new(7u32).expect("eventfd")));
        let returned = Arc::new(AtomicBool::new(false));
        let asleep = Arc::new(AtomicBool::new(false));
        let flag = returned.clone();
        let sleeping = asleep.clone();
        let sleeper = std::thread::spawn(move || {
            let code = cell.enter_unlocked(|locked, bell| {
                locked(&mut |n: &mut u32| {
                    *n += 1;
                    Ok(())
                })?;
                // Sleep on the close bell as a wait sleeps on the client's descriptor.
                let mut fds = [nix::poll::PollFd::new(bell, nix::poll::PollFlags::POLLIN)];
                sleeping.store(true, Ordering::SeqCst);
                let _ = nix::poll::poll(&mut fds, nix::poll::PollTimeout::NONE);
                flag.store(true, Ordering::SeqCst);
                locked(&mut |_| Ok(()))
            });
            assert_eq!(code, nerva_status::NERVA_E_CLOSED.code());
        });
        while !asleep.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        cell.close_and_wait();
        // SAFETY: `cell` was leaked from a Box above; the only other user has left (waited
        // for above), so it is reclaimed exactly once, here.
        let boxed = unsafe { Box::from_raw(core::ptr::from_ref(cell).cast_mut()) };
        assert_eq!(boxed.into_inner(), Some(8));
        assert!(
            returned.load(Ordering::SeqCst),
            "close returned before the sleeper left"
        );
        sleeper.join().expect("sleeper");
    }

    #[test]
    fn null_and_misaligned_arguments_are_refused() {
        // SAFETY: NULL pointers and a misaligned pointer are rejected before any read.
        unsafe {
            assert!(arg_ref::<u32>(core::ptr::null()).is_err());
            assert!(arg_out::<u32>(core::ptr::null_mut()).is_err());
            assert_eq!(arg_slice::<u32>(core::ptr::null(), 0), Ok(&[][..]));
            assert!(arg_slice::<u32>(core::ptr::null(), 1).is_err());
            let words = [0u32; 2];
            let odd = (words.as_ptr() as *const u8).wrapping_add(1) as *const u32;
            assert!(arg_slice(odd, 1).is_err());
            assert!(arg_slice(words.as_ptr(), usize::MAX / 2).is_err());
        }
    }
}
