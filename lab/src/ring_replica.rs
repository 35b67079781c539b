//! A lab-only replica of nerva-rings' SPSC protocol with switches, to find out by ablation what
//! makes the real ring slower than `rtrb` (experiment 02). NOT a product ring: heap only, one
//! process, no hostile-peer hardening beyond what the real ring does on its hot path.
//!
//! Same protocol as `nerva_rings::SpscRing`: free-running `u32` indices on their own 128-byte
//! lines, each side caching the other's index and refreshing only when the ring looks full or
//! empty, the distance check on every refresh. The switches:
//! - `WIDE`: copy an entry with four 16-byte volatile loads/stores instead of one
//!   `read_volatile::<T>()`, which LLVM lowers field by field (17 loads for a `Descriptor`);
//! - `LAZY`: the consumer stores its index only when it has used up the entries it knew about
//!   (or every quarter ring), instead of after every pop;
//! - `pop_outlined` vs `pop`: an out-of-line call returning `Option<T>` through memory (what the
//!   lab binary got from the real ring) vs an inlined one;
//! - `push_plain` vs `push`: the producer writes the slot with a plain `ptr::write` (as rtrb)
//!   instead of a volatile copy from the stack.

use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use crossbeam_utils::CachePadded;

struct Shared<T> {
    consumer: CachePadded<AtomicU32>,
    producer: CachePadded<AtomicU32>,
    slots: Box<[UnsafeCell<MaybeUninit<T>>]>,
    mask: u32,
}

// SAFETY: slots are accessed by the protocol only (producer writes released slots, consumer
// reads published ones, ordered by the Release/Acquire index pair); `T: Copy + Send`.
unsafe impl<T: Copy + Send> Sync for Shared<T> {}
// SAFETY: as above.
unsafe impl<T: Copy + Send> Send for Shared<T> {}

impl<T: Copy> Shared<T> {
    fn slot(&self, index: u32) -> *mut T {
        self.slots[(index & self.mask) as usize].get().cast()
    }
}

/// Creates a replica ring of `capacity` (a power of two) entries.
pub fn replica<T: Copy + Send, const WIDE: bool, const LAZY: bool>(
    capacity: u32,
) -> (ReplicaProducer<T, WIDE>, ReplicaConsumer<T, WIDE, LAZY>) {
    assert!(capacity.is_power_of_two());
    assert!(
        !WIDE || (size_of::<T>() == 64 && align_of::<T>() >= 16),
        "WIDE copies 64-byte, 16-aligned entries"
    );
    let shared = Arc::new(Shared {
        consumer: CachePadded::new(AtomicU32::new(0)),
        producer: CachePadded::new(AtomicU32::new(0)),
        slots: (0..capacity)
            .map(|_| UnsafeCell::new(MaybeUninit::uninit()))
            .collect(),
        mask: capacity - 1,
    });
    (
        ReplicaProducer {
            shared: shared.clone(),
            tail: 0,
            consumer_cache: 0,
            capacity,
        },
        ReplicaConsumer {
            shared,
            head: 0,
            released: 0,
            producer_cache: 0,
            capacity,
        },
    )
}

#[cfg(target_arch = "x86_64")]
type Chunk = core::arch::x86_64::__m128i;
#[cfg(not(target_arch = "x86_64"))]
type Chunk = u128;

/// Writes `value` to `dst` with four 16-byte volatile stores.
///
/// # Safety
/// `dst` is valid for a 64-byte, 16-aligned write (checked at ring creation for `WIDE`).
#[inline(always)]
unsafe fn wide_write<T: Copy>(dst: *mut T, value: T) {
    let src = (&value as *const T).cast::<Chunk>();
    let dst = dst.cast::<Chunk>();
    for i in 0..4 {
        // SAFETY: `value` is 64 bytes (4 chunks) and `dst` 64 writable bytes, both 16-aligned.
        unsafe { dst.add(i).write_volatile(src.add(i).read_unaligned()) };
    }
}

/// Reads a `T` from `src` with four 16-byte volatile loads.
///
/// # Safety
/// `src` is valid for a 64-byte, 16-aligned read of an initialised `T`.
#[inline(always)]
unsafe fn wide_read<T: Copy>(src: *const T) -> T {
    let mut out = MaybeUninit::<T>::uninit();
    let dst = out.as_mut_ptr().cast::<Chunk>();
    let src = src.cast::<Chunk>();
    for i in 0..4 {
        // SAFETY: 4 chunks = 64 bytes on both sides; `out` is 64 writable bytes.
        unsafe { dst.add(i).write_unaligned(src.add(i).read_volatile()) };
    }
    // SAFETY: all 64 bytes were copied from an initialised `T`.
    unsafe { out.assume_init() }
}

