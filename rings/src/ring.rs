//! `SpscRing<T>`: a single-producer single-consumer ring of [`Pod`] entries in caller-provided
//! memory (a shared mapping) or on the heap.
//!
//! # Protocol
//! Two free-running `u32` indices live in a [`RingHeader`], each on its own cache-line pair
//! (`CachePadded`: 128 bytes on x86-64 because the adjacent-line prefetcher pulls lines in
//! pairs). `producer` counts entries ever published, `consumer` entries ever released. Entry
//! `i` lives in slot `i & (capacity - 1)`. Invariant (checked on every refresh, because the
//! peer may be hostile): `producer.wrapping_sub(consumer) <= capacity`.
//!
//! - The producer writes slots past its private tail, then publishes them all with **one**
//!   `Release` store of `producer` ([`Producer::commit`]).
//! - The consumer `Acquire`-loads `producer` once per refresh, copies each entry out with one
//!   volatile read, and releases everything it read with **one** `Release` store of `consumer`.
//! - Each side caches the other's index and reloads it only when the ring *looks* full (producer)
//!   or empty (consumer), so in steady state each side touches the other's line once per batch.
//!
//! # Hostile peer
//! The index written by the other side is read once per refresh and validated: a distance above
//! the capacity is [`RingError::Corrupt`], never an out-of-bounds access (slots are always
//! addressed through the mask). Entries are `Pod`, so whatever bytes the peer left in a slot is
//! a valid value; the reader validates the private copy.

use core::marker::PhantomData;
#[cfg(not(loom))]
use core::ptr::NonNull;

use crossbeam_utils::CachePadded;

use crate::pod::{Pod, zeroed};
use crate::sync::{AtomicU32, Ordering, UnsafeCell};

/// Largest capacity a ring may have (indices are `u32`; distances must stay unambiguous).
pub const MAX_RING_CAPACITY: u32 = 1 << 30;

/// The two indices of a ring, each on its own padded line. `#[repr(C)]` so both processes
/// agree on it; it is placed at the start of each ring in a segment, followed by the slots.
#[repr(C)]
#[derive(Debug)]
pub struct RingHeader {
    /// Entries ever released by the consumer (free-running). Written only by the consumer.
    consumer: CachePadded<AtomicU32>,
    /// Entries ever published by the producer (free-running). Written only by the producer.
    producer: CachePadded<AtomicU32>,
}

impl RingHeader {
    /// An empty ring header (both indices 0).
    pub fn new() -> Self {
        Self {
            consumer: CachePadded::new(AtomicU32::new(0)),
            producer: CachePadded::new(AtomicU32::new(0)),
        }
    }
}

impl Default for RingHeader {
    fn default() -> Self {
        Self::new()
    }
}

/// A ring operation found the peer's index impossible (distance beyond capacity). The peer is
/// broken or hostile; the daemon disconnects such a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RingError {
    /// `producer - consumer` (wrapping) exceeded the capacity.
    Corrupt {
        /// Consumer index seen.
        consumer: u32,
        /// Producer index seen.
        producer: u32,
        /// Ring capacity.
        capacity: u32,
    },
}

impl core::fmt::Display for RingError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Corrupt {
                consumer,
                producer,
                capacity,
            } => write!(
                f,
                "corrupt ring indices: producer {producer}, consumer {consumer}, capacity {capacity}"
            ),
        }
    }
}

impl std::error::Error for RingError {}

/// A push did not happen; the value is handed back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushError<T> {
    /// The ring is full (the consumer has not released enough entries).
    Full(T),
    /// The consumer's index is corrupt.
    Corrupt(T, RingError),
}

impl<T> PushError<T> {
    /// The value that was not pushed.
    pub fn into_inner(self) -> T {
        match self {
            Self::Full(v) | Self::Corrupt(v, _) => v,
        }
    }
}

impl<T> core::fmt::Display for PushError<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Full(_) => write!(f, "ring full"),
            Self::Corrupt(_, e) => write!(f, "{e}"),
        }
    }
}

impl<T: core::fmt::Debug> std::error::Error for PushError<T> {}

/// Heap storage for in-process rings (and every ring under loom).
struct HeapRing<T> {
    header: RingHeader,
    slots: Box<[UnsafeCell<T>]>,
}

// SAFETY: the slots are only touched through the ring protocol (one producer writes released
// slots, one consumer reads published ones, ordered by the Release/Acquire index pair); the
// header is atomics. So sharing the storage between the two halves' threads is sound.
unsafe impl<T: Pod> Sync for HeapRing<T> {}
// SAFETY: `T: Pod` is `Send`; the storage owns nothing thread-bound.
unsafe impl<T: Pod> Send for HeapRing<T> {}

