//! 04 — wake-up cost: how long does it take to tell another core "your turn" and hear back?
//!
//! Round trip (A → B → A) between two pinned parties, as threads and as processes sharing a
//! memfd mapping, through:
//! - busy-poll, one shared line: A writes 2k+1 into a counter, B spins until it sees it and
//!   writes 2k+2, A spins for that. The floor for any shared-memory handoff (two line transfers);
//! - busy-poll, two lines: A owns a "ping" line, B a "pong" line (the shape of a ring pair, whose
//!   indices each live on their own line);
//! - futex: same two words, but the waiter blocks in `FUTEX_WAIT` and the writer always calls
//!   `FUTEX_WAKE` (private futexes for threads, shared ones for processes);
//! - eventfd: A `write`s B's eventfd and blocks in `read` on its own, and vice versa;
//! - eventfd after idle: A pauses 1 ms (untimed), then `write`s B's eventfd and busy-polls the
//!   pong line; B has been blocked in `read` for that millisecond. One wake of a sleeper that
//!   has really gone idle, plus one line transfer: the shape of the daemon's "from sleep" NOP
//!   (`nervactl ping`), without the daemon. A wake after 1 ms idle can cost far more than a
//!   wake inside a tight ping-pong, where the idle CPU has not gone into a deep sleep yet.
//!
//! Each sample is one round trip timed with one `Instant::now()` (its cost is printed).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Instant;

use crossbeam_utils::CachePadded;
use nerva_lab::affinity::CpuPair;
use nerva_lab::args::LabArgs;
use nerva_lab::cacheline::{cache_line_round_trips, spin_until};
use nerva_lab::eventfd::EventFd;
use nerva_lab::futex;
use nerva_lab::machine::print_header;
use nerva_lab::pair::{Placement, run_pair};
use nerva_lab::report::{Table, f};
use nerva_lab::shm::SharedRegion;
use nerva_lab::stats::{Summary, clock_overhead_ns, summarize};

/// The state both parties touch; all-zero is the initial state, so a fresh memfd is ready.
#[repr(C)]
struct Mailboxes {
    ping: CachePadded<AtomicU64>,
    pong: CachePadded<AtomicU64>,
    fping: CachePadded<AtomicU32>,
    fpong: CachePadded<AtomicU32>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mechanism {
    BusyOneLine,
    BusyTwoLines,
    Futex,
    EventFd,
    EventFdAfterIdle,
}

/// How long A pauses before each "after idle" round (long enough for the sleeping side's CPU
/// to go idle, as the daemon's does between pings after its spin window).
const IDLE_PAUSE: std::time::Duration = std::time::Duration::from_millis(1);

impl Mechanism {
    fn label(self) -> &'static str {
        match self {
            Self::BusyOneLine => "busy-poll, one shared line",
            Self::BusyTwoLines => "busy-poll, two lines",
            Self::Futex => "futex wait/wake",
            Self::EventFd => "eventfd read/write",
            Self::EventFdAfterIdle => "eventfd wake after 1 ms idle, busy reply",
        }
    }
}

fn futex_until(word: &AtomicU32, value: u32, private: bool) {
    // Acquire pairs with the peer's Release store; the kernel re-checks `word` under its lock,
    // so a store + wake between our load and the sleep cannot be lost.
    loop {
        let seen = word.load(Ordering::Acquire);
        if seen == value {
            return;
        }
        futex::wait(word, seen, private);
    }
}

