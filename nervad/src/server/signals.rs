//! SIGTERM/SIGINT as a readable descriptor (signalfd), so the poll thread sees a shutdown
//! request in the same epoll set as its doorbells instead of in an async-signal handler.

use std::io;
use std::os::fd::{AsFd, BorrowedFd};

use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

/// The blocked shutdown signals and the descriptor that reports them.
pub struct ShutdownSignals {
    fd: SignalFd,
}

impl ShutdownSignals {
    /// Block SIGTERM and SIGINT in the calling thread (call before spawning threads so all
    /// inherit the mask) and open a non-blocking signalfd for them.
    pub fn block() -> io::Result<ShutdownSignals> {
        let mut set = SigSet::empty();
        set.add(Signal::SIGTERM);
        set.add(Signal::SIGINT);
        set.thread_block()?;
        let fd = SignalFd::with_flags(&set, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)?;
        Ok(ShutdownSignals { fd })
    }

    /// The signal that arrived, if any (non-blocking).
    pub fn take(&self) -> Option<Signal> {
        match self.fd.read_signal() {
            Ok(Some(info)) => Signal::try_from(info.ssi_signo as i32).ok(),
            _ => None,
        }
    }

    /// For epoll.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