/// Where a ring's header and slots are, and what keeps them alive.
struct RingMemory<T> {
    #[cfg(not(loom))]
    header: NonNull<RingHeader>,
    #[cfg(not(loom))]
    slots: NonNull<T>,
    /// Keeps the heap ring or the mapping alive while a half exists.
    _owner: Option<std::sync::Arc<dyn Send + Sync>>,
    #[cfg(loom)]
    heap: std::sync::Arc<HeapRing<T>>,
    capacity: u32,
    mask: u32,
}

// SAFETY: `RingMemory` is a pair of pointers into memory kept alive by `owner` (or by the
// caller of `from_raw_parts`, per its contract). It is handed to exactly one `Producer` or one
// `Consumer`; concurrent use of the shared parts goes through the atomics in `RingHeader`, and
// slot access follows the ring protocol (disjoint slots per side). `T: Pod` is `Send`.
unsafe impl<T: Pod> Send for RingMemory<T> {}

impl<T: Pod> RingMemory<T> {
    /// A ring at `header` and `slots` (the callers check `capacity` and promise the memory).
    #[cfg(not(loom))]
    fn at(
        header: NonNull<RingHeader>,
        slots: NonNull<T>,
        capacity: u32,
        owner: Option<std::sync::Arc<dyn Send + Sync>>,
    ) -> Self {
        RingMemory {
            header,
            slots,
            _owner: owner,
            capacity,
            mask: capacity - 1,
        }
    }

    #[inline]
    fn header(&self) -> &RingHeader {
        #[cfg(not(loom))]
        {
            // SAFETY: `header` points to a live, initialised `RingHeader` for as long as this
            // value exists (kept alive by `owner`, or promised by `from_raw_parts`' caller).
            unsafe { self.header.as_ref() }
        }
        #[cfg(loom)]
        {
            &self.heap.header
        }
    }

    /// Write `value` into the slot of entry `index`.
    ///
    /// # Safety
    /// Only the producer calls this, and only for an entry the consumer has released
    /// (`index - consumer < capacity` with `consumer` loaded with Acquire).
    #[inline]
    unsafe fn write(&self, index: u32, value: T) {
        let slot = (index & self.mask) as usize;
        #[cfg(not(loom))]
        {
            // SAFETY: `slot < capacity` by the mask, and `slots` points to `capacity` slots;
            // the caller guarantees the consumer is not reading this slot. Volatile because
            // another process reads it; the compiler must not elide or merge the store.
            unsafe { wide::store(self.slots.as_ptr().add(slot), value) }
        }
        #[cfg(loom)]
        {
            // SAFETY: as above; loom checks the claim that no read of this slot is concurrent.
            self.heap.slots[slot].with_mut(|p| unsafe { p.write(value) })
        }
    }

    /// Write `values` into the slots of entries `index..index + values.len()`: at most two
    /// contiguous runs (before and after the wrap point), each one bulk copy.
    ///
    /// # Safety
    /// Only the producer calls this, only for entries the consumer has released
    /// (`index + values.len() - consumer <= capacity` with `consumer` loaded with Acquire).
    #[inline]
    unsafe fn write_run(&self, index: u32, values: &[T]) {
        #[cfg(not(loom))]
        {
            let slot = (index & self.mask) as usize;
            let first = values.len().min(self.capacity as usize - slot);
            let base = self.slots.as_ptr();
            // SAFETY: `slot + first <= capacity` and `values.len() - first <= slot` (the caller
            // passes at most `capacity` values), so both runs stay inside the `capacity` slots;
            // `values` is private memory, so the ranges do not overlap; the caller guarantees
            // the consumer reads none of these slots until we publish them.
            // A plain (not volatile) copy is enough on the writing side: nothing of ours reads
            // these bytes back, and the Release store that publishes them keeps the compiler
            // from dropping or sinking the copy. A bulk copy lets memcpy move the run with its
            // widest stores (rtrb's slice API does the same).
            unsafe {
                core::ptr::copy_nonoverlapping(values.as_ptr(), base.add(slot), first);
                core::ptr::copy_nonoverlapping(
                    values.as_ptr().add(first),
                    base,
                    values.len() - first,
                );
            }
        }
        #[cfg(loom)]
        for (i, value) in values.iter().enumerate() {
            // SAFETY: as in `write`, for each entry of the run.
            unsafe { self.write(index.wrapping_add(i as u32), *value) };
        }
    }

