//! Forming steps: the planned step (decodes by rank, then prefill chunks by fair share, each
//! taking its pages) and the step launched ahead while one is in flight.

use super::*;
use crate::backend::BackendError;

impl Engine {
    /// Order the slots waiting to prefill (initially or recomputing): least-served client
    /// first, then priority, then arrival, then sample.
    pub(super) fn plan_prefill_order(&mut self) {
        self.prefill_order.clear();
        for (slot, seq) in self.seqs.iter().enumerate() {
            if !seq.active || !seq.prefilling() {
                continue;
            }
            let Some(req) = self.requests[seq.request].as_ref() else {
                continue;
            };
            if self.paused.contains(&req.key.client) {
                continue;
            }
            self.prefill_order.push(slot);
        }
        let requests = &self.requests;
        let seqs = &self.seqs;
        let fair = &self.fair;
        let key = |slot: &usize| {
            let seq = &seqs[*slot];
            requests[seq.request]
                .as_ref()
                .map(|r| fair_key(fair, r.key.client, r.priority, (r.received_at, seq.sample)))
        };
        // sort_unstable_by_key on a small, preallocated vector: no allocation.
        self.prefill_order.sort_unstable_by_key(key);
    }

    /// Most prompt tokens a step carries on top of its decode tokens: the prefill chunk,
    /// except for a `lone` prompt (no decode token in the step, no other prompt to prefill) with
    /// no request queued, which only the step budget bounds. The chunk keeps decoding streams
    /// flowing and waiting prompts taking turns; with neither there it only makes the prompt
    /// wait (a 2,048-token prompt in four steps of 512 instead of one of 2,048).
    fn prompt_cap(&self, lone: bool) -> usize {
        if lone && self.queue.is_empty() && self.parked.is_empty() {
            usize::MAX
        } else {
            self.prefill_chunk
        }
    }

    /// Choose the step's entries into `self.entries`: every runnable decoding sample (best
    /// rank first, each taking the page its next position needs, preempting lower-ranked
    /// sequences when the pool is dry, or itself when it ranks lowest), then prefill chunks
    /// filling the token budget with the pages left.
    pub(super) fn plan_step(&mut self, sink: &mut dyn EventSink) {
        self.entries.clear();
        let mut budget = self.limits.max_step_tokens;
        self.order.clear();
        for (slot, seq) in self.seqs.iter().enumerate() {
            if !seq.active || !seq.decoding {
                continue;
            }
            let Some(req) = self.requests[seq.request].as_ref() else {
                continue;
            };
            if !self.paused.contains(&req.key.client) {
                self.order.push(slot as u32);
            }
        }
        let requests = &self.requests;
        let seqs = &self.seqs;
        self.order
            .sort_unstable_by_key(|&slot| Self::rank_of(requests, &seqs[slot as usize]));
        for i in 0..self.order.len() {
            let slot = self.order[i];
            let seq = &self.seqs[slot as usize];
            // A lower-ranked sequence may have been preempted for a better one already.
            if !seq.active || !seq.decoding || budget == 0 {
                continue;
            }
            let (rid, pos, epoch) = (seq.request, seq.len, seq.epoch);
            let rank = Self::rank_of(&self.requests, seq);
            let need = self.pages_to_write(slot, pos, pos + 1);
            if need > 0 && !self.make_room(need, rank) {
                self.preempt(slot);
                continue;
            }
            if let Err(e) = self.prepare_write(slot, pos, pos + 1) {
                self.fail_request(rid, e, Some(&mut *sink));
                continue;
            }
            self.entries.push(StepEntry {
                slot,
                request: rid,
                prefill: 0,
                epoch,
            });
            budget -= 1;
        }

        self.plan_prefill_order();
        let pt = self.limits.page_tokens;
        // Prompt chunks take what the decode tokens left, up to the prefill chunk (a lone
        // prompt: up to the budget).
        let lone = self.entries.is_empty() && self.prefill_order.len() == 1;
        let mut budget = budget.min(self.prompt_cap(lone));
        for i in 0..self.prefill_order.len() {
            if budget == 0 || self.entries.len() >= self.limits.max_seqs {
                break;
            }
            let slot = self.prefill_order[i] as u32;
            if !self.seqs[slot as usize].active {
                continue;
            }
            self.extend_from_cache(slot);
            let seq = &self.seqs[slot as usize];
            if !seq.prefilling() {
                // The cache held all of it (a recompute, or a fork's shared prompt).
                self.prefill_done(slot, None, Instant::now(), sink);
                continue;
            }
            let (rid, from, epoch) = (seq.request, seq.len, seq.epoch);
            let rank = Self::rank_of(&self.requests, seq);
            let mut to = from + (seq.prefill_to - from).min(budget);
            let need = self.pages_to_write(slot, from, to);
            if need > self.pool.free() {
                // Only lower-ranked prefills and parked samples make room for a prefill
                // (running decodes are in the step already); then the chunk shrinks to the
                // pages there are.
                self.make_room(need, rank);
                let seq = &self.seqs[slot as usize];
                to = to.min((seq.table.len() + self.pool.free()) * pt);
                if to <= from || self.pages_to_write(slot, from, to) > self.pool.free() {
                    continue;
                }
            }
            if let Err(e) = self.prepare_write(slot, from, to) {
                self.fail_request(rid, e, Some(&mut *sink));
                continue;
            }
            self.entries.push(StepEntry {
                slot,
                request: rid,
                prefill: to - from,
                epoch,
            });
            budget -= to - from;
        }
        // A request failed above may have had entries already.
        let seqs = &self.seqs;
        self.entries.retain(|e| {
            let seq = &seqs[e.slot as usize];
            seq.active && seq.epoch == e.epoch && seq.request == e.request
        });
    }

