//! 06 — memory ordering: what goes wrong when the ring's Release/Acquire pair (or the doorbell's
//! fence) is weakened, and what this x86 machine can and cannot show.
//!
//! Two litmus tests, each with two pinned threads:
//!
//! 1. Message passing (MP) — the ring's publish: the producer writes an entry (`data`) then the
//!    tail (`flag`); the consumer reads the tail, then the entry. With `Relaxed` on both sides the
//!    language allows the consumer to see the new tail and the old entry. We count such stale
//!    reads. On x86-64 the count is 0 for a precise reason: x86-TSO never reorders a store with
//!    an older store nor a load with an older load, and the compiler emitted the accesses in
//!    program order here (Release/Acquire compile to the very same `mov`s as Relaxed on x86).
//!    The bug is real on ARM/POWER and under a compiler that reorders; on x86 only a model
//!    checker finds it: `rings/tests/loom_ring.rs::relaxed_publish_is_caught` weakens the publish
//!    to Relaxed and loom reports the causality violation.
//! 2. Store buffering (SB) — the doorbell handshake: the producer publishes the tail then checks
//!    the consumer's "sleeping" flag; the consumer sets "sleeping" then re-checks the tail.
//!    A lost wake-up is the outcome where *both* read the old value (producer: "nobody sleeps",
//!    consumer: "ring empty", and it blocks forever). Release/Acquire does NOT forbid this and
//!    x86 DOES do it in hardware (each store waits in its core's store buffer while the later
//!    load runs). A `SeqCst` fence between the store and the load on both sides forbids it.

use std::hint::spin_loop;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};

use crossbeam_utils::CachePadded;
use nerva_lab::affinity::CpuPair;
use nerva_lab::args::LabArgs;
use nerva_lab::machine::print_header;
use nerva_lab::report::Table;

/// Brings two threads to trial `i` at about the same moment. Release/Acquire on x86 adds no
/// fence, so this lock-step cannot hide the reordering under test.
fn lockstep(mine: &AtomicU64, theirs: &AtomicU64, i: usize) {
    mine.store(i as u64 + 1, Ordering::Release); // pairs with the peer's Acquire wait below
    while theirs.load(Ordering::Acquire) < i as u64 + 1 {
        spin_loop();
    }
}

fn fresh_lines(n: usize) -> Vec<CachePadded<AtomicU32>> {
    (0..n)
        .map(|_| CachePadded::new(AtomicU32::new(0)))
        .collect()
}

/// MP over `trials` fresh (entry, tail) pairs: returns (trials where the reader saw the new
/// tail, and among them those where it then read the old entry).
fn message_passing(weak: bool, trials: usize, cpus: CpuPair) -> (u64, u64) {
    let (entry, tail) = (fresh_lines(trials), fresh_lines(trials));
    let (progress_w, progress_r) = (
        CachePadded::new(AtomicU64::new(0)),
        CachePadded::new(AtomicU64::new(0)),
    );
    let (store, load) = if weak {
        (Ordering::Relaxed, Ordering::Relaxed)
    } else {
        (Ordering::Release, Ordering::Acquire)
    };
    std::thread::scope(|s| {
        s.spawn(|| {
            cpus.pin_a();
            for i in 0..trials {
                lockstep(&progress_w, &progress_r, i);
                entry[i].store(1, Ordering::Relaxed);
                tail[i].store(1, store); // the publish; Release (strong) pairs with the reader's Acquire
            }
        });
        s.spawn(|| {
            cpus.pin_b();
            let (mut seen, mut stale) = (0u64, 0u64);
            for i in 0..trials {
                lockstep(&progress_r, &progress_w, i);
                // Give the writer a moment to get its stores going, then race it.
                for _ in 0..(i % 8) {
                    spin_loop();
                }
                let t = tail[i].load(load); // Acquire (strong) pairs with the writer's Release
                let e = entry[i].load(Ordering::Relaxed);
                if t == 1 {
                    seen += 1;
                    if e == 0 {
                        stale += 1;
                    }
                }
            }
            (seen, stale)
        })
        .join()
        .unwrap_or((0, 0))
    })
}

#[derive(Clone, Copy)]
enum SbVariant {
    ReleaseAcquire,
    FencedSeqCst,
    SeqCstAccesses,
}