    /// Hint the CPU to start fetching the slot of entry `index` into this core's cache.
    ///
    /// The consumer calls it just before it re-reads the producer index on an empty ring: the
    /// slot's cache line then travels in parallel with the index's line instead of after it,
    /// which takes one cache-line transfer off each one-way hop of a ping-pong. A prefetch is
    /// only a hint: it never faults, never changes what a later load returns (coherence does
    /// that), and the data it brings is not used until the Acquire load says it is published.
    #[inline(always)]
    fn prefetch(&self, index: u32) {
        #[cfg(all(not(loom), target_arch = "x86_64"))]
        {
            let slot = (index & self.mask) as usize;
            // SAFETY: `slot < capacity`, so the address is inside the slot memory; prefetch
            // reads nothing architecturally and cannot fault.
            unsafe {
                core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(
                    self.slots.as_ptr().add(slot).cast::<i8>(),
                )
            }
        }
        #[cfg(any(loom, not(target_arch = "x86_64")))]
        let _ = index;
    }

    /// Copy the entry `index` out of its slot (exactly one read of shared memory).
    ///
    /// # Safety
    /// Only the consumer calls this, and only for an entry the producer has published
    /// (`producer - index > 0` with `producer` loaded with Acquire).
    #[inline]
    unsafe fn read(&self, index: u32) -> T {
        let slot = (index & self.mask) as usize;
        #[cfg(not(loom))]
        {
            // SAFETY: `slot < capacity` by the mask; `T: Pod` so any bytes a hostile writer
            // left are a valid `T`. Volatile: one real copy, never re-read later (no double
            // fetch), whatever the optimiser would like.
            unsafe { wide::load(self.slots.as_ptr().add(slot)) }
        }
        #[cfg(loom)]
        {
            // SAFETY: as above; loom checks no write of this slot is concurrent.
            self.heap.slots[slot].with(|p| unsafe { p.read() })
        }
    }
}

/// Constructors of ring halves. The ring itself is the memory; the halves are the only way to
/// touch it.
pub struct SpscRing<T>(PhantomData<T>);

impl<T: Pod> SpscRing<T> {
    /// An in-process ring on the heap with `capacity` entries (a power of two,
    /// 1..=[`MAX_RING_CAPACITY`]). For tests, the lab and the daemon's internal queues.
    pub fn with_capacity(capacity: u32) -> Result<(Producer<T>, Consumer<T>), CapacityError> {
        check_capacity(capacity)?;
        let slots: Box<[UnsafeCell<T>]> =
            (0..capacity).map(|_| UnsafeCell::new(zeroed())).collect();
        let heap = std::sync::Arc::new(HeapRing {
            header: RingHeader::new(),
            slots,
        });
        let memory = |heap: &std::sync::Arc<HeapRing<T>>| {
            #[cfg(not(loom))]
            {
                let owner: std::sync::Arc<dyn Send + Sync> = heap.clone();
                RingMemory::at(
                    NonNull::from(&heap.header),
                    // `UnsafeCell<T>` is `repr(transparent)` over `T`, so the cell array is a `T`
                    // array; writing through it is allowed because the cells are `UnsafeCell`.
                    NonNull::new(heap.slots.as_ptr().cast_mut().cast::<T>())
                        .unwrap_or(NonNull::dangling()),
                    capacity,
                    Some(owner),
                )
            }
            #[cfg(loom)]
            {
                RingMemory {
                    _owner: None,
                    heap: heap.clone(),
                    capacity,
                    mask: capacity - 1,
                }
            }
        };
        let producer = Producer::attach(memory(&heap));
        let consumer = Consumer::attach(memory(&heap));
        match (producer, consumer) {
            (Ok(p), Ok(c)) => Ok((p, c)),
            // A fresh header has both indices at 0, which always validates.
            _ => Err(CapacityError(capacity)),
        }
    }
}

#[cfg(not(loom))]
impl<T: Pod> SpscRing<T> {
    /// Bytes of slot memory a ring of `capacity` entries needs after its [`RingHeader`].
    pub const fn slot_bytes(capacity: u32) -> usize {
        capacity as usize * core::mem::size_of::<T>()
    }

    /// Initialise a ring header in place (both indices 0). The creator of a segment does this
    /// once, before any peer can see the memory.
    ///
    /// # Safety
    /// `header` must be valid for writes of a `RingHeader`, aligned for it, and no other
    /// thread or process may access it during the call.
    pub unsafe fn init_header(header: NonNull<RingHeader>) {
        // SAFETY: the caller guarantees exclusive, aligned, writable memory.
        unsafe { header.as_ptr().write(RingHeader::new()) }
    }

    /// The producer half of a ring in caller-provided memory.
    ///
    /// # Safety
    /// - `header` points to an initialised, properly aligned [`RingHeader`] and `slots` to
    ///   `capacity` properly aligned slots of `T`, both in memory valid for reads and writes
    ///   (typically a `MAP_SHARED` mapping) that stays mapped until the returned half and
    ///   every clone of `owner` are dropped; `owner`, if given, is what keeps it mapped.
    /// - At most one producer exists for this ring at a time, across all processes.
    /// - Nothing else writes the ring's memory through Rust references (other processes may
    ///   write anything; that is handled).
    pub unsafe fn producer_from_raw_parts(
        header: NonNull<RingHeader>,
        slots: NonNull<T>,
        capacity: u32,
        owner: Option<std::sync::Arc<dyn Send + Sync>>,
    ) -> Result<Producer<T>, AttachError> {
        check_capacity(capacity)?;
        Ok(Producer::attach(RingMemory::at(
            header, slots, capacity, owner,
        ))?)
    }

