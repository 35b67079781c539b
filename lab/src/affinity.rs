//! CPU pinning with `sched_setaffinity`, so that a ping-pong really crosses two cores and the
//! scheduler does not migrate a spinning thread mid-run.

use std::io;

/// The CPUs this process may run on (from `sched_getaffinity`), ascending.
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    // SAFETY: `cpu_set_t` is a plain bitmask; all-zero is a valid (empty) set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: the pointer and size describe `set`, which lives for the call.
    let rc = unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((0..libc::CPU_SETSIZE as usize)
        // SAFETY: `cpu` < CPU_SETSIZE, the bound `CPU_ISSET` requires.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect())
}

/// Pins the calling thread to `cpu`.
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "cpu index out of range",
        ));
    }
    // SAFETY: all-zero is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` < CPU_SETSIZE was checked above.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: the pointer and size describe `set`; pid 0 means the calling thread.
    let rc = unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Two distinct CPUs for a two-party experiment: the first two allowed ones. With a single
/// allowed CPU both parties share it (the table then says so through [`CpuPair::shared`]).
#[derive(Clone, Copy, Debug)]
pub struct CpuPair {
    /// CPU of the measuring side.
    pub a: usize,
    /// CPU of the responding side.
    pub b: usize,
}

impl CpuPair {
    /// Picks the pair, falling back to CPU 0 if the mask cannot be read.
    pub fn pick() -> Self {
        let cpus = allowed_cpus().unwrap_or_default();
        match cpus.as_slice() {
            [] => Self { a: 0, b: 0 },
            [only] => Self { a: *only, b: *only },
            [first, second, ..] => Self {
                a: *first,
                b: *second,
            },
        }
    }

    /// True when both parties must share one CPU.
    pub fn shared(&self) -> bool {
        self.a == self.b
    }

    /// Pins the caller to `a`, printing (not failing) if the kernel refuses.
    pub fn pin_a(&self) {
        if let Err(e) = pin_current_thread(self.a) {
            eprintln!("warning: cannot pin to cpu {}: {e}", self.a);
        }
    }

    /// Pins the caller to `b`, printing (not failing) if the kernel refuses.
    pub fn pin_b(&self) {
        if let Err(e) = pin_current_thread(self.b) {
            eprintln!("warning: cannot pin to cpu {}: {e}", self.b);
        }
    }
}
