//! Host-side sampling: logits of one position → one token, per sequence slot.
//!
//! The order follows Hugging Face `generate`: repetition penalty (CTRL: positive logits divided,
//! negative multiplied, over every distinct prompt and output token), presence and frequency
//! penalties (OpenAI: over output tokens), temperature, then top-k, top-p, min-p truncation, then
//! a draw from the slot's own ChaCha stream. One draw per sampled token and nothing shared
//! between slots, so a request's tokens depend only on its seed and its own logits — never on
//! what else is in the batch.
//!
//! Log-probabilities are `log_softmax` of the logits after penalties and temperature
//! (temperature 1 when greedy), before truncation.
//!
//! Nothing here allocates per token: every buffer is sized at construction.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{BackendError, MAX_TOP_LOGPROBS, SampledToken};
use crate::backend::SamplingParams;

/// How many top candidates are sorted before falling back to a full sort for top-p.
const TOP_P_FIRST_PASS: usize = 1024;

/// Scratch of one sampling thread: `(token, logit)` candidates, vocabulary-sized.
pub type Candidates = Vec<(u32, f32)>;

/// Penalty and random state of one sequence slot.
#[derive(Debug)]
pub struct SlotState {
    params: SamplingParams,
    rng: ChaCha8Rng,
    /// Occurrences of each token in the output so far (presence/frequency penalties).
    output_counts: Vec<u32>,
    /// Bit per token: appears in the prompt (repetition penalty).
    in_prompt: Vec<u64>,
    /// Distinct tokens seen in prompt or output, each once; the penalty loops and the reset walk
    /// only these, never the whole vocabulary.
    distinct: Vec<u32>,
}

impl SlotState {
    fn new(vocab: usize) -> Self {
        SlotState {
            params: SamplingParams::default(),
            rng: ChaCha8Rng::seed_from_u64(0),
            output_counts: vec![0; vocab],
            in_prompt: vec![0; vocab.div_ceil(64)],
            distinct: Vec::with_capacity(vocab.min(1 << 16)),
        }
    }

    fn seen(&self, token: u32) -> bool {
        let t = token as usize;
        self.output_counts[t] > 0 || self.in_prompt[t / 64] & (1 << (t % 64)) != 0
    }

    fn clear(&mut self) {
        for &t in &self.distinct {
            let t = t as usize;
            self.output_counts[t] = 0;
            self.in_prompt[t / 64] &= !(1 << (t % 64));
        }
        self.distinct.clear();
    }

    fn note_prompt(&mut self, token: u32) {
        if !self.seen(token) {
            self.distinct.push(token);
        }
        let t = token as usize;
        self.in_prompt[t / 64] |= 1 << (t % 64);
    }

    /// Count a sampled token into the output penalty state.
    pub fn note_output(&mut self, token: u32) {
        let t = token as usize;
        if t >= self.output_counts.len() {
            return;
        }
        if !self.seen(token) {
            self.distinct.push(token);
        }
        self.output_counts[t] = self.output_counts[t].saturating_add(1);
    }
}

/// Validate sampling parameters (ranges a request must respect).
pub fn validate_params(p: &SamplingParams) -> Result<(), &'static str> {
    if !(p.temperature.is_finite() && p.temperature >= 0.0) {
        return Err("temperature must be finite and >= 0");
    }
    if !(p.top_p > 0.0 && p.top_p <= 1.0) {
        return Err("top_p must be in (0, 1]");
    }
    if !(0.0..=1.0).contains(&p.min_p) {
        return Err("min_p must be in [0, 1]");
    }
    if !(p.repetition_penalty.is_finite() && p.repetition_penalty > 0.0) {
        return Err("repetition_penalty must be finite and > 0");
    }
    if !p.presence_penalty.is_finite() || !p.frequency_penalty.is_finite() {
        return Err("presence/frequency penalties must be finite");
    }
    if usize::from(p.top_logprobs) > MAX_TOP_LOGPROBS {
        return Err("top_logprobs must be <= 20");
    }
    Ok(())
}

