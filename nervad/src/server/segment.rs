//! Per-client shared-memory segments: a sealed memfd, mapped once by the daemon.
//!
//! Backing, best first: hugetlb pages (`MFD_HUGETLB`; needs reserved pages, which our machines
//! do not have by default), transparent huge pages (`MADV_HUGEPAGE`; only effective when
//! `/sys/kernel/mm/transparent_hugepage/shmem_enabled` allows it, which is `never` on our
//! machines), else base pages. The page size reported is the one the kernel actually gave us,
//! never the one we asked for.
//!
//! The memfd is sealed with `F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL` before the client sees
//! it: a client that could shrink the file would make the daemon's next access to the mapping
//! raise `SIGBUS`.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;

use memmap2::{MmapOptions, MmapRaw};
use nix::fcntl::{FcntlArg, SealFlag, fcntl};
use nix::sys::memfd::{MFdFlags, memfd_create};

/// 2 MiB: the huge page size of x86-64 and of the aarch64 4K-granule configuration.
pub const HUGE_PAGE_BYTES: u64 = 2 << 20;
/// Base page size assumed when the kernel gives us nothing better.
pub const BASE_PAGE_BYTES: u64 = 4096;

/// What backs a segment's pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageBacking {
    /// Hugetlbfs pages reserved by the administrator.
    Hugetlb,
    /// Transparent huge pages on shmem.
    TransparentHuge,
    /// Ordinary base pages.
    Base,
}

impl PageBacking {
    /// Short name for logs and `nervactl status`.
    pub fn name(self) -> &'static str {
        match self {
            PageBacking::Hugetlb => "hugetlb",
            PageBacking::TransparentHuge => "thp",
            PageBacking::Base => "4k",
        }
    }
}

/// How to build segments.
#[derive(Debug, Clone, Copy)]
pub struct SegmentOptions {
    /// Try `MFD_HUGETLB` first.
    pub try_hugetlb: bool,
    /// Try `mlock` (failure is reported, not fatal).
    pub mlock: bool,
}

/// A mapped, sealed memfd owned by the daemon.
pub struct SharedSegment {
    // Field order matters for drop: unmap before closing the fd (either order is sound for
    // the kernel, this one keeps the mapping's lifetime inside the fd's).
    map: MmapRaw,
    fd: OwnedFd,
    len: usize,
    backing: PageBacking,
    page_bytes: u64,
    locked: bool,
}

impl std::fmt::Debug for SharedSegment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedSegment")
            .field("len", &self.len)
            .field("backing", &self.backing)
            .field("page_bytes", &self.page_bytes)
            .field("locked", &self.locked)
            .finish()
    }
}

impl SharedSegment {
    /// Create a segment of at least `min_len` bytes (rounded up to its page size), zeroed,
    /// pre-faulted, sealed against resizing.
    pub fn create(min_len: usize, options: SegmentOptions) -> io::Result<SharedSegment> {
        if min_len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty segment"));
        }
        if options.try_hugetlb {
            match Self::create_hugetlb(min_len, options) {
                Ok(seg) => return Ok(seg),
                Err(e) => tracing::debug!(error = %e, "hugetlb segment unavailable, falling back"),
            }
        }
        Self::create_shmem(min_len, options)
    }

    fn create_hugetlb(min_len: usize, options: SegmentOptions) -> io::Result<SharedSegment> {
        let len = round_up(min_len as u64, HUGE_PAGE_BYTES)?;
        let fd = memfd_create(
            c"nerva-segment",
            MFdFlags::MFD_CLOEXEC
                | MFdFlags::MFD_ALLOW_SEALING
                | MFdFlags::MFD_HUGETLB
                | MFdFlags::MFD_HUGE_2MB,
        )?;
        // A hugetlb mapping reserves its pages at mmap time (we do not pass MAP_NORESERVE), so
        // a host without free huge pages fails here with ENOMEM instead of SIGBUS on first touch.
        Self::finish(fd, len, PageBacking::Hugetlb, HUGE_PAGE_BYTES, options)
    }

    fn create_shmem(min_len: usize, options: SegmentOptions) -> io::Result<SharedSegment> {
        let want_thp = thp_shmem_possible() && min_len as u64 >= HUGE_PAGE_BYTES;
        let align = if want_thp { HUGE_PAGE_BYTES } else { BASE_PAGE_BYTES };
        let len = round_up(min_len as u64, align)?;
        let fd = memfd_create(
            c"nerva-segment",
            MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
        )?;
        let mut seg = Self::finish(fd, len, PageBacking::Base, BASE_PAGE_BYTES, options)?;
        if want_thp {
            // Advice only: whether the kernel honoured it is read back from smaps below.
            if seg.map.advise(memmap2::Advice::HugePage).is_ok()
                && pmd_mapped_bytes(seg.map.as_ptr() as usize) > 0
            {
                seg.backing = PageBacking::TransparentHuge;
                seg.page_bytes = HUGE_PAGE_BYTES;
            }
        }
        Ok(seg)
    }

    fn finish(
        fd: OwnedFd,
        len: u64,
        backing: PageBacking,
        page_bytes: u64,
        options: SegmentOptions,
    ) -> io::Result<SharedSegment> {
        let off_len = i64::try_from(len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "segment too large"))?;
        nix::unistd::ftruncate(&fd, off_len)?;
        fcntl(
            &fd,
            FcntlArg::F_ADD_SEALS(
                SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_SEAL,
            ),
        )?;
        let len = usize::try_from(len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "segment too large"))?;
        let file = File::from(fd.try_clone()?);
        // populate: fault every page now, at connect time, so the hot path never page-faults.
        let map = MmapOptions::new().len(len).populate().map_raw(&file)?;
        let locked = options.mlock && map.lock().is_ok();
        Ok(SharedSegment {
            map,
            fd,
            len,
            backing,
            page_bytes,
            locked,
        })
    }

    /// Start of the daemon's mapping. Valid (and at least [`Self::len`] bytes long) for the
    /// lifetime of `self`; the bytes are shared with an untrusted process.
    pub fn as_ptr(&self) -> NonNull<u8> {
        // memmap2 never returns a null mapping.
        NonNull::new(self.map.as_mut_ptr()).unwrap_or(NonNull::dangling())
    }

    /// Mapped length in bytes (the memfd's sealed size).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: segments are created non-empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The memfd to pass to the client.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// What backs the pages.
    pub fn backing(&self) -> PageBacking {
        self.backing
    }

    /// Page size actually obtained.
    pub fn page_bytes(&self) -> u64 {
        self.page_bytes
    }

    /// Whether `mlock` succeeded.
    pub fn locked(&self) -> bool {
        self.locked
    }
}