/// Producer half of the replica.
pub struct ReplicaProducer<T, const WIDE: bool> {
    shared: Arc<Shared<T>>,
    tail: u32,
    consumer_cache: u32,
    capacity: u32,
}

impl<T: Copy + Send, const WIDE: bool> ReplicaProducer<T, WIDE> {
    /// Pushes one entry (publish per push), handing it back if the ring is full.
    #[inline]
    pub fn push(&mut self, value: T) -> Result<(), T> {
        self.push_impl(value, false)
    }

    /// Like [`Self::push`] but writes the slot with a plain (non-volatile) `ptr::write`, as rtrb
    /// does, so LLVM may build the entry directly in the slot instead of copying it from the
    /// stack. Measures the producer-side copy; a hostile-peer ring should not do this blindly.
    #[inline]
    pub fn push_plain(&mut self, value: T) -> Result<(), T> {
        self.push_impl(value, true)
    }

    #[inline(always)]
    fn push_impl(&mut self, value: T, plain: bool) -> Result<(), T> {
        if self.tail.wrapping_sub(self.consumer_cache) == self.capacity {
            // SYNC: pairs with the consumer's Release store of its index.
            let c = self.shared.consumer.load(Ordering::Acquire);
            if self.tail.wrapping_sub(c) > self.capacity {
                panic!("corrupt consumer index");
            }
            self.consumer_cache = c;
            if self.tail.wrapping_sub(c) == self.capacity {
                return Err(value);
            }
        }
        let slot = self.shared.slot(self.tail);
        if plain {
            // SAFETY: the slot is released (checked above) and only this producer writes it.
            unsafe { slot.write(value) };
        } else if WIDE {
            // SAFETY: the slot is released (checked above), 64 bytes, 16-aligned.
            unsafe { wide_write(slot, value) };
        } else {
            // SAFETY: the slot is released and only this producer writes it.
            unsafe { slot.write_volatile(value) };
        }
        self.tail = self.tail.wrapping_add(1);
        // SYNC: pairs with the consumer's Acquire load of the producer index.
        self.shared.producer.store(self.tail, Ordering::Release);
        Ok(())
    }
}

/// Consumer half of the replica.
pub struct ReplicaConsumer<T, const WIDE: bool, const LAZY: bool> {
    shared: Arc<Shared<T>>,
    head: u32,
    released: u32,
    producer_cache: u32,
    capacity: u32,
}

impl<T: Copy + Send, const WIDE: bool, const LAZY: bool> ReplicaConsumer<T, WIDE, LAZY> {
    /// Pops one entry, inlined into the caller.
    #[inline]
    pub fn pop(&mut self) -> Option<T> {
        self.pop_impl()
    }

    /// Pops one entry through an out-of-line call (as the real ring's `pop` ended up).
    #[inline(never)]
    pub fn pop_outlined(&mut self) -> Option<T> {
        self.pop_impl()
    }

    #[inline(always)]
    fn pop_impl(&mut self) -> Option<T> {
        if self.head == self.producer_cache {
            if LAZY && self.released != self.head {
                // About to look for more: hand back everything read so far first.
                self.release();
            }
            // SYNC: pairs with the producer's Release store of its index.
            let p = self.shared.producer.load(Ordering::Acquire);
            if p.wrapping_sub(self.head) > self.capacity {
                panic!("corrupt producer index");
            }
            self.producer_cache = p;
            if p == self.head {
                return None;
            }
        }
        let slot = self.shared.slot(self.head);
        let value = if WIDE {
            // SAFETY: the entry is published (Acquire above) and not yet released.
            unsafe { wide_read(slot) }
        } else {
            // SAFETY: as above.
            unsafe { slot.read_volatile() }
        };
        self.head = self.head.wrapping_add(1);
        if !LAZY || self.head.wrapping_sub(self.released) >= self.capacity / 4 {
            self.release();
        }
        Some(value)
    }

    fn release(&mut self) {
        // SYNC: pairs with the producer's Acquire load of the consumer index.
        self.shared.consumer.store(self.head, Ordering::Release);
        self.released = self.head;
    }
}