/// What every backend checks before (re)starting sampling slot `slot` of `slots` for `prompt`.
pub fn check_start(
    params: &SamplingParams,
    slot: u32,
    slots: usize,
    prompt: &[u32],
    vocab: usize,
) -> Result<(), BackendError> {
    validate_params(params).map_err(|e| BackendError::InvalidInput(e.to_string()))?;
    if slot as usize >= slots {
        return Err(BackendError::InvalidInput(format!(
            "slot {slot} out of range"
        )));
    }
    if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= vocab) {
        return Err(BackendError::InvalidInput(format!(
            "token {bad} outside vocabulary"
        )));
    }
    Ok(())
}

/// What every backend checks before forking slot `src` into `dst`.
pub fn check_fork(
    params: &SamplingParams,
    src: u32,
    dst: u32,
    slots: usize,
) -> Result<(), BackendError> {
    validate_params(params).map_err(|e| BackendError::InvalidInput(e.to_string()))?;
    if src == dst {
        return Err(BackendError::InvalidInput("fork onto itself".into()));
    }
    if src as usize >= slots || dst as usize >= slots {
        return Err(BackendError::InvalidInput(format!(
            "fork {src} -> {dst} out of range"
        )));
    }
    Ok(())
}

/// Sampling state for every slot plus shared scratch.
#[derive(Debug)]
pub struct Sampler {
    vocab: usize,
    slots: Vec<SlotState>,
    /// `(token, logit)` candidates for truncation, one vocabulary-sized buffer per thread that
    /// may sample concurrently.
    candidates: Vec<Vec<(u32, f32)>>,
}

impl Sampler {
    /// State for `slots` sequences over a vocabulary of `vocab` tokens.
    pub fn new(vocab: usize, slots: usize) -> Self {
        Sampler::with_threads(vocab, slots, 1)
    }

    /// Like [`Sampler::new`], with scratch for `threads` concurrent samplers.
    pub fn with_threads(vocab: usize, slots: usize, threads: usize) -> Self {
        Sampler {
            vocab,
            slots: (0..slots).map(|_| SlotState::new(vocab)).collect(),
            candidates: (0..threads.max(1))
                .map(|_| Vec::with_capacity(vocab))
                .collect(),
        }
    }

    /// Every slot's state and every thread's scratch, for sampling several slots at once with
    /// [`sample_slot`].
    pub fn parts_mut(&mut self) -> (&mut [SlotState], &mut [Candidates]) {
        (&mut self.slots, &mut self.candidates)
    }

    fn slot_mut(&mut self, slot: u32) -> Result<&mut SlotState, BackendError> {
        self.slots
            .get_mut(slot as usize)
            .ok_or_else(|| BackendError::InvalidInput(format!("slot {slot} out of range")))
    }

    /// Reset `slot` for a new sequence.
    pub fn start(
        &mut self,
        slot: u32,
        params: &SamplingParams,
        seed: u64,
        prompt: &[u32],
    ) -> Result<(), BackendError> {
        check_start(params, slot, self.slots.len(), prompt, self.vocab)?;
        let state = self.slot_mut(slot)?;
        state.clear();
        state.params = *params;
        state.rng = ChaCha8Rng::seed_from_u64(seed);
        if params.repetition_penalty != 1.0 {
            for &t in prompt {
                state.note_prompt(t);
            }
        }
        Ok(())
    }

    /// Put `slot` in the state `start(slot, params, seed, prompt)` followed by sampling
    /// `output` leaves: output tokens counted, and the random stream past their draws. A draw
    /// happens only when sampling (temperature > 0) and takes exactly one `next_u64` (two
    /// ChaCha words, see `draw`), so the stream position is `2 * output.len()` words.
    pub fn resume(
        &mut self,
        slot: u32,
        params: &SamplingParams,
        seed: u64,
        prompt: &[u32],
        output: &[u32],
    ) -> Result<(), BackendError> {
        if let Some(&bad) = output.iter().find(|&&t| t as usize >= self.vocab) {
            return Err(BackendError::InvalidInput(format!(
                "token {bad} outside vocabulary"
            )));
        }
        self.start(slot, params, seed, prompt)?;
        let state = self.slot_mut(slot)?;
        for &t in output {
            state.note_output(t);
        }
        if params.temperature > 0.0 {
            state.rng.set_word_pos(2 * output.len() as u128);
        }
        Ok(())
    }

