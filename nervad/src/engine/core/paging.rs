//! KV pages of the engine's sequences: admission's page arithmetic, growth with
//! copy-on-write, prefix-cache hits and registration, preemption (swap or recompute) and
//! resumption (the policy choices come from [`crate::engine::scheduler`]; the module docs of
//! `core` tell the story).

use super::*;
use crate::engine::swap_slots::HostSwapSlots;

/// Preemption by swapping: the host slots, the scratch of one swap, the counters.
#[derive(Debug)]
pub(super) struct SwapState {
    /// Swap, or always recompute.
    mode: Preemption,
    /// Slots of the backend's host swap area.
    pub(super) slots: HostSwapSlots,
    /// Sequences swapped out / in since start, and the pages copied each way.
    pub(super) outs: u64,
    pub(super) ins: u64,
    pub(super) pages_out: u64,
    pub(super) pages_in: u64,
    /// Pages and their host slots of the swap being made (sized for one sequence).
    pages: Vec<u32>,
    host: Vec<u32>,
    page_tokens: usize,
}

impl SwapState {
    pub(super) fn new(mode: Preemption, limits: &BackendLimits) -> Self {
        SwapState {
            mode,
            slots: HostSwapSlots::new(limits.swap_pages),
            outs: 0,
            ins: 0,
            pages_out: 0,
            pages_in: 0,
            pages: Vec::with_capacity(limits.max_pages_per_seq()),
            host: Vec::with_capacity(limits.max_pages_per_seq()),
            page_tokens: limits.page_tokens,
        }
    }

    /// Swap `seq` (out of its slot, holding its pages) out: copy each page it alone holds to
    /// a host slot and free it; keep the pages it shares (freeing them would free nothing, and
    /// nobody writes a shared page: copy-on-write). Its position, phase and prefix-cache state
    /// stay as they are. False, with nothing changed, when swap is off or the host area lacks
    /// room for its pages (the caller recomputes it instead).
    pub(super) fn swap_out(
        &mut self,
        backend: &mut dyn Backend,
        pool: &mut KvPagePool,
        seq: &mut Sequence,
    ) -> bool {
        debug_assert!(!seq.swapped());
        let own = seq.table.iter().filter(|&&p| pool.refs(p) == 1).count();
        if self.mode != Preemption::Swap || seq.table.is_empty() || own > self.slots.free() {
            return false;
        }
        self.pages.clear();
        self.host.clear();
        seq.host.clear();
        for &page in &seq.table {
            if pool.refs(page) == 1 {
                let slot = self.slots.take().unwrap_or(RESIDENT);
                seq.host.push(slot);
                self.pages.push(page);
                self.host.push(slot);
            } else {
                seq.host.push(RESIDENT);
            }
        }
        if let Err(e) = backend.swap_out(&self.pages, &self.host) {
            tracing::warn!(error = %e, "swap-out failed; the sequence is recomputed instead");
            for &slot in &self.host {
                self.slots.release(slot);
            }
            seq.host.clear();
            return false;
        }
        // Freed only now: the backend has the copies ordered before any later use of a page.
        // A page cached for its prefix stays cached (evictable) and may be taken back.
        for &page in &self.pages {
            pool.release_page(page);
        }
        self.outs += 1;
        self.pages_out += self.pages.len() as u64;
        true
    }

    /// Bring the pages of swapped `seq` back: a page it had that is still cached for the same
    /// prefix is taken again as it is (it is full, so nobody wrote it since, and an evicted
    /// page would have been unregistered), every other one is copied into a fresh page. The
    /// caller made sure enough pages are free.
    pub(super) fn swap_in(
        &mut self,
        backend: &mut dyn Backend,
        pool: &mut KvPagePool,
        seq: &mut Sequence,
    ) -> Result<(), RequestError> {
        let pt = self.page_tokens;
        self.pages.clear();
        self.host.clear();
        let mut key = prefix_cache::ROOT;
        let mut result = Ok(());
        for i in 0..seq.table.len() {
            let slot = seq.host[i];
            // The first `cached_pages` pages are full and cached for their prefix.
            let cached = (i < seq.cached_pages).then(|| &seq.tokens[i * pt..(i + 1) * pt]);
            if slot != RESIDENT {
                let had = seq.table[i];
                if cached.is_some_and(|tokens| pool.lookup(key, tokens) == Some(had)) {
                    pool.share(had);
                    self.slots.release(slot);
                } else if let Some(page) = pool.alloc() {
                    seq.table[i] = page;
                    self.pages.push(page);
                    self.host.push(slot);
                } else {
                    // Cannot happen (the caller checked): keep the rest on the host, and let
                    // the caller release what is held and what is not alike.
                    result = Err(RequestError::Backend("KV pool ran dry at swap-in".into()));
                    break;
                }
                seq.host[i] = RESIDENT;
            }
            if let Some(tokens) = cached {
                key = prefix_cache::chain(key, tokens);
            }
        }
        if result.is_ok() {
            result = backend
                .swap_in(&self.host, &self.pages)
                .map_err(|e| RequestError::Backend(e.to_string()));
        }
        // The host slots are free again (the backend ordered the copies before any reuse).
        for &slot in &self.host {
            self.slots.release(slot);
        }
        self.ins += 1;
        self.pages_in += self.pages.len() as u64;
        if result.is_ok() {
            seq.host.clear();
        }
        result
    }
}