    /// The consumer half of a ring in caller-provided memory.
    ///
    /// # Safety
    /// As for [`SpscRing::producer_from_raw_parts`], with "at most one consumer".
    pub unsafe fn consumer_from_raw_parts(
        header: NonNull<RingHeader>,
        slots: NonNull<T>,
        capacity: u32,
        owner: Option<std::sync::Arc<dyn Send + Sync>>,
    ) -> Result<Consumer<T>, AttachError> {
        check_capacity(capacity)?;
        Ok(Consumer::attach(RingMemory::at(
            header, slots, capacity, owner,
        ))?)
    }
}

/// A capacity that is not a power of two in 1..=[`MAX_RING_CAPACITY`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapacityError(pub u32);

impl core::fmt::Display for CapacityError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "ring capacity {} is not a power of two in 1..={MAX_RING_CAPACITY}",
            self.0
        )
    }
}

impl std::error::Error for CapacityError {}

/// Attaching a half to existing memory failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AttachError {
    /// Bad capacity.
    Capacity(CapacityError),
    /// The indices already in memory are inconsistent.
    Ring(RingError),
}

impl From<CapacityError> for AttachError {
    fn from(e: CapacityError) -> Self {
        Self::Capacity(e)
    }
}

impl From<RingError> for AttachError {
    fn from(e: RingError) -> Self {
        Self::Ring(e)
    }
}

