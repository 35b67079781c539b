//! Large anonymous arenas with a chosen page backing (hugetlb, transparent hugepages, 4K), and a
//! scoped reservation of hugetlb pages that always puts the system setting back.

use std::io;
use std::ptr::NonNull;

/// 2 MiB, the x86-64 huge page size this lab uses.
pub const HUGE_PAGE: usize = 2 << 20;

/// How an arena's pages are backed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backing {
    /// `MAP_HUGETLB`: pre-reserved 2 MiB pages, guaranteed or the mapping fails.
    HugeTlb,
    /// Anonymous memory with `madvise(MADV_HUGEPAGE)`: 2 MiB pages if the kernel finds them.
    Thp,
    /// Anonymous memory with `madvise(MADV_NOHUGEPAGE)`: 4 KiB pages only.
    Small,
}

/// An anonymous private mapping, every page touched (faulted in) on creation.
pub struct Arena {
    map: NonNull<u8>,
    map_len: usize,
    base: *mut u8,
    len: usize,
}

impl Arena {
    /// Maps `len` bytes (a multiple of [`HUGE_PAGE`]) with `backing`, 2 MiB aligned, and touches
    /// every 4 KiB page so that the measurement never takes a page fault.
    pub fn new(len: usize, backing: Backing) -> io::Result<Self> {
        if len == 0 || len % HUGE_PAGE != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "length must be n * 2 MiB",
            ));
        }
        // hugetlb mappings are aligned by the kernel; others get one spare huge page to align in.
        let map_len = if backing == Backing::HugeTlb {
            len
        } else {
            len + HUGE_PAGE
        };
        let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
        if backing == Backing::HugeTlb {
            flags |= libc::MAP_HUGETLB | libc::MAP_POPULATE;
        }
        // SAFETY: a fresh anonymous mapping; the kernel picks the address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let map = NonNull::new(p.cast::<u8>()).ok_or_else(io::Error::last_os_error)?;
        let skip = map.as_ptr().align_offset(HUGE_PAGE);
        // SAFETY: `skip` < HUGE_PAGE and the mapping has a spare huge page unless it is hugetlb
        // (which the kernel aligns, so `skip` is 0 there): base..base+len stays inside.
        let base = unsafe { map.as_ptr().add(skip) };
        let arena = Self {
            map,
            map_len,
            base,
            len,
        };
        let advice = match backing {
            Backing::HugeTlb => None,
            Backing::Thp => Some(libc::MADV_HUGEPAGE),
            Backing::Small => Some(libc::MADV_NOHUGEPAGE),
        };
        if let Some(advice) = advice {
            // SAFETY: the range is inside our mapping; advice does not change memory contents.
            if unsafe { libc::madvise(arena.base.cast(), len, advice) } != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        for off in (0..len).step_by(4096) {
            // SAFETY: `off` < len, inside the mapping, which is writable and private to us.
            unsafe { arena.base.add(off).write_volatile(1) };
        }
        Ok(arena)
    }

    /// The arena as 8-byte words.
    pub fn words(&self) -> &[u64] {
        // SAFETY: base is 2 MiB aligned, `len` bytes are mapped, initialised (zero-filled by the
        // kernel, then touched), and only read through this slice while `&self` lives.
        unsafe { std::slice::from_raw_parts(self.base.cast::<u64>(), self.len / 8) }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: empty arenas are refused.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// KiB of this arena that the kernel backs with transparent huge pages right now (sum of
    /// `AnonHugePages` over the VMAs of `/proc/self/smaps` that overlap the arena).
    pub fn anon_huge_kib(&self) -> io::Result<u64> {
        let smaps = std::fs::read_to_string("/proc/self/smaps")?;
        let (lo, hi) = (self.base as usize, self.base as usize + self.len);
        let mut inside = false;
        let mut total = 0;
        for line in smaps.lines() {
            let first = line.split_whitespace().next().unwrap_or("");
            // A VMA header line is "start-end perms ..."; field lines are "Name: value".
            let range = first.split_once('-').and_then(|(a, b)| {
                Some((
                    usize::from_str_radix(a, 16).ok()?,
                    usize::from_str_radix(b, 16).ok()?,
                ))
            });
            if let Some((a, b)) = range {
                inside = a < hi && b > lo;
                continue;
            }
            let huge = line.strip_prefix("AnonHugePages:").filter(|_| inside);
            if let Some(rest) = huge {
                total += rest
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .unwrap_or(0);
            }
        }
        Ok(total)
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping created in `new`, unmapped only here.
        unsafe { libc::munmap(self.map.as_ptr().cast(), self.map_len) };
    }
}

const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";

/// Reads a `HugePages_*` counter from `/proc/meminfo`.
pub fn meminfo(key: &str) -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// A temporary raise of `/proc/sys/vm/nr_hugepages`; the old value is written back by
/// [`Self::restore`] or on drop. Pages still mapped at restore time become surplus pages that
/// the kernel frees when they are unmapped, so restoring early is safe.
pub struct HugeTlbReservation {
    old: u64,
    restored: bool,
}

impl HugeTlbReservation {
    /// Asks the kernel for `extra` more persistent huge pages; returns the reservation and how
    /// many free huge pages there now are (may be fewer than asked: fragmentation).
    pub fn raise_by(extra: u64) -> Result<(Self, u64), String> {
        let old: u64 = std::fs::read_to_string(NR_HUGEPAGES)
            .map_err(|e| format!("cannot read {NR_HUGEPAGES}: {e}"))?
            .trim()
            .parse()
            .map_err(|e| format!("bad {NR_HUGEPAGES}: {e}"))?;
        std::fs::write(NR_HUGEPAGES, (old + extra).to_string())
            .map_err(|e| format!("cannot write {NR_HUGEPAGES} (needs root): {e}"))?;
        let guard = Self {
            old,
            restored: false,
        };
        let free = meminfo("HugePages_Free").unwrap_or(0);
        Ok((guard, free))
    }

    /// Writes the old value back now; returns an error text if the kernel refused.
    pub fn restore(&mut self) -> Result<(), String> {
        if self.restored {
            return Ok(());
        }
        self.restored = true;
        std::fs::write(NR_HUGEPAGES, self.old.to_string())
            .map_err(|e| format!("could not restore {NR_HUGEPAGES} to {}: {e}", self.old))
    }

    /// The value found before the raise.
    pub fn old(&self) -> u64 {
        self.old
    }
}

impl Drop for HugeTlbReservation {
    fn drop(&mut self) {
        if let Err(e) = self.restore() {
            eprintln!("WARNING: {e}");
        }
    }
}
