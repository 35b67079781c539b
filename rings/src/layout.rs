//! Where everything lives in a client's shared-memory segment.
//!
//! ```text
//! offset 0      SegmentHeader: geometry (magic, version, sizes, offsets) | sq need-wakeup | cq need-wakeup
//!        128-aligned  submission ring: RingHeader (consumer | producer, padded) + sq_entries × 64 B
//!        128-aligned  completion ring: RingHeader + cq_entries × 64 B
//!        4096-aligned input region  (client writes prompts, token ids, extension blocks)
//!        4096-aligned output region (daemon writes admin replies)
//!        total rounded up to 4096
//! ```
//! Padded lines use `crossbeam_utils::CachePadded` (128 bytes on x86-64 and aarch64), so the
//! header size depends on the architecture; `header_bytes` makes a mismatch a clean error
//! rather than a misread (both ends of a segment run on the same host anyway).
//!
//! The creator (daemon) computes a [`SegmentLayout`] and writes the header; the peer (client)
//! copies the geometry once and checks it with [`SegmentLayout::validate`] before touching
//! anything else.

use crossbeam_utils::CachePadded;

use crate::completion::Completion;
use crate::descriptor::Descriptor;
use crate::doorbell::NeedWakeup;
use crate::handshake::ABI_VERSION;
use crate::ring::RingHeader;

/// `SegmentGeometry::magic`: "NERVASEG".
pub const SEGMENT_MAGIC: u64 = u64::from_le_bytes(*b"NERVASEG");
/// Alignment of the data regions (a page).
pub const REGION_ALIGN: u64 = 4096;
/// Alignment of each ring.
pub const RING_ALIGN: u64 = 128;
/// Largest ring in a segment (entries).
pub const MAX_SEGMENT_RING_ENTRIES: u32 = 1 << 20;
/// Largest data region (descriptor offsets are `u32`; keep every `offset + len` addressable).
pub const MAX_DATA_REGION_BYTES: u64 = 1 << 31;

/// The plain-data part of the header: read once by the peer with one volatile copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct SegmentGeometry {
    /// [`SEGMENT_MAGIC`].
    pub magic: u64,
    /// [`ABI_VERSION`] of the creator.
    pub layout_version: u32,
    /// `size_of::<SegmentHeader>()` of the creator.
    pub header_bytes: u32,
    /// Bytes of the whole segment (the mapping may be larger: page rounding).
    pub total_bytes: u64,
    /// Submission ring offset (its `RingHeader`; slots follow).
    pub sq_offset: u64,
    /// Submission ring entries (power of two).
    pub sq_entries: u32,
    /// Bytes per submission entry (64).
    pub sq_entry_bytes: u32,
    /// Completion ring offset.
    pub cq_offset: u64,
    /// Completion ring entries (power of two).
    pub cq_entries: u32,
    /// Bytes per completion entry (64).
    pub cq_entry_bytes: u32,
    /// Input region offset.
    pub input_offset: u64,
    /// Input region bytes.
    pub input_bytes: u64,
    /// Output region offset.
    pub output_offset: u64,
    /// Output region bytes.
    pub output_bytes: u64,
}

/// The header at offset 0 of every segment.
#[derive(Debug)]
#[repr(C)]
pub struct SegmentHeader {
    /// Sizes and offsets (written once by the creator).
    pub geometry: SegmentGeometry,
    /// Set while the daemon sleeps and wants a submission doorbell.
    pub sq_need_wakeup: CachePadded<NeedWakeup>,
    /// Set while the client blocks in `wait` and wants a completion doorbell.
    pub cq_need_wakeup: CachePadded<NeedWakeup>,
}

const RING_HEADER_BYTES: u64 = core::mem::size_of::<RingHeader>() as u64;
const HEADER_BYTES: u64 = core::mem::size_of::<SegmentHeader>() as u64;
const _: () = assert!(core::mem::align_of::<SegmentHeader>() as u64 <= REGION_ALIGN);
const _: () = assert!(core::mem::align_of::<RingHeader>() as u64 <= RING_ALIGN);
const _: () = assert!(
    RING_HEADER_BYTES % 64 == 0,
    "slots after the header stay 64-aligned"
);