impl core::fmt::Display for AttachError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Capacity(e) => e.fmt(f),
            Self::Ring(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for AttachError {}

fn check_capacity(capacity: u32) -> Result<(), CapacityError> {
    if capacity.is_power_of_two() && capacity <= MAX_RING_CAPACITY {
        Ok(())
    } else {
        Err(CapacityError(capacity))
    }
}

fn distance_checked(consumer: u32, producer: u32, capacity: u32) -> Result<u32, RingError> {
    let distance = producer.wrapping_sub(consumer);
    if distance <= capacity {
        Ok(distance)
    } else {
        Err(RingError::Corrupt {
            consumer,
            producer,
            capacity,
        })
    }
}

/// The writing half. `Send`, not `Sync`: one thread at a time.
///
/// Entries [`Producer::stage`]d but not [`Producer::commit`]ted when the producer is dropped
/// are never published.
pub struct Producer<T: Pod> {
    memory: RingMemory<T>,
    /// Next entry to write (private; ahead of `committed` by the staged entries).
    tail: u32,
    /// Last value stored to `header.producer`.
    committed: u32,
    /// Last consumer index seen; `tail - consumer_cache <= capacity` always.
    consumer_cache: u32,
}

impl<T: Pod> Producer<T> {
    fn attach(memory: RingMemory<T>) -> Result<Self, RingError> {
        let header = memory.header();
        // Our own index: only we write it, so this single read at attach is authoritative
        // (for a fresh segment it is the creator's 0).
        let tail = header.producer.load(Ordering::Relaxed);
        // SYNC: pairs with the consumer's Release store in `Consumer::release`, so slots it
        // released before we attached are free to overwrite.
        let consumer = header.consumer.load(Ordering::Acquire);
        distance_checked(consumer, tail, memory.capacity)?;
        Ok(Self {
            memory,
            tail,
            committed: tail,
            consumer_cache: consumer,
        })
    }

    /// Number of slots.
    pub fn capacity(&self) -> u32 {
        self.memory.capacity
    }

    /// Entries written with [`Producer::stage`] but not yet published.
    pub fn staged(&self) -> u32 {
        self.tail.wrapping_sub(self.committed)
    }

    /// Reload the consumer index (one Acquire load), validating it.
    #[inline]
    fn refresh(&mut self) -> Result<(), RingError> {
        // SYNC: pairs with the Release store in `Consumer::release`: everything the consumer
        // did with the slots it released (its reads) happens-before we overwrite them.
        let consumer = self.memory.header().consumer.load(Ordering::Acquire);
        // The consumer can only have released what we committed, and with our staged entries
        // the ring can never hold more than `capacity`; a consumer index violating either is
        // corrupt. (Both checks keep `capacity - (tail - consumer)` from underflowing.)
        distance_checked(consumer, self.committed, self.memory.capacity)?;
        distance_checked(consumer, self.tail, self.memory.capacity)?;
        self.consumer_cache = consumer;
        Ok(())
    }

    /// Free slots from the cached consumer index; reloads it only if fewer than `want` look
    /// free (so the common case touches no shared line).
    #[inline]
    fn free_at_least(&mut self, want: u32) -> Result<u32, RingError> {
        let cap = self.memory.capacity;
        let used = self.tail.wrapping_sub(self.consumer_cache);
        debug_assert!(used <= cap, "tail - consumer_cache <= capacity");
        if cap - used >= want {
            return Ok(cap - used);
        }
        self.refresh()?;
        Ok(cap - self.tail.wrapping_sub(self.consumer_cache))
    }

    /// Free slots now (reloads the consumer index: one Acquire load of the shared line).
    pub fn free_slots(&mut self) -> Result<u32, RingError> {
        self.refresh()?;
        Ok(self.memory.capacity - self.tail.wrapping_sub(self.consumer_cache))
    }

    /// Write `value` into the next slot without publishing it; [`Producer::commit`] publishes
    /// every staged entry with one store.
    #[inline(always)]
    pub fn stage(&mut self, value: T) -> Result<(), PushError<T>> {
        match self.free_at_least(1) {
            Ok(0) => return Err(PushError::Full(value)),
            Ok(_) => {}
            Err(e) => return Err(PushError::Corrupt(value, e)),
        }
        // SAFETY: `free_at_least(1) > 0` means `tail - consumer < capacity` with `consumer` loaded
        // with Acquire, so the consumer has released this slot and will not read it until we
        // publish it; we are the only producer (type invariant).
        unsafe { self.memory.write(self.tail, value) };
        self.tail = self.tail.wrapping_add(1);
        Ok(())
    }

    /// Stage as many of `values` as fit (reloading the consumer index at most once, and only
    /// if the cached one shows too little room) and return how many; does not publish.
    #[inline]
    pub fn stage_slice(&mut self, values: &[T]) -> Result<usize, RingError> {
        let want = u32::try_from(values.len()).unwrap_or(u32::MAX);
        let free = self.free_at_least(want)? as usize;
        let n = free.min(values.len());
        // SAFETY: as in `stage`: `n <= free` slots past `tail` are released.
        unsafe { self.memory.write_run(self.tail, &values[..n]) };
        // `n <= free <= capacity <= MAX_RING_CAPACITY` fits in u32.
        self.tail = self.tail.wrapping_add(n as u32);
        Ok(n)
    }

    /// Publish every staged entry with a single Release store (no-op when nothing is staged).
    #[inline(always)]
    pub fn commit(&mut self) {
        if self.tail != self.committed {
            // SYNC: pairs with the Acquire load in `Consumer::refresh`: the slot writes above
            // happen-before the consumer's reads of them.
            self.memory
                .header()
                .producer
                .store(self.tail, Ordering::Release);
            self.committed = self.tail;
        }
    }

    /// Test-only: publish with a Relaxed store, to show loom catches the missing Release.
    #[cfg(loom)]
    #[doc(hidden)]
    pub fn commit_relaxed_for_loom(&mut self) {
        if self.tail != self.committed {
            self.memory
                .header()
                .producer
                .store(self.tail, Ordering::Relaxed);
            self.committed = self.tail;
        }
    }

    /// Stage and commit one entry.
    #[inline(always)]
    pub fn push(&mut self, value: T) -> Result<(), PushError<T>> {
        self.stage(value)?;
        self.commit();
        Ok(())
    }

    /// Stage as many of `values` as fit and commit them with one store; returns how many.
    #[inline]
    pub fn push_slice(&mut self, values: &[T]) -> Result<usize, RingError> {
        let n = self.stage_slice(values)?;
        self.commit();
        Ok(n)
    }
}

/// The reading half. `Send`, not `Sync`: one thread at a time.
pub struct Consumer<T: Pod> {
    memory: RingMemory<T>,
    /// Next entry to read (private; ahead of the released index while inside `consume`).
    head: u32,
    /// Last producer index seen; `producer_cache - head <= capacity` always.
    producer_cache: u32,
}

impl<T: Pod> Consumer<T> {
    fn attach(memory: RingMemory<T>) -> Result<Self, RingError> {
        let header = memory.header();
        // Our own index; only we write it, read once at attach.
        let head = header.consumer.load(Ordering::Relaxed);
        // SYNC: pairs with the producer's Release store in `Producer::commit`.
        let producer = header.producer.load(Ordering::Acquire);
        distance_checked(head, producer, memory.capacity)?;
        Ok(Self {
            memory,
            head,
            producer_cache: producer,
        })
    }

    /// Number of slots.
    pub fn capacity(&self) -> u32 {
        self.memory.capacity
    }

    /// Reload the producer index (one Acquire load), validating it.
    #[inline]
    fn refresh(&mut self) -> Result<(), RingError> {
        if self.producer_cache == self.head {
            // Empty as far as we know: the entry we wait for will land in the `head` slot.
            // (Not when a batch wants more: that slot is already published and about to be
            // read anyway, and a prefetch per call costs the batched path.)
            self.memory.prefetch(self.head);
        }
        // SYNC: pairs with the Release store in `Producer::commit`: the producer's slot writes
        // happen-before our reads of the entries it published.
        let producer = self.memory.header().producer.load(Ordering::Acquire);
        distance_checked(self.head, producer, self.memory.capacity)?;
        self.producer_cache = producer;
        Ok(())
    }

    /// Entries ready from the cached producer index; reloads it only if fewer than `want`
    /// look ready (so the common case touches no shared line).
    #[inline]
    fn ready_at_least(&mut self, want: u32) -> Result<u32, RingError> {
        let ready = self.producer_cache.wrapping_sub(self.head);
        debug_assert!(
            ready <= self.memory.capacity,
            "producer_cache - head <= capacity"
        );
        if ready >= want {
            return Ok(ready);
        }
        self.refresh()?;
        Ok(self.producer_cache.wrapping_sub(self.head))
    }

    /// Entries available now (reloads the producer index: one Acquire load).
    pub fn available(&mut self) -> Result<u32, RingError> {
        self.refresh()?;
        Ok(self.producer_cache.wrapping_sub(self.head))
    }

    /// Whether an entry is available (refreshing if the ring looks empty). The doorbell's
    /// sleeper calls this as its re-check after announcing sleep.
    #[inline]
    pub fn has_pending(&mut self) -> Result<bool, RingError> {
        Ok(self.ready_at_least(1)? > 0)
    }

    #[inline(always)]
    fn release(&mut self) {
        // SYNC: pairs with the Acquire load in `Producer::refresh`: our reads of the released
        // slots happen-before the producer overwrites them.
        self.memory
            .header()
            .consumer
            .store(self.head, Ordering::Release);
    }

    /// Pop one entry (copied out once) and release its slot.
    // Always inlined: out of line (or inlined late) the 64-byte entry travels through the
    // caller's `Result<Option<T>, _>` temporaries of `.expect()`, two extra 128-byte copies
    // with misaligned loads that fail store forwarding (16.7 vs 3.7 ns per push + pop in a
    // single-thread loop).
    #[inline(always)]
    pub fn pop(&mut self) -> Result<Option<T>, RingError> {
        if self.ready_at_least(1)? == 0 {
            return Ok(None);
        }
        // SAFETY: `ready_at_least(1) > 0`: entry `head` was published (Acquire above) and not yet
        // released, so the producer does not write its slot; we are the only consumer.
        let value = unsafe { self.memory.read(self.head) };
        self.head = self.head.wrapping_add(1);
        self.release();
        Ok(Some(value))
    }

    /// Copy up to `out.len()` entries into `out` (refreshing at most once) and release them
    /// with one store. Returns how many were copied.
    #[inline]
    pub fn pop_slice(&mut self, out: &mut [T]) -> Result<usize, RingError> {
        let mut slots = out.iter_mut();
        self.consume(slots.len(), |value| {
            if let Some(slot) = slots.next() {
                *slot = value;
            }
        })
    }

    /// Copy out up to `max` entries one at a time, handing each private copy to `f`, then
    /// release them all with one store. Returns how many were consumed.
    #[inline]
    pub fn consume(&mut self, max: usize, mut f: impl FnMut(T)) -> Result<usize, RingError> {
        let want = u32::try_from(max).unwrap_or(u32::MAX);
        let n = (self.ready_at_least(want)? as usize).min(max);
        for _ in 0..n {
            // SAFETY: as in `pop`, for each of the `n <= ready` published entries.
            let value = unsafe { self.memory.read(self.head) };
            self.head = self.head.wrapping_add(1);
            f(value);
        }
        if n > 0 {
            self.release();
        }
        Ok(n)
    }
}

impl<T: Pod> core::fmt::Debug for Producer<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Producer")
            .field("capacity", &self.memory.capacity)
            .field("tail", &self.tail)
            .field("committed", &self.committed)
            .field("consumer_cache", &self.consumer_cache)
            .finish()
    }
}

