//! Raw futex wait/wake on an `AtomicU32` (shared between processes when `private` is false).

use std::sync::atomic::AtomicU32;

/// Blocks while `*word == expected` (returns at once otherwise, or on a spurious wake-up:
/// callers re-check in a loop). `private` may be true only if all waiters share one process.
pub fn wait(word: &AtomicU32, expected: u32, private: bool) {
    let op = if private {
        libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG
    } else {
        libc::FUTEX_WAIT
    };
    // SAFETY: `word` is a live, aligned u32 for the call; a null timeout means wait forever;
    // the kernel only reads the word. EAGAIN/EINTR are expected outcomes handled by the caller's
    // re-check loop.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            op,
            expected,
            std::ptr::null::<libc::timespec>(),
        );
    }
}

/// Wakes up to `count` waiters blocked on `word`.
pub fn wake(word: &AtomicU32, count: i32, private: bool) {
    let op = if private {
        libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG
    } else {
        libc::FUTEX_WAKE
    };
    // SAFETY: `word` is a live, aligned u32; FUTEX_WAKE does not touch memory.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), op, count);
    }
}