impl Engine {
    /// Pages that must be free to admit a request: its prompt's, plus one per sample for the
    /// first page each writes on its own (its first decode page, or the copy of the shared
    /// partial prompt page), but never more than it needs to finish (so any request that
    /// passed submit is admitted on an idle pool).
    pub(super) fn admission_pages(&self, prompt_len: usize, max_tokens: u32, n: u16) -> usize {
        let (shared, own) = self.page_need(prompt_len, max_tokens, n);
        let whole = shared + own * usize::from(n);
        (pages_for(prompt_len, self.limits.page_tokens) + usize::from(n)).min(whole)
    }

    /// Pages that sequences in a slot still need to finish their prefill: admission leaves them
    /// free, so an admitted prompt is not starved by the next admission. A paused client's
    /// prefill does not count (it is not running, and its pages may be reclaimed).
    pub(super) fn prefill_backlog(&self) -> usize {
        let pt = self.limits.page_tokens;
        self.seqs
            .iter()
            .filter(|s| s.active && s.prefilling())
            .filter(|s| {
                self.requests[s.request]
                    .as_ref()
                    .is_some_and(|r| !self.paused.contains(&r.key.client))
            })
            .map(|s| pages_for(s.prefill_to, pt).saturating_sub(s.table.len()))
            .sum()
    }

    /// The scheduler's rank of the sequence `seq`.
    pub(super) fn rank_of(requests: &[Option<Request>], seq: &Sequence) -> Rank {
        match requests[seq.request].as_ref() {
            Some(r) => Rank::new(r.priority, r.stamp, seq.sample),
            None => Rank::new(0, u64::MAX, u16::MAX),
        }
    }

    /// Give samples without a slot (parked by a pause that has ended, or preempted) a slot
    /// again, best rank first, while slots and pages allow; a swapped one has its pages
    /// swapped in first, a recomputed one recomputes its prefix. Returns false when one that
    /// could run still waits (nothing new is admitted past it). `backlog` is the prefill
    /// backlog of [`Engine::prefill_backlog`], kept current.
    pub(super) fn resume_off_slot(
        &mut self,
        backlog: &mut usize,
        sink: &mut dyn EventSink,
    ) -> bool {
        let pt = self.limits.page_tokens;
        loop {
            let mut best: Option<(Rank, usize)> = None;
            for (i, seq) in self.parked.iter().enumerate() {
                let Some(req) = self.requests[seq.request].as_ref() else {
                    continue;
                };
                if self.paused.contains(&req.key.client) {
                    continue;
                }
                let r = Self::rank_of(&self.requests, seq);
                if best.is_none_or(|(b, _)| r < b) {
                    best = Some((r, i));
                }
            }
            let Some((_, i)) = best else { return true };
            // Pages up to and including the position it writes next, and those it swaps in
            // (at most: a page it had may still be cached and be taken again).
            let seq = &self.parked[i];
            let need = pages_for(seq.tokens.len(), pt).saturating_sub(seq.table.len())
                + seq.pages_on_host();
            if self.free_slots.is_empty() || !self.reclaim_paused(*backlog + need) {
                return false;
            }
            // (`reclaim_paused` changes parked records in place and appends: `i` still holds.)
            let mut seq = self.parked.swap_remove(i);
            if seq.swapped()
                && let Err(e) = self
                    .swap
                    .swap_in(&mut *self.backend, &mut self.pool, &mut seq)
            {
                let rid = seq.request;
                seq.active = false;
                Self::release_kv(&mut self.pool, &mut self.swap.slots, &mut seq);
                self.spare.push(seq);
                self.fail_request(rid, e, Some(&mut *sink));
                continue;
            }
            if seq.prefilling() {
                *backlog += pages_for(seq.prefill_to, pt).saturating_sub(seq.table.len());
            }
            let slot = self.free_slots.pop().unwrap_or_default();
            let rid = seq.request;
            let sample = seq.sample;
            // The new slot's device token ring holds its previous occupant's token: feed this
            // sample's last token from the host, and mark the slot's new occupancy.
            seq.input_sampled = false;
            seq.preempted = false;
            seq.epoch = self.seqs[slot as usize].epoch.wrapping_add(1);
            if !seq.decoding && seq.prefill_to == 0 {
                // A fork's sample of a one-token prompt: nothing to recompute.
                seq.decoding = true;
            }
            let Some(req) = self.requests[rid].as_mut() else {
                self.free_slots.push(slot);
                continue;
            };
            // Exactly the sampling state an uninterrupted run has here (sample i of a request
            // draws from seed + i, see `fork_samples`).
            let started = self.backend.resume_sequence(
                slot,
                &req.sampling,
                req.sampling.seed.wrapping_add(u64::from(sample)),
                &seq.tokens[..seq.prompt_len],
                seq.output(),
            );
            req.slots[usize::from(sample)] = slot;
            let old = std::mem::replace(&mut self.seqs[slot as usize], seq);
            self.spare.push(old);
            if let Err(e) = started {
                self.fail_request(rid, RequestError::Backend(e.to_string()), Some(&mut *sink));
            }
        }
    }