impl<T: Pod> core::fmt::Debug for Consumer<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Consumer")
            .field("capacity", &self.memory.capacity)
            .field("head", &self.head)
            .field("producer_cache", &self.producer_cache)
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn capacity_must_be_power_of_two() {
        assert!(SpscRing::<u64>::with_capacity(0).is_err());
        assert!(SpscRing::<u64>::with_capacity(3).is_err());
        assert!(SpscRing::<u64>::with_capacity(MAX_RING_CAPACITY * 2).is_err());
        assert!(SpscRing::<u64>::with_capacity(1).is_ok());
    }

    #[test]
    fn fifo_full_empty_and_wrap_around() {
        let (mut p, mut c) = SpscRing::<u64>::with_capacity(4).expect("ring");
        assert_eq!(c.pop(), Ok(None));
        let mut next_in = 0u64;
        let mut next_out = 0u64;
        for round in 0..50 {
            let burst = round % 5 + 1;
            for _ in 0..burst {
                match p.push(next_in) {
                    Ok(()) => next_in += 1,
                    Err(PushError::Full(v)) => {
                        assert_eq!(v, next_in);
                        assert_eq!(next_in - next_out, 4);
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            for _ in 0..(round % 3 + 1) {
                if let Some(v) = c.pop().expect("ok") {
                    assert_eq!(v, next_out);
                    next_out += 1;
                }
            }
        }
        while let Some(v) = c.pop().expect("ok") {
            assert_eq!(v, next_out);
            next_out += 1;
        }
        assert_eq!(next_in, next_out);
        assert!(next_in > 20, "wrapped several times");
    }

    #[test]
    fn staged_entries_are_invisible_until_commit() {
        let (mut p, mut c) = SpscRing::<u32>::with_capacity(8).expect("ring");
        p.stage(1).expect("room");
        p.stage(2).expect("room");
        assert_eq!(p.staged(), 2);
        assert_eq!(c.pop(), Ok(None));
        p.commit();
        assert_eq!(p.staged(), 0);
        let mut out = [0u32; 8];
        assert_eq!(c.pop_slice(&mut out), Ok(2));
        assert_eq!(out[..2], [1, 2]);
        assert_eq!(p.push_slice(&[3, 4, 5, 6, 7, 8, 9, 10, 11, 12]), Ok(8));
        let mut seen = Vec::new();
        assert_eq!(c.consume(5, |v| seen.push(v)), Ok(5));
        assert_eq!(seen, [3, 4, 5, 6, 7]);
        assert_eq!(p.free_slots(), Ok(5));
    }

    #[test]
    fn corrupt_indices_are_errors_not_ub() {
        let (mut p, mut c) = SpscRing::<u64>::with_capacity(4).expect("ring");
        p.push(1).expect("room");
        p.push(2).expect("room");
        assert_eq!(c.pop(), Ok(Some(1)));
        // A hostile producer claims 1000 entries.
        c.memory.header().producer.store(1000, Ordering::Relaxed);
        // The consumer still has the one cached entry, then sees the corruption on refresh.
        assert_eq!(c.pop(), Ok(Some(2)));
        assert!(matches!(c.pop(), Err(RingError::Corrupt { .. })));
        // A producer index behind the consumer is corrupt too.
        c.memory.header().producer.store(0, Ordering::Relaxed);
        assert!(matches!(c.available(), Err(RingError::Corrupt { .. })));
        // A hostile consumer claims to be ahead of the producer.
        let (mut p2, _c2) = SpscRing::<u64>::with_capacity(4).expect("ring");
        for v in 0..4 {
            p2.push(v).expect("room");
        }
        p2.memory.header().consumer.store(7, Ordering::Relaxed);
        assert!(matches!(p2.push(9), Err(PushError::Corrupt(9, _))));
        drop(p);
    }

    /// A 64-byte, 64-aligned entry: the 16-byte-chunk copy path (as `Descriptor`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    #[repr(C, align(64))]
    struct Line([u64; 8]);
    // SAFETY: eight integers, no padding, any bit pattern valid, no pointers.
    unsafe impl Pod for Line {}

    /// A 24-byte, 8-aligned entry: the 8-byte-chunk copy path.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    #[repr(C)]
    struct Triple([u64; 3]);
    // SAFETY: as for `Line`.
    unsafe impl Pod for Triple {}

    /// Every byte of every entry must arrive, whichever copy path the entry shape takes
    /// (16-byte chunks, 8-byte chunks, or the plain volatile copy for `[u8; 3]`), through
    /// every API and across wrap-around.
    fn every_byte_arrives<T: Pod + PartialEq + core::fmt::Debug>(make: impl Fn(u64) -> T) {
        let (mut p, mut c) = SpscRing::<T>::with_capacity(8).expect("ring");
        let mut sent = 0u64;
        let mut got = 0u64;
        let mut out = [make(0); 5];
        for round in 0..12 {
            p.push(make(sent)).expect("room");
            sent += 1;
            let batch: Vec<T> = (sent..sent + 4).map(&make).collect();
            assert_eq!(p.push_slice(&batch), Ok(4));
            sent += 4;
            assert_eq!(c.pop(), Ok(Some(make(got))));
            got += 1;
            if round % 2 == 0 {
                assert_eq!(c.pop_slice(&mut out[..4]), Ok(4));
                for v in &out[..4] {
                    assert_eq!(*v, make(got));
                    got += 1;
                }
            } else {
                assert_eq!(
                    c.consume(4, |v| {
                        assert_eq!(v, make(got));
                        got += 1;
                    }),
                    Ok(4)
                );
            }
        }
        assert_eq!(c.pop(), Ok(None));
        assert_eq!(sent, got);
    }

    #[test]
    fn every_byte_arrives_for_each_copy_width() {
        // Distinct bytes in every position, so a chunk copied twice or skipped shows.
        let word = |seq: u64, i: u64| (seq << 8 | i).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        every_byte_arrives(|s| Line(core::array::from_fn(|i| word(s, i as u64))));
        every_byte_arrives(|s| Triple(core::array::from_fn(|i| word(s, i as u64))));
        every_byte_arrives(|s| {
            let w = word(s, 0).to_le_bytes();
            [w[0], w[3], w[7]]
        });
    }

    #[test]
    fn threads_move_entries_in_order() {
        let n: u64 = if cfg!(debug_assertions) {
            200_000
        } else {
            2_000_000
        };
        let (mut p, mut c) = SpscRing::<u64>::with_capacity(64).expect("ring");
        let writer = std::thread::spawn(move || {
            let mut next = 0;
            while next < n {
                let batch: Vec<u64> = (next..(next + 7).min(n)).collect();
                next += p.push_slice(&batch).expect("no corruption") as u64;
                if next < n {
                    std::hint::spin_loop();
                }
            }
        });
        let mut expected = 0;
        let mut buf = [0u64; 16];
        while expected < n {
            let got = c.pop_slice(&mut buf).expect("no corruption");
            for v in &buf[..got] {
                assert_eq!(*v, expected);
                expected += 1;
            }
        }
        writer.join().expect("writer");
    }
}

/// Full-width volatile copies of slots: `read_volatile::<T>()` is lowered per *field* of `T`
/// (17 loads for a `Descriptor`); copying in 16- or 8-byte chunks keeps the single fetch of
/// every byte with 4 (or 8) instructions.
#[cfg(not(loom))]
mod wide {
    use core::mem::MaybeUninit;

    #[cfg(target_arch = "x86_64")]
    type Chunk16 = core::arch::x86_64::__m128i;
    #[cfg(not(target_arch = "x86_64"))]
    type Chunk16 = u128;

    /// # Safety
    /// `dst` valid for a write of `T`, aligned for `T`.
    #[inline(always)]
    pub(super) unsafe fn store<T: Copy>(dst: *mut T, value: T) {
        let size = size_of::<T>();
        if size % 16 == 0 && align_of::<T>() >= 16 {
            let src = (&value as *const T).cast::<Chunk16>();
            for i in 0..size / 16 {
                // SAFETY: in bounds of `value` and `*dst`; `dst` 16-aligned as `T` is.
                unsafe {
                    dst.cast::<Chunk16>()
                        .add(i)
                        .write_volatile(src.add(i).read_unaligned())
                };
            }
        } else if size % 8 == 0 && align_of::<T>() >= 8 {
            let src = (&value as *const T).cast::<u64>();
            for i in 0..size / 8 {
                // SAFETY: as above with 8-byte chunks.
                unsafe {
                    dst.cast::<u64>()
                        .add(i)
                        .write_volatile(src.add(i).read_unaligned())
                };
            }
        } else {
            // SAFETY: caller's contract.
            unsafe { dst.write_volatile(value) };
        }
    }

    /// # Safety
    /// `src` valid for a read of an initialised `T`, aligned for `T`.
    #[inline(always)]
    pub(super) unsafe fn load<T: Copy>(src: *const T) -> T {
        let size = size_of::<T>();
        let mut out = MaybeUninit::<T>::uninit();
        if size % 16 == 0 && align_of::<T>() >= 16 {
            let dst = out.as_mut_ptr().cast::<Chunk16>();
            for i in 0..size / 16 {
                // SAFETY: in bounds of `*src` and `out`; `src` 16-aligned as `T` is.
                unsafe {
                    dst.add(i)
                        .write_unaligned(src.cast::<Chunk16>().add(i).read_volatile())
                };
            }
        } else if size % 8 == 0 && align_of::<T>() >= 8 {
            let dst = out.as_mut_ptr().cast::<u64>();
            for i in 0..size / 8 {
                // SAFETY: as above with 8-byte chunks.
                unsafe {
                    dst.add(i)
                        .write_unaligned(src.cast::<u64>().add(i).read_volatile())
                };
            }
        } else {
            // SAFETY: caller's contract.
            return unsafe { src.read_volatile() };
        }
        // SAFETY: every byte of `out` was copied from an initialised `T`.
        unsafe { out.assume_init() }
    }
}
