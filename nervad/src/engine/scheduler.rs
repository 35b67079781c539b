//! Scheduling policy: who runs first, who is preempted when the KV pool runs dry.
//!
//! The engine (`core`) owns the mechanism (slots, pages, steps); the choices it makes are
//! written here so they can be read, and tested, on their own.
//!
//! - **Rank** orders running sequences for pages: higher request priority first, then the
//!   request admitted earlier (its admission stamp is kept across preemption, so a preempted
//!   request regains its place), then the lower sample index. A sequence that needs a page
//!   when none is left preempts the *lowest*-ranked sequence that holds pages (vLLM's
//!   policy: lowest priority, then most recently admitted), or itself when it ranks lowest.

use std::cmp::Reverse;

/// Where a sequence stands for pages: smaller runs first, the largest is the next victim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Rank {
    priority: Reverse<u8>,
    stamp: u64,
    sample: u16,
}

impl Rank {
    /// The rank of sample `sample` of a request with `priority`, admitted `stamp`-th.
    pub fn new(priority: u8, stamp: u64, sample: u16) -> Self {
        Rank {
            priority: Reverse(priority),
            stamp,
            sample,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_is_priority_then_admission_then_sample() {
        let old_low = Rank::new(0, 1, 0);
        let new_low = Rank::new(0, 2, 0);
        let new_high = Rank::new(5, 3, 0);
        let mut v = vec![new_low, old_low, Rank::new(0, 1, 1), new_high];
        v.sort();
        assert_eq!(v, vec![new_high, old_low, Rank::new(0, 1, 1), new_low]);
        // The victim is the largest: lowest priority, most recently admitted.
        assert_eq!(v.iter().max(), Some(&new_low));
    }
}
