//! Bookkeeping of the backend's host swap area: which of its page-sized slots are free.
//!
//! The area itself lives in the backend (page-locked host memory for a GPU); this is the
//! allocator over its slot ids, sized once at start. Taking and returning slots never
//! allocates.

/// Free list over `0..total` host swap slots.
#[derive(Debug)]
pub struct HostSwapSlots {
    /// Free slot ids, lowest on top: a sequence swapped out whole gets consecutive slots while
    /// the area is unfragmented, and consecutive slots of consecutive pages copy as one.
    free: Vec<u32>,
    total: usize,
}

impl HostSwapSlots {
    /// `total` free slots.
    pub fn new(total: usize) -> Self {
        HostSwapSlots {
            free: (0..total as u32).rev().collect(),
            total,
        }
    }

    /// Slots in the area.
    pub fn total(&self) -> usize {
        self.total
    }

    /// Slots free now.
    pub fn free(&self) -> usize {
        self.free.len()
    }

    /// Slots holding a swapped page now.
    pub fn used(&self) -> usize {
        self.total - self.free.len()
    }

    /// Take one slot, or `None` when the area is full.
    pub fn take(&mut self) -> Option<u32> {
        self.free.pop()
    }

    /// Give `slot` back (its page was swapped in, or its sequence ended or was recomputed).
    pub fn release(&mut self, slot: u32) {
        debug_assert!((slot as usize) < self.total, "slot {slot} out of range");
        debug_assert!(
            self.free.len() < self.total,
            "releasing into a full free list"
        );
        self.free.push(slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_taken_lowest_first_and_come_back() {
        let mut s = HostSwapSlots::new(3);
        assert_eq!((s.take(), s.take()), (Some(0), Some(1)));
        assert_eq!((s.used(), s.free()), (2, 1));
        s.release(0);
        assert_eq!(s.take(), Some(0));
        assert_eq!(s.take(), Some(2));
        assert_eq!(s.take(), None);
        assert_eq!(s.used(), 3);
    }
}