    /// Make `pages` free if need be by dropping the pages of a paused client's samples, parked
    /// ones first, then prompts it had in prefill (a client that stops reading must not hold
    /// the pool); false if they cannot be.
    pub(super) fn reclaim_paused(&mut self, pages: usize) -> bool {
        while self.pool.free() < pages {
            let paused = &self.paused;
            let requests = &self.requests;
            let pool = &self.pool;
            let found = self.parked.iter().position(|s| {
                s.holds_freeable(pool)
                    && requests[s.request]
                        .as_ref()
                        .is_some_and(|r| paused.contains(&r.key.client))
            });
            if let Some(i) = found {
                self.evict_parked(i);
                continue;
            }
            // A paused client's prompt in mid-prefill keeps its slot (only decoding samples
            // are parked) but makes no progress either.
            let held = self.seqs.iter().position(|s| {
                s.active
                    && !s.table.is_empty()
                    && requests[s.request]
                        .as_ref()
                        .is_some_and(|r| paused.contains(&r.key.client))
            });
            match held {
                Some(slot) => self.preempt(slot as u32),
                None => return false,
            }
        }
        true
    }

    /// Release what `seq` holds of the KV pool and the host swap area (its pages, or for a
    /// swapped sequence its resident pages and its host slots) and clear its table.
    pub(super) fn release_kv(pool: &mut KvPagePool, slots: &mut HostSwapSlots, seq: &mut Sequence) {
        if seq.swapped() {
            for (&page, &slot) in seq.table.iter().zip(&seq.host) {
                if slot == RESIDENT {
                    pool.release_page(page);
                } else {
                    slots.release(slot);
                }
            }
            seq.host.clear();
            seq.table.clear();
        } else {
            pool.release(&mut seq.table);
        }
    }

    /// Drop `seq`'s KV pages (and host slots): it will prefill its prefix again, then decode on
    /// from its last sampled token (which stays in `input`) without sampling at the end of the
    /// recompute.
    pub(super) fn drop_kv(pool: &mut KvPagePool, slots: &mut HostSwapSlots, seq: &mut Sequence) {
        seq.recompute_to = seq.recompute_to.max(seq.len);
        Self::release_kv(pool, slots, seq);
        if seq.decoding {
            seq.prefill_to = seq.tokens.len() - 1;
            seq.sample_after_prefill = false;
            seq.decoding = false;
        }
        seq.len = 0;
        seq.cached_pages = 0;
        seq.prefix_key = prefix_cache::ROOT;
        seq.preempted = true;
    }

    /// Take cached pages for the prefix `slot` is about to prefill, as far as they reach
    /// (never its last prompt position when it samples after its prefill: that token's logits
    /// must be computed). Only while all its pages so far are full and cached.
    pub(super) fn extend_from_cache(&mut self, slot: u32) {
        let pt = self.limits.page_tokens;
        let seq = &mut self.seqs[slot as usize];
        if seq.len != seq.cached_pages * pt || seq.table.len() != seq.cached_pages {
            return;
        }
        let limit = (seq.prefill_to - usize::from(seq.sample_after_prefill)) / pt;
        while seq.cached_pages < limit {
            let i = seq.cached_pages;
            let tokens = &seq.tokens[i * pt..(i + 1) * pt];
            let Some(page) = self.pool.lookup(seq.prefix_key, tokens) else {
                break;
            };
            self.pool.share(page);
            seq.table.push(page);
            seq.prefix_key = prefix_cache::chain(seq.prefix_key, tokens);
            seq.cached_pages += 1;
            seq.len += pt;
            self.prefix_hits += 1;
        }
    }

