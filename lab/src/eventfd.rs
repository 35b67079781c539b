//! A minimal blocking eventfd (counter semantics), inherited across `fork`.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// An eventfd in blocking counter mode.
pub struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    /// Creates an eventfd with counter 0 (blocking, not close-on-exec so `fork` children keep it;
    /// children here never exec).
    pub fn new() -> io::Result<Self> {
        // SAFETY: plain syscall with constant flags.
        let raw = unsafe { libc::eventfd(0, 0) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        Ok(Self { fd })
    }

    /// Adds `n` to the counter, waking a blocked reader.
    pub fn signal(&self, n: u64) -> io::Result<()> {
        let buf = n.to_ne_bytes();
        loop {
            // SAFETY: `buf` is 8 readable bytes, the size eventfd requires.
            let rc = unsafe { libc::write(self.fd.as_raw_fd(), buf.as_ptr().cast(), 8) };
            if rc == 8 {
                return Ok(());
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(err);
            }
        }
    }

    /// Blocks until the counter is non-zero, then returns and resets it.
    pub fn wait(&self) -> io::Result<u64> {
        let mut buf = [0u8; 8];
        loop {
            // SAFETY: `buf` is 8 writable bytes, the size eventfd requires.
            let rc = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), 8) };
            if rc == 8 {
                return Ok(u64::from_ne_bytes(buf));
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(err);
            }
        }
    }
}
