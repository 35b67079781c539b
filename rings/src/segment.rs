//! A mapped segment and the two ends that use it.
//!
//! The daemon maps the client's memfd, calls [`Segment::create`] (writes the header, zeroes the
//! ring indices) and takes the [`DaemonEnd`]; the client maps the received fd, calls
//! [`Segment::open`] (copies and validates the geometry) and takes the [`ClientEnd`]. Each end
//! can be taken once per mapping, so safe code in one process cannot create a second producer
//! or consumer for a ring; across processes the protocol (who takes which end) guarantees it.
//!
//! This is one of the crate's few `unsafe` modules: it turns offsets that were validated
//! against the mapping into pointers.

use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::completion::Completion;
use crate::descriptor::{ByteRange, Descriptor, RangeError, check_range};
use crate::doorbell::{NeedWakeup, WakeFlag};
use crate::layout::{SegmentError, SegmentGeometry, SegmentHeader, SegmentLayout};
use crate::ring::{AttachError, Consumer, Producer, RingHeader, SpscRing};

/// An owned `MAP_SHARED` read-write mapping, unmapped on drop.
#[derive(Debug)]
pub struct SegmentMapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory with no thread affinity; all access to it goes
// through atomics (ring indices, flags) or through the take-once ends below.
unsafe impl Send for SegmentMapping {}
// SAFETY: as above; `&SegmentMapping` only exposes the pointer and length.
unsafe impl Sync for SegmentMapping {}

impl SegmentMapping {
    fn mmap(fd: libc::c_int, len: usize, flags: libc::c_int) -> std::io::Result<Self> {
        if len == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "cannot map an empty segment",
            ));
        }
        // SAFETY: a fresh mapping chosen by the kernel (addr NULL); no existing memory is
        // affected. The result is checked against MAP_FAILED.
        let ptr = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        match NonNull::new(ptr.cast::<u8>()) {
            Some(ptr) => Ok(Self { ptr, len }),
            None => Err(std::io::Error::other("mmap returned NULL")),
        }
    }

    /// Map `len` bytes of `fd` (a memfd) shared and read-write. The file must be at least
    /// `len` bytes (the daemon seals it against shrinking, so the mapping cannot fault later).
    pub fn map_fd(fd: BorrowedFd<'_>, len: usize) -> std::io::Result<Self> {
        Self::mmap(fd.as_raw_fd(), len, libc::MAP_SHARED | libc::MAP_POPULATE)
    }

    /// An anonymous shared mapping of `len` zeroed bytes, inherited across `fork` (tests).
    pub fn anonymous(len: usize) -> std::io::Result<Self> {
        Self::mmap(-1, len, libc::MAP_SHARED | libc::MAP_ANONYMOUS)
    }

    /// Take ownership of an existing mapping (e.g. one made with `MAP_HUGETLB`).
    ///
    /// # Safety
    /// `ptr..ptr+len` must be a live mapping created with `mmap`, readable and writable, that
    /// nothing else unmaps or reuses; it will be `munmap`ed when this value drops. `ptr` must
    /// be page-aligned (as `mmap` returns it).
    pub unsafe fn from_raw(ptr: NonNull<u8>, len: usize) -> Self {
        Self { ptr, len }
    }

    /// Mapped bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty (never true for a constructed mapping).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Start of the mapping.
    pub fn as_ptr(&self) -> NonNull<u8> {
        self.ptr
    }
}