    /// Cache the pages of `slot` that its collected steps have filled.
    pub(super) fn register_full_pages(&mut self, slot: u32) {
        let pt = self.limits.page_tokens;
        let seq = &mut self.seqs[slot as usize];
        while (seq.cached_pages + 1) * pt <= seq.len {
            let i = seq.cached_pages;
            let tokens = &seq.tokens[i * pt..(i + 1) * pt];
            seq.prefix_key = self.pool.register(seq.table[i], seq.prefix_key, tokens);
            seq.cached_pages += 1;
        }
    }

    /// Take pages from parked sequence `i` (not running): swap it out, or drop its pages when
    /// it is swapped already (what it still holds it shares) or cannot be swapped.
    pub(super) fn evict_parked(&mut self, i: usize) {
        let seq = &mut self.parked[i];
        if seq.swapped() || !self.swap.swap_out(&mut *self.backend, &mut self.pool, seq) {
            Self::drop_kv(&mut self.pool, &mut self.swap.slots, seq);
        }
        self.preemptions += 1;
    }

    /// Preempt the sequence in `slot`: swap out or free its pages, free its slot (module docs).
    pub(super) fn preempt(&mut self, slot: u32) {
        let blank = match self.spare.pop() {
            Some(blank) => blank,
            None => Sequence::empty(&self.limits, self.tokens.longest()),
        };
        let mut seq = std::mem::replace(&mut self.seqs[slot as usize], blank);
        self.free_slots.push(slot);
        if let Some(req) = self.requests[seq.request].as_mut() {
            req.slots[usize::from(seq.sample)] = PARKED;
        }
        if !self
            .swap
            .swap_out(&mut *self.backend, &mut self.pool, &mut seq)
        {
            Self::drop_kv(&mut self.pool, &mut self.swap.slots, &mut seq);
        }
        self.preemptions += 1;
        self.parked.push(seq);
    }

    /// Free pages for a sequence of rank `rank`: take the pages of a sample without a slot
    /// (it is not running anyway), else preempt the lowest-ranked sequence that holds pages,
    /// ranks below `rank` and is not in the step being planned. False when there is none.
    pub(super) fn preempt_one_below(&mut self, rank: Rank) -> bool {
        let pool = &self.pool;
        if let Some(i) = self.parked.iter().position(|s| s.holds_freeable(pool)) {
            self.evict_parked(i);
            return true;
        }
        let mut victim: Option<(Rank, u32)> = None;
        for (slot, seq) in self.seqs.iter().enumerate() {
            if !seq.active
                || seq.table.is_empty()
                || self.entries.iter().any(|e| e.slot == slot as u32)
            {
                continue;
            }
            let r = Self::rank_of(&self.requests, seq);
            if r > rank && victim.is_none_or(|(v, _)| r > v) {
                victim = Some((r, slot as u32));
            }
        }
        match victim {
            Some((_, slot)) => {
                self.preempt(slot);
                true
            }
            None => false,
        }
    }

    /// Preempt lower-ranked sequences until `pages` are free; false if they cannot be.
    pub(super) fn make_room(&mut self, pages: usize, rank: Rank) -> bool {
        while self.pool.free() < pages {
            if !self.preempt_one_below(rank) {
                return false;
            }
        }
        true
    }

    /// Pages `slot` must take to write positions `from..to`: new ones past its table, and a
    /// copy of each page in the range that others hold too.
    pub(super) fn pages_to_write(&self, slot: u32, from: usize, to: usize) -> usize {
        let pt = self.limits.page_tokens;
        let table = &self.seqs[slot as usize].table;
        let end = pages_for(to, pt);
        let shared = (from / pt..end.min(table.len()))
            .filter(|&i| self.pool.refs(table[i]) > 1)
            .count();
        end.saturating_sub(table.len()) + shared
    }

    /// Make positions `from..to` of `slot` writable: copy pages others hold too
    /// (copy-on-write), append new pages. The caller made sure enough pages are free.
    pub(super) fn prepare_write(
        &mut self,
        slot: u32,
        from: usize,
        to: usize,
    ) -> Result<(), RequestError> {
        let pt = self.limits.page_tokens;
        let end = pages_for(to, pt);
        let seq = &mut self.seqs[slot as usize];
        let dry = || RequestError::Backend("KV pool ran dry".into());
        for i in from / pt..end.min(seq.table.len()) {
            let old = seq.table[i];
            if self.pool.refs(old) > 1 {
                let new = self.pool.alloc().ok_or_else(dry)?;
                seq.table[i] = new;
                self.pool.release_page(old);
                self.backend
                    .copy_page(old, new)
                    .map_err(|e| RequestError::Backend(e.to_string()))?;
            }
        }
        while seq.table.len() < end {
            let page = self.pool.alloc().ok_or_else(dry)?;
            seq.table.push(page);
        }
        Ok(())
    }
}