// SAFETY: the segment owns its mapping and fd; the raw pointer inside MmapRaw is only an
// address, and all accesses through it go through the ring types, which treat the memory as
// shared with another process (atomics / volatile copies).
unsafe impl Send for SharedSegment {}

fn round_up(value: u64, align: u64) -> io::Result<u64> {
    value
        .checked_next_multiple_of(align)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "segment too large"))
}

/// Whether shmem THP can be had at all with `MADV_HUGEPAGE`.
fn thp_shmem_possible() -> bool {
    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
        .map(|s| {
            ["[always]", "[within_size]", "[advise]", "[force]"]
                .iter()
                .any(|m| s.contains(m))
        })
        .unwrap_or(false)
}

/// Bytes of the mapping starting at `start` that the kernel maps with PMD (huge) entries,
/// read from `/proc/self/smaps`. 0 when unknown.
fn pmd_mapped_bytes(start: usize) -> u64 {
    let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
        return 0;
    };
    let prefix = format!("{start:x}-");
    let mut in_region = false;
    for line in smaps.lines() {
        if line.starts_with(|c: char| c.is_ascii_hexdigit()) && line.contains('-') {
            in_region = line.starts_with(&prefix);
            continue;
        }
        if in_region && (line.starts_with("ShmemPmdMapped:") || line.starts_with("FilePmdMapped:"))
        {
            let kb: u64 = line
                .split_whitespace()
                .nth(1)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            if kb > 0 {
                return kb * 1024;
            }
        }
    }
    0
}

/// Page sizes and policies of this host, for the startup log and `nervactl status`.
pub fn host_page_report() -> String {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "unknown".into())
    };
    format!(
        "nr_hugepages={} thp_shmem={}",
        read("/proc/sys/vm/nr_hugepages"),
        read("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_is_sealed_zeroed_and_reports_its_pages() {
        let seg = SharedSegment::create(
            10_000,
            SegmentOptions {
                try_hugetlb: true,
                mlock: false,
            },
        )
        .expect("segment");
        assert!(seg.len() >= 10_000);
        assert_eq!(seg.len() as u64 % seg.page_bytes(), 0);
        let seals = fcntl(seg.fd(), FcntlArg::F_GET_SEALS).expect("seals");
        let want = (SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_SEAL).bits();
        assert_eq!(seals & want, want);
        // A sealed memfd refuses to shrink: the client cannot SIGBUS the daemon.
        assert!(nix::unistd::ftruncate(seg.fd(), 0).is_err());
        // SAFETY: the mapping is seg.len() bytes and nobody else maps it in this test.
        let bytes = unsafe { std::slice::from_raw_parts(seg.as_ptr().as_ptr(), seg.len()) };
        assert!(bytes.iter().all(|&b| b == 0));
    }
}
