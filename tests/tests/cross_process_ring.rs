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
    match std::env::var(CHILD_ENV).as_deref() {
        Ok("echo") => run_child(),
        Ok("hostile") => run_hostile_child(),
        _ => {}
    }
}

/// xorshift64*: a tiny deterministic generator, so a failing corruption sequence can be
/// replayed from its seed.
struct Scribbles(u64);

impl Scribbles {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

const HOSTILE_SEED: u64 = 0x6e65_7276_615f_6878;

/// A hostile client: it maps the segment and writes garbage over everything it can reach,
/// with a bias towards the submission ring's indices and slots (where the daemon reads), and
/// towards "plausible" producer indices that make the daemon read garbage entries.
fn run_hostile_child() {
    let memfd = fd_from_env("NERVA_XPROC_MEMFD");
    let len: usize = std::env::var("NERVA_XPROC_LEN")
        .expect("len")
        .parse()
        .expect("len");
    let scribbles: u64 = count();
    let mapping =
        SegmentMapping::map_fd(std::os::fd::AsFd::as_fd(&memfd), len).expect("map segment");
    let layout = Segment::open(mapping)
        .expect("valid header")
        .layout()
        .to_owned();
    // Our own second mapping, written through atomics (we are a separate process; the daemon
    // must cope with anything, whatever width or timing we write with).
    let raw = SegmentMapping::map_fd(std::os::fd::AsFd::as_fd(&memfd), len).expect("map");
    let base = raw.as_ptr().as_ptr();
    let word = |offset: u64| {
        debug_assert!(offset & 3 == 0 && offset + 4 <= len as u64);
        // SAFETY: 4-aligned offset inside our live mapping; AtomicU32 has the layout of u32.
        unsafe {
            &*base
                .add(offset as usize)
                .cast::<std::sync::atomic::AtomicU32>()
        }
    };
    let sq_header = layout.sq_offset();
    let sq_slots = layout.sq_slots_offset();
    let sq_slot_bytes = u64::from(layout.sq_entries()) * 64;
    // The ring header is two padded lines: consumer index, then producer index.
    let producer_index = sq_header + (std::mem::size_of::<nerva_rings::RingHeader>() / 2) as u64;
    // Start only once the daemon side is reading (it sets the first word of the output
    // region), so the two really run concurrently however the scheduler starts them.
    let go = word(layout.output_offset());
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while go.load(std::sync::atomic::Ordering::Acquire) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "daemon side never started"
        );
        std::thread::yield_now();
    }
    let mut rng = Scribbles(HOSTILE_SEED);
    for _ in 0..scribbles {
        let r = rng.next();
        let value = (r >> 32) as u32;
        let ordering = std::sync::atomic::Ordering::Relaxed;
        let slot = sq_slots + (r >> 8) % u64::from(layout.sq_entries()) * 64;
        match r % 16 {
            // Plausible producer index: up to 8 entries past the daemon's published index,
            // so the daemon really copies out and validates garbage entries.
            0..=3 => {
                let head = word(sq_header).load(ordering);
                word(producer_index).store(head.wrapping_add(value % 9), ordering);
            }
            // Wild producer index.
            4 => word(producer_index).store(value, ordering),
            // Random words in the slots the daemon copies out.
            5..=9 => word(sq_slots + (r >> 8) % sq_slot_bytes / 4 * 4).store(value, ordering),
            // A whole well-formed descriptor (sometimes with ranges outside the regions), so
            // the accept path and the range checks run on hostile input too.
            10..=11 => {
                let range = nerva_rings::ByteRange::new(value % 8192, (r >> 20) as u32 % 8192 + 1);
                let d = if r & (1 << 62) != 0 {
                    Descriptor::nop(r, value.into())
                } else {
                    let request =
                        nerva_rings::GenerateRequest::new(r, nerva_rings::PromptKind::Text, range);
                    Descriptor::generate(&request).expect("well-formed")
                };
                for (i, chunk) in d.to_bytes().chunks_exact(4).enumerate() {
                    let w = u32::from_ne_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
                    word(slot + 4 * i as u64).store(w, ordering);
                }
            }
            // The ring header past the daemon's own index (padding, the producer line).
            12 => {
                let span = sq_slots - sq_header - 4;
                word(sq_header + 4 + (r >> 8) % span / 4 * 4).store(value, ordering)
            }
            // Anywhere before the output region, except the daemon's own consumer index (the
            // output region is the daemon's to write; it holds the start signal). The daemon never reads
            // that word back (so scribbling it proves nothing), and this test's plausible
            // producer indices are derived from it.
            _ => {
                let offset = (r >> 8) % layout.output_offset() / 4 * 4;
                if offset != sq_header {
                    word(offset).store(value, ordering)
                }
            }
        }
    }
    println!("hostile child: {scribbles} corrupting writes");
}

