//! Full KV pages indexed by the token prefix they complete, kept after their last holder ends.
//!
//! A page is registered once every position of it is in the pool (written by a collected
//! step). Its key is a chain hash: the hash of the previous page's key and this page's token
//! ids, so one lookup per page finds the longest cached prefix of a token sequence, across
//! requests and clients (vLLM's automatic prefix caching, SGLang's radix cache flattened to
//! pages). A lookup also compares the page's own token ids and its parent key, so a false
//! match needs a 64-bit collision of two different parent prefixes.
//!
//! A registered page nobody holds is *evictable*: it stays cached in least-recently-released
//! order and is reused (and forgotten) only when the pool has no free page left. Everything is
//! sized from the page count at start; no operation allocates.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

/// No page (list ends, a page without a cached parent).
const NONE: u32 = u32::MAX;

/// Chain key of the empty prefix.
pub const ROOT: u64 = 0x6e65_7276_615f_6b76;

/// Chain key of a page holding `tokens` after a prefix with key `parent`.
pub fn chain(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

/// The index of cached pages and their evictable LRU list.
#[derive(Debug)]
pub struct PrefixCache {
    page_tokens: usize,
    by_key: HashMap<u64, u32>,
    /// Per page: its key, its parent's key and its token ids (valid while registered).
    key: Vec<u64>,
    parent: Vec<u64>,
    tokens: Vec<u32>,
    registered: Vec<bool>,
    /// Evictable pages, a doubly linked list through `prev`/`next`: oldest at `head`.
    prev: Vec<u32>,
    next: Vec<u32>,
    head: u32,
    tail: u32,
    evictable: usize,
}

impl PrefixCache {
    /// An empty index over `pages` pages of `page_tokens` tokens.
    pub fn new(pages: usize, page_tokens: usize) -> Self {
        PrefixCache {
            page_tokens,
            by_key: HashMap::with_capacity(pages),
            key: vec![0; pages],
            parent: vec![0; pages],
            tokens: vec![0; pages * page_tokens],
            registered: vec![false; pages],
            prev: vec![NONE; pages],
            next: vec![NONE; pages],
            head: NONE,
            tail: NONE,
            evictable: 0,
        }
    }

    /// Pages cached and held by nobody.
    pub fn evictable(&self) -> usize {
        self.evictable
    }

    /// Is `page` in the index?
    pub fn is_registered(&self, page: u32) -> bool {
        self.registered[page as usize]
    }

    /// The cached page completing the prefix `parent` with `tokens`, if any.
    pub fn lookup(&self, parent: u64, tokens: &[u32]) -> Option<u32> {
        let key = chain(parent, tokens);
        let &page = self.by_key.get(&key)?;
        let p = page as usize;
        let pt = self.page_tokens;
        let same = self.parent[p] == parent && self.tokens[p * pt..(p + 1) * pt] == *tokens;
        same.then_some(page)
    }

    /// Index `page`, which holds `tokens` after the prefix `parent`, under `chain(parent,
    /// tokens)` (returned). A prefix already cached keeps its page; this one stays unindexed.
    pub fn register(&mut self, page: u32, parent: u64, tokens: &[u32]) -> u64 {
        let key = chain(parent, tokens);
        let p = page as usize;
        if self.registered[p] || self.by_key.contains_key(&key) {
            return key;
        }
        let pt = self.page_tokens;
        self.by_key.insert(key, page);
        self.key[p] = key;
        self.parent[p] = parent;
        self.tokens[p * pt..(p + 1) * pt].copy_from_slice(tokens);
        self.registered[p] = true;
        key
    }

    /// `page` (registered) lost its last holder: it becomes the newest evictable page.
    pub fn release(&mut self, page: u32) {
        debug_assert!(self.registered[page as usize]);
        let p = page as usize;
        self.prev[p] = self.tail;
        self.next[p] = NONE;
        if self.tail == NONE {
            self.head = page;
        } else {
            self.next[self.tail as usize] = page;
        }
        self.tail = page;
        self.evictable += 1;
    }

    /// `page` (evictable) is held again.
    pub fn revive(&mut self, page: u32) {
        let p = page as usize;
        let (prev, next) = (self.prev[p], self.next[p]);
        if prev == NONE {
            self.head = next;
        } else {
            self.next[prev as usize] = next;
        }
        if next == NONE {
            self.tail = prev;
        } else {
            self.prev[next as usize] = prev;
        }
        self.prev[p] = NONE;
        self.next[p] = NONE;
        self.evictable -= 1;
    }

    /// Forget the least recently released evictable page and hand it out for reuse.
    pub fn evict(&mut self) -> Option<u32> {
        let page = self.head;
        if page == NONE {
            return None;
        }
        self.revive(page);
        let p = page as usize;
        self.by_key.remove(&self.key[p]);
        self.registered[p] = false;
        Some(page)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_register_evict_in_lru_order() {
        let mut c = PrefixCache::new(4, 2);
        let k0 = c.register(0, ROOT, &[1, 2]);
        let k1 = c.register(1, k0, &[3, 4]);
        assert_eq!(c.lookup(ROOT, &[1, 2]), Some(0));
        assert_eq!(c.lookup(k0, &[3, 4]), Some(1));
        assert_eq!(c.lookup(k0, &[3, 5]), None);
        assert_eq!(c.lookup(ROOT, &[3, 4]), None, "same tokens, other prefix");
        // A second page with a cached prefix stays unindexed.
        assert_eq!(c.register(2, ROOT, &[1, 2]), k0);
        assert!(!c.is_registered(2));
        c.release(1);
        c.release(0);
        assert_eq!(c.evictable(), 2);
        c.revive(1);
        assert_eq!(c.evict(), Some(0));
        assert_eq!(c.evict(), None);
        assert_eq!(c.lookup(ROOT, &[1, 2]), None, "evicted pages are forgotten");
        assert_eq!(c.lookup(k0, &[3, 4]), Some(1));
        assert_eq!(k1, chain(k0, &[3, 4]));
    }
}
