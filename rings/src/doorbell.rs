//! The doorbell: a need-wakeup flag in shared memory plus an eventfd, so a producer pays a
//! system call only when the consumer really sleeps (io_uring's `IORING_SQ_NEED_WAKEUP`).
//!
//! # The handshake and why it cannot lose a wakeup
//! Producer (after publishing entries with the ring's Release store):
//! `fence(SeqCst)`, load the flag; if set, clear it and write the eventfd.
//! Sleeper: store the flag, `fence(SeqCst)`, re-check the ring; block on the eventfd only if
//! the ring is still empty; clear the flag when it wakes.
//!
//! The two SeqCst fences are totally ordered. If the producer's fence comes first, everything
//! before it (the publish) is visible to the sleeper's re-check after its own fence, so the
//! sleeper sees the entry and does not block. If the sleeper's fence comes first, its flag store
//! is visible to the producer's load after the producer's fence, so the producer writes the
//! eventfd. Either way the entry is seen or the sleeper is woken: the store-buffering outcome
//! "re-check sees empty *and* producer sees flag clear" is excluded. Release/Acquire alone does
//! not exclude it (it is exactly the Dekker/store-buffer litmus test), which is why the fences
//! are SeqCst and why `tests/loom_doorbell.rs` has a model that drops one and fails.
//!
//! Only the eventfd write is a system call, and only while the peer sleeps; the producer
//! clears the flag when it rings so a burst of publishes during one sleep costs one write.

#[cfg(not(loom))]
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
#[cfg(not(loom))]
use std::ptr::NonNull;
#[cfg(not(loom))]
use std::sync::Arc;
#[cfg(not(loom))]
use std::sync::atomic::AtomicU64;
#[cfg(not(loom))]
use std::time::{Duration, Instant};

use crate::sync::{AtomicU32, Ordering, fence};

/// A need-wakeup flag: non-zero while its consumer sleeps (or is about to). Lives in the
/// segment header (one for the daemon's submission side, one for the client's completion
/// side) or, in-process, on the heap.
#[derive(Debug)]
#[repr(transparent)]
pub struct NeedWakeup(AtomicU32);

impl Default for NeedWakeup {
    fn default() -> Self {
        Self::new()
    }
}

impl NeedWakeup {
    /// A cleared flag.
    pub fn new() -> Self {
        Self(AtomicU32::new(0))
    }

    /// Producer side, right after publishing: returns `true` (and calls `wake`) if the consumer
    /// announced sleep, in which case this call also clears the flag so later publishes in the
    /// same sleep skip the wake.
    pub fn wake_if_sleeping(&self, wake: impl FnOnce()) -> bool {
        // SYNC: SeqCst fence pairs with the SeqCst fence in `prepare_sleep` (module docs):
        // orders our earlier publish (ring Release store) before the flag load below.
        fence(Ordering::SeqCst);
        if self.0.load(Ordering::Relaxed) == 0 {
            return false;
        }
        // Relaxed is enough: the wake itself (eventfd write/read) synchronises through the
        // kernel, and the sleeper re-checks the ring after waking. The swap makes the wake
        // happen once per sleep even if several publishes race here.
        if self.0.swap(0, Ordering::Relaxed) == 0 {
            return false;
        }
        wake();
        true
    }

    /// Sleeper side, step 1: announce sleep. Afterwards the caller must re-check its ring and
    /// only block if it is still empty; either way it calls [`NeedWakeup::finish_sleep`].
    pub fn prepare_sleep(&self) {
        self.0.store(1, Ordering::Relaxed);
        // SYNC: SeqCst fence pairs with the SeqCst fence in `wake_if_sleeping`: orders the
        // flag store before the caller's re-check of the ring (an Acquire load).
        fence(Ordering::SeqCst);
    }

    /// Test-only: announce sleep *without* the fence, to show loom catches the lost wakeup.
    #[cfg(loom)]
    #[doc(hidden)]
    pub fn prepare_sleep_without_fence_for_loom(&self) {
        self.0.store(1, Ordering::Relaxed);
    }

    /// Sleeper side, last step: awake again (woken, timed out, or the re-check found work).
    pub fn finish_sleep(&self) {
        self.0.store(0, Ordering::Relaxed);
    }

    /// Whether the flag is set now (diagnostics only; racy by nature).
    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::Relaxed) != 0
    }
}

/// A shared handle to a [`NeedWakeup`] that lives in a segment (kept mapped by the handle) or
/// on the heap.
#[cfg(not(loom))]
#[derive(Clone)]
pub struct WakeFlag {
    flag: NonNull<NeedWakeup>,
    _owner: Arc<dyn Send + Sync>,
}