    /// Build the step of `self.entries` (borrowing the sequences; the entries remember who is
    /// who) and launch it; Ok(false) when there is nothing to launch. `ahead_of`: the index in
    /// `launched` of the step in flight that this one follows without having seen its tokens
    /// (`launch_speculative`); each slot then starts past the positions that step covers.
    pub(super) fn launch_entries(&mut self, ahead_of: Option<usize>) -> Result<bool, BackendError> {
        let mut batch: Vec<SeqStep<'_>> = recycle(std::mem::take(&mut self.step_buf));
        for e in &self.entries {
            let seq = &self.seqs[e.slot as usize];
            let (at, from_last_sample) = match ahead_of {
                None => (seq.len, seq.input_sampled),
                Some(head) => {
                    // The slot's entry in the step in flight (every entry here has one).
                    let was = self.launched[head]
                        .iter()
                        .find(|p| p.slot == e.slot)
                        .map_or(1, |p| p.prefill);
                    // The slot samples this token in the step in flight, except after a
                    // recompute: then it is the host's last token.
                    (seq.len + was.max(1), was == 0 || seq.sample_after_prefill)
                }
            };
            batch.push(if e.prefill == 0 {
                SeqStep {
                    slot: e.slot,
                    tokens: &seq.input,
                    start_pos: at as u32,
                    block_table: &seq.table,
                    sample: true,
                    want_logits: false,
                    from_last_sample,
                }
            } else {
                let end = at + e.prefill;
                SeqStep {
                    slot: e.slot,
                    tokens: &seq.tokens[at..end],
                    start_pos: at as u32,
                    block_table: &seq.table,
                    sample: end == seq.prefill_to && seq.sample_after_prefill,
                    want_logits: false,
                    from_last_sample: false,
                }
            });
        }
        let result = if batch.is_empty() {
            Ok(false)
        } else {
            self.backend.launch(&batch, &mut self.out).map(|()| true)
        };
        self.step_buf = recycle(batch);
        result
    }

    /// With one step in flight, launch the next step of its sequences without waiting for its
    /// tokens, so the device never idles while the host learns them. Each decode entry
    /// decodes one position further, feeding the token its slot samples in the step in flight
    /// (`from_last_sample`); each prefill chunk goes on with its next chunk (its tokens are on
    /// the host), and a prefill that ends in the step in flight decodes next (from its sampled
    /// token, or its last token after a recompute). Only when nothing else waits (no cancel,
    /// no queued request that a free slot could take, no prefill outside the step, no sample
    /// waiting for a slot, no paused client in the step, no fork due: a fork changes host
    /// state the next step needs; a full batch with a queue behind it keeps launching ahead
    /// until a slot frees), only for
    /// sequences that cannot finish by count in the step in flight (a sequence that stops on a
    /// token there costs this one discarded entry), and only when the pages the step needs are
    /// free (otherwise the next planned step preempts).
    pub(super) fn launch_speculative(&mut self, sink: &mut dyn EventSink) {
        if !self.backend.overlaps() {
            return;
        }
        match self.try_launch_ahead(sink) {
            Ok(()) => self.launch_ahead.launched += 1,
            Err(Some(why)) => self.launch_ahead.missed[why as usize] += 1,
            Err(None) => {}
        }
    }

