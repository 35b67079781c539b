//! Two real processes share one segment (a memfd) and move ≥ 10 million entries through a
//! ring pair: the parent (client role) submits NOP descriptors tagged with a sequence number
//! on the submission ring; the child (daemon role, this same test binary re-executed) copies
//! each out, validates it, checks the sequence and echoes it as a NOP_REPLY completion; the
//! parent checks the echoed sequence. Any lost, duplicated or reordered entry fails the test
//! on the side that sees it. Both sides spin briefly when idle, then sleep on the eventfd
//! doorbells with the need-wakeup handshake, so the test also exercises the real doorbell.
//!
//! `NERVA_XPROC_COUNT` overrides the count (default 10,000,000).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nerva_rings::{
    Completion, Consumer, Descriptor, Event, EventFd, Notifier, Pod, Request, Segment,
    SegmentLayout, SegmentMapping, Waiter,
};

const CHILD_ENV: &str = "NERVA_XPROC_CHILD";
const COUNT_ENV: &str = "NERVA_XPROC_COUNT";
const SQ_ENTRIES: u32 = 1024;
const CQ_ENTRIES: u32 = 1024;
const BATCH: usize = 64;
/// Idle spins before announcing sleep: long enough that a busy peer rarely sees a sleeper,
/// short enough not to burn a shared CI core.
const SPINS_BEFORE_SLEEP: u32 = 256;
/// Payload derived from the sequence number, so a stale or foreign slot is caught too.
const PAYLOAD_MIX: u64 = 0x9e37_79b9_7f4a_7c15;

fn count() -> u64 {
    std::env::var(COUNT_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000)
}

fn check_os(ret: libc::c_int, what: &str) -> libc::c_int {
    assert!(ret >= 0, "{what}: {}", std::io::Error::last_os_error());
    ret
}

/// A descriptor the child process inherits (no close-on-exec).
fn inheritable_eventfd() -> OwnedFd {
    // SAFETY: plain syscall; result checked. No EFD_CLOEXEC: the child must inherit it.
    let fd = check_os(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK) }, "eventfd");
    // SAFETY: fresh descriptor owned by us.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

