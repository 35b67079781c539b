//! Bookkeeping of the KV page pool: which page ids are free, and how many sequences share each.
//!
//! The pages themselves live in the backend (device memory on a GPU); this is the host-side
//! allocator over their ids. Everything is sized once from the page count; taking and returning
//! pages never allocates.

/// Free list and reference counts over `0..total` page ids.
#[derive(Debug)]
pub struct KvPagePool {
    /// Free page ids (a stack: recently freed pages are reused first, warm in cache).
    free: Vec<u32>,
    /// Sequences holding each page; 0 = free.
    refs: Vec<u16>,
}

impl KvPagePool {
    /// A pool of `total` free pages.
    pub fn new(total: usize) -> Self {
        KvPagePool {
            free: (0..total as u32).rev().collect(),
            refs: vec![0; total],
        }
    }

    /// Pages in total.
    pub fn total(&self) -> usize {
        self.refs.len()
    }

    /// Pages free now.
    pub fn free(&self) -> usize {
        self.free.len()
    }

    /// Sequences holding `page` (0: free).
    pub fn refs(&self, page: u32) -> u16 {
        self.refs[page as usize]
    }

    /// Pages held by more than one sequence.
    pub fn shared(&self) -> usize {
        self.refs.iter().filter(|&&r| r > 1).count()
    }

    /// Take one free page (held once), or `None` when the pool is dry.
    pub fn alloc(&mut self) -> Option<u32> {
        let p = self.free.pop()?;
        self.refs[p as usize] = 1;
        Some(p)
    }

    /// Take `n` pages onto the end of `table`, or none if fewer than `n` are free.
    /// `table` must have room (it is sized for a full-context sequence).
    pub fn take(&mut self, n: usize, table: &mut Vec<u32>) -> bool {
        if n > self.free.len() {
            return false;
        }
        for _ in 0..n {
            if let Some(p) = self.alloc() {
                table.push(p);
            }
        }
        true
    }

    /// One more sequence holds `page` (prefix sharing).
    pub fn share(&mut self, page: u32) {
        let r = &mut self.refs[page as usize];
        debug_assert!(*r > 0, "sharing a free page");
        *r = r.saturating_add(1);
    }

    /// Drop one holder of `page`; a page nobody holds becomes free.
    pub fn release_page(&mut self, page: u32) {
        let r = &mut self.refs[page as usize];
        debug_assert!(*r > 0, "releasing a free page");
        *r = r.saturating_sub(1);
        if *r == 0 {
            self.free.push(page);
        }
    }

    /// Drop one holder of every page of `table` and clear it.
    pub fn release(&mut self, table: &mut Vec<u32>) {
        for &p in table.iter() {
            self.release_page(p);
        }
        table.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_share_release_round_trip() {
        let mut pool = KvPagePool::new(4);
        let mut a = Vec::with_capacity(4);
        let mut b = Vec::with_capacity(4);
        assert!(pool.take(3, &mut a));
        assert!(!pool.take(2, &mut b), "only one left");
        assert!(b.is_empty());
        pool.share(a[0]);
        b.push(a[0]);
        assert_eq!(pool.shared(), 1);
        assert!(pool.take(1, &mut b));
        assert_eq!(pool.free(), 0);
        assert_eq!(pool.alloc(), None);
        pool.release(&mut a);
        assert_eq!(pool.free(), 2, "a[0] still held by b");
        assert_eq!(pool.refs(b[0]), 1);
        pool.release(&mut b);
        assert_eq!(pool.free(), 4);
    }
}