    /// Make `dst` a copy of `src`'s penalty state with new parameters and seed.
    pub fn fork(
        &mut self,
        src: u32,
        dst: u32,
        params: &SamplingParams,
        seed: u64,
    ) -> Result<(), BackendError> {
        check_fork(params, src, dst, self.slots.len())?;
        let (s, d) = if src < dst {
            let (a, b) = self.slots.split_at_mut(dst as usize);
            (&a[src as usize], &mut b[0])
        } else {
            let (a, b) = self.slots.split_at_mut(src as usize);
            (&b[0], &mut a[dst as usize])
        };
        d.clear();
        for &t in &s.distinct {
            let i = t as usize;
            d.output_counts[i] = s.output_counts[i];
            d.in_prompt[i / 64] |= s.in_prompt[i / 64] & (1 << (i % 64));
            d.distinct.push(t);
        }
        d.params = *params;
        d.rng = ChaCha8Rng::seed_from_u64(seed);
        Ok(())
    }

    /// Sample from `logits` (one position, modified in place by penalties and temperature) for
    /// `slot`, and count the token into the slot's output state.
    pub fn sample(&mut self, slot: u32, logits: &mut [f32]) -> Result<SampledToken, BackendError> {
        if logits.len() != self.vocab {
            return Err(BackendError::InvalidInput(
                "logits row has wrong width".into(),
            ));
        }
        let candidates = &mut self.candidates[0];
        let state = self
            .slots
            .get_mut(slot as usize)
            .ok_or_else(|| BackendError::InvalidInput(format!("slot {slot} out of range")))?;
        Ok(sample_slot(state, logits, candidates))
    }
}

/// Sample from `logits` (modified in place) for one slot with `candidates` as scratch, and count
/// the token into the slot's output state. `logits` must have the vocabulary's width.
pub fn sample_slot(
    state: &mut SlotState,
    logits: &mut [f32],
    candidates: &mut Vec<(u32, f32)>,
) -> SampledToken {
    let out = sample_row(state, logits, candidates);
    state.note_output(out.token);
    out
}

/// `e^x` for `x <= 0` (log-sum-exp and sampling weights), branch-free so the vocabulary-wide
/// loops vectorize: Cody-Waite range reduction and the Cephes `expf` polynomial, within 2 ulp
/// of the exact value; inputs below -87 give about 1e-38 instead of 0.
#[inline(always)]
pub fn exp_nonpositive(x: f32) -> f32 {
    let x = x.clamp(-87.0, 0.0);
    // Round to nearest with the 1.5 * 2^23 trick (exact for |v| < 2^22; plain adds vectorize
    // where `round` would be a libm call without SSE4.1).
    const MAGIC: f32 = 12_582_912.0;
    let n = (x * std::f32::consts::LOG2_E + MAGIC) - MAGIC;
    let r = x - n * 0.693_359_4 - n * -2.121_944_4e-4;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    // Cephes' 5.0000001201e-1 rounds to exactly 0.5 in f32.
    p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    // n is in [-126, 0]: 2^n is a normal f32.
    y * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

fn apply_penalties(state: &SlotState, logits: &mut [f32]) {
    let p = &state.params;
    if p.repetition_penalty != 1.0 {
        for &t in &state.distinct {
            let l = &mut logits[t as usize];
            // CTRL (Keskar et al. 2019) as in transformers' RepetitionPenaltyLogitsProcessor.
            *l = if *l > 0.0 {
                *l / p.repetition_penalty
            } else {
                *l * p.repetition_penalty
            };
        }
    }
    if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
        for &t in &state.distinct {
            let count = state.output_counts[t as usize];
            if count > 0 {
                logits[t as usize] -= p.presence_penalty + p.frequency_penalty * count as f32;
            }
        }
    }
}

