//! 01 — false sharing: two threads, each incrementing only its own counter.
//!
//! Three layouts of the same pair of `AtomicU64` counters:
//! - same line: adjacent 8-byte fields, one 64-byte cache line;
//! - padded 64: each counter on its own 64-byte line, both lines in one 128-byte aligned pair
//!   (so the adjacent-line prefetcher, if the CPU has one, still couples them);
//! - padded 128: `crossbeam_utils::CachePadded` (128 bytes on x86-64).
//!
//! Plus a single-thread baseline (no second writer at all). Each variant is repeated and the
//! median reported. The counters never share data, so every slowdown is the coherence
//! protocol moving the line back and forth.

use std::hint::black_box;
use std::sync::Barrier;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crossbeam_utils::CachePadded;
use nerva_lab::affinity::CpuPair;
use nerva_lab::args::LabArgs;
use nerva_lab::machine::print_header;
use nerva_lab::report::{Table, f};
use nerva_lab::stats::median_f64;

/// Both counters in one cache line.
#[repr(C, align(64))]
#[derive(Default)]
struct SameLine {
    a: AtomicU64,
    b: AtomicU64,
}

/// One counter per 64-byte line.
#[repr(C, align(64))]
#[derive(Default)]
struct Line64(AtomicU64);

/// Two 64-byte lines inside one 128-byte aligned block: the adjacent-line pair.
#[repr(C, align(128))]
#[derive(Default)]
struct Padded64 {
    a: Line64,
    b: Line64,
}

/// `CachePadded` = 128 bytes on x86-64: each counter alone in its 128-byte pair of lines.
#[repr(C)]
#[derive(Default)]
struct Padded128 {
    a: CachePadded<AtomicU64>,
    b: CachePadded<AtomicU64>,
}

const _: () = assert!(size_of::<SameLine>() == 64);
const _: () = assert!(size_of::<Padded64>() == 128);
const _: () = assert!(size_of::<Padded128>() >= 256 || size_of::<CachePadded<u64>>() < 128);

fn hammer(counter: &AtomicU64, ops: u64) {
    for _ in 0..ops {
        // A locked read-modify-write, like a ring index or a statistics counter bumped per op.
        counter.fetch_add(1, Ordering::Relaxed);
    }
    black_box(counter.load(Ordering::Relaxed));
}

/// Runs two pinned threads on `a` and `b`; returns ns per increment (per thread), measured
/// from the common start to the moment both have finished.
fn two_writers(a: &AtomicU64, b: &AtomicU64, ops: u64, cpus: CpuPair) -> f64 {
    let barrier = Barrier::new(3);
    let start = std::thread::scope(|s| {
        s.spawn(|| {
            cpus.pin_a();
            barrier.wait();
            hammer(a, ops);
        });
        s.spawn(|| {
            cpus.pin_b();
            barrier.wait();
            hammer(b, ops);
        });
        barrier.wait();
        Instant::now()
        // The scope joins both writers before it returns.
    });
    start.elapsed().as_nanos() as f64 / ops as f64
}

fn one_writer(a: &AtomicU64, ops: u64, cpus: CpuPair) -> f64 {
    std::thread::scope(|s| {
        s.spawn(|| {
            cpus.pin_a();
            let start = Instant::now();
            hammer(a, ops);
            start.elapsed().as_nanos() as f64 / ops as f64
        })
        .join()
        .unwrap_or(f64::NAN)
    })
}

fn main() {
    let args = LabArgs::parse("01_false_sharing: same line vs padded 64 vs padded 128");
    let ops: u64 = args.pick(20_000_000, 300_000);
    let reps = args.pick(5, 1);
    let cpus = CpuPair::pick();
    print_header("01 false sharing");

    let same = Box::new(SameLine::default());
    let p64 = Box::new(Padded64::default());
    let p128 = Box::new(Padded128::default());

    let variants: [(&str, &str, &dyn Fn() -> f64); 4] = [
        ("single thread (baseline)", "-", &|| {
            one_writer(&p128.a, ops, cpus)
        }),
        ("same line", "8 B apart", &|| {
            two_writers(&same.a, &same.b, ops, cpus)
        }),
        ("padded 64", "64 B apart, same 128 B pair", &|| {
            two_writers(&p64.a.0, &p64.b.0, ops, cpus)
        }),
        ("padded 128 (CachePadded)", "128 B apart", &|| {
            two_writers(&p128.a, &p128.b, ops, cpus)
        }),
    ];

    let mut results = Vec::new();
    for (name, distance, run) in variants {
        run(); // warm-up: fault the pages in, settle the clocks
        let mut v: Vec<f64> = (0..reps).map(|_| run()).collect();
        results.push((name, distance, median_f64(&mut v)));
    }

    println!(
        "{ops} relaxed `fetch_add`s per thread, median of {reps} runs; threads pinned to cpus {} and {}{}.",
        cpus.a,
        cpus.b,
        if cpus.shared() {
            " (ONE cpu: threads time-share, no coherence traffic)"
        } else {
            ""
        }
    );
    println!();
    let padded128 = results[3].2;
    let mut table = Table::new(&["layout", "counter distance", "ns/op", "vs padded 128"]);
    for (name, distance, ns) in &results {
        table.row(vec![
            (*name).to_owned(),
            (*distance).to_owned(),
            f(*ns, 2),
            format!("{}x", f(ns / padded128, 2)),
        ]);
    }
    table.print();
}