/// SB over `trials` fresh pairs of words: returns how many trials ended with both sides reading
/// the old value (a lost wake-up in the doorbell handshake).
fn store_buffering(variant: SbVariant, trials: usize, cpus: CpuPair) -> u64 {
    // Fresh words per trial, so no reset races; each word on its own line.
    let (tail, sleeping) = (fresh_lines(trials), fresh_lines(trials));
    let producer_saw: Vec<AtomicU32> = (0..trials).map(|_| AtomicU32::new(9)).collect();
    let consumer_saw: Vec<AtomicU32> = (0..trials).map(|_| AtomicU32::new(9)).collect();
    let progress_p = CachePadded::new(AtomicU64::new(0));
    let progress_c = CachePadded::new(AtomicU64::new(0));
    let (st, ld) = match variant {
        SbVariant::SeqCstAccesses => (Ordering::SeqCst, Ordering::SeqCst),
        _ => (Ordering::Release, Ordering::Acquire),
    };
    let fenced = matches!(variant, SbVariant::FencedSeqCst);

    let side = |mine: &AtomicU64,
                theirs: &AtomicU64,
                store_to: &[CachePadded<AtomicU32>],
                load_from: &[CachePadded<AtomicU32>],
                saw: &[AtomicU32]| {
        for i in 0..trials {
            lockstep(mine, theirs, i);
            store_to[i].store(1, st); // producer: publish tail / consumer: set "sleeping"
            if fenced {
                // The handshake's fence: orders the store above before the load below
                // (pairs with the same fence on the other side).
                fence(Ordering::SeqCst);
            }
            saw[i].store(load_from[i].load(ld), Ordering::Relaxed);
        }
    };
    std::thread::scope(|s| {
        s.spawn(|| {
            cpus.pin_a();
            side(&progress_p, &progress_c, &tail, &sleeping, &producer_saw);
        });
        s.spawn(|| {
            cpus.pin_b();
            side(&progress_c, &progress_p, &sleeping, &tail, &consumer_saw);
        });
    });
    producer_saw
        .iter()
        .zip(&consumer_saw)
        .filter(|(p, c)| p.load(Ordering::Relaxed) == 0 && c.load(Ordering::Relaxed) == 0)
        .count() as u64
}

fn main() {
    let args =
        LabArgs::parse("06_memory_ordering: message-passing and store-buffering litmus tests");
    let cpus = CpuPair::pick();
    print_header("06 memory ordering");
    // Two 128-byte lines per trial: 500 k trials = 128 MB.
    let trials: usize = args.pick(500_000, 10_000);

    let mut table = Table::new(&[
        "litmus (Nerva shape)",
        "orderings",
        "trials",
        "bad outcomes",
        "meaning",
    ]);
    for weak in [true, false] {
        let (seen, stale) = message_passing(weak, trials, cpus);
        table.row(vec![
            "MP (ring publish: entry, then tail)".into(),
            if weak {
                "Relaxed / Relaxed".into()
            } else {
                "Release / Acquire".into()
            },
            format!("{trials} ({seen} saw the new tail)"),
            format!("{stale} stale entries"),
            if weak {
                "allowed by the language; x86-TSO never shows it; loom does (rings/tests/loom_ring.rs relaxed_publish_is_caught)".into()
            } else {
                "forbidden".into()
            },
        ]);
    }
    for (variant, orderings, meaning) in [
        (
            SbVariant::ReleaseAcquire,
            "Release store; Acquire load",
            "allowed, and x86 does it: lost wake-ups (loom: rings/tests/loom_doorbell.rs dropping_the_sleep_fence_loses_a_wakeup)",
        ),
        (
            SbVariant::FencedSeqCst,
            "Release; fence(SeqCst); Acquire",
            "forbidden: the doorbell's fence",
        ),
        (
            SbVariant::SeqCstAccesses,
            "SeqCst store; SeqCst load",
            "forbidden (x86: xchg store)",
        ),
    ] {
        let lost = store_buffering(variant, trials, cpus);
        table.row(vec![
            "SB (doorbell: publish/check-sleeping vs set-sleeping/re-check)".into(),
            orderings.into(),
            trials.to_string(),
            format!("{lost} both-stale"),
            meaning.into(),
        ]);
    }
    println!("Threads pinned to cpus {} and {}.", cpus.a, cpus.b);
    println!();
    table.print();
}
