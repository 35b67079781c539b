//! 03 — huge pages vs 4 KiB pages: what does the TLB cost on random reads over a large arena?
//!
//! One arena size for all backings (2 GiB, scaled to a quarter of `MemAvailable`, a power
//! of two): hugetlb (`MAP_HUGETLB`; if none are reserved and we are root, a few are reserved
//! for the run and `nr_hugepages` is restored right after the arena is populated — pages in use
//! then become surplus and are freed on unmap), transparent huge pages (`MADV_HUGEPAGE`, with
//! what we actually got read back from `/proc/self/smaps`), and plain 4 KiB pages
//! (`MADV_NOHUGEPAGE`). Two access patterns:
//! - dependent: each read's address depends on the previous read's value (pointer-chase
//!   latency: every TLB miss is a page walk on the critical path);
//! - independent: addresses from a PRNG only (the CPU overlaps many misses).

use std::hint::black_box;
use std::time::Instant;

use nerva_lab::arena::{Arena, Backing, HUGE_PAGE, HugeTlbReservation, meminfo};
use nerva_lab::args::LabArgs;
use nerva_lab::machine::print_header;
use nerva_lab::report::{Table, f};

fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// ns per read when each address depends on the value just read.
fn dependent_reads(words: &[u64], reads: u64) -> f64 {
    let mask = words.len() as u64 - 1; // len is a power of two
    let (mut x, mut v) = (0x9E37_79B9_7F4A_7C15_u64, 0u64);
    let start = Instant::now();
    for _ in 0..reads {
        let idx = ((xorshift(&mut x) ^ v) & mask) as usize;
        v = words[idx];
    }
    black_box(v);
    start.elapsed().as_nanos() as f64 / reads as f64
}

/// ns per read when addresses are independent of the data (memory-level parallelism).
fn independent_reads(words: &[u64], reads: u64) -> f64 {
    let mask = words.len() as u64 - 1;
    let (mut x, mut sum) = (0x2545_F491_4F6C_DD1D_u64, 0u64);
    let start = Instant::now();
    for _ in 0..reads {
        sum = sum.wrapping_add(words[(xorshift(&mut x) & mask) as usize]);
    }
    black_box(sum);
    start.elapsed().as_nanos() as f64 / reads as f64
}

fn pow2_floor(n: u64) -> u64 {
    if n == 0 {
        0
    } else {
        1 << (63 - n.leading_zeros())
    }
}

struct Row {
    backing: &'static str,
    got: String,
    dependent: Option<f64>,
    independent: Option<f64>,
}

