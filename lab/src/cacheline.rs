//! The reference round trip: two parties bouncing one cache line by busy-polling. Any
//! shared-memory handoff (a ring ping-pong included) costs at least this; experiments 02 and 04
//! both measure it so that the ring can be judged against it in the same run.

use std::hint::spin_loop;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crossbeam_utils::CachePadded;

use crate::affinity::CpuPair;
use crate::pair::{Placement, run_pair};
use crate::shm::SharedRegion;
use crate::stats::{Summary, summarize};

/// Spins (with the CPU's spin-loop hint) until `word` holds `value`.
pub fn spin_until(word: &AtomicU64, value: u64) {
    // Acquire pairs with the peer's Release store of `value`.
    while word.load(Ordering::Acquire) != value {
        spin_loop();
    }
}

/// `rounds` round trips over one shared line (A writes 2k+1, B answers 2k+2), after `warmup`
/// unrecorded ones; one sample per round trip, timed with one `Instant::now()` each.
pub fn cache_line_round_trips(
    placement: Placement,
    cpus: CpuPair,
    rounds: u64,
    warmup: u64,
) -> std::io::Result<Summary> {
    let region = SharedRegion::new("lab-line", size_of::<CachePadded<AtomicU64>>())?;
    // SAFETY: an atomic (all-zero valid), only ever accessed atomically by both parties.
    let line: &CachePadded<AtomicU64> = unsafe { region.at(0) };
    let total = rounds + warmup;
    run_pair(
        placement,
        cpus,
        || {
            let mut samples = Vec::with_capacity(rounds as usize);
            let mut prev = Instant::now();
            for k in 1..=total {
                line.store(2 * k - 1, Ordering::Release); // pairs with B's Acquire spin
                spin_until(line, 2 * k);
                let now = Instant::now();
                if k > warmup {
                    samples.push(now.duration_since(prev).as_nanos() as u64);
                }
                prev = now;
            }
            summarize(&mut samples)
        },
        || {
            for k in 1..=total {
                spin_until(line, 2 * k - 1);
                line.store(2 * k, Ordering::Release); // pairs with A's Acquire spin
            }
        },
    )
}