fn spawn_child(memfd: &OwnedFd, sq: &OwnedFd, cq: &OwnedFd, len: u64, n: u64) -> Child {
    Command::new(std::env::current_exe().expect("test binary path"))
        .args([
            "--exact",
            "cross_process_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "echo")
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

/// A memfd of `len` bytes that a child process inherits, mapped and initialised as a segment.
fn shared_segment(layout: &SegmentLayout) -> (OwnedFd, std::sync::Arc<Segment>) {
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
    let segment = Segment::create(mapping, layout).expect("create segment");
    (memfd, segment)
}

#[test]
fn ten_million_descriptors_cross_two_processes_in_order() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return; // the child runs only `cross_process_child`
    }
    let n = count();
    let layout = SegmentLayout::new(SQ_ENTRIES, CQ_ENTRIES, 4096, 4096).expect("layout");
    let len = layout.total_bytes();
    let (memfd, segment) = shared_segment(&layout);
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

/// The daemon's side of a segment whose client process scribbles over the shared memory
/// while the daemon keeps consuming: every outcome must be a value (an entry, a refused
/// descriptor, a corrupt-index error), never a panic, a crash or an out-of-bounds access.
#[test]
fn hostile_peer_scribbling_over_the_segment_never_crashes_the_reader() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    let scribbles: u64 = if cfg!(debug_assertions) {
        2_000_000
    } else {
        20_000_000
    };
    let layout = SegmentLayout::new(64, 64, 4096, 4096).expect("layout");
    let (memfd, segment) = shared_segment(&layout);
    let mut end = segment.daemon_end().expect("daemon end");
    let mut child = Command::new(std::env::current_exe().expect("test binary path"))
        .args([
            "--exact",
            "cross_process_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "hostile")
        .env(COUNT_ENV, scribbles.to_string())
        .env("NERVA_XPROC_MEMFD", memfd.as_raw_fd().to_string())
        .env("NERVA_XPROC_LEN", layout.total_bytes().to_string())
        .spawn()
        .expect("spawn hostile child");

    let (mut rounds, mut entries, mut valid, mut refused, mut corrupt) =
        (0u64, 0u64, 0u64, 0u64, 0u64);
    let (mut cq_full, mut cq_corrupt) = (0u64, 0u64);
    let mut prompt = vec![0u8; 4096];
    let status = loop {
        if let Some(status) = child.try_wait().expect("waitpid") {
            break status;
        }
        if rounds == 1 {
            end.output.write(0, &1u32.to_ne_bytes()).expect("in range");
        }
        rounds += 1;
        let consumed = end.submissions.consume(16, |d: Descriptor| {
            entries += 1;
            match d.validate().and_then(|r| {
                r.check_regions(end.input.len(), end.output.len())
                    .map(|()| r)
            }) {
                Ok(request) => {
                    valid += 1;
                    if let Request::Generate(g) = request {
                        // In range by `check_regions`; copy out what a daemon would.
                        let len = g.prompt.len as usize;
                        end.input
                            .read(g.prompt.offset, &mut prompt[..len])
                            .expect("range was checked");
                    }
                }
                Err(e) => {
                    refused += 1;
                    // Every refusal maps to a documented wire code.
                    assert!(nerva_rings::StatusCode::from_u16(e.status().as_u16()).is_some());
                }
            }
        });
        if consumed.is_err() {
            corrupt += 1;
        }
        // The completion side reads the (hostile) consumer index too.
        match end
            .completions
            .push(Completion::shutdown(nerva_rings::StatusCode::Ok))
        {
            Ok(()) => {}
            Err(nerva_rings::PushError::Full(_)) => cq_full += 1,
            Err(nerva_rings::PushError::Corrupt(..)) => cq_corrupt += 1,
        }
    };
    assert!(status.success(), "hostile child failed: {status}");
    assert!(rounds > 0);
    println!(
        "hostile peer: {scribbles} corrupting writes; reader ran {rounds} rounds: {entries} \
         entries copied out ({valid} valid, {refused} refused), {corrupt} corrupt-index \
         errors; completion side {cq_full} full, {cq_corrupt} corrupt"
    );
}
