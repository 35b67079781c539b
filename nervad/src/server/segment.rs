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

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use nerva_rings::SegmentMapping;
use nix::fcntl::{FcntlArg, SealFlag, fcntl};
use nix::sys::memfd::{MFdFlags, memfd_create};
use nix::sys::mman::{MmapAdvise, madvise, mlock};

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

/// A sealed memfd and the daemon's mapping of it.
pub struct SharedMemfd {
    /// The memfd to pass to the client.
    pub fd: OwnedFd,
    /// The daemon's mapping (unmapped on drop).
    pub mapping: SegmentMapping,
    /// What backs the pages.
    pub backing: PageBacking,
    /// Page size actually obtained.
    pub page_bytes: u64,
    /// Whether `mlock` succeeded.
    pub locked: bool,
}

impl std::fmt::Debug for SharedMemfd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedMemfd")
            .field("len", &self.mapping.len())
            .field("backing", &self.backing)
            .field("page_bytes", &self.page_bytes)
            .field("locked", &self.locked)
            .finish()
    }
}

impl SharedMemfd {
    /// Create a memfd of at least `min_len` bytes (rounded up to its page size), zeroed,
    /// pre-faulted, sealed against resizing, and map it.
    pub fn create(min_len: usize, options: SegmentOptions) -> io::Result<SharedMemfd> {
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

    fn create_hugetlb(min_len: usize, options: SegmentOptions) -> io::Result<SharedMemfd> {
        let len = round_up(min_len as u64, HUGE_PAGE_BYTES)?;
        let fd = memfd_create(
            c"nerva-segment",
            MFdFlags::MFD_CLOEXEC
                | MFdFlags::MFD_ALLOW_SEALING
                | MFdFlags::MFD_HUGETLB
                | MFdFlags::MFD_HUGE_2MB,
        )?;
        // A hugetlb mapping reserves its pages at mmap time (no MAP_NORESERVE), so a host
        // without free huge pages fails here with ENOMEM instead of SIGBUS on first touch.
        Self::finish(
            fd,
            len,
            PageBacking::Hugetlb,
            HUGE_PAGE_BYTES,
            options,
            false,
        )
    }

    fn create_shmem(min_len: usize, options: SegmentOptions) -> io::Result<SharedMemfd> {
        let want_thp = thp_shmem_possible() && min_len as u64 >= HUGE_PAGE_BYTES;
        let align = if want_thp {
            HUGE_PAGE_BYTES
        } else {
            BASE_PAGE_BYTES
        };
        let len = round_up(min_len as u64, align)?;
        let fd = memfd_create(
            c"nerva-segment",
            MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
        )?;
        Self::finish(
            fd,
            len,
            PageBacking::Base,
            BASE_PAGE_BYTES,
            options,
            want_thp,
        )
    }

    fn finish(
        fd: OwnedFd,
        len: u64,
        backing: PageBacking,
        page_bytes: u64,
        options: SegmentOptions,
        want_thp: bool,
    ) -> io::Result<SharedMemfd> {
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
        // MAP_POPULATE: every page is faulted now, at connect time, never on the hot path.
        let mapping = SegmentMapping::map_fd(fd.as_fd(), len)?;
        let mut seg = SharedMemfd {
            fd,
            mapping,
            backing,
            page_bytes,
            locked: false,
        };
        let base = seg.mapping.as_ptr().cast::<std::ffi::c_void>();
        if want_thp {
            // SAFETY: advice over exactly our own live mapping; MADV_HUGEPAGE changes no
            // contents. Whether the kernel honoured it is read back from smaps below.
            let advised = unsafe { madvise(base, len, MmapAdvise::MADV_HUGEPAGE) }.is_ok();
            if advised && pmd_mapped_bytes(base.as_ptr() as usize) > 0 {
                seg.backing = PageBacking::TransparentHuge;
                seg.page_bytes = HUGE_PAGE_BYTES;
            }
        }
        if options.mlock {
            // SAFETY: locks exactly our own live mapping; no contents change. Failure (e.g.
            // RLIMIT_MEMLOCK) is reported, not fatal.
            seg.locked = unsafe { mlock(base, len) }.is_ok();
        }
        Ok(seg)
    }
}

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
        let seg = SharedMemfd::create(
            10_000,
            SegmentOptions {
                try_hugetlb: true,
                mlock: false,
            },
        )
        .expect("segment");
        let len = seg.mapping.len();
        assert!(len >= 10_000);
        assert_eq!(len as u64 % seg.page_bytes, 0);
        let seals = fcntl(&seg.fd, FcntlArg::F_GET_SEALS).expect("seals");
        let want = (SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_SEAL).bits();
        assert_eq!(seals & want, want);
        // A sealed memfd refuses to shrink: the client cannot SIGBUS the daemon.
        assert!(nix::unistd::ftruncate(&seg.fd, 0).is_err());
        // SAFETY: the mapping is `len` bytes, live, and nobody else maps it in this test.
        let bytes = unsafe { std::slice::from_raw_parts(seg.mapping.as_ptr().as_ptr(), len) };
        assert!(bytes.iter().all(|&b| b == 0));
    }

    /// Exercises the hugetlb path by reserving two huge pages for the duration of the test
    /// (root only; our machines reserve none). Skips, saying why, where that is impossible.
    #[test]
    fn hugetlb_segment_when_pages_are_reserved() {
        const KNOB: &str = "/proc/sys/vm/nr_hugepages";
        let Ok(before) = std::fs::read_to_string(KNOB) else {
            eprintln!("skip: {KNOB} unreadable");
            return;
        };
        let Ok(n) = before.trim().parse::<u64>() else {
            eprintln!("skip: {KNOB} unparsable");
            return;
        };
        if std::fs::write(KNOB, format!("{}", n + 2)).is_err() {
            eprintln!("skip: cannot reserve huge pages (not root or not permitted)");
            return;
        }
        let seg = SharedMemfd::create(
            100_000,
            SegmentOptions {
                try_hugetlb: true,
                mlock: false,
            },
        );
        let _ = std::fs::write(KNOB, format!("{n}"));
        let seg = seg.expect("segment");
        if seg.backing != PageBacking::Hugetlb {
            eprintln!("skip: kernel reserved no huge page (fragmented memory?)");
            return;
        }
        assert_eq!(seg.page_bytes, HUGE_PAGE_BYTES);
        assert_eq!(seg.mapping.len() as u64 % HUGE_PAGE_BYTES, 0);
        let seals = fcntl(&seg.fd, FcntlArg::F_GET_SEALS).expect("seals");
        assert_ne!(seals & SealFlag::F_SEAL_SHRINK.bits(), 0);
    }
}
