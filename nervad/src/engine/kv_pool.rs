//! Bookkeeping of the KV page pool: which page ids are free, how many sequences share each,
//! and which full pages stay cached for their prefix after their last holder ended.
//!
//! The pages themselves live in the backend (device memory on a GPU); this is the host-side
//! allocator over their ids. A page is free, held (by one or more sequences), or cached and
//! evictable ([`PrefixCache`]): the pool hands out free pages first, then evicts the least
//! recently released cached page. Everything is sized once from the page count; taking and
//! returning pages never allocates.

use super::prefix_cache::PrefixCache;

/// Free list, reference counts and prefix cache over `0..total` page ids.
#[derive(Debug)]
pub struct KvPagePool {
    /// Free page ids (a stack: recently freed pages are reused first, warm in cache).
    free: Vec<u32>,
    /// Sequences holding each page; 0 = free or evictable.
    refs: Vec<u16>,
    /// Pages with `refs > 1` (kept current: status is published every step).
    shared: usize,
    /// Most pages held at once since the pool was last empty (no page held): updated at every
    /// page taken, restarted when a page is taken from a pool that held none, so once the
    /// pool is empty again it keeps the high-water mark of the busy period that just ended.
    peak: usize,
    cache: PrefixCache,
}

impl KvPagePool {
    /// A pool of `total` free pages of `page_tokens` tokens.
    pub fn new(total: usize, page_tokens: usize) -> Self {
        KvPagePool {
            free: (0..total as u32).rev().collect(),
            refs: vec![0; total],
            shared: 0,
            peak: 0,
            cache: PrefixCache::new(total, page_tokens),
        }
    }

    /// Pages some sequence holds.
    pub fn held(&self) -> usize {
        self.total() - self.free()
    }

    /// Most pages held at once since the pool was last empty (see the field).
    pub fn peak_held(&self) -> usize {
        self.peak
    }

    /// One more page is held: raise the high-water mark, or restart it if the pool held none
    /// before (pages are taken one at a time, so one held means it was empty).
    fn note_taken(&mut self) {
        let held = self.held();
        self.peak = if held == 1 { 1 } else { self.peak.max(held) };
    }

    /// Pages in total.
    pub fn total(&self) -> usize {
        self.refs.len()
    }

    /// Pages no sequence holds: free, or cached and evictable (both can be taken).
    pub fn free(&self) -> usize {
        self.free.len() + self.cache.evictable()
    }

    /// Pages cached for their prefix that no sequence holds.
    pub fn cached(&self) -> usize {
        self.cache.evictable()
    }

    /// Sequences holding `page` (0: free).
    pub fn refs(&self, page: u32) -> u16 {
        self.refs[page as usize]
    }

    /// Pages held by more than one sequence.
    pub fn shared(&self) -> usize {
        self.shared
    }

    /// Take one free page (held once), else the least recently released cached one (which is
    /// forgotten), or `None` when every page is held.
    pub fn alloc(&mut self) -> Option<u32> {
        let p = self.free.pop().or_else(|| self.cache.evict())?;
        self.refs[p as usize] = 1;
        self.note_taken();
        Some(p)
    }

    /// The cached page that holds `tokens` (a page's worth) after the prefix keyed `parent`.
    /// Take it with [`KvPagePool::share`].
    pub fn lookup(&self, parent: u64, tokens: &[u32]) -> Option<u32> {
        self.cache.lookup(parent, tokens)
    }

    /// Cache `page`, full and holding `tokens` after the prefix keyed `parent`, for its
    /// prefix; returns the prefix key through this page.
    pub fn register(&mut self, page: u32, parent: u64, tokens: &[u32]) -> u64 {
        self.cache.register(page, parent, tokens)
    }

    /// Take `n` pages onto the end of `table` (evicting cached ones if need be), or none if
    /// fewer than `n` can be taken. `table` must have room (it is sized for a full-context
    /// sequence).
    pub fn take(&mut self, n: usize, table: &mut Vec<u32>) -> bool {
        if n > self.free() {
            return false;
        }
        for _ in 0..n {
            if let Some(p) = self.alloc() {
                table.push(p);
            }
        }
        true
    }

    /// One more sequence holds `page`: a held page (forked samples) or a cached one.
    pub fn share(&mut self, page: u32) {
        let r = &mut self.refs[page as usize];
        let revived = *r == 0;
        if revived {
            debug_assert!(self.cache.is_registered(page), "sharing a free page");
            self.cache.revive(page);
        }
        *r = r.saturating_add(1);
        if *r == 2 {
            self.shared += 1;
        }
        if revived {
            self.note_taken();
        }
    }

    /// Drop one holder of `page`; a page nobody holds becomes free, or evictable if cached.
    pub fn release_page(&mut self, page: u32) {
        let r = &mut self.refs[page as usize];
        debug_assert!(*r > 0, "releasing a free page");
        *r = r.saturating_sub(1);
        if *r == 1 {
            self.shared -= 1;
        }
        if *r == 0 {
            if self.cache.is_registered(page) {
                self.cache.release(page);
            } else {
                self.free.push(page);
            }
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
    use super::super::prefix_cache::ROOT;
    use super::*;

    #[test]
    fn take_share_release_round_trip() {
        let mut pool = KvPagePool::new(4, 2);
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

    #[test]
    fn peak_counts_held_pages_of_the_busy_period() {
        let mut pool = KvPagePool::new(8, 2);
        let mut a = Vec::with_capacity(8);
        let mut b = Vec::with_capacity(8);
        assert!(pool.take(3, &mut a));
        pool.register(a[0], ROOT, &[1, 2]);
        // Sharing a held page holds no more pages.
        pool.share(a[0]);
        b.push(a[0]);
        assert!(pool.take(2, &mut b));
        assert_eq!((pool.held(), pool.peak_held()), (5, 5));
        pool.release(&mut b);
        assert_eq!((pool.held(), pool.peak_held()), (3, 5), "a high-water mark");
        pool.release(&mut a);
        assert_eq!(pool.held(), 0);
        assert_eq!(pool.peak_held(), 5, "kept while the pool is empty");
        // The next busy period starts from its first page, here a cached one revived.
        let page = pool.lookup(ROOT, &[1, 2]).unwrap();
        pool.share(page);
        a.push(page);
        assert_eq!((pool.held(), pool.peak_held()), (1, 1));
        assert!(pool.take(1, &mut a));
        assert_eq!(pool.peak_held(), 2);
    }

    #[test]
    fn cached_pages_outlive_their_holders_until_the_pool_needs_them() {
        let mut pool = KvPagePool::new(3, 2);
        let mut a = Vec::with_capacity(3);
        assert!(pool.take(2, &mut a));
        pool.register(a[0], ROOT, &[7, 8]);
        pool.release(&mut a);
        assert_eq!((pool.free(), pool.cached()), (3, 1));
        // Found again and held: no longer evictable.
        let page = pool.lookup(ROOT, &[7, 8]).unwrap();
        pool.share(page);
        assert_eq!((pool.free(), pool.cached()), (2, 0));
        pool.release_page(page);
        // Free pages go first; the cached page only when nothing else is left.
        let mut b = Vec::with_capacity(3);
        assert!(pool.take(2, &mut b));
        assert!(!b.contains(&page));
        assert!(pool.lookup(ROOT, &[7, 8]).is_some());
        assert!(pool.take(1, &mut b), "a cached page can be taken");
        assert_eq!(b[2], page);
        assert!(pool.lookup(ROOT, &[7, 8]).is_none());
        assert_eq!(pool.free(), 0);
    }
}