fn fd_from_env(name: &str) -> OwnedFd {
    let fd: RawFd = std::env::var(name)
        .unwrap_or_else(|_| panic!("{name} not set"))
        .parse()
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    // SAFETY: the parent passed us this inherited descriptor, which nothing else in this
    // process owns.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// Spin, then sleep on the doorbell until `consumer` has an entry. Calls `alive` each time a
/// sleep times out so a dead peer fails the test instead of hanging it.
fn wait_for_entries<T: Pod>(
    waiter: &Waiter,
    consumer: &mut Consumer<T>,
    idle_spins: &mut u32,
    sleeps: &mut u64,
    mut alive: impl FnMut(),
) {
    if *idle_spins < SPINS_BEFORE_SLEEP {
        *idle_spins += 1;
        if *idle_spins & 31 == 0 {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
        return;
    }
    *idle_spins = 0;
    *sleeps += 1;
    while !waiter
        .wait(consumer, Some(Duration::from_millis(200)))
        .expect("ring and doorbell ok")
    {
        alive();
    }
}

/// The daemon side, in the child process.
fn run_child() {
    let n = count();
    let memfd = fd_from_env("NERVA_XPROC_MEMFD");
    let sq_fd = EventFd::from_owned(fd_from_env("NERVA_XPROC_SQ_EVENTFD")).expect("sq eventfd");
    let cq_fd = EventFd::from_owned(fd_from_env("NERVA_XPROC_CQ_EVENTFD")).expect("cq eventfd");
    let len: usize = std::env::var("NERVA_XPROC_LEN")
        .expect("len")
        .parse()
        .expect("len");
    let mapping =
        SegmentMapping::map_fd(std::os::fd::AsFd::as_fd(&memfd), len).expect("map segment");
    let segment = Segment::open(mapping).expect("valid segment header");
    let mut end = segment.daemon_end().expect("daemon end");
    let waiter = Waiter::new(end.daemon_sleeping.clone(), sq_fd);
    let notifier = Notifier::new(end.client_waiting.clone(), cq_fd);
    let parent = std::os::unix::process::parent_id();

    let mut expected: u64 = 0;
    let mut idle = 0;
    let mut sleeps = 0;
    let mut batch: Vec<Completion> = Vec::with_capacity(BATCH);
    while expected < n {
        // Take only what fits in the completion ring, so nothing read is ever held back.
        let room = end.completions.free_slots().expect("cq ok") as usize;
        batch.clear();
        let got = end
            .submissions
            .consume(room.min(BATCH), |d: Descriptor| {
                let request = d.validate().expect("parent sends valid NOPs");
                let Request::Nop { tag, payload } = request else {
                    panic!("unexpected request {request:?}");
                };
                assert_eq!(tag, expected, "submission lost, duplicated or reordered");
                assert_eq!(payload, tag ^ PAYLOAD_MIX, "corrupt submission payload");
                batch.push(Completion::nop_reply(tag, payload));
                expected += 1;
            })
            .expect("sq ok");
        if got == 0 {
            wait_for_entries(
                &waiter,
                &mut end.submissions,
                &mut idle,
                &mut sleeps,
                || {
                    assert_eq!(std::os::unix::process::parent_id(), parent, "parent died");
                },
            );
            continue;
        }
        idle = 0;
        let pushed = end.completions.push_slice(&batch).expect("cq ok");
        assert_eq!(pushed, batch.len(), "room was checked before consuming");
        notifier.notify().expect("doorbell");
    }
    println!(
        "child: echoed {expected} descriptors; slept {sleeps} times; rang the client {} times",
        notifier.writes()
    );
}

/// Runs only as the re-executed child (the parent sets the env var); a no-op otherwise.
#[test]
fn cross_process_child() {
    if std::env::var_os(CHILD_ENV).is_some() {
        run_child();
    }
}

fn spawn_child(memfd: &OwnedFd, sq: &OwnedFd, cq: &OwnedFd, len: u64, n: u64) -> Child {
    Command::new(std::env::current_exe().expect("test binary path"))
        .args([
            "--exact",
            "cross_process_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "1")
        .env(COUNT_ENV, n.to_string())
        .env("NERVA_XPROC_MEMFD", memfd.as_raw_fd().to_string())
        .env("NERVA_XPROC_SQ_EVENTFD", sq.as_raw_fd().to_string())
        .env("NERVA_XPROC_CQ_EVENTFD", cq.as_raw_fd().to_string())
        .env("NERVA_XPROC_LEN", len.to_string())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child")
}

#[test]
fn ten_million_descriptors_cross_two_processes_in_order() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return; // the child runs only `cross_process_child`
    }
    let n = count();
    let layout = SegmentLayout::new(SQ_ENTRIES, CQ_ENTRIES, 4096, 4096).expect("layout");
    let len = layout.total_bytes();

    // SAFETY: static NUL-terminated name; flags 0 (inheritable by the child). Checked.
    let raw = check_os(
        unsafe { libc::memfd_create(c"nerva-xproc-test".as_ptr(), 0) },
        "memfd_create",
    );
    // SAFETY: fresh descriptor owned by us.
    let memfd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: valid descriptor; length fits off_t.
    check_os(
        unsafe { libc::ftruncate(memfd.as_raw_fd(), len as libc::off_t) },
        "ftruncate",
    );
    let mapping =
        SegmentMapping::map_fd(std::os::fd::AsFd::as_fd(&memfd), len as usize).expect("map");
    let segment = Segment::create(mapping, &layout).expect("create segment");
    let mut end = segment.client_end().expect("client end");

    let sq_fd = inheritable_eventfd();
    let cq_fd = inheritable_eventfd();
    let mut child = spawn_child(&memfd, &sq_fd, &cq_fd, len, n);
    let notifier = Notifier::new(
        end.daemon_sleeping.clone(),
        EventFd::from_owned(sq_fd).expect("sq eventfd"),
    );
    let waiter = Waiter::new(
        end.client_waiting.clone(),
        EventFd::from_owned(cq_fd).expect("cq eventfd"),
    );

    let start = Instant::now();
    let mut next_submit: u64 = 0;
    let mut next_complete: u64 = 0;
    let mut idle = 0;
    let mut sleeps = 0;
    let mut out: Vec<Descriptor> = Vec::with_capacity(BATCH);
    while next_complete < n {
        // Submit a batch with one publish and at most one doorbell.
        out.clear();
        let upto = (next_submit + BATCH as u64).min(n);
        out.extend((next_submit..upto).map(|seq| Descriptor::nop(seq, seq ^ PAYLOAD_MIX)));
        let submitted = end.submissions.push_slice(&out).expect("sq ok");
        if submitted > 0 {
            next_submit += submitted as u64;
            notifier.notify().expect("doorbell");
        }
        // Drain completions, checking the echoed sequence.
        let completed = end
            .completions
            .consume(BATCH, |c: Completion| {
                assert_eq!(
                    c.tag(),
                    next_complete,
                    "completion lost, duplicated or reordered"
                );
                match c.event() {
                    Ok(Event::NopReply { payload }) => {
                        assert_eq!(payload, next_complete ^ PAYLOAD_MIX, "corrupt echo")
                    }
                    other => panic!("unexpected completion {other:?}"),
                }
                next_complete += 1;
            })
            .expect("cq ok");
        if submitted == 0 && completed == 0 {
            wait_for_entries(
                &waiter,
                &mut end.completions,
                &mut idle,
                &mut sleeps,
                || {
                    if let Some(status) = child.try_wait().expect("waitpid") {
                        panic!("child exited early: {status}");
                    }
                },
            );
        } else {
            idle = 0;
        }
    }
    let elapsed = start.elapsed();
    let status = child.wait().expect("wait child");
    assert!(status.success(), "child failed: {status}");
    assert_eq!(next_submit, n);
    assert_eq!(next_complete, n);
    // Nothing extra arrived after the last expected completion.
    assert_eq!(end.completions.pop().expect("cq ok"), None);
    let rate = n as f64 / elapsed.as_secs_f64();
    println!(
        "cross-process: {n} descriptors out and {n} completions back, 0 lost/duplicated/\
         reordered, in {:.2} s = {:.2} M round trips/s ({} build); parent slept {sleeps} \
         times, rang the daemon {} times",
        elapsed.as_secs_f64(),
        rate / 1e6,
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        notifier.writes()
    );
}
