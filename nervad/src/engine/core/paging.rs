//! KV pages of the engine's sequences: admission's page arithmetic, growth with
//! copy-on-write, prefix-cache hits and registration, preemption and resumption (the policy
//! choices come from [`crate::engine::scheduler`]; the module docs of `core` tell the story).

use super::*;

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
    /// again, best rank first, while slots and pages allow; a preempted one recomputes its
    /// prefix. Returns false when one that could run still waits (nothing new is admitted past
    /// it). `backlog` is the prefill backlog of [`Engine::prefill_backlog`], kept current.
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
            // Pages up to and including the position it writes next.
            let seq = &self.parked[i];
            let need = pages_for(seq.tokens.len(), pt).saturating_sub(seq.table.len());
            if self.free_slots.is_empty() || !self.reclaim_paused(*backlog + need) {
                return false;
            }
            let mut seq = self.parked.swap_remove(i);
            if seq.preempted {
                *backlog += pages_for(seq.prefill_to, pt);
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
            let found = self.parked.iter_mut().find(|s| {
                !s.table.is_empty()
                    && requests[s.request]
                        .as_ref()
                        .is_some_and(|r| paused.contains(&r.key.client))
            });
            if let Some(seq) = found {
                Self::drop_kv(&mut self.pool, seq);
                self.preemptions += 1;
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

    /// Drop `seq`'s KV pages: it will prefill its prefix again, then decode on from its last
    /// sampled token (which stays in `input`) without sampling at the end of the recompute.
    pub(super) fn drop_kv(pool: &mut KvPagePool, seq: &mut Sequence) {
        pool.release(&mut seq.table);
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

    /// Preempt the sequence in `slot`: free its pages and its slot (module docs).
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
        Self::drop_kv(&mut self.pool, &mut seq);
        self.preemptions += 1;
        self.parked.push(seq);
    }

    /// Free pages for a sequence of rank `rank`: drop the pages of a sample without a slot
    /// (it is not running anyway), else preempt the lowest-ranked sequence that holds pages,
    /// ranks below `rank` and is not in the step being planned. False when there is none.
    pub(super) fn preempt_one_below(&mut self, rank: Rank) -> bool {
        if let Some(seq) = self.parked.iter_mut().find(|s| !s.table.is_empty()) {
            Self::drop_kv(&mut self.pool, seq);
            self.preemptions += 1;
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