    /// `launch_speculative`'s work: Ok when a step went out, else why not (None: nothing in
    /// flight, or the launch failed and its requests with it).
    fn try_launch_ahead(&mut self, sink: &mut dyn EventSink) -> Result<(), Option<AheadMiss>> {
        let could_admit = !self.queue.is_empty() && !self.free_slots.is_empty();
        if !self.cancelled.is_empty() || could_admit {
            return Err(Some(AheadMiss::Admission));
        }
        let prev = &self.launched[self.launched_head];
        if prev.is_empty() {
            return Err(None);
        }
        let in_prev = |slot: usize| prev.iter().any(|e| e.slot as usize == slot);
        // Work of a paused client waits for the client, not for this step.
        let runnable = |s: &Sequence| {
            self.requests[s.request]
                .as_ref()
                .is_some_and(|r| !self.paused.contains(&r.key.client))
        };
        let waiting = self
            .seqs
            .iter()
            .enumerate()
            .any(|(slot, s)| s.active && s.prefilling() && !in_prev(slot) && runnable(s))
            || self.parked.iter().any(runnable);
        if waiting {
            return Err(Some(AheadMiss::Waiting));
        }
        let pt = self.limits.page_tokens;
        self.entries.clear();
        let mut new_pages = 0usize;
        let mut budget = self.limits.max_step_tokens;
        // Nothing waits outside the step (above): a step of one prompt goes on alone.
        let mut prompt_budget = self.prompt_cap(prev.len() == 1);
        for e in prev {
            let seq = &self.seqs[e.slot as usize];
            if !seq.active || seq.epoch != e.epoch || seq.request != e.request {
                continue;
            }
            let Some(req) = self.requests[seq.request].as_ref() else {
                continue;
            };
            if self.paused.contains(&req.key.client) {
                return Err(Some(AheadMiss::HostState));
            }
            // Where the sequence stands once the step in flight is collected.
            let at = seq.len + e.prefill.max(1);
            let decodes_next = e.prefill == 0 || at == seq.prefill_to;
            let next = if decodes_next {
                if e.prefill > 0 && req.phase == Phase::Prefill && req.n_samples > 1 {
                    return Err(Some(AheadMiss::HostState));
                }
                // Tokens it will have sampled after the step in flight (none more after a
                // recompute); the next step samples one more, which must still be allowed.
                let sampled_now = e.prefill == 0 || seq.sample_after_prefill;
                let after = seq.generated as usize + usize::from(sampled_now);
                if after >= req.max_tokens as usize || seq.prompt_len + after >= seq.limit {
                    continue;
                }
                1
            } else {
                let chunk = (seq.prefill_to - at).min(budget).min(prompt_budget);
                prompt_budget -= chunk;
                chunk
            };
            if next == 0 || budget < next {
                return Err(Some(AheadMiss::Budget));
            }
            budget -= next;
            // Written before the step in flight's tokens are known: never into a page others
            // hold (past a fork's first step only full pages, never written again, are shared).
            for i in at / pt..pages_for(at + next, pt) {
                match seq.table.get(i) {
                    Some(&page) if self.pool.refs(page) > 1 => {
                        return Err(Some(AheadMiss::Pages));
                    }
                    Some(_) => {}
                    None => new_pages += 1,
                }
            }
            self.entries.push(StepEntry {
                prefill: if decodes_next { 0 } else { next },
                ..*e
            });
        }
        if new_pages > self.pool.free() {
            return Err(Some(AheadMiss::Pages));
        }
        // The in-flight entry of a slot (every entry here has one).
        let prev = &self.launched[self.launched_head];
        let before = |slot: u32| {
            prev.iter()
                .find(|p| p.slot == slot)
                .map_or(1, |p| p.prefill)
        };
        for e in &self.entries {
            let seq = &mut self.seqs[e.slot as usize];
            let end = seq.len + before(e.slot).max(1) + e.prefill.max(1);
            while seq.table.len() < pages_for(end, pt) {
                match self.pool.alloc() {
                    Some(page) => seq.table.push(page),
                    None => return Err(Some(AheadMiss::Pages)),
                }
            }
        }
        match self.launch_entries(Some(self.launched_head)) {
            Ok(true) => {
                self.push_launched();
                Ok(())
            }
            Ok(false) => Err(Some(AheadMiss::Finishing)),
            Err(e) => {
                self.fail_entries(RequestError::Backend(e.to_string()), sink);
                Err(None)
            }
        }
    }
}
