//! 02 — nerva-rings' SPSC ring vs `rtrb` vs `crossbeam_queue::ArrayQueue`, 64-byte entries.
//!
//! Throughput: a producer thread moves N `Descriptor`s (64 B) to a consumer thread through a
//! queue of 1024 slots; the consumer checks every sequence number and times first to last entry.
//! Our ring runs in a memfd mapping (as in a client segment) with single push/pop and with
//! batches of 32 published by one store (`push_slice` / `consume`); rtrb with push/pop and with
//! its slice API (`push_partial_slice` / `pop_partial_slice`); ArrayQueue (MPMC, CAS per op).
//!
//! Ping-pong: A sends an entry, B echoes it on a second queue; one sample per round trip. Our
//! ring also across two processes sharing the memfd. rtrb and ArrayQueue cannot: they live on
//! the heap of one process and hold pointers (`Arc`, `Box<[T]>`), meaningless in another address
//! space. The busy-poll cache-line round trip (experiment 04's reference) is measured in the
//! same run, so the acceptance ratio compares numbers taken under the same conditions.

use std::hint::spin_loop;
use std::sync::Arc;
use std::time::Instant;

use crossbeam_queue::ArrayQueue;
use crossbeam_utils::CachePadded;
use nerva_lab::affinity::CpuPair;
use nerva_lab::args::LabArgs;
use nerva_lab::cacheline::cache_line_round_trips;
use nerva_lab::machine::print_header;
use nerva_lab::pair::{Placement, run_pair};
use nerva_lab::report::{Table, f};
use nerva_lab::shm_ring::SharedRings;
use nerva_lab::stats::{Summary, median_f64, summarize};
use nerva_rings::Descriptor;
use std::sync::atomic::{AtomicU64, Ordering};

const CAPACITY: u32 = 1024;
/// Largest batch; the batch used is `batch()` (32 unless `--batch8` is given).
const BATCH: usize = 32;
static BATCH_USED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(BATCH);

/// Diagnostics for `--verbose`: how often the consumer found the queue empty and the producer
/// found it full (which side waits tells which regime the queue ran in). Each counter on its own
/// line, bumped only on the slow path.
static EMPTY_SPINS: CachePadded<AtomicU64> = CachePadded::new(AtomicU64::new(0));
static FULL_SPINS: CachePadded<AtomicU64> = CachePadded::new(AtomicU64::new(0));

fn empty_spin() {
    EMPTY_SPINS.fetch_add(1, Ordering::Relaxed);
    spin_loop();
}

fn full_spin() {
    FULL_SPINS.fetch_add(1, Ordering::Relaxed);
    spin_loop();
}

fn batch() -> usize {
    BATCH_USED.load(std::sync::atomic::Ordering::Relaxed)
}

const _: () = assert!(size_of::<Descriptor>() == 64);

fn entry(seq: u64) -> Descriptor {
    Descriptor::nop(seq, !seq)
}

/// A 64-byte ring entry that carries a sequence number. The ring copies entries with one
/// `read_volatile::<T>`, which LLVM lowers per *field* of `T`: `Descriptor` (17 fields) becomes
/// 17 loads per entry. The two probe types below have the same size and alignment but 8 and
/// 4 fields, to measure what the copy width costs on the very same ring code.
trait Entry: nerva_rings::Pod + Default {
    fn with_seq(seq: u64) -> Self;
    fn seq(&self) -> u64;
}

impl Entry for Descriptor {
    fn with_seq(seq: u64) -> Self {
        entry(seq)
    }
    fn seq(&self) -> u64 {
        self.tag()
    }
}

/// Eight u64 words: a volatile copy is 8 loads.
#[derive(Clone, Copy, Default)]
#[repr(C, align(64))]
struct Words8([u64; 8]);

// SAFETY: plain integers, no padding (64 bytes of u64), any bit pattern valid, no pointers.
unsafe impl nerva_rings::Pod for Words8 {}

