//! Cross-process setup: a memfd-backed `MAP_SHARED` mapping and `fork` with a closure.
//!
//! This is the same mechanism Nerva uses for a client segment (a memfd mapped by two
//! processes), minus sealing and `SCM_RIGHTS`: here the child inherits the mapping by `fork`.
//! Experiments fork *before* they start any thread, so the child is a clean single-threaded copy.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

use nerva_rings::SegmentMapping;

/// A zero-filled memfd mapping shared with every process forked after its creation.
pub struct SharedRegion {
    map: SegmentMapping,
    _fd: OwnedFd,
}

impl SharedRegion {
    /// Creates a memfd named `name` of `len` bytes and maps it read-write, shared.
    pub fn new(name: &str, len: usize) -> io::Result<Self> {
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty region"));
        }
        let cname = CString::new(name)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in name"))?;
        // SAFETY: `cname` is a valid NUL-terminated string for the duration of the call.
        let raw = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor we own; OwnedFd closes it exactly once.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let size = libc::off_t::try_from(len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "region too large"))?;
        // SAFETY: `fd` is an open memfd.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // The same shared, prefaulted mapping a client segment gets.
        let map = SegmentMapping::map_fd(fd.as_fd(), len)?;
        Ok(Self { map, _fd: fd })
    }

    /// Base address (page aligned).
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.as_ptr().as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Always false: an empty region cannot be created.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// A shared reference to a `T` at `offset`. Bounds and alignment are checked (panic on a
    /// programming error in the experiment, never on peer data).
    ///
    /// # Safety
    /// Every bit pattern, including all zeroes, must be a valid `T` (atomics, integers), and
    /// other processes may only access that memory through the same `T` (atomically where `T`
    /// is an atomic), so that the shared reference never observes a torn or invalid value.
    pub unsafe fn at<T>(&self, offset: usize) -> &T {
        let end = offset.checked_add(size_of::<T>()).expect("offset overflow");
        assert!(end <= self.len(), "object beyond the shared region");
        // SAFETY: `offset` is within the mapping (checked above), so the add stays in bounds.
        let p = unsafe { self.as_ptr().add(offset) };
        assert!(
            p.align_offset(align_of::<T>()) == 0,
            "misaligned object in shared region"
        );
        // SAFETY: in bounds and aligned (checked), valid for any bit pattern and shared
        // access (caller's obligation), and the mapping outlives `&self`.
        unsafe { &*p.cast::<T>() }
    }
}

/// A forked child process running an experiment's responder side.
pub struct Child {
    pid: libc::pid_t,
}

/// Forks; the child runs `body` and exits with its return code (101 on panic), never returning
/// into the parent's code. Call before starting threads.
pub fn fork_child<F: FnOnce() -> i32>(body: F) -> io::Result<Child> {
    // SAFETY: experiments call this while single-threaded, so the child inherits no lock held by
    // another thread; the child leaves with `_exit`, skipping the parent's atexit handlers.
    let pid = unsafe { libc::fork() };
    match pid {
        -1 => Err(io::Error::last_os_error()),
        0 => {
            let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).unwrap_or(101);
            // SAFETY: terminating the child immediately is the intent.
            unsafe { libc::_exit(code) }
        }
        pid => Ok(Child { pid }),
    }
}

impl Child {
    /// Waits for the child; returns its exit code, or an error if it died from a signal.
    pub fn wait(self) -> io::Result<i32> {
        let mut status = 0;
        loop {
            // SAFETY: `pid` is our child; `status` is a valid out-pointer.
            let rc = unsafe { libc::waitpid(self.pid, &mut status, 0) };
            if rc == self.pid {
                break;
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(err);
            }
        }
        if libc::WIFEXITED(status) {
            Ok(libc::WEXITSTATUS(status))
        } else {
            Err(io::Error::other(format!(
                "child died: wait status {status:#x}"
            )))
        }
    }
}