/// Descending by logit, ties broken by the lower token id (a total order, so results never
/// depend on the sort algorithm).
fn by_logit_desc(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

fn sample_row(
    state: &mut SlotState,
    logits: &mut [f32],
    candidates: &mut Vec<(u32, f32)>,
) -> SampledToken {
    apply_penalties(state, logits);
    let p = state.params;
    if p.temperature > 0.0 && p.temperature != 1.0 {
        for l in logits.iter_mut() {
            *l /= p.temperature;
        }
    }
    // log-sum-exp in f64 for the log-probabilities.
    let mut max = f32::NEG_INFINITY;
    let mut argmax = 0usize;
    for (i, &l) in logits.iter().enumerate() {
        if l > max {
            max = l;
            argmax = i;
        }
    }
    // exp in f32 (within 2 ulp; this vocabulary-wide loop is on every token's path), summed
    // in f64.
    let sum: f64 = logits
        .iter()
        .map(|&l| f64::from(exp_nonpositive(l - max)))
        .sum::<f64>();
    let lse = f64::from(max) + sum.ln();
    let logprob_of = |l: f32| (f64::from(l) - lse) as f32;

    let token = if p.temperature == 0.0 {
        argmax as u32
    } else {
        draw(state, logits, candidates, max)
    };
    let mut out = SampledToken {
        token,
        logprob: logprob_of(logits[token as usize]),
        ..SampledToken::default()
    };
    let n = usize::from(p.top_logprobs)
        .min(MAX_TOP_LOGPROBS)
        .min(logits.len());
    if n > 0 {
        // Insertion into a short sorted list: one pass, no allocation.
        let mut top: [(u32, f32); MAX_TOP_LOGPROBS] = [(0, f32::NEG_INFINITY); MAX_TOP_LOGPROBS];
        let mut len = 0usize;
        for (i, &l) in logits.iter().enumerate() {
            let item = (i as u32, l);
            if len == n && by_logit_desc(&item, &top[n - 1]) != std::cmp::Ordering::Less {
                continue;
            }
            let mut j = if len < n { len } else { n - 1 };
            while j > 0 && by_logit_desc(&item, &top[j - 1]) == std::cmp::Ordering::Less {
                top[j] = top[j - 1];
                j -= 1;
            }
            top[j] = item;
            if len < n {
                len += 1;
            }
        }
        for (k, &(id, l)) in top[..len].iter().enumerate() {
            out.top_ids[k] = id;
            out.top_logprobs[k] = logprob_of(l);
        }
        out.top_n = len as u8;
    }
    out
}

/// Truncate (top-k, top-p, min-p) and draw one token. `max` is the largest logit.
fn draw(state: &mut SlotState, logits: &[f32], candidates: &mut Vec<(u32, f32)>, max: f32) -> u32 {
    let p = state.params;
    let vocab = logits.len();
    candidates.clear();
    candidates.extend(logits.iter().enumerate().map(|(i, &l)| (i as u32, l)));
    // top-k: keep the k best (sorted).
    let k = if p.top_k > 0 {
        (p.top_k as usize).min(vocab)
    } else {
        vocab
    };
    let mut sorted_len;
    if k < vocab {
        candidates.select_nth_unstable_by(k - 1, by_logit_desc);
        candidates.truncate(k);
        candidates.sort_unstable_by(by_logit_desc);
        sorted_len = k;
    } else if p.top_p < 1.0 && vocab > TOP_P_FIRST_PASS {
        // Usually the top-p set is small: sort only the best few first.
        candidates.select_nth_unstable_by(TOP_P_FIRST_PASS - 1, by_logit_desc);
        candidates[..TOP_P_FIRST_PASS].sort_unstable_by(by_logit_desc);
        sorted_len = TOP_P_FIRST_PASS;
    } else {
        candidates.sort_unstable_by(by_logit_desc);
        sorted_len = candidates.len();
    }
    // Probabilities relative to the best (exp(l - max)); the normalizer is over the candidates
    // still in play, as transformers renormalizes after each warper.
    let weight = |l: f32| f64::from(exp_nonpositive(l - max));
    if p.top_p < 1.0 {
        let total: f64 = candidates.iter().map(|c| weight(c.1)).sum();
        let target = f64::from(p.top_p) * total;
        // Keep a token while the mass strictly before it is below top_p (transformers removes
        // tokens whose ascending cumulative mass is <= 1 - top_p); always keep one.
        let mut cum = 0.0f64;
        let mut keep = 0usize;
        loop {
            if keep == sorted_len && sorted_len < candidates.len() {
                // The first pass was not enough: sort the rest too.
                candidates[sorted_len..].sort_unstable_by(by_logit_desc);
                sorted_len = candidates.len();
            }
            if keep >= sorted_len || (keep > 0 && cum >= target) {
                break;
            }
            cum += weight(candidates[keep].1);
            keep += 1;
        }
        candidates.truncate(keep);
    } else {
        candidates.truncate(sorted_len);
    }
    if p.min_p > 0.0 {
        // Candidates are sorted; the best is candidates[0].
        let best = weight(candidates[0].1);
        let threshold = f64::from(p.min_p) * best;
        let keep = candidates
            .iter()
            .position(|c| weight(c.1) < threshold)
            .unwrap_or(candidates.len())
            .max(1);
        candidates.truncate(keep);
    }
    let total: f64 = candidates.iter().map(|c| weight(c.1)).sum();
    let u: f64 = state.rng.random::<f64>() * total;
    let mut cum = 0.0f64;
    for c in candidates.iter() {
        cum += weight(c.1);
        if u < cum {
            return c.0;
        }
    }
    // Rounding left u at the very top: the last candidate.
    candidates.last().map_or(0, |c| c.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> SamplingParams {
        SamplingParams {
            temperature: 1.0,
            ..SamplingParams::default()
        }
    }

    fn histogram(params: SamplingParams, logits: &[f32], draws: usize) -> Vec<usize> {
        let mut s = Sampler::new(logits.len(), 1);
        s.start(0, &params, 7, &[]).unwrap();
        let mut h = vec![0; logits.len()];
        let mut row = logits.to_vec();
        for _ in 0..draws {
            row.copy_from_slice(logits);
            // Restart penalties each draw: only the truncation is under test.
            s.slots[0].clear();
            let t = s.sample(0, &mut row).unwrap();
            h[t.token as usize] += 1;
        }
        h
    }

    /// A slot resumed from (seed, prompt, output) samples exactly what the slot that produced
    /// `output` samples next: same penalties, same position in the random stream (also across
    /// ChaCha's buffer refills, 64 words = 32 draws).
    #[test]
    fn resume_continues_the_exact_stream_and_penalties() {
        let vocab = 40;
        let p = SamplingParams {
            temperature: 0.8,
            top_k: 20,
            repetition_penalty: 1.3,
            presence_penalty: 0.4,
            frequency_penalty: 0.3,
            ..SamplingParams::default()
        };
        let logits: Vec<f32> = (0..vocab).map(|i| ((i * 7) % 11) as f32 * 0.3).collect();
        let prompt = [1u32, 5, 9, 5];
        for (cut, params) in [
            (0, p),
            (3, p),
            (33, p),
            (70, p),
            (5, SamplingParams::default()),
        ] {
            let mut a = Sampler::new(vocab, 2);
            a.start(0, &params, 11, &prompt).unwrap();
            let mut output = Vec::new();
            let mut row = logits.clone();
            for _ in 0..cut {
                row.copy_from_slice(&logits);
                output.push(a.sample(0, &mut row).unwrap().token);
            }
            a.resume(1, &params, 11, &prompt, &output).unwrap();
            for i in 0..40 {
                let mut r0 = logits.clone();
                let mut r1 = logits.clone();
                let t0 = a.sample(0, &mut r0).unwrap();
                let t1 = a.sample(1, &mut r1).unwrap();
                assert_eq!(t0, t1, "cut {cut}, draw {i}");
            }
        }
        let mut a = Sampler::new(vocab, 1);
        assert!(a.resume(0, &p, 1, &prompt, &[vocab as u32]).is_err());
    }

    #[test]
    fn fast_exp_is_accurate() {
        let mut worst = 0f64;
        for i in 0..=200_000 {
            let x = -(i as f32) * 86.0 / 200_000.0;
            let got = f64::from(exp_nonpositive(x));
            let want = f64::from(x).exp();
            worst = worst.max(((got - want) / want).abs());
        }
        assert!(worst < 3e-7, "relative error {worst:e}");
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert!(exp_nonpositive(f32::NEG_INFINITY) < 1e-37);
    }

    #[test]
    fn greedy_takes_first_max_and_reports_logprob() {
        let mut s = Sampler::new(4, 1);
        s.start(0, &SamplingParams::default(), 0, &[]).unwrap();
        let mut row = vec![1.0, 3.0, 3.0, -1.0];
        let t = s.sample(0, &mut row).unwrap();
        assert_eq!(t.token, 1);
        let lse = (1f64.exp() + 2.0 * 3f64.exp() + (-1f64).exp()).ln();
        assert!((f64::from(t.logprob) - (3.0 - lse)).abs() < 1e-6);
    }

    #[test]
    fn top_k_masks_all_but_k() {
        let logits = [0.0, 2.0, 1.0, 1.5, -3.0];
        let h = histogram(
            SamplingParams {
                top_k: 2,
                ..params()
            },
            &logits,
            400,
        );
        assert_eq!(h[0] + h[2] + h[4], 0, "{h:?}");
        assert!(h[1] > 0 && h[3] > 0, "{h:?}");
    }

    #[test]
    fn top_p_keeps_smallest_prefix_reaching_p() {
        // probs ∝ [8, 4, 2, 1, 1] / 16 = .5 .25 .125 .0625 .0625
        let logits: Vec<f32> = [8f32, 4., 2., 1., 1.].iter().map(|x| x.ln()).collect();
        // p = 0.7: .5 (< .7, keep next) .75 → keep tokens 0,1.
        let h = histogram(
            SamplingParams {
                top_p: 0.7,
                ..params()
            },
            &logits,
            400,
        );
        assert_eq!(h[2] + h[3] + h[4], 0, "{h:?}");
        assert!(h[0] > 0 && h[1] > 0);
        // p = 0.75 exactly reached after two: still two.
        let h = histogram(
            SamplingParams {
                top_p: 0.75,
                ..params()
            },
            &logits,
            400,
        );
        assert_eq!(h[2] + h[3] + h[4], 0, "{h:?}");
    }

    #[test]
    fn top_p_first_pass_falls_back_to_full_sort() {
        // Flat distribution over 2000 tokens: top-p 0.9 needs 1800 > the 1024 of the first pass.
        let logits = vec![0.0f32; 2000];
        let h = histogram(
            SamplingParams {
                top_p: 0.9,
                ..params()
            },
            &logits,
            300,
        );
        // Ties sort by id: tokens >= 1800 are never drawn; draws reach past the first pass.
        assert_eq!(h[1800..].iter().sum::<usize>(), 0);
        assert!(h[1024..1800].iter().sum::<usize>() > 0);
        assert!(h.iter().filter(|&&c| c > 0).count() > 100);
    }

    #[test]
    fn min_p_drops_tokens_below_fraction_of_best() {
        let logits: Vec<f32> = [10f32, 5., 0.9, 0.5].iter().map(|x| x.ln()).collect();
        let h = histogram(
            SamplingParams {
                min_p: 0.1,
                ..params()
            },
            &logits,
            400,
        );
        assert_eq!(h[2] + h[3], 0, "{h:?}");
        assert!(h[1] > 0);
    }

    #[test]
    fn repetition_penalty_is_ctrl_over_prompt_and_output() {
        let mut s = Sampler::new(4, 1);
        let p = SamplingParams {
            repetition_penalty: 2.0,
            ..SamplingParams::default()
        };
        s.start(0, &p, 0, &[0, 1, 1]).unwrap();
        let mut row = vec![4.0, -1.0, 3.0, 0.5];
        let t = s.sample(0, &mut row).unwrap();
        assert_eq!(row, vec![2.0, -2.0, 3.0, 0.5]);
        assert_eq!(t.token, 2);
        // token 2 is now output: penalized next time.
        let mut row = vec![4.0, -1.0, 3.0, 0.5];
        s.sample(0, &mut row).unwrap();
        assert_eq!(row, vec![2.0, -2.0, 1.5, 0.5]);
    }

    #[test]
    fn presence_and_frequency_count_output_only() {
        let mut s = Sampler::new(3, 1);
        let p = SamplingParams {
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            ..SamplingParams::default()
        };
        s.start(0, &p, 0, &[1, 1]).unwrap();
        let mut row = vec![0.0, 5.0, 1.0];
        assert_eq!(s.sample(0, &mut row).unwrap().token, 1);
        assert_eq!(row, vec![0.0, 5.0, 1.0], "prompt tokens are not penalized");
        let mut row = vec![0.0, 5.0, 1.0];
        s.sample(0, &mut row).unwrap();
        assert_eq!(row, vec![0.0, 4.25, 1.0]);
        let mut row = vec![0.0, 5.0, 1.0];
        s.sample(0, &mut row).unwrap();
        assert_eq!(row, vec![0.0, 4.0, 1.0]);
    }

    #[test]
    fn seed_reproducible_and_slot_independent() {
        let logits: Vec<f32> = (0..50).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let run = |slot: u32, interleave: bool| {
            let mut s = Sampler::new(50, 3);
            s.start(slot, &params(), 42, &[]).unwrap();
            let other = (slot + 1) % 3;
            s.start(other, &params(), 9, &[]).unwrap();
            let mut out = Vec::new();
            for _ in 0..64 {
                if interleave {
                    let mut row = logits.clone();
                    s.sample(other, &mut row).unwrap();
                }
                let mut row = logits.clone();
                out.push(s.sample(slot, &mut row).unwrap().token);
            }
            out
        };
        let a = run(0, false);
        assert_eq!(a, run(2, true));
        assert!(a.iter().any(|&t| t != a[0]), "draws vary");
    }

    #[test]
    fn top_logprobs_sorted_and_match_logprob() {
        let mut s = Sampler::new(6, 1);
        let p = SamplingParams {
            top_logprobs: 3,
            ..SamplingParams::default()
        };
        s.start(0, &p, 0, &[]).unwrap();
        let mut row = vec![0.5, 2.0, -1.0, 2.0, 1.0, 0.0];
        let t = s.sample(0, &mut row).unwrap();
        assert_eq!(t.top_ids(), &[1, 3, 4]);
        assert_eq!(t.top_logprobs()[0], t.logprob);
        assert!(t.top_logprobs()[1] >= t.top_logprobs()[2]);
    }

    #[test]
    fn fork_copies_penalty_state() {
        let mut s = Sampler::new(4, 2);
        let p = SamplingParams {
            frequency_penalty: 1.0,
            ..SamplingParams::default()
        };
        s.start(0, &p, 0, &[]).unwrap();
        let mut row = vec![0.0, 3.0, 0.0, 0.0];
        s.sample(0, &mut row).unwrap();
        s.fork(0, 1, &p, 5).unwrap();
        let mut row = vec![0.0, 3.0, 0.0, 0.0];
        s.sample(1, &mut row).unwrap();
        assert_eq!(row[1], 2.0);
    }

    #[test]
    fn bad_params_rejected() {
        let mut s = Sampler::new(4, 1);
        for bad in [
            SamplingParams {
                temperature: -1.0,
                ..SamplingParams::default()
            },
            SamplingParams {
                top_p: 0.0,
                ..SamplingParams::default()
            },
            SamplingParams {
                top_logprobs: 21,
                ..SamplingParams::default()
            },
            SamplingParams {
                repetition_penalty: f32::NAN,
                ..SamplingParams::default()
            },
        ] {
            assert!(s.start(0, &bad, 0, &[]).is_err());
        }
        assert!(s.start(0, &SamplingParams::default(), 0, &[4]).is_err());
    }
}