/// Why a layout was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SegmentError {
    /// Wrong magic.
    Magic(u64),
    /// Layout version differs from this build's [`ABI_VERSION`].
    Version(u32),
    /// Header size differs from this build's.
    HeaderSize(u32),
    /// Entry size is not 64.
    EntrySize(u32),
    /// Ring entries not a power of two in 1..=[`MAX_SEGMENT_RING_ENTRIES`].
    RingEntries(u32),
    /// A data region exceeds [`MAX_DATA_REGION_BYTES`].
    RegionSize(u64),
    /// A part is misaligned (name of the part).
    Misaligned(&'static str),
    /// A part extends past `total_bytes` or overflows (name of the part).
    OutOfBounds(&'static str),
    /// Two parts overlap (their names).
    Overlap(&'static str, &'static str),
    /// `total_bytes` exceeds the mapping.
    MappingTooSmall {
        /// Bytes the segment needs.
        needed: u64,
        /// Bytes mapped.
        mapped: u64,
    },
    /// This half or region of the segment was already taken in this process.
    AlreadyTaken(&'static str),
}

impl core::fmt::Display for SegmentError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Magic(m) => write!(f, "bad segment magic {m:#018x}"),
            Self::Version(v) => write!(f, "segment layout version {v}, expected {ABI_VERSION}"),
            Self::HeaderSize(s) => {
                write!(f, "segment header of {s} bytes, expected {HEADER_BYTES}")
            }
            Self::EntrySize(s) => write!(f, "ring entry of {s} bytes, expected 64"),
            Self::RingEntries(n) => write!(
                f,
                "ring entries {n} not a power of two in 1..={MAX_SEGMENT_RING_ENTRIES}"
            ),
            Self::RegionSize(n) => {
                write!(
                    f,
                    "data region of {n} bytes exceeds {MAX_DATA_REGION_BYTES}"
                )
            }
            Self::Misaligned(what) => write!(f, "segment {what} misaligned"),
            Self::OutOfBounds(what) => write!(f, "segment {what} outside the segment"),
            Self::Overlap(a, b) => write!(f, "segment {a} overlaps {b}"),
            Self::MappingTooSmall { needed, mapped } => {
                write!(f, "segment needs {needed} bytes, {mapped} mapped")
            }
            Self::AlreadyTaken(what) => write!(f, "segment {what} already taken"),
        }
    }
}

impl std::error::Error for SegmentError {}

/// Computed (creator) or validated (peer) positions of every part of a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentLayout {
    geometry: SegmentGeometry,
}

fn align_up(value: u64, align: u64) -> Option<u64> {
    value.checked_add(align - 1).map(|v| v & !(align - 1))
}

fn check_entries(n: u32) -> Result<(), SegmentError> {
    if n.is_power_of_two() && n <= MAX_SEGMENT_RING_ENTRIES {
        Ok(())
    } else {
        Err(SegmentError::RingEntries(n))
    }
}

fn ring_bytes(entries: u32) -> u64 {
    RING_HEADER_BYTES + u64::from(entries) * 64
}

impl SegmentLayout {
    /// Lay out a segment with the given ring sizes (powers of two) and data region sizes.
    pub fn new(
        sq_entries: u32,
        cq_entries: u32,
        input_bytes: u64,
        output_bytes: u64,
    ) -> Result<Self, SegmentError> {
        check_entries(sq_entries)?;
        check_entries(cq_entries)?;
        for bytes in [input_bytes, output_bytes] {
            if bytes > MAX_DATA_REGION_BYTES {
                return Err(SegmentError::RegionSize(bytes));
            }
        }
        // All sums below are bounded (≤ 2^20 × 64 per ring, ≤ 2^31 per region): no overflow.
        let sq_offset = align_up(HEADER_BYTES, RING_ALIGN).unwrap_or(u64::MAX);
        let cq_offset = align_up(sq_offset + ring_bytes(sq_entries), RING_ALIGN).unwrap_or(0);
        let input_offset = align_up(cq_offset + ring_bytes(cq_entries), REGION_ALIGN).unwrap_or(0);
        let output_offset = align_up(input_offset + input_bytes, REGION_ALIGN).unwrap_or(0);
        let total_bytes = align_up(output_offset + output_bytes, REGION_ALIGN).unwrap_or(0);
        let layout = Self {
            geometry: SegmentGeometry {
                magic: SEGMENT_MAGIC,
                layout_version: ABI_VERSION,
                header_bytes: HEADER_BYTES as u32,
                total_bytes,
                sq_offset,
                sq_entries,
                sq_entry_bytes: core::mem::size_of::<Descriptor>() as u32,
                cq_offset,
                cq_entries,
                cq_entry_bytes: core::mem::size_of::<Completion>() as u32,
                input_offset,
                input_bytes,
                output_offset,
                output_bytes,
            },
        };
        // Our own arithmetic must satisfy the peer's checks; keep the two in one place.
        Self::validate(&layout.geometry, total_bytes)
    }