// SAFETY: `WakeFlag` only hands out `&NeedWakeup`, an atomic, which is `Sync`; the pointee stays
// alive as long as `_owner` does.
#[cfg(not(loom))]
unsafe impl Send for WakeFlag {}
// SAFETY: as above.
#[cfg(not(loom))]
unsafe impl Sync for WakeFlag {}

#[cfg(not(loom))]
impl WakeFlag {
    /// An in-process flag on the heap.
    pub fn new_heap() -> Self {
        let owner = Arc::new(NeedWakeup::new());
        Self {
            flag: NonNull::from(&*owner),
            _owner: owner,
        }
    }

    /// A flag in memory kept alive by `owner`.
    ///
    /// # Safety
    /// `flag` must point to an initialised, aligned `NeedWakeup` that stays valid while
    /// `owner` (or any clone of it) is alive.
    pub unsafe fn from_raw(flag: NonNull<NeedWakeup>, owner: Arc<dyn Send + Sync>) -> Self {
        Self {
            flag,
            _owner: owner,
        }
    }
}

#[cfg(not(loom))]
impl core::ops::Deref for WakeFlag {
    type Target = NeedWakeup;
    fn deref(&self) -> &NeedWakeup {
        // SAFETY: valid while `_owner` lives (constructor contracts), and `self` holds it.
        unsafe { self.flag.as_ref() }
    }
}

#[cfg(not(loom))]
impl core::fmt::Debug for WakeFlag {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_tuple("WakeFlag").field(&self.is_set()).finish()
    }
}

/// A Linux eventfd used as a counting doorbell (non-blocking, close-on-exec).
#[cfg(not(loom))]
#[derive(Debug)]
pub struct EventFd(OwnedFd);

#[cfg(not(loom))]
impl EventFd {
    /// A new eventfd with counter 0 (`EFD_NONBLOCK | EFD_CLOEXEC`).
    pub fn new() -> std::io::Result<Self> {
        // SAFETY: plain syscall with constant flags; the result is checked below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor we own exclusively.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Wrap a descriptor received from the peer (e.g. via `SCM_RIGHTS`). Non-blocking mode is
    /// enforced here, because the sender may not have set it and a blocking read in
    /// [`EventFd::drain`] could hang.
    pub fn from_owned(fd: OwnedFd) -> std::io::Result<Self> {
        // SAFETY: `fd` is a valid open descriptor (owned); F_GETFL/F_SETFL have no memory
        // arguments.
        let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
        if flags < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: as above.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Self(fd))
    }

    /// Add 1 to the counter (wakes a poller). A saturated counter (`EAGAIN`) already means
    /// "woken", so it is not an error.
    pub fn signal(&self) -> std::io::Result<()> {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live local `u64` to our own descriptor.
        let n = unsafe {
            libc::write(
                self.0.as_raw_fd(),
                (&one as *const u64).cast::<libc::c_void>(),
                8,
            )
        };
        if n == 8 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        if err.kind() == std::io::ErrorKind::WouldBlock {
            Ok(())
        } else {
            Err(err)
        }
    }

    /// Read and reset the counter; 0 if it was already 0.
    pub fn drain(&self) -> std::io::Result<u64> {
        let mut value: u64 = 0;
        // SAFETY: reads at most 8 bytes into a live local `u64` from our own descriptor.
        let n = unsafe {
            libc::read(
                self.0.as_raw_fd(),
                (&mut value as *mut u64).cast::<libc::c_void>(),
                8,
            )
        };
        if n == 8 {
            return Ok(value);
        }
        let err = std::io::Error::last_os_error();
        if err.kind() == std::io::ErrorKind::WouldBlock {
            Ok(0)
        } else {
            Err(err)
        }
    }

    /// Block until the counter is non-zero or `timeout` passes (`None`: forever). Returns
    /// whether it became readable. Interrupted waits resume with the remaining time.
    pub fn wait_readable(&self, timeout: Option<Duration>) -> std::io::Result<bool> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let ms: libc::c_int = match deadline {
                None => -1,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    // Round up so a sub-millisecond timeout still sleeps instead of spinning.
                    let ms = left.as_micros().div_ceil(1000);
                    ms.min(libc::c_int::MAX as u128) as libc::c_int
                }
            };
            let mut pfd = libc::pollfd {
                fd: self.0.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid `pollfd` on the stack, count 1.
            let n = unsafe { libc::poll(&mut pfd, 1, ms) };
            if n > 0 {
                return Ok(true);
            }
            if n == 0 {
                return Ok(false);
            }
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::Interrupted {
                return Err(err);
            }
        }
    }
}

