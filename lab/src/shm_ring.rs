//! nerva-rings' `SpscRing` placed in a memfd mapping, as a client segment would hold it, for
//! experiments that run its two halves in two threads or two forked processes.
//!
//! Layout: one 128-byte line of claim flags (a producer and a consumer claim per ring), then the
//! rings, each `[RingHeader][capacity slots]` at a 128-byte aligned offset. The claim flags live
//! in the shared memory itself, so "at most one producer and one consumer per ring, across all
//! processes" — the contract of `SpscRing::*_from_raw_parts` — is enforced, not just hoped for.

use std::io;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use nerva_rings::{Consumer, Pod, Producer, RingHeader, SpscRing};

use crate::shm::SharedRegion;

const CLAIMS_BYTES: usize = 128;
const MAX_RINGS: usize = CLAIMS_BYTES / 8; // two u32 claims per ring

/// `count` rings of `capacity` entries of `T` in one shared mapping.
pub struct SharedRings<T: Pod> {
    region: Arc<SharedRegion>,
    count: usize,
    capacity: u32,
    stride: usize,
    // `fn() -> T`: the rings hand out `T`s (which are `Send` as `Pod`), they do not share them.
    _entries: std::marker::PhantomData<fn() -> T>,
}

impl<T: Pod> SharedRings<T> {
    /// Creates the mapping and initialises every ring header. Call before forking.
    pub fn new(count: usize, capacity: u32) -> io::Result<Self> {
        if count == 0 || count > MAX_RINGS || !capacity.is_power_of_two() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "bad ring count or capacity",
            ));
        }
        let header = size_of::<RingHeader>().next_multiple_of(align_of::<T>());
        let stride = (header + SpscRing::<T>::slot_bytes(capacity)).next_multiple_of(128);
        let region = Arc::new(SharedRegion::new(
            "lab-rings",
            CLAIMS_BYTES + count * stride,
        )?);
        let rings = Self {
            region,
            count,
            capacity,
            stride,
            _entries: std::marker::PhantomData,
        };
        for i in 0..count {
            // SAFETY: the header pointer is inside the fresh mapping, 128-byte aligned (page
            // aligned base + multiples of 128), and nobody else can see the mapping yet.
            unsafe { SpscRing::<T>::init_header(rings.header(i)) };
        }
        Ok(rings)
    }

    fn header(&self, ring: usize) -> NonNull<RingHeader> {
        assert!(ring < self.count);
        // SAFETY: `CLAIMS_BYTES + ring * stride` < mapping length for `ring < count`.
        let p = unsafe { self.region.as_ptr().add(CLAIMS_BYTES + ring * self.stride) };
        NonNull::new(p.cast()).unwrap_or(NonNull::dangling())
    }

    fn slots(&self, ring: usize) -> NonNull<T> {
        let header = size_of::<RingHeader>().next_multiple_of(align_of::<T>());
        // SAFETY: the slots follow the header inside the ring's stride, inside the mapping.
        let p = unsafe { self.header(ring).as_ptr().cast::<u8>().add(header) };
        NonNull::new(p.cast()).unwrap_or(NonNull::dangling())
    }

    fn owner(&self) -> Arc<dyn Send + Sync> {
        self.region.clone()
    }

    fn claim(&self, ring: usize, side: usize) -> bool {
        // SAFETY: the claims line is atomics only (all-zero = unclaimed), in bounds, aligned.
        let flag: &AtomicU32 = unsafe { self.region.at((2 * ring + side) * 4) };
        // Relaxed is enough: the claim only needs atomicity (one winner); the ring's own
        // Acquire/Release indices order everything else.
        flag.swap(1, Ordering::Relaxed) == 0
    }

    /// The producer half of ring `ring`, once per ring across all processes sharing the mapping.
    pub fn producer(&self, ring: usize) -> io::Result<Producer<T>> {
        if ring >= self.count || !self.claim(ring, 0) {
            return Err(io::Error::other(
                "producer already claimed (or no such ring)",
            ));
        }
        // SAFETY: header/slots point into the mapping, initialised in `new`, aligned; the half
        // holds an `Arc` of the mapping (the `owner`), so it stays mapped while the half lives;
        // the claim flag makes this the only producer of this ring in every process.
        unsafe {
            SpscRing::producer_from_raw_parts(
                self.header(ring),
                self.slots(ring),
                self.capacity,
                Some(self.owner()),
            )
        }
        .map_err(|e| io::Error::other(e.to_string()))
    }

    /// The consumer half of ring `ring`, once per ring across all processes sharing the mapping.
    pub fn consumer(&self, ring: usize) -> io::Result<Consumer<T>> {
        if ring >= self.count || !self.claim(ring, 1) {
            return Err(io::Error::other(
                "consumer already claimed (or no such ring)",
            ));
        }
        // SAFETY: as in `producer`, with the consumer claim.
        unsafe {
            SpscRing::consumer_from_raw_parts(
                self.header(ring),
                self.slots(ring),
                self.capacity,
                Some(self.owner()),
            )
        }
        .map_err(|e| io::Error::other(e.to_string()))
    }
}
