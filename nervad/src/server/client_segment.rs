//! One client's segment as the daemon builds it: a sealed memfd laid out by the rings crate
//! (header, submission ring, completion ring, input region, output region).

use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use nerva_rings::{Segment, SegmentLayout};

use super::segment::{PageBacking, SegmentOptions, SharedMemfd};

/// What a segment holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentSizes {
    /// Submission ring entries.
    pub sq_entries: u32,
    /// Completion ring entries.
    pub cq_entries: u32,
    /// Input region bytes.
    pub input_bytes: u64,
    /// Output region bytes.
    pub output_bytes: u64,
}

/// A created, initialised segment, not yet handed to a client.
pub struct SegmentSpec {
    /// The laid-out segment (its header and ring indices are initialised).
    pub segment: Arc<Segment>,
    /// The memfd to pass.
    pub fd: OwnedFd,
    /// Bytes of the memfd.
    pub bytes: u64,
    /// Page backing obtained.
    pub backing: PageBacking,
    /// Page size obtained.
    pub page_bytes: u64,
    /// Whether the mapping is mlocked.
    pub locked: bool,
}

impl SegmentSpec {
    /// Create a memfd big enough for `sizes`, map it, write the header.
    pub fn create(sizes: SegmentSizes, options: SegmentOptions) -> io::Result<SegmentSpec> {
        let layout = SegmentLayout::new(
            sizes.sq_entries,
            sizes.cq_entries,
            sizes.input_bytes,
            sizes.output_bytes,
        )
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let total = usize::try_from(layout.total_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "segment too large"))?;
        let memfd = SharedMemfd::create(total, options)?;
        let bytes = memfd.mapping.len() as u64;
        let SharedMemfd {
            fd,
            mapping,
            backing,
            page_bytes,
            locked,
        } = memfd;
        let segment =
            Segment::create(mapping, &layout).map_err(|e| io::Error::other(e.to_string()))?;
        Ok(SegmentSpec {
            segment,
            fd,
            bytes,
            backing,
            page_bytes,
            locked,
        })
    }
}