    /// Check a geometry copied from a peer's header against a mapping of `mapping_len`
    /// bytes: magic, version, sizes, powers of two, alignment, every part inside
    /// `total_bytes ≤ mapping_len`, no two parts overlapping.
    pub fn validate(g: &SegmentGeometry, mapping_len: u64) -> Result<Self, SegmentError> {
        if g.magic != SEGMENT_MAGIC {
            return Err(SegmentError::Magic(g.magic));
        }
        if g.layout_version != ABI_VERSION {
            return Err(SegmentError::Version(g.layout_version));
        }
        if u64::from(g.header_bytes) != HEADER_BYTES {
            return Err(SegmentError::HeaderSize(g.header_bytes));
        }
        for size in [g.sq_entry_bytes, g.cq_entry_bytes] {
            if size != 64 {
                return Err(SegmentError::EntrySize(size));
            }
        }
        check_entries(g.sq_entries)?;
        check_entries(g.cq_entries)?;
        for bytes in [g.input_bytes, g.output_bytes] {
            if bytes > MAX_DATA_REGION_BYTES {
                return Err(SegmentError::RegionSize(bytes));
            }
        }
        if g.total_bytes > mapping_len {
            return Err(SegmentError::MappingTooSmall {
                needed: g.total_bytes,
                mapped: mapping_len,
            });
        }
        let parts: [(&'static str, u64, u64, u64); 5] = [
            ("header", 0, HEADER_BYTES, REGION_ALIGN),
            (
                "submission ring",
                g.sq_offset,
                ring_bytes(g.sq_entries),
                RING_ALIGN,
            ),
            (
                "completion ring",
                g.cq_offset,
                ring_bytes(g.cq_entries),
                RING_ALIGN,
            ),
            ("input region", g.input_offset, g.input_bytes, REGION_ALIGN),
            (
                "output region",
                g.output_offset,
                g.output_bytes,
                REGION_ALIGN,
            ),
        ];
        for (name, offset, len, align) in parts {
            if offset % align != 0 {
                return Err(SegmentError::Misaligned(name));
            }
            match offset.checked_add(len) {
                Some(end) if end <= g.total_bytes => {}
                _ => return Err(SegmentError::OutOfBounds(name)),
            }
        }
        for (i, a) in parts.iter().enumerate() {
            for b in &parts[i + 1..] {
                // Empty regions overlap nothing.
                let disjoint = a.2 == 0 || b.2 == 0 || a.1 + a.2 <= b.1 || b.1 + b.2 <= a.1;
                if !disjoint {
                    return Err(SegmentError::Overlap(a.0, b.0));
                }
            }
        }
        Ok(Self { geometry: *g })
    }

    /// The geometry (what the creator writes into the header).
    pub fn geometry(&self) -> &SegmentGeometry {
        &self.geometry
    }

    /// Bytes of the whole segment.
    pub fn total_bytes(&self) -> u64 {
        self.geometry.total_bytes
    }

    /// Submission ring entries.
    pub fn sq_entries(&self) -> u32 {
        self.geometry.sq_entries
    }

    /// Completion ring entries.
    pub fn cq_entries(&self) -> u32 {
        self.geometry.cq_entries
    }

    /// Offset of the submission ring's [`RingHeader`].
    pub fn sq_offset(&self) -> u64 {
        self.geometry.sq_offset
    }

    /// Offset of the submission ring's first slot.
    pub fn sq_slots_offset(&self) -> u64 {
        self.geometry.sq_offset + RING_HEADER_BYTES
    }

    /// Offset of the completion ring's [`RingHeader`].
    pub fn cq_offset(&self) -> u64 {
        self.geometry.cq_offset
    }

    /// Offset of the completion ring's first slot.
    pub fn cq_slots_offset(&self) -> u64 {
        self.geometry.cq_offset + RING_HEADER_BYTES
    }

    /// Input region offset.
    pub fn input_offset(&self) -> u64 {
        self.geometry.input_offset
    }

    /// Input region bytes.
    pub fn input_bytes(&self) -> u64 {
        self.geometry.input_bytes
    }

    /// Output region offset.
    pub fn output_offset(&self) -> u64 {
        self.geometry.output_offset
    }

    /// Output region bytes.
    pub fn output_bytes(&self) -> u64 {
        self.geometry.output_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_aligned_and_validates() {
        let l = SegmentLayout::new(256, 1024, 1 << 20, 64 << 10).expect("layout");
        assert_eq!(l.sq_offset() % RING_ALIGN, 0);
        assert_eq!(l.cq_offset() % RING_ALIGN, 0);
        assert_eq!(l.input_offset() % REGION_ALIGN, 0);
        assert_eq!(l.output_offset() % REGION_ALIGN, 0);
        assert_eq!(l.total_bytes() % REGION_ALIGN, 0);
        assert!(l.sq_slots_offset() + 256 * 64 <= l.cq_offset());
        assert!(l.cq_slots_offset() + 1024 * 64 <= l.input_offset());
        assert_eq!(
            SegmentLayout::validate(l.geometry(), l.total_bytes()),
            Ok(l)
        );
    }

    #[test]
    fn bad_geometry_is_refused_with_specific_errors() {
        assert_eq!(
            SegmentLayout::new(3, 8, 0, 0),
            Err(SegmentError::RingEntries(3))
        );
        assert_eq!(
            SegmentLayout::new(8, 0, 0, 0),
            Err(SegmentError::RingEntries(0))
        );
        assert!(matches!(
            SegmentLayout::new(8, 8, MAX_DATA_REGION_BYTES + 1, 0),
            Err(SegmentError::RegionSize(_))
        ));
        let l = SegmentLayout::new(64, 64, 8192, 8192).expect("layout");
        let g = *l.geometry();
        let check = |mutate: fn(&mut SegmentGeometry), len: u64| {
            let mut bad = g;
            mutate(&mut bad);
            SegmentLayout::validate(&bad, len)
        };
        let total = g.total_bytes;
        assert!(matches!(
            check(|g| g.magic ^= 1, total),
            Err(SegmentError::Magic(_))
        ));
        assert!(matches!(
            check(|g| g.layout_version += 1, total),
            Err(SegmentError::Version(_))
        ));
        assert!(matches!(
            check(|g| g.header_bytes = 8, total),
            Err(SegmentError::HeaderSize(8))
        ));
        assert!(matches!(
            check(|g| g.cq_entry_bytes = 32, total),
            Err(SegmentError::EntrySize(32))
        ));
        assert!(matches!(
            check(|_| {}, total - 1),
            Err(SegmentError::MappingTooSmall { .. })
        ));
        assert!(matches!(
            check(|g| g.input_offset += 1, total),
            Err(SegmentError::Misaligned(_))
        ));
        assert!(matches!(
            check(|g| g.output_bytes += 4096, total + 4096),
            Err(SegmentError::OutOfBounds("output region"))
        ));
        assert!(matches!(
            check(|g| g.input_offset = !4095, total),
            Err(SegmentError::OutOfBounds("input region"))
        ));
        assert!(matches!(
            check(|g| g.cq_offset = g.sq_offset, total),
            Err(SegmentError::Overlap("submission ring", "completion ring"))
        ));
        assert!(matches!(
            check(|g| g.output_offset = g.input_offset, total),
            Err(SegmentError::Overlap("input region", "output region"))
        ));
        assert!(matches!(
            check(|g| g.sq_offset = 0, total),
            Err(SegmentError::Overlap("header", "submission ring"))
        ));
    }
}