fn main() {
    let args = LabArgs::parse_with(
        "03_hugepages_tlb: random reads over a large arena: hugetlb vs THP vs 4K pages",
        &[(
            "--no-reserve",
            "never touch /proc/sys/vm/nr_hugepages (hugetlb only if pre-reserved)",
        )],
    );
    print_header("03 hugepages vs 4K TLB");
    let avail = meminfo("MemAvailable").unwrap_or(0) * 1024;
    let full = pow2_floor((avail / 4).min(2 << 30)).max(256 << 20);
    let mut size = args.pick(full, 256 << 20);
    // Dependent reads cost up to ~1.5 µs each in a loaded VM: keep the default run under ~30 s.
    let reads: u64 = args.pick(3_000_000, 100_000);
    let independent_count: u64 = args.pick(10_000_000, 300_000);

    // hugetlb first: it decides whether the common size must shrink to what could be reserved.
    let mut hugetlb_note = String::new();
    let mut reservation = None;
    let want = size / HUGE_PAGE as u64;
    let free = meminfo("HugePages_Free").unwrap_or(0);
    if free < want {
        if args.has("--no-reserve") {
            hugetlb_note = format!(
                "unavailable: {free} free hugetlb pages, {want} needed, --no-reserve given"
            );
        } else {
            match HugeTlbReservation::raise_by(want - free) {
                Ok((r, now_free)) => {
                    let fits = pow2_floor(now_free * HUGE_PAGE as u64);
                    if fits >= size {
                        // enough
                    } else if fits >= 64 << 20 {
                        hugetlb_note = format!(
                            "kernel reserved only {now_free} of {want} pages (fragmentation); all arenas shrunk to {} MiB",
                            fits >> 20
                        );
                        size = fits;
                    } else {
                        hugetlb_note =
                            format!("unavailable: kernel reserved only {now_free} of {want} pages");
                    }
                    reservation = Some(r);
                }
                Err(e) => hugetlb_note = format!("unavailable: {e}"),
            }
        }
    }
    let len = size as usize;

    let mut rows = Vec::new();
    let hugetlb = if hugetlb_note.starts_with("unavailable") {
        None
    } else {
        match Arena::new(len, Backing::HugeTlb) {
            Ok(a) => Some(a),
            Err(e) => {
                hugetlb_note = format!("unavailable: mmap(MAP_HUGETLB) failed: {e}");
                None
            }
        }
    };
    // The arena (if any) is populated: give the system its setting back before measuring.
    if let Some(mut r) = reservation.take() {
        let old = r.old();
        match r.restore() {
            Ok(()) => {
                let note =
                    format!("nr_hugepages raised temporarily, restored to {old} after populate");
                hugetlb_note = if hugetlb_note.is_empty() {
                    note
                } else {
                    format!("{hugetlb_note}; {note}")
                };
            }
            Err(e) => eprintln!("WARNING: {e}"),
        }
    }
    match hugetlb {
        Some(a) => {
            rows.push(Row {
                backing: "hugetlb (MAP_HUGETLB)",
                got: format!("{} x 2 MiB hugetlb; {hugetlb_note}", len / HUGE_PAGE),
                dependent: Some(dependent_reads(a.words(), reads)),
                independent: Some(independent_reads(a.words(), independent_count)),
            });
        }
        None => rows.push(Row {
            backing: "hugetlb (MAP_HUGETLB)",
            got: hugetlb_note,
            dependent: None,
            independent: None,
        }),
    }
    // Arenas one at a time: never hold two large arenas at once.
    for (backing, name) in [
        (Backing::Thp, "THP (MADV_HUGEPAGE)"),
        (Backing::Small, "4 KiB (MADV_NOHUGEPAGE)"),
    ] {
        match Arena::new(len, backing) {
            Ok(a) => {
                let dependent = dependent_reads(a.words(), reads);
                let independent = independent_reads(a.words(), independent_count);
                let huge = a.anon_huge_kib().unwrap_or(0) * 1024;
                let got = format!(
                    "{:.1}% of the arena in THP (AnonHugePages {} MiB)",
                    100.0 * huge as f64 / len as f64,
                    huge >> 20
                );
                rows.push(Row {
                    backing: name,
                    got,
                    dependent: Some(dependent),
                    independent: Some(independent),
                });
            }
            Err(e) => rows.push(Row {
                backing: name,
                got: format!("mmap failed: {e}"),
                dependent: None,
                independent: None,
            }),
        }
    }
    if let Some(total) = meminfo("HugePages_Total") {
        println!("After the run: HugePages_Total = {total} (as found before, unless noted).");
    }
    println!(
        "Arena {} MiB; {reads} dependent and {independent_count} independent random 8-byte reads; THP setting `{}`.",
        len >> 20,
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .unwrap_or_default()
            .trim()
    );
    println!();

    let small = rows.last().and_then(|r| r.dependent);
    let small_ind = rows.last().and_then(|r| r.independent);
    let mut table = Table::new(&[
        "backing",
        "pages obtained",
        "dependent ns/read",
        "vs 4K",
        "independent ns/read",
        "vs 4K",
    ]);
    let cell = |v: Option<f64>| v.map_or("n/a".to_owned(), |v| f(v, 1));
    let ratio = |v: Option<f64>, base: Option<f64>| match (v, base) {
        (Some(v), Some(b)) => format!("{}x", f(v / b, 2)),
        _ => "n/a".to_owned(),
    };
    for r in &rows {
        table.row(vec![
            r.backing.to_owned(),
            r.got.clone(),
            cell(r.dependent),
            ratio(r.dependent, small),
            cell(r.independent),
            ratio(r.independent, small_ind),
        ]);
    }
    table.print();
}