#[cfg(not(loom))]
impl AsFd for EventFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

#[cfg(not(loom))]
impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// Producer side of a doorbell: call [`Notifier::notify`] after each commit (or batch of
/// commits). Counts the eventfd writes it makes.
#[cfg(not(loom))]
#[derive(Debug)]
pub struct Notifier {
    flag: WakeFlag,
    eventfd: EventFd,
    writes: AtomicU64,
}

#[cfg(not(loom))]
impl Notifier {
    /// Ring `eventfd` when `flag` says the consumer sleeps.
    pub fn new(flag: WakeFlag, eventfd: EventFd) -> Self {
        Self {
            flag,
            eventfd,
            writes: AtomicU64::new(0),
        }
    }

    /// After publishing: wake the consumer if (and only if) it announced sleep. Returns whether
    /// the eventfd was written.
    pub fn notify(&self) -> std::io::Result<bool> {
        let mut result = Ok(());
        let woke = self
            .flag
            .wake_if_sleeping(|| result = self.eventfd.signal());
        result?;
        if woke {
            self.writes
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(woke)
    }

    /// Eventfd writes made so far (doorbells actually rung).
    pub fn writes(&self) -> u64 {
        self.writes.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The eventfd (e.g. to pass it to the peer).
    pub fn eventfd(&self) -> &EventFd {
        &self.eventfd
    }

    /// The flag.
    pub fn flag(&self) -> &WakeFlag {
        &self.flag
    }
}

/// Why [`Waiter::wait`] failed.
#[cfg(not(loom))]
#[derive(Debug)]
#[non_exhaustive]
pub enum WaitError {
    /// The ring's indices are corrupt.
    Ring(crate::RingError),
    /// poll/read on the eventfd failed.
    Io(std::io::Error),
}

#[cfg(not(loom))]
impl core::fmt::Display for WaitError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Ring(e) => write!(f, "{e}"),
            Self::Io(e) => write!(f, "doorbell: {e}"),
        }
    }
}

#[cfg(not(loom))]
impl std::error::Error for WaitError {}

#[cfg(not(loom))]
impl From<crate::RingError> for WaitError {
    fn from(e: crate::RingError) -> Self {
        Self::Ring(e)
    }
}

#[cfg(not(loom))]
impl From<std::io::Error> for WaitError {
    fn from(e: std::io::Error) -> Self {
        Self::Io(e)
    }
}

/// Consumer side of a doorbell: block until the ring has an entry, with the need-wakeup
/// handshake. Also usable piecewise for an epoll loop over many rings
/// ([`Waiter::prepare_sleep`] / the raw fd / [`Waiter::finish_sleep`]).
#[cfg(not(loom))]
#[derive(Debug)]
pub struct Waiter {
    flag: WakeFlag,
    eventfd: EventFd,
}

#[cfg(not(loom))]
impl Waiter {
    /// Sleep on `eventfd`, announcing it through `flag`.
    pub fn new(flag: WakeFlag, eventfd: EventFd) -> Self {
        Self { flag, eventfd }
    }

    /// Wait until `consumer` has an entry or `timeout` passes (`None`: forever). Returns
    /// `true` when an entry is available. Never blocks while an entry is available; returns
    /// immediately if one is.
    pub fn wait<T: crate::Pod>(
        &self,
        consumer: &mut crate::Consumer<T>,
        timeout: Option<Duration>,
    ) -> Result<bool, WaitError> {
        if consumer.has_pending()? {
            return Ok(true);
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if !self.prepare_sleep(consumer)? {
                return Ok(true);
            }
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            let readable = self.eventfd.wait_readable(left);
            self.finish_sleep()?;
            readable?;
            if consumer.has_pending()? {
                return Ok(true);
            }
            // Woken with nothing to read (a stale count from an earlier wake) or timed out.
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(false);
            }
        }
    }

    /// Announce sleep and re-check `consumer`. Returns `true` if the caller may now block on
    /// [`Waiter::as_raw_fd`] (the ring is still empty); `false` if an entry arrived, in which
    /// case the flag is already cleared again. After blocking, call [`Waiter::finish_sleep`].
    pub fn prepare_sleep<T: crate::Pod>(
        &self,
        consumer: &mut crate::Consumer<T>,
    ) -> Result<bool, crate::RingError> {
        self.flag.prepare_sleep();
        match consumer.has_pending() {
            Ok(false) => Ok(true),
            Ok(true) => {
                self.flag.finish_sleep();
                Ok(false)
            }
            Err(e) => {
                self.flag.finish_sleep();
                Err(e)
            }
        }
    }

    /// Awake again: clear the flag and reset the eventfd counter (one `read`).
    pub fn finish_sleep(&self) -> std::io::Result<()> {
        self.flag.finish_sleep();
        self.eventfd.drain().map(|_| ())
    }

    /// Awake again without reading the eventfd: for an epoll loop over many rings, call this
    /// for the rings whose eventfd epoll did *not* report, and [`Waiter::finish_sleep`] for the
    /// ones it did, so a wake costs one `read` per ringing peer, not one per peer. A count
    /// that arrives in between only causes one spurious wake later.
    pub fn disarm(&self) {
        self.flag.finish_sleep();
    }

    /// The eventfd (for epoll).
    pub fn eventfd(&self) -> &EventFd {
        &self.eventfd
    }

    /// The eventfd's raw descriptor (for epoll).
    pub fn as_raw_fd(&self) -> RawFd {
        self.eventfd.as_raw_fd()
    }

    /// The flag.
    pub fn flag(&self) -> &WakeFlag {
        &self.flag
    }
}