/// Runs `rounds` round trips and returns one sample (ns) per round after `warmup` rounds.
fn measure(
    mech: Mechanism,
    placement: Placement,
    cpus: CpuPair,
    rounds: u64,
    warmup: u64,
) -> Summary {
    if mech == Mechanism::BusyOneLine {
        return cache_line_round_trips(placement, cpus, rounds, warmup).expect("ping-pong run");
    }
    let region = SharedRegion::new("lab04", size_of::<Mailboxes>()).expect("memfd");
    // SAFETY: `Mailboxes` is atomics only (all-zero valid), accessed only through atomics.
    let mb: &Mailboxes = unsafe { region.at(0) };
    let (to_b, to_a) = (
        EventFd::new().expect("eventfd"),
        EventFd::new().expect("eventfd"),
    );
    let private = placement == Placement::Threads;
    let total = rounds + warmup;

    let initiator = || {
        let mut samples = Vec::with_capacity(rounds as usize);
        let mut prev = Instant::now();
        for k in 1..=total {
            if mech == Mechanism::EventFdAfterIdle {
                std::thread::sleep(IDLE_PAUSE);
                prev = Instant::now();
            }
            match mech {
                Mechanism::BusyOneLine => unreachable!("measured by cache_line_round_trips"),
                Mechanism::BusyTwoLines => {
                    mb.ping.store(k, Ordering::Release); // pairs with B's Acquire spin on ping
                    spin_until(&mb.pong, k);
                }
                Mechanism::Futex => {
                    mb.fping.store(k as u32, Ordering::Release); // pairs with B's futex_until
                    futex::wake(&mb.fping, 1, private);
                    futex_until(&mb.fpong, k as u32, private);
                }
                Mechanism::EventFd => {
                    to_b.signal(1).expect("eventfd write");
                    to_a.wait().expect("eventfd read");
                }
                Mechanism::EventFdAfterIdle => {
                    to_b.signal(1).expect("eventfd write");
                    spin_until(&mb.pong, k);
                }
            }
            let now = Instant::now();
            if k > warmup {
                samples.push(now.duration_since(prev).as_nanos() as u64);
            }
            prev = now;
        }
        summarize(&mut samples)
    };
    let responder = || {
        for k in 1..=total {
            match mech {
                Mechanism::BusyOneLine => unreachable!("measured by cache_line_round_trips"),
                Mechanism::BusyTwoLines => {
                    spin_until(&mb.ping, k);
                    mb.pong.store(k, Ordering::Release); // pairs with A's Acquire spin on pong
                }
                Mechanism::Futex => {
                    futex_until(&mb.fping, k as u32, private);
                    mb.fpong.store(k as u32, Ordering::Release); // pairs with A's futex_until
                    futex::wake(&mb.fpong, 1, private);
                }
                Mechanism::EventFd => {
                    to_b.wait().expect("eventfd read");
                    to_a.signal(1).expect("eventfd write");
                }
                Mechanism::EventFdAfterIdle => {
                    to_b.wait().expect("eventfd read");
                    mb.pong.store(k, Ordering::Release); // pairs with A's Acquire spin on pong
                }
            }
        }
    };
    run_pair(placement, cpus, initiator, responder).expect("ping-pong run")
}

fn main() {
    let args = LabArgs::parse("04_wakeup_cost: busy-poll vs futex vs eventfd round trip");
    let cpus = CpuPair::pick();
    print_header("04 wake-up cost");
    let clock = clock_overhead_ns();

    let mut table = Table::new(&[
        "mechanism",
        "placement",
        "round trips",
        "p50 ns",
        "p90 ns",
        "p99 ns",
        "p99.9 ns",
        "mean ns",
    ]);
    for mech in [
        Mechanism::BusyOneLine,
        Mechanism::BusyTwoLines,
        Mechanism::Futex,
        Mechanism::EventFd,
        Mechanism::EventFdAfterIdle,
    ] {
        let busy = matches!(mech, Mechanism::BusyOneLine | Mechanism::BusyTwoLines);
        let rounds = if busy {
            args.pick(2_000_000, 20_000)
        } else if mech == Mechanism::EventFdAfterIdle {
            // Each round pauses 1 ms first.
            args.pick(3_000, 200)
        } else {
            args.pick(200_000, 2_000)
        };
        for placement in [Placement::Threads, Placement::Processes] {
            let s = measure(mech, placement, cpus, rounds, rounds / 10);
            table.row(vec![
                mech.label().to_owned(),
                placement.label().to_owned(),
                s.count.to_string(),
                s.p50.to_string(),
                s.p90.to_string(),
                s.p99.to_string(),
                s.p999.to_string(),
                f(s.mean, 0),
            ]);
        }
    }
    println!(
        "Pinned to cpus {} and {}{}; one `Instant::now()` costs ~{clock} ns and is inside every sample.",
        cpus.a,
        cpus.b,
        if cpus.shared() {
            " (ONE cpu: busy-poll degenerates into time slices)"
        } else {
            ""
        }
    );
    println!();
    table.print();
}
