//! 05 — doorbell batching: what does waking a sleeping consumer cost per descriptor?
//!
//! A producer thread pushes N 64-byte descriptors into a nerva-rings ring (1024 slots) and
//! publishes them every K = 1, 8 or 64 descriptors (one Release store per publish). The consumer
//! thread drains the ring and, when it finds it empty, sleeps on an eventfd. Two doorbells:
//! - need-wakeup (nerva-rings `Notifier`/`Waiter`): after each publish the producer fences and
//!   writes the eventfd only if the consumer has announced sleep; the consumer announces, fences,
//!   re-checks the ring, then blocks (`poll`) and drains the eventfd (`read`) when woken;
//! - naive: the producer writes the eventfd after every publish; the consumer blocks in `read`
//!   whenever the ring is empty (the eventfd counter makes this race-free, at a syscall per
//!   publish).
//!
//! Reported: ns per descriptor (end-to-end, N / time), eventfd writes and consumer sleeps per
//! 1000 descriptors. Both threads pinned to different CPUs.

use std::hint::spin_loop;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use nerva_lab::affinity::CpuPair;
use nerva_lab::args::LabArgs;
use nerva_lab::eventfd::EventFd;
use nerva_lab::machine::print_header;
use nerva_lab::pair::{Placement, run_pair};
use nerva_lab::report::{Table, f};
use nerva_rings::{Descriptor, SpscRing, doorbell_pair};

const CAPACITY: u32 = 1024;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Doorbell {
    NeedWakeup,
    Naive,
}

struct Outcome {
    ns_per_descriptor: f64,
    writes: u64,
    sleeps: u64,
}

/// Stages `n` descriptors, publishing every `every`; calls `ring` after each publish.
fn produce(tx: &mut nerva_rings::Producer<Descriptor>, n: u64, every: u64, mut ring: impl FnMut()) {
    for seq in 0..n {
        let mut d = Descriptor::nop(seq, 0);
        loop {
            match tx.stage(d) {
                Ok(()) => break,
                Err(e) => {
                    // Full: publish what is staged (the consumer may be waiting for it).
                    d = e.into_inner();
                    tx.commit();
                    ring();
                    spin_loop();
                }
            }
        }
        if (seq + 1) % every == 0 || seq + 1 == n {
            tx.commit();
            ring();
        }
    }
}

/// Drains everything available, checking order; returns how many were taken.
fn drain(rx: &mut nerva_rings::Consumer<Descriptor>, expected: &mut u64) -> usize {
    rx.consume(usize::MAX, |d| {
        assert_eq!(d.tag(), *expected, "descriptor out of sequence");
        *expected += 1;
    })
    .expect("ring corrupt")
}

fn run(doorbell: Doorbell, every: u64, n: u64, cpus: CpuPair) -> Outcome {
    let (mut tx, mut rx) = SpscRing::<Descriptor>::with_capacity(CAPACITY).expect("ring");
    let sleeps = AtomicU64::new(0);
    let writes = AtomicU64::new(0);
    let start = Instant::now();
    match doorbell {
        Doorbell::NeedWakeup => {
            let (notifier, waiter) = doorbell_pair().expect("doorbell");
            run_pair(
                Placement::Threads,
                cpus,
                || {
                    let mut expected = 0;
                    while expected < n {
                        if drain(&mut rx, &mut expected) == 0 {
                            sleeps.fetch_add(1, Ordering::Relaxed);
                            waiter.wait(&mut rx, None).expect("wait");
                        }
                    }
                },
                || {
                    produce(&mut tx, n, every, || {
                        notifier.notify().expect("eventfd write");
                    });
                    writes.store(notifier.writes(), Ordering::Relaxed);
                },
            )
            .expect("run");
        }
        Doorbell::Naive => {
            let efd = EventFd::new().expect("eventfd");
            run_pair(
                Placement::Threads,
                cpus,
                || {
                    let mut expected = 0;
                    while expected < n {
                        if drain(&mut rx, &mut expected) == 0 {
                            sleeps.fetch_add(1, Ordering::Relaxed);
                            efd.wait().expect("eventfd read");
                        }
                    }
                },
                || {
                    let mut count = 0;
                    produce(&mut tx, n, every, || {
                        efd.signal(1).expect("eventfd write");
                        count += 1;
                    });
                    writes.store(count, Ordering::Relaxed);
                },
            )
            .expect("run");
        }
    }
    Outcome {
        ns_per_descriptor: start.elapsed().as_nanos() as f64 / n as f64,
        writes: writes.load(Ordering::Relaxed),
        sleeps: sleeps.load(Ordering::Relaxed),
    }
}

fn main() {
    let args = LabArgs::parse(
        "05_doorbell_batching: cost per descriptor when ringing every 1/8/64 descriptors",
    );
    let cpus = CpuPair::pick();
    print_header("05 doorbell batching");
    let n: u64 = args.pick(1_000_000, 20_000);

    let mut table = Table::new(&[
        "doorbell",
        "publish + ring every",
        "ns / descriptor",
        "eventfd writes / 1000 desc",
        "consumer sleeps / 1000 desc",
    ]);
    for doorbell in [Doorbell::NeedWakeup, Doorbell::Naive] {
        for every in [1u64, 8, 64] {
            let o = run(doorbell, every, n, cpus);
            table.row(vec![
                match doorbell {
                    Doorbell::NeedWakeup => "need-wakeup flag (nerva-rings)".into(),
                    Doorbell::Naive => "naive: always write eventfd".into(),
                },
                every.to_string(),
                f(o.ns_per_descriptor, 1),
                f(o.writes as f64 * 1000.0 / n as f64, 2),
                f(o.sleeps as f64 * 1000.0 / n as f64, 2),
            ]);
        }
    }
    println!(
        "{n} descriptors per run, ring of {CAPACITY}, threads pinned to cpus {} and {}.",
        cpus.a, cpus.b
    );
    println!();
    table.print();
}
