//! The client's allocator for its input region: a byte ring whose space is released in
//! submission order, as the daemon's submission-ring consumer index passes each descriptor
//! (the daemon copies a descriptor's bytes out when it consumes the descriptor, so they are
//! free from then on).

use std::collections::VecDeque;

/// A byte ring over the input region. Positions are logical (ever-increasing `u64`); the
/// physical offset is `position % size`. An allocation never wraps: if it does not fit before
/// the end, the tail of the region is skipped.
#[derive(Debug)]
pub struct InputArena {
    size: u64,
    /// Next free logical position.
    head: u64,
    /// Oldest logical position still in use.
    tail: u64,
    /// (submission sequence number of the descriptor, logical end of its bytes), oldest first.
    in_use: VecDeque<(u32, u64)>,
}

/// Why an allocation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArenaError {
    /// Larger than the whole region: can never succeed.
    TooLarge,
    /// Not enough free space now: retry after the daemon consumed earlier descriptors.
    Full,
}

impl InputArena {
    /// An empty arena over `size` bytes.
    pub fn new(size: u64) -> Self {
        InputArena {
            size,
            head: 0,
            tail: 0,
            in_use: VecDeque::with_capacity(64),
        }
    }

    /// Region size.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Bytes in use (including skipped tails).
    #[cfg(test)]
    pub fn used(&self) -> u64 {
        self.head - self.tail
    }

    /// Reserve `len` contiguous bytes; returns their physical offset. Call [`Self::commit`]
    /// with the descriptor's sequence number once it is pushed, or nothing (the reservation is
    /// simply reused by the next `reserve`).
    pub fn reserve(&self, len: u64) -> Result<(u64, u64), ArenaError> {
        if len == 0 {
            return Ok((0, self.head));
        }
        if len > self.size {
            return Err(ArenaError::TooLarge);
        }
        let pos = self.head % self.size;
        let skip = if pos + len > self.size {
            self.size - pos
        } else {
            0
        };
        let start = self.head + skip;
        if start + len - self.tail > self.size {
            return Err(ArenaError::Full);
        }
        Ok((start % self.size, start + len))
    }

    /// Record that the bytes up to logical `end` (from [`Self::reserve`]) belong to the
    /// descriptor with submission sequence number `seq`.
    pub fn commit(&mut self, seq: u32, end: u64) {
        if end > self.head {
            self.head = end;
            self.in_use.push_back((seq, end));
        }
    }

    /// The daemon has consumed every descriptor before sequence number `consumed`
    /// (wrapping): release their bytes.
    pub fn release_before(&mut self, consumed: u32) {
        while let Some(&(seq, end)) = self.in_use.front() {
            // `seq` precedes `consumed` in wrapping order (distances stay far below 2^31
            // because the submission ring is much smaller).
            if consumed.wrapping_sub(seq).wrapping_sub(1) < (1 << 31) {
                self.tail = end;
                self.in_use.pop_front();
            } else {
                break;
            }
        }
        if self.in_use.is_empty() {
            // Nothing outstanding: start over at offset 0 so large prompts fit again.
            self.head = self.head.next_multiple_of(self.size.max(1));
            self.tail = self.head;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocates_in_order_skips_tails_and_releases_by_sequence() {
        let mut a = InputArena::new(100);
        let (off, end) = a.reserve(60).expect("fits");
        assert_eq!(off, 0);
        a.commit(0, end);
        let (off, end) = a.reserve(30).expect("fits");
        assert_eq!(off, 60);
        a.commit(1, end);
        assert_eq!(a.reserve(20), Err(ArenaError::Full));
        assert_eq!(a.reserve(101), Err(ArenaError::TooLarge));
        a.release_before(1); // descriptor 0 consumed
        // 20 bytes do not fit in the 10 left before the end: skip to offset 0.
        let (off, end) = a.reserve(20).expect("fits after release");
        assert_eq!(off, 0);
        a.commit(2, end);
        a.release_before(3);
        assert_eq!(a.used(), 0);
        let (off, _) = a.reserve(100).expect("whole region after full release");
        assert_eq!(off, 0);
    }

    #[test]
    fn sequence_numbers_wrap() {
        let mut a = InputArena::new(64);
        let (_, end) = a.reserve(10).expect("fits");
        a.commit(u32::MAX, end);
        let (_, end) = a.reserve(10).expect("fits");
        a.commit(0, end);
        a.release_before(0);
        assert_eq!(a.used(), 10);
        a.release_before(1);
        assert_eq!(a.used(), 0);
    }
}