/// A connected in-process doorbell pair over one heap flag and one eventfd (tests, lab).
#[cfg(not(loom))]
pub fn doorbell_pair() -> std::io::Result<(Notifier, Waiter)> {
    let flag = WakeFlag::new_heap();
    let fd = EventFd::new()?;
    let dup = fd.0.try_clone()?;
    Ok((
        Notifier::new(flag.clone(), fd),
        Waiter::new(flag, EventFd(dup)),
    ))
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::SpscRing;

    #[test]
    fn eventfd_counts_and_drains() {
        let fd = EventFd::new().expect("eventfd");
        assert_eq!(fd.drain().expect("drain"), 0);
        fd.signal().expect("signal");
        fd.signal().expect("signal");
        assert!(fd.wait_readable(Some(Duration::ZERO)).expect("poll"));
        assert_eq!(fd.drain().expect("drain"), 2);
        assert!(
            !fd.wait_readable(Some(Duration::from_millis(1)))
                .expect("poll")
        );
    }

    #[test]
    fn notify_writes_only_while_the_consumer_sleeps() {
        let (notifier, waiter) = doorbell_pair().expect("pair");
        let (mut p, mut c) = SpscRing::<u64>::with_capacity(8).expect("ring");
        p.push(1).expect("room");
        assert!(
            !notifier.notify().expect("notify"),
            "awake consumer: no syscall"
        );
        assert_eq!(notifier.writes(), 0);
        // Entry pending: wait returns at once.
        assert!(waiter.wait(&mut c, Some(Duration::ZERO)).expect("wait"));
        assert_eq!(c.pop(), Ok(Some(1)));
        // Empty: times out.
        assert!(
            !waiter
                .wait(&mut c, Some(Duration::from_millis(2)))
                .expect("wait")
        );
        // A sleeper that announced itself is woken exactly once per sleep.
        assert!(waiter.prepare_sleep(&mut c).expect("ring ok"));
        p.push(2).expect("room");
        assert!(notifier.notify().expect("notify"));
        p.push(3).expect("room");
        assert!(!notifier.notify().expect("notify"), "flag already cleared");
        assert_eq!(notifier.writes(), 1);
        assert!(
            waiter
                .eventfd()
                .wait_readable(Some(Duration::ZERO))
                .expect("poll")
        );
        waiter.finish_sleep().expect("drain");
        assert_eq!(c.pop(), Ok(Some(2)));
    }

    #[test]
    fn blocked_waiter_is_woken_by_another_thread() {
        let (notifier, waiter) = doorbell_pair().expect("pair");
        let (mut p, mut c) = SpscRing::<u64>::with_capacity(8).expect("ring");
        let rounds = if cfg!(debug_assertions) { 200 } else { 2000 };
        let producer = std::thread::spawn(move || {
            for i in 0..rounds {
                p.push(i)
                    .expect("room: consumer drains each entry before the next");
                notifier.notify().expect("notify");
                // Give the consumer time to go to sleep sometimes.
                if i % 16 == 0 {
                    std::thread::sleep(Duration::from_micros(200));
                }
                while p.free_slots().expect("ok") < 8 {
                    std::hint::spin_loop();
                }
            }
            notifier.writes()
        });
        for i in 0..rounds {
            // Generous timeout: the assertion is "no lost wakeup", not a latency bound.
            assert!(
                waiter
                    .wait(&mut c, Some(Duration::from_secs(30)))
                    .expect("wait")
            );
            assert_eq!(c.pop(), Ok(Some(i)));
        }
        let writes = producer.join().expect("producer");
        assert!(writes <= rounds);
    }
}