impl Entry for Words8 {
    fn with_seq(seq: u64) -> Self {
        Self([seq, !seq, 0, 0, 0, 0, 0, 0])
    }
    fn seq(&self) -> u64 {
        self.0[0]
    }
}

/// Four 16-byte SSE vectors: a volatile copy is 4 loads (SSE2 is baseline on x86-64).
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Vectors4([core::arch::x86_64::__m128i; 4]);

#[cfg(target_arch = "x86_64")]
impl Default for Vectors4 {
    fn default() -> Self {
        Self::with_seq(0)
    }
}

// SAFETY: SIMD integer vectors accept every bit pattern; 64 bytes, no padding, no pointers.
#[cfg(target_arch = "x86_64")]
unsafe impl nerva_rings::Pod for Vectors4 {}

#[cfg(target_arch = "x86_64")]
impl Entry for Vectors4 {
    fn with_seq(seq: u64) -> Self {
        // SAFETY: `[u64; 8]` and `[__m128i; 4]` have the same size; every bit pattern is valid.
        Self(unsafe {
            std::mem::transmute::<[u64; 8], [core::arch::x86_64::__m128i; 4]>([
                seq, !seq, 0, 0, 0, 0, 0, 0,
            ])
        })
    }
    fn seq(&self) -> u64 {
        // SAFETY: as above, the other way round.
        unsafe { std::mem::transmute::<[core::arch::x86_64::__m128i; 4], [u64; 8]>(self.0)[0] }
    }
}

/// Consumer-side bookkeeping: checks order, times first to last entry.
struct Tally {
    expected: u64,
    start: Option<Instant>,
}

impl Tally {
    fn new() -> Self {
        Self {
            expected: 0,
            start: None,
        }
    }

    #[inline]
    fn take<E: Entry>(&mut self, d: &E) {
        if self.start.is_none() {
            self.start = Some(Instant::now());
        }
        // Lost, duplicated or reordered entries would make the throughput figure a lie.
        assert_eq!(d.seq(), self.expected, "entry out of sequence");
        // A real consumer uses the whole entry: without this, a queue that copies with a plain
        // `ptr::read` gets its 60 unused bytes optimised away, one that copies with a volatile
        // read does not, and the comparison would not be like for like.
        std::hint::black_box(d);
        self.expected += 1;
    }

