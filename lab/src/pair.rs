//! Two-party experiments: run an initiator and a responder on two pinned CPUs, either as two
//! threads of this process or as two processes (the responder in a forked child).

use std::io;

use crate::affinity::CpuPair;
use crate::shm::fork_child;

/// Where the two parties live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Two threads of one process.
    Threads,
    /// Two processes; shared state must be in a [`crate::shm::SharedRegion`] (or inherited fds).
    Processes,
}

impl Placement {
    /// Short label for tables.
    pub fn label(self) -> &'static str {
        match self {
            Self::Threads => "threads",
            Self::Processes => "processes",
        }
    }
}

/// Runs `responder` pinned to `cpus.b` and `initiator` pinned to `cpus.a`, concurrently, and
/// returns the initiator's result once both have finished. Must be called while the process has
/// no other live thread (the process placement forks).
pub fn run_pair<R, I, P>(
    placement: Placement,
    cpus: CpuPair,
    initiator: I,
    responder: P,
) -> io::Result<R>
where
    R: Send,
    I: FnOnce() -> R + Send,
    P: FnOnce() + Send,
{
    match placement {
        Placement::Threads => std::thread::scope(|s| {
            let resp = s.spawn(move || {
                cpus.pin_b();
                responder();
            });
            let init = s.spawn(move || {
                cpus.pin_a();
                initiator()
            });
            let r = init
                .join()
                .map_err(|_| io::Error::other("initiator thread panicked"))?;
            resp.join()
                .map_err(|_| io::Error::other("responder thread panicked"))?;
            Ok(r)
        }),
        Placement::Processes => {
            let child = fork_child(move || {
                cpus.pin_b();
                responder();
                0
            })?;
            let r = std::thread::scope(|s| {
                s.spawn(move || {
                    cpus.pin_a();
                    initiator()
                })
                .join()
            });
            let code = child.wait()?;
            let r = r.map_err(|_| io::Error::other("initiator thread panicked"))?;
            if code != 0 {
                return Err(io::Error::other(format!(
                    "responder process exited with {code}"
                )));
            }
            Ok(r)
        }
    }
}
