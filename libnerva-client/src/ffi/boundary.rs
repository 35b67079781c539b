//! The boundary every C entry point crosses: no panic unwinds into C, every error becomes a
//! `nerva_status` code, and a client is entered by one thread at a time.

use core::cell::UnsafeCell;
use core::ffi::c_int;
use core::sync::atomic::{AtomicBool, Ordering};
use std::panic::{AssertUnwindSafe, catch_unwind};

use super::status::nerva_status;

/// Result of the safe body of an entry point.
pub(crate) type FfiResult = Result<(), nerva_status>;

/// Run the body of an entry point that takes no client: panics become `NERVA_E_INTERNAL`.
pub(crate) fn guard(body: impl FnOnce() -> FfiResult) -> c_int {
    // AssertUnwindSafe: the body only touches state it creates, or state it reaches through a
    // `Exclusive` (which poisons itself on a panic), so nothing half-updated is observed later.
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => nerva_status::NERVA_OK.code(),
        Ok(Err(status)) => status.code(),
        Err(_) => nerva_status::NERVA_E_INTERNAL.code(),
    }
}

/// State that C holds through an opaque pointer and may hand to any thread, one call at a time.
///
/// C cannot be trusted to serialize calls, and two overlapping calls would be two `&mut` to the
/// same state (undefined behaviour). The `entered` flag turns that misuse into
/// `NERVA_E_CLIENT_IN_USE` for the second caller at the cost of one uncontended atomic swap.
pub(crate) struct Exclusive<T> {
    /// Set while one call is inside `enter`.
    entered: AtomicBool,
    /// Set once a call panicked: the state may be half-updated and is never used again.
    poisoned: AtomicBool,
    state: UnsafeCell<T>,
}

// SAFETY: `state` is only reached through `enter`, which hands out `&mut T` to at most one
// thread at a time (the `entered` flag), so sharing `&Exclusive<T>` between threads is sound when
// `T` itself may move between threads.
unsafe impl<T: Send> Sync for Exclusive<T> {}

impl<T> Exclusive<T> {
    /// Wrap freshly created state.
    pub(crate) fn new(state: T) -> Self {
        Exclusive {
            entered: AtomicBool::new(false),
            poisoned: AtomicBool::new(false),
            state: UnsafeCell::new(state),
        }
    }

    /// Run `body` with exclusive access to the state, turning overlap, poison and panics into
    /// status codes.
    pub(crate) fn enter(&self, body: impl FnOnce(&mut T) -> FfiResult) -> c_int {
        // SYNC: Acquire pairs with the Release store at the end of the previous `enter` (maybe
        // on another thread), so this call sees every write that call made to `state`.
        if self
            .entered
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return nerva_status::NERVA_E_CLIENT_IN_USE.code();
        }
        let code = if self.poisoned.load(Ordering::Relaxed) {
            nerva_status::NERVA_E_INTERNAL.code()
        } else {
            // SAFETY: the compare_exchange above made this thread the only one inside `enter`
            // until the Release store below, so this is the only reference to `state`.
            let state = unsafe { &mut *self.state.get() };
            match catch_unwind(AssertUnwindSafe(|| body(state))) {
                Ok(Ok(())) => nerva_status::NERVA_OK.code(),
                Ok(Err(status)) => status.code(),
                Err(_) => {
                    // The state may be half-updated (a ring index advanced, an event half
                    // copied); using it again could misreport, so poison it.
                    self.poisoned.store(true, Ordering::Relaxed);
                    nerva_status::NERVA_E_INTERNAL.code()
                }
            }
        };
        // SYNC: Release pairs with the Acquire compare_exchange of the next `enter`.
        self.entered.store(false, Ordering::Release);
        code
    }

    /// Whether a call is inside `enter` right now (a racy snapshot, for `close` diagnostics).
    pub(crate) fn is_entered(&self) -> bool {
        self.entered.load(Ordering::Acquire)
    }

    /// Take the state back, e.g. to close it.
    pub(crate) fn into_inner(self) -> T {
        self.state.into_inner()
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
        let cell = Exclusive::new(0u32);
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
        assert!(!cell.is_entered());
        assert_eq!(cell.into_inner(), 1);
        assert_eq!(
            guard(|| panic!("bug")),
            nerva_status::NERVA_E_INTERNAL.code()
        );
    }

    #[test]
    fn overlapping_calls_are_refused() {
        let cell = Exclusive::new(());
        let inner = cell.enter(|_| {
            assert_eq!(
                cell.enter(|_| Ok(())),
                nerva_status::NERVA_E_CLIENT_IN_USE.code()
            );
            Ok(())
        });
        assert_eq!(inner, 0);
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