impl Drop for SegmentMapping {
    fn drop(&mut self) {
        // SAFETY: we own this mapping (constructor contracts) and nothing can use it after
        // drop: every pointer into it is held together with an `Arc` that keeps us alive.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// A mapped segment with a validated layout.
#[derive(Debug)]
pub struct Segment {
    mapping: SegmentMapping,
    layout: SegmentLayout,
    client_taken: AtomicBool,
    daemon_taken: AtomicBool,
}

/// The client's end: it submits descriptors, writes the input region, consumes completions,
/// reads the output region.
#[derive(Debug)]
pub struct ClientEnd {
    /// Submission ring, producer half.
    pub submissions: Producer<Descriptor>,
    /// Completion ring, consumer half.
    pub completions: Consumer<Completion>,
    /// The input region (prompts, token ids, extension blocks).
    pub input: RegionWriter,
    /// The output region (admin replies).
    pub output: RegionReader,
    /// Set by the daemon while it sleeps: pass to a [`crate::Notifier`] with the submission
    /// eventfd.
    pub daemon_sleeping: WakeFlag,
    /// Set by this client while it blocks: pass to a [`crate::Waiter`] with the completion
    /// eventfd.
    pub client_waiting: WakeFlag,
    /// The validated layout.
    pub layout: SegmentLayout,
}

/// The daemon's end: it consumes descriptors, reads the input region, produces completions,
/// writes the output region.
#[derive(Debug)]
pub struct DaemonEnd {
    /// Submission ring, consumer half.
    pub submissions: Consumer<Descriptor>,
    /// Completion ring, producer half.
    pub completions: Producer<Completion>,
    /// The input region (read: copy out, then validate).
    pub input: RegionReader,
    /// The output region.
    pub output: RegionWriter,
    /// Set by the daemon while it sleeps: pass to a [`crate::Waiter`] (or use with epoll).
    pub daemon_sleeping: WakeFlag,
    /// Set by the client while it blocks: pass to a [`crate::Notifier`] with the completion
    /// eventfd.
    pub client_waiting: WakeFlag,
    /// The layout.
    pub layout: SegmentLayout,
}

impl From<AttachError> for SegmentError {
    fn from(_: AttachError) -> Self {
        // Only reachable if the peer scribbled over the indices between open and take.
        SegmentError::OutOfBounds("ring indices")
    }
}

impl Segment {
    /// Initialise a fresh segment in `mapping` with `layout`: header, both ring headers with
    /// indices 0, flags clear. Only for memory no peer can see yet (a new memfd).
    pub fn create(
        mapping: SegmentMapping,
        layout: &SegmentLayout,
    ) -> Result<Arc<Self>, SegmentError> {
        let needed = layout.total_bytes();
        if needed > mapping.len as u64 {
            return Err(SegmentError::MappingTooSmall {
                needed,
                mapped: mapping.len as u64,
            });
        }
        let base = mapping.ptr.as_ptr();
        // SAFETY: `layout` validated that the header and both ring headers lie inside
        // `total_bytes ≤ mapping.len`, aligned (offset 0 of a page-aligned mapping; rings at
        // 128-aligned offsets ≥ align_of::<RingHeader>()); the memory is ours alone (no peer
        // has the fd yet), so plain writes are fine.
        unsafe {
            base.cast::<SegmentHeader>().write(SegmentHeader {
                geometry: *layout.geometry(),
                sq_need_wakeup: Default::default(),
                cq_need_wakeup: Default::default(),
            });
            for offset in [layout.sq_offset(), layout.cq_offset()] {
                let ring = NonNull::new_unchecked(base.add(offset as usize).cast::<RingHeader>());
                SpscRing::<Descriptor>::init_header(ring);
            }
        }
        Ok(Arc::new(Self {
            mapping,
            layout: *layout,
            client_taken: AtomicBool::new(false),
            daemon_taken: AtomicBool::new(false),
        }))
    }

    /// Open a segment created by the peer: copy the geometry out once and validate it against
    /// the mapping's length.
    pub fn open(mapping: SegmentMapping) -> Result<Arc<Self>, SegmentError> {
        if (mapping.len as u64) < core::mem::size_of::<SegmentHeader>() as u64 {
            return Err(SegmentError::MappingTooSmall {
                needed: core::mem::size_of::<SegmentHeader>() as u64,
                mapped: mapping.len as u64,
            });
        }
        // SAFETY: the mapping holds at least a header, page-aligned; `SegmentGeometry` is
        // integers only (any bits valid). One volatile copy: the peer may change the header
        // later, we never read it again.
        let geometry = unsafe {
            mapping
                .ptr
                .as_ptr()
                .cast::<SegmentGeometry>()
                .read_volatile()
        };
        let layout = SegmentLayout::validate(&geometry, mapping.len as u64)?;
        Ok(Arc::new(Self {
            mapping,
            layout,
            client_taken: AtomicBool::new(false),
            daemon_taken: AtomicBool::new(false),
        }))
    }

    /// The validated layout.
    pub fn layout(&self) -> &SegmentLayout {
        &self.layout
    }

    /// The mapping.
    pub fn mapping(&self) -> &SegmentMapping {
        &self.mapping
    }

    fn at<T>(&self, offset: u64) -> NonNull<T> {
        debug_assert!(offset < self.layout.total_bytes());
        // SAFETY: every offset passed here comes from the validated layout and lies inside
        // the mapping, so the pointer is in bounds and non-null.
        unsafe { NonNull::new_unchecked(self.mapping.ptr.as_ptr().add(offset as usize).cast()) }
    }

    fn flags(self: &Arc<Self>) -> (WakeFlag, WakeFlag) {
        let header = self.at::<SegmentHeader>(0);
        let owner: Arc<dyn Send + Sync> = self.clone();
        // SAFETY: the header is in bounds and initialised (created by `create`, or by the
        // peer and validated by `open`); `NeedWakeup` is an atomic, valid for any bits. The
        // `Arc` keeps the mapping alive as long as the flag.
        unsafe {
            let sq =
                NonNull::new_unchecked(core::ptr::addr_of_mut!((*header.as_ptr()).sq_need_wakeup))
                    .cast::<NeedWakeup>();
            let cq =
                NonNull::new_unchecked(core::ptr::addr_of_mut!((*header.as_ptr()).cq_need_wakeup))
                    .cast::<NeedWakeup>();
            (
                WakeFlag::from_raw(sq, owner.clone()),
                WakeFlag::from_raw(cq, owner),
            )
        }
    }

    fn regions(self: &Arc<Self>) -> (Region, Region) {
        let l = self.layout;
        (
            Region {
                ptr: self.at(l.input_offset()),
                len: l.input_bytes(),
                _owner: self.clone(),
            },
            Region {
                ptr: self.at(l.output_offset()),
                len: l.output_bytes(),
                _owner: self.clone(),
            },
        )
    }

    /// Take the client's end (once per mapping).
    pub fn client_end(self: &Arc<Self>) -> Result<ClientEnd, SegmentError> {
        // Relaxed: only atomicity matters (exactly one caller sees `false`); the flag
        // publishes no data.
        if self.client_taken.swap(true, Ordering::Relaxed) {
            return Err(SegmentError::AlreadyTaken("client end"));
        }
        let l = self.layout;
        let owner: Arc<dyn Send + Sync> = self.clone();
        // SAFETY: ring header and slots lie inside the validated layout (aligned, in bounds),
        // kept mapped by `owner`; the take-once flag makes this the only submission producer
        // and completion consumer in this process, and the protocol gives the other halves to
        // the daemon.
        let (submissions, completions) = unsafe {
            (
                SpscRing::<Descriptor>::producer_from_raw_parts(
                    self.at(l.sq_offset()),
                    self.at(l.sq_slots_offset()),
                    l.sq_entries(),
                    Some(owner.clone()),
                )?,
                SpscRing::<Completion>::consumer_from_raw_parts(
                    self.at(l.cq_offset()),
                    self.at(l.cq_slots_offset()),
                    l.cq_entries(),
                    Some(owner),
                )?,
            )
        };
        let (daemon_sleeping, client_waiting) = self.flags();
        let (input, output) = self.regions();
        Ok(ClientEnd {
            submissions,
            completions,
            input: RegionWriter(input),
            output: RegionReader(output),
            daemon_sleeping,
            client_waiting,
            layout: l,
        })
    }

    /// Take the daemon's end (once per mapping).
    pub fn daemon_end(self: &Arc<Self>) -> Result<DaemonEnd, SegmentError> {
        // Relaxed: as in `client_end`.
        if self.daemon_taken.swap(true, Ordering::Relaxed) {
            return Err(SegmentError::AlreadyTaken("daemon end"));
        }
        let l = self.layout;
        let owner: Arc<dyn Send + Sync> = self.clone();
        // SAFETY: as in `client_end`, for the submission consumer and completion producer.
        let (submissions, completions) = unsafe {
            (
                SpscRing::<Descriptor>::consumer_from_raw_parts(
                    self.at(l.sq_offset()),
                    self.at(l.sq_slots_offset()),
                    l.sq_entries(),
                    Some(owner.clone()),
                )?,
                SpscRing::<Completion>::producer_from_raw_parts(
                    self.at(l.cq_offset()),
                    self.at(l.cq_slots_offset()),
                    l.cq_entries(),
                    Some(owner),
                )?,
            )
        };
        let (daemon_sleeping, client_waiting) = self.flags();
        let (input, output) = self.regions();
        Ok(DaemonEnd {
            submissions,
            completions,
            input: RegionReader(input),
            output: RegionWriter(output),
            daemon_sleeping,
            client_waiting,
            layout: l,
        })
    }
}

/// A data region: pointer and length inside a mapping kept alive by `_owner`.
#[derive(Debug)]
struct Region {
    ptr: NonNull<u8>,
    len: u64,
    _owner: Arc<Segment>,
}

// SAFETY: the region is shared memory kept alive by the `Arc`; the reader/writer wrappers
// below are the only ways to touch it and need `&`/`&mut` as documented there.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

impl Region {
    fn span(&self, offset: u32, len: usize) -> Result<*mut u8, RangeError> {
        let len32 = u32::try_from(len).map_err(|_| RangeError {
            offset: offset.into(),
            len: len as u64,
            region_len: self.len,
        })?;
        check_range(offset, len32, self.len)?;
        // SAFETY: `offset + len ≤ self.len` (checked) and the region lies inside the mapping.
        Ok(unsafe { self.ptr.as_ptr().add(offset as usize) })
    }
}

/// Read side of a data region written by the peer: copies bytes out (once) into private
/// memory, where they can be validated.
#[derive(Debug)]
pub struct RegionReader(Region);

impl RegionReader {
    /// Region bytes.
    pub fn len(&self) -> u64 {
        self.0.len
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.0.len == 0
    }

    /// Copy `out.len()` bytes starting at `offset` into `out`.
    pub fn read(&self, offset: u32, out: &mut [u8]) -> Result<(), RangeError> {
        let src = self.0.span(offset, out.len())?;
        // SAFETY: `src..src+out.len()` is inside the mapping (checked by `span`); `out` is
        // private memory that cannot overlap the shared mapping. The peer may write these
        // bytes concurrently: we only get some bytes, which the caller validates; we never read
        // them again.
        unsafe { core::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Copy the bytes of `range` into a new vector (convenience for the client and tools; the
    /// daemon uses [`RegionReader::read`] into pre-allocated buffers).
    pub fn read_range(&self, range: ByteRange) -> Result<Vec<u8>, RangeError> {
        check_range(range.offset, range.len, self.0.len)?;
        let mut out = vec![0u8; range.len as usize];
        self.read(range.offset, &mut out)?;
        Ok(out)
    }
}

/// Write side of a data region. `&mut self` so one thread of this process writes at a time.
#[derive(Debug)]
pub struct RegionWriter(Region);

impl RegionWriter {
    /// Region bytes.
    pub fn len(&self) -> u64 {
        self.0.len
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.0.len == 0
    }

    /// Copy `bytes` to `offset`.
    pub fn write(&mut self, offset: u32, bytes: &[u8]) -> Result<(), RangeError> {
        let dst = self.0.span(offset, bytes.len())?;
        // SAFETY: `dst..dst+bytes.len()` is inside the mapping (checked by `span`); `bytes` is
        // private memory. The peer only reads these bytes after a ring entry referencing them is
        // published with Release, which orders this copy before its reads.
        unsafe { core::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, bytes.len()) };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::descriptor::{GenerateRequest, PromptKind, Request};

    fn fresh(layout: &SegmentLayout) -> Arc<Segment> {
        let mapping = SegmentMapping::anonymous(layout.total_bytes() as usize).expect("mmap");
        Segment::create(mapping, layout).expect("create")
    }

    #[test]
    fn both_ends_talk_through_one_mapping() {
        let layout = SegmentLayout::new(8, 16, 8192, 4096).expect("layout");
        let seg = fresh(&layout);
        let mut daemon = seg.daemon_end().expect("daemon end");
        let mut client = seg.client_end().expect("client end");
        assert!(matches!(
            seg.client_end(),
            Err(SegmentError::AlreadyTaken(_))
        ));

        client.input.write(100, b"hello").expect("in range");
        assert!(client.input.write(8190, b"abc").is_err());
        let req = GenerateRequest::new(42, PromptKind::Text, ByteRange::new(100, 5));
        client
            .submissions
            .push(Descriptor::generate(&req).expect("valid"))
            .expect("room");

        let d = daemon.submissions.pop().expect("ok").expect("one entry");
        let request = d.validate().expect("valid");
        request
            .check_regions(daemon.input.len(), daemon.output.len())
            .expect("in range");
        let Request::Generate(g) = request else {
            panic!("not generate")
        };
        let mut prompt = vec![0u8; g.prompt.len as usize];
        daemon
            .input
            .read(g.prompt.offset, &mut prompt)
            .expect("range");
        assert_eq!(prompt, b"hello");

        daemon.output.write(0, b"{}").expect("range");
        daemon
            .completions
            .push(Completion::nop_reply(42, 7))
            .expect("room");
        let c = client.completions.pop().expect("ok").expect("entry");
        assert_eq!(c.tag(), 42);
        assert_eq!(
            client
                .output
                .read_range(ByteRange::new(0, 2))
                .expect("range"),
            b"{}"
        );
        // The flags are shared through the mapping.
        daemon.daemon_sleeping.prepare_sleep();
        assert!(client.daemon_sleeping.is_set());
    }

    #[test]
    fn open_validates_the_peer_header() {
        let layout = SegmentLayout::new(8, 8, 4096, 4096).expect("layout");
        let seg = fresh(&layout);
        // Re-open the same memory as the client would (a second mapping of the same pages is
        // simulated by reading the header through a fresh anonymous copy).
        let copy = SegmentMapping::anonymous(seg.mapping().len()).expect("mmap");
        // SAFETY: both mappings are live, distinct, and at least `len` bytes.
        unsafe {
            core::ptr::copy_nonoverlapping(
                seg.mapping().as_ptr().as_ptr(),
                copy.as_ptr().as_ptr(),
                copy.len(),
            )
        };
        let opened = Segment::open(copy).expect("valid header");
        assert_eq!(opened.layout(), &layout);

        let bad = SegmentMapping::anonymous(4096).expect("mmap");
        assert!(matches!(Segment::open(bad), Err(SegmentError::Magic(0))));
        let tiny = SegmentMapping::anonymous(64).expect("mmap");
        assert!(matches!(
            Segment::open(tiny),
            Err(SegmentError::MappingTooSmall { .. })
        ));
        let small = SegmentMapping::anonymous(4096).expect("mmap");
        assert!(matches!(
            Segment::create(small, &layout),
            Err(SegmentError::MappingTooSmall { .. })
        ));
    }
}