    /// Million entries per second over the `n - 1` intervals after the first entry.
    fn rate(&self, n: u64) -> f64 {
        let secs = self.start.map_or(f64::NAN, |s| s.elapsed().as_secs_f64());
        (n - 1) as f64 / secs / 1e6
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
#[allow(clippy::enum_variant_names)] // `ArrayQueue` is the crate type's name
enum Queue {
    Ours,
    OursWords8,
    OursVectors4,
    OursHeap,
    OursConsume1,
    OursBatched,
    OursBatchedWords8,
    OursBatchedVectors4,
    Rtrb,
    RtrbSlices,
    ArrayQueue,
    /// Lab replica of the ring protocol (ablation): (wide copy, lazy release, inlined pop).
    Replica(bool, bool, bool),
    /// Replica with wide reads, lazy release, inlined pop and a plain producer write.
    ReplicaPlainStore,
}

impl Queue {
    fn label(self) -> &'static str {
        match self {
            Self::Ours => "nerva-rings push/pop",
            Self::OursWords8 => "nerva-rings push/pop, probe entry [u64; 8]",
            Self::OursVectors4 => "nerva-rings push/pop, probe entry 4 x __m128i",
            Self::OursHeap => "nerva-rings push/pop, heap ring (with_capacity)",
            Self::OursConsume1 => "nerva-rings push / consume(1) (closure, no by-value return)",
            Self::OursBatchedWords8 => "nerva-rings batch 32, probe entry [u64; 8]",
            Self::OursBatchedVectors4 => "nerva-rings batch 32, probe entry 4 x __m128i",
            Self::Replica(false, false, false) => {
                "replica: as nerva-rings (field copy, release per pop, outlined pop)"
            }
            Self::Replica(false, false, true) => "replica: + inlined pop",
            Self::Replica(true, false, true) => "replica: + inlined pop + 4 x 16 B copy",
            Self::Replica(false, true, true) => "replica: + inlined pop + lazy release",
            Self::Replica(true, true, true) => {
                "replica: + inlined pop + 4 x 16 B copy + lazy release"
            }
            Self::Replica(true, true, false) => {
                "replica: + 4 x 16 B copy + lazy release (outlined pop)"
            }
            Self::Replica(..) => "replica: other combination",
            Self::ReplicaPlainStore => {
                "replica: + inlined pop + 4 x 16 B read + lazy release + plain ptr::write push"
            }
            Self::OursBatched => "nerva-rings batch 32 (push_slice/consume)",
            Self::Rtrb => "rtrb push/pop",
            Self::RtrbSlices => "rtrb batch 32 (push/pop_partial_slice)",
            Self::ArrayQueue => "crossbeam ArrayQueue push/pop",
        }
    }
}

/// Consumer loop of the nerva-rings throughput runs; returns M entries/s.
/// `per_call`: 0 = `pop()`, k = `consume(k, ..)` (which releases once per call).
fn ours_consume<E: Entry>(rx: &mut nerva_rings::Consumer<E>, per_call: usize, n: u64) -> f64 {
    let mut tally = Tally::new();
    while tally.expected < n {
        let got = if per_call > 0 {
            rx.consume(per_call, |d| tally.take(&d))
                .expect("ring corrupt")
        } else {
            match rx.pop().expect("ring corrupt") {
                Some(d) => {
                    tally.take(&d);
                    1
                }
                None => 0,
            }
        };
        if got == 0 {
            empty_spin();
        }
    }
    tally.rate(n)
}

fn per_call(batched: bool) -> usize {
    if batched { batch() } else { 0 }
}

/// Producer loop of the nerva-rings throughput runs.
fn ours_produce<E: Entry>(tx: &mut nerva_rings::Producer<E>, batched: bool, n: u64) {
    if batched {
        let mut next = 0;
        while next < n {
            let len = (n - next).min(batch() as u64);
            let batch: [E; BATCH] = std::array::from_fn(|i| E::with_seq(next + i as u64));
            let mut off = 0;
            while off < len as usize {
                let k = tx
                    .push_slice(&batch[off..len as usize])
                    .expect("ring corrupt");
                if k == 0 {
                    full_spin();
                }
                off += k;
            }
            next += len;
        }
    } else {
        for seq in 0..n {
            let mut d = E::with_seq(seq);
            while let Err(e) = tx.push(d) {
                d = e.into_inner();
                full_spin();
            }
        }
    }
}

/// nerva-rings in a memfd mapping (as in a client segment), threads or processes.
fn ours_throughput<E: Entry>(batched: bool, placement: Placement, cpus: CpuPair, n: u64) -> f64 {
    let rings = SharedRings::<E>::new(1, CAPACITY).expect("shared ring");
    run_pair(
        placement,
        cpus,
        || {
            ours_consume(
                &mut rings.consumer(0).expect("consumer"),
                per_call(batched),
                n,
            )
        },
        || ours_produce(&mut rings.producer(0).expect("producer"), batched, n),
    )
    .expect("run")
}

/// nerva-rings on the heap (`SpscRing::with_capacity`), threads: isolates the memory placement.
fn ours_heap_throughput(batched: bool, cpus: CpuPair, n: u64) -> f64 {
    let (tx, rx) = nerva_rings::SpscRing::<Descriptor>::with_capacity(CAPACITY).expect("ring");
    // Each half on its own 128-byte pair (see `replica_throughput`).
    let (mut tx, mut rx) = (CachePadded::new(tx), CachePadded::new(rx));
    run_pair(
        Placement::Threads,
        cpus,
        move || ours_consume(&mut rx, per_call(batched), n),
        move || ours_produce(&mut tx, batched, n),
    )
    .expect("run")
}

/// The ablation replica (lab/src/ring_replica.rs), threads, single push/pop.
fn replica_throughput<const WIDE: bool, const LAZY: bool>(
    plain_store: bool,
    inlined: bool,
    cpus: CpuPair,
    n: u64,
) -> f64 {
    let (tx, rx) = nerva_lab::ring_replica::replica::<Descriptor, WIDE, LAZY>(CAPACITY);
    // Each half on its own 128-byte pair: the halves are moved into heap-allocated thread
    // closures, and two halves' private indices on one line would be false sharing that
    // measures the allocator, not the queue.
    let (mut tx, mut rx) = (CachePadded::new(tx), CachePadded::new(rx));
    run_pair(
        Placement::Threads,
        cpus,
        move || {
            let mut tally = Tally::new();
            while tally.expected < n {
                let got = if inlined { rx.pop() } else { rx.pop_outlined() };
                match got {
                    Some(d) => tally.take(&d),
                    None => empty_spin(),
                }
            }
            tally.rate(n)
        },
        move || {
            for seq in 0..n {
                let mut d = entry(seq);
                loop {
                    let pushed = if plain_store {
                        tx.push_plain(d)
                    } else {
                        tx.push(d)
                    };
                    match pushed {
                        Ok(()) => break,
                        Err(back) => {
                            d = back;
                            full_spin();
                        }
                    }
                }
            }
        },
    )
    .expect("run")
}

fn throughput(queue: Queue, placement: Placement, cpus: CpuPair, n: u64) -> f64 {
    match queue {
        Queue::Replica(false, false, inl) => {
            replica_throughput::<false, false>(false, inl, cpus, n)
        }
        Queue::Replica(true, false, inl) => replica_throughput::<true, false>(false, inl, cpus, n),
        Queue::Replica(false, true, inl) => replica_throughput::<false, true>(false, inl, cpus, n),
        Queue::Replica(true, true, inl) => replica_throughput::<true, true>(false, inl, cpus, n),
        Queue::ReplicaPlainStore => replica_throughput::<true, true>(true, true, cpus, n),
        Queue::Ours | Queue::OursBatched => {
            ours_throughput::<Descriptor>(queue == Queue::OursBatched, placement, cpus, n)
        }
        Queue::OursWords8 => ours_throughput::<Words8>(false, placement, cpus, n),
        Queue::OursHeap => ours_heap_throughput(false, cpus, n),
        Queue::OursConsume1 => {
            let rings = SharedRings::<Descriptor>::new(1, CAPACITY).expect("shared ring");
            run_pair(
                placement,
                cpus,
                || ours_consume(&mut rings.consumer(0).expect("consumer"), 1, n),
                || ours_produce(&mut rings.producer(0).expect("producer"), false, n),
            )
            .expect("run")
        }
        Queue::OursBatchedWords8 => ours_throughput::<Words8>(true, placement, cpus, n),
        #[cfg(target_arch = "x86_64")]
        Queue::OursBatchedVectors4 => ours_throughput::<Vectors4>(true, placement, cpus, n),
        #[cfg(not(target_arch = "x86_64"))]
        Queue::OursBatchedVectors4 => f64::NAN,
        #[cfg(target_arch = "x86_64")]
        Queue::OursVectors4 => ours_throughput::<Vectors4>(false, placement, cpus, n),
        #[cfg(not(target_arch = "x86_64"))]
        Queue::OursVectors4 => f64::NAN,
        Queue::Rtrb | Queue::RtrbSlices => {
            let (tx, rx) = rtrb::RingBuffer::<Descriptor>::new(CAPACITY as usize);
            // Each half on its own 128-byte pair (see `ours_heap_throughput`).
            let (mut tx, mut rx) = (CachePadded::new(tx), CachePadded::new(rx));
            let sliced = queue == Queue::RtrbSlices;
            run_pair(
                Placement::Threads,
                cpus,
                move || {
                    let mut tally = Tally::new();
                    let mut buf = [Descriptor::default(); BATCH];
                    while tally.expected < n {
                        let got = if sliced {
                            let (popped, _) = rx.pop_partial_slice(&mut buf[..batch()]);
                            popped.iter().for_each(|d| tally.take(d));
                            popped.len()
                        } else {
                            match rx.pop() {
                                Ok(d) => {
                                    tally.take(&d);
                                    1
                                }
                                Err(_) => 0,
                            }
                        };
                        if got == 0 {
                            empty_spin();
                        }
                    }
                    tally.rate(n)
                },
                move || {
                    if sliced {
                        let mut next = 0;
                        while next < n {
                            let len = (n - next).min(batch() as u64);
                            let batch: [Descriptor; BATCH] =
                                std::array::from_fn(|i| entry(next + i as u64));
                            let mut rest = &batch[..len as usize];
                            while !rest.is_empty() {
                                let (pushed, left) = tx.push_partial_slice(rest);
                                if pushed.is_empty() {
                                    full_spin();
                                }
                                rest = left;
                            }
                            next += len;
                        }
                    } else {
                        for seq in 0..n {
                            let mut d = entry(seq);
                            while let Err(rtrb::PushError::Full(back)) = tx.push(d) {
                                d = back;
                                full_spin();
                            }
                        }
                    }
                },
            )
            .expect("run")
        }
        Queue::ArrayQueue => {
            let q = Arc::new(ArrayQueue::<Descriptor>::new(CAPACITY as usize));
            let (qc, qp) = (q.clone(), q);
            run_pair(
                Placement::Threads,
                cpus,
                move || {
                    let mut tally = Tally::new();
                    while tally.expected < n {
                        match qc.pop() {
                            Some(d) => tally.take(&d),
                            None => empty_spin(),
                        }
                    }
                    tally.rate(n)
                },
                move || {
                    for seq in 0..n {
                        let mut d = entry(seq);
                        while let Err(back) = qp.push(d) {
                            d = back;
                            full_spin();
                        }
                    }
                },
            )
            .expect("run")
        }
    }
}

/// A: send seq on the forward queue, spin for its echo; B: echo. One sample per round trip.
fn ping_pong(queue: Queue, placement: Placement, cpus: CpuPair, rounds: u64) -> Summary {
    let warmup = rounds / 10;
    let total = rounds + warmup;
    // Generic over how a side sends and receives, so every queue runs the identical loop.
    fn initiator(
        total: u64,
        warmup: u64,
        mut send: impl FnMut(Descriptor),
        mut recv: impl FnMut() -> Option<Descriptor>,
    ) -> Summary {
        let mut samples = Vec::with_capacity((total - warmup) as usize);
        let mut prev = Instant::now();
        for seq in 0..total {
            send(entry(seq));
            let back = loop {
                match recv() {
                    Some(d) => break d,
                    None => spin_loop(),
                }
            };
            assert_eq!(back.tag(), seq, "echo out of sequence");
            let now = Instant::now();
            if seq >= warmup {
                samples.push(now.duration_since(prev).as_nanos() as u64);
            }
            prev = now;
        }
        summarize(&mut samples)
    }
    fn responder(
        total: u64,
        mut send: impl FnMut(Descriptor),
        mut recv: impl FnMut() -> Option<Descriptor>,
    ) {
        for _ in 0..total {
            let d = loop {
                match recv() {
                    Some(d) => break d,
                    None => spin_loop(),
                }
            };
            send(d);
        }
    }
    fn replica_ping_pong<const WIDE: bool, const LAZY: bool>(
        cpus: CpuPair,
        total: u64,
        warmup: u64,
    ) -> Summary {
        let (atx, brx) = nerva_lab::ring_replica::replica::<Descriptor, WIDE, LAZY>(CAPACITY);
        let (btx, arx) = nerva_lab::ring_replica::replica::<Descriptor, WIDE, LAZY>(CAPACITY);
        // Each half on its own 128-byte pair (see `replica_throughput`).
        let (mut atx, mut brx) = (CachePadded::new(atx), CachePadded::new(brx));
        let (mut btx, mut arx) = (CachePadded::new(btx), CachePadded::new(arx));
        run_pair(
            Placement::Threads,
            cpus,
            move || {
                initiator(
                    total,
                    warmup,
                    |d| atx.push(d).map_err(|_| ()).expect("cannot be full"),
                    || arx.pop(),
                )
            },
            move || {
                responder(
                    total,
                    |d| btx.push(d).map_err(|_| ()).expect("cannot be full"),
                    || brx.pop(),
                )
            },
        )
        .expect("run")
    }
    match queue {
        Queue::Ours
        | Queue::OursBatched
        | Queue::OursWords8
        | Queue::OursVectors4
        | Queue::OursHeap
        | Queue::OursConsume1
        | Queue::OursBatchedWords8
        | Queue::OursBatchedVectors4
        | Queue::ReplicaPlainStore => {
            let rings = SharedRings::<Descriptor>::new(2, CAPACITY).expect("shared rings");
            run_pair(
                placement,
                cpus,
                || {
                    let (mut tx, mut rx) = (
                        rings.producer(0).expect("tx"),
                        rings.consumer(1).expect("rx"),
                    );
                    initiator(
                        total,
                        warmup,
                        |d| tx.push(d).expect("ping ring cannot be full"),
                        || rx.pop().expect("ring corrupt"),
                    )
                },
                || {
                    let (mut tx, mut rx) = (
                        rings.producer(1).expect("tx"),
                        rings.consumer(0).expect("rx"),
                    );
                    responder(
                        total,
                        |d| tx.push(d).expect("pong ring cannot be full"),
                        || rx.pop().expect("ring corrupt"),
                    );
                },
            )
            .expect("run")
        }
        Queue::Replica(false, false, _) => replica_ping_pong::<false, false>(cpus, total, warmup),
        Queue::Replica(true, false, _) => replica_ping_pong::<true, false>(cpus, total, warmup),
        Queue::Replica(false, true, _) => replica_ping_pong::<false, true>(cpus, total, warmup),
        Queue::Replica(true, true, _) => replica_ping_pong::<true, true>(cpus, total, warmup),
        Queue::Rtrb | Queue::RtrbSlices => {
            let (atx, brx) = rtrb::RingBuffer::<Descriptor>::new(CAPACITY as usize);
            let (btx, arx) = rtrb::RingBuffer::<Descriptor>::new(CAPACITY as usize);
            // Each half on its own 128-byte pair (see `ours_heap_throughput`).
            let (mut atx, mut brx) = (CachePadded::new(atx), CachePadded::new(brx));
            let (mut btx, mut arx) = (CachePadded::new(btx), CachePadded::new(arx));
            run_pair(
                Placement::Threads,
                cpus,
                move || {
                    initiator(
                        total,
                        warmup,
                        |d| atx.push(d).expect("cannot be full"),
                        || arx.pop().ok(),
                    )
                },
                move || {
                    responder(
                        total,
                        |d| btx.push(d).expect("cannot be full"),
                        || brx.pop().ok(),
                    )
                },
            )
            .expect("run")
        }
        Queue::ArrayQueue => {
            let (ab, ba) = (
                Arc::new(ArrayQueue::new(CAPACITY as usize)),
                Arc::new(ArrayQueue::new(CAPACITY as usize)),
            );
            let (ab2, ba2) = (ab.clone(), ba.clone());
            run_pair(
                Placement::Threads,
                cpus,
                move || {
                    initiator(
                        total,
                        warmup,
                        |d| ab.push(d).expect("cannot be full"),
                        || ba.pop(),
                    )
                },
                move || {
                    responder(
                        total,
                        |d| ba2.push(d).expect("cannot be full"),
                        || ab2.pop(),
                    )
                },
            )
            .expect("run")
        }
    }
}

fn main() {
    let args = LabArgs::parse_with(
        "02_ring_compare: nerva-rings vs rtrb vs crossbeam ArrayQueue, 64-byte entries",
        &[
            ("--verbose", "print every repetition's throughput to stderr"),
            (
                "--batch8",
                "batches of 8 instead of 32 (both rings; diagnostic)",
            ),
            (
                "--diagnose",
                "add the diagnosis rows (probe entry types, heap ring, consume(1), replicas)",
            ),
        ],
    );
    if args.has("--batch8") {
        BATCH_USED.store(8, std::sync::atomic::Ordering::Relaxed);
    }
    let cpus = CpuPair::pick();
    print_header("02 ring compare");
    let n: u64 = args.pick(5_000_000, 200_000);
    let reps = args.pick(3, 1);
    let rounds: u64 = args.pick(500_000, 10_000);

    let verbose = args.has("--verbose");
    let tp = |queue: Queue, placement: Placement| {
        let mut v = Vec::new();
        let mut waits = Vec::new();
        for _ in 0..reps {
            let (e0, f0) = (
                EMPTY_SPINS.load(Ordering::Relaxed),
                FULL_SPINS.load(Ordering::Relaxed),
            );
            v.push(throughput(queue, placement, cpus, n));
            // Forked producers count in their own copy of the statics: only threads report.
            waits.push((
                (EMPTY_SPINS.load(Ordering::Relaxed) - e0) as f64 / n as f64,
                (FULL_SPINS.load(Ordering::Relaxed) - f0) as f64 / n as f64,
            ));
        }
        if verbose {
            let rates: Vec<String> = v.iter().map(|r| f(*r, 1)).collect();
            let w: Vec<String> = waits
                .iter()
                .map(|(e, f_)| format!("{}/{}", f(*e, 2), f(*f_, 2)))
                .collect();
            eprintln!(
                "{} / {}: M/s {:?}; empty-spins/full-spins per entry {:?}",
                queue.label(),
                placement.label(),
                rates,
                w
            );
        }
        median_f64(&mut v)
    };
    let diagnose = args.has("--diagnose");
    // The acceptance rows come first, at fixed positions (the verdict below indexes them).
    let mut rows: Vec<(Queue, Placement)> = vec![
        (Queue::Ours, Placement::Threads),
        (Queue::OursBatched, Placement::Threads),
        (Queue::Rtrb, Placement::Threads),
        (Queue::RtrbSlices, Placement::Threads),
        (Queue::ArrayQueue, Placement::Threads),
        (Queue::Ours, Placement::Processes),
        (Queue::OursBatched, Placement::Processes),
    ];
    let diagnosis_rows = [
        (Queue::OursWords8, Placement::Threads),
        (Queue::OursVectors4, Placement::Threads),
        (Queue::OursHeap, Placement::Threads),
        (Queue::OursConsume1, Placement::Threads),
        (Queue::OursBatchedWords8, Placement::Threads),
        (Queue::OursBatchedVectors4, Placement::Threads),
        (Queue::Replica(false, false, false), Placement::Threads),
        (Queue::Replica(false, false, true), Placement::Threads),
        (Queue::Replica(true, false, true), Placement::Threads),
        (Queue::Replica(false, true, true), Placement::Threads),
        (Queue::Replica(true, true, true), Placement::Threads),
        (Queue::Replica(true, true, false), Placement::Threads),
        (Queue::ReplicaPlainStore, Placement::Threads),
    ];
    if diagnose {
        rows.extend(diagnosis_rows);
    }
    let tps: Vec<f64> = rows.iter().map(|&(q, p)| tp(q, p)).collect();
    let mut lat_rows = vec![
        (Queue::Ours, Placement::Threads),
        (Queue::Ours, Placement::Processes),
        (Queue::Rtrb, Placement::Threads),
        (Queue::ArrayQueue, Placement::Threads),
    ];
    if diagnose {
        lat_rows.extend([
            (Queue::Replica(false, false, false), Placement::Threads),
            (Queue::Replica(true, true, true), Placement::Threads),
        ]);
    }
    let lat: Vec<(Queue, Placement, Summary)> = lat_rows
        .into_iter()
        .map(|(q, p)| (q, p, ping_pong(q, p, cpus, rounds)))
        .collect();
    let line_threads = cache_line_round_trips(Placement::Threads, cpus, rounds, rounds / 10)
        .expect("cache line run");
    let line_procs = cache_line_round_trips(Placement::Processes, cpus, rounds, rounds / 10)
        .expect("cache line run");

    let rtrb_tp = tps[2];
    let rtrb_slices_tp = tps[3];
    let ours_proc_p50 = lat[1].2.p50 as f64;
    println!(
        "{n} entries per throughput run (median of {reps}), {rounds} round trips per ping-pong, {CAPACITY} slots, \
         cpus {} and {}{}.",
        cpus.a,
        cpus.b,
        if cpus.shared() { " (ONE cpu!)" } else { "" }
    );
    println!();
    println!("Acceptance (issue 2):");
    println!(
        "- push/pop throughput ≥ rtrb push/pop: {} ({} vs {} M/s)",
        if tps[0] >= rtrb_tp { "HOLDS" } else { "FAILS" },
        f(tps[0], 1),
        f(rtrb_tp, 1)
    );
    println!(
        "- batched throughput ≥ rtrb (push/pop and slices): {} ({} vs {} / {} M/s)",
        if tps[1] >= rtrb_tp && tps[1] >= rtrb_slices_tp {
            "HOLDS"
        } else {
            "FAILS"
        },
        f(tps[1], 1),
        f(rtrb_tp, 1),
        f(rtrb_slices_tp, 1)
    );
    println!(
        "- cross-process ping-pong p50 ≤ 2 × cache-line round trip across processes: {} ({} ns vs 2 × {} ns; ratio {})",
        if ours_proc_p50 <= 2.0 * line_procs.p50 as f64 {
            "HOLDS"
        } else {
            "FAILS"
        },
        lat[1].2.p50,
        line_procs.p50,
        f(ours_proc_p50 / line_procs.p50 as f64, 2)
    );
    println!();

    let mut table = Table::new(&[
        "queue",
        "placement",
        "throughput M entries/s",
        "vs rtrb push/pop",
        "round trip p50 ns",
        "p99 ns",
        "p99.9 ns",
    ]);
    for (i, &(q, p)) in rows.iter().enumerate() {
        let latency = lat
            .iter()
            .find(|(lq, lp, _)| *lq == q && *lp == p)
            .map(|(_, _, s)| *s);
        let cells = |s: Option<Summary>| match s {
            Some(s) => [s.p50.to_string(), s.p99.to_string(), s.p999.to_string()],
            None => ["—".to_owned(), "—".to_owned(), "—".to_owned()],
        };
        let [p50, p99, p999] = cells(latency);
        table.row(vec![
            q.label().into(),
            p.label().into(),
            f(tps[i], 1),
            format!("{}x", f(tps[i] / rtrb_tp, 2)),
            p50,
            p99,
            p999,
        ]);
    }
    for q in [Queue::Rtrb, Queue::ArrayQueue] {
        table.row(vec![
            q.label().into(),
            "processes".into(),
            "impossible: heap + pointers".into(),
            "—".into(),
            "—".into(),
            "—".into(),
            "—".into(),
        ]);
    }
    for (label, s) in [("threads", line_threads), ("processes", line_procs)] {
        table.row(vec![
            "reference: one cache line, busy-poll (04)".into(),
            label.into(),
            "—".into(),
            "—".into(),
            s.p50.to_string(),
            s.p99.to_string(),
            s.p999.to_string(),
        ]);
    }
    table.print();
}
