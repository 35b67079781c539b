//! The exact CPU backend: the f32 reference every other backend is tested against, and the
//! default when there is no GPU.
//!
//! One step runs the whole batch through every layer together: each projection reads each
//! weight row once per step for all tokens of all sequences (see `kernels`), the work split by
//! output rows over a persistent worker pool. K/V live in an f32 page pool allocated once from
//! the KV budget. Every buffer a step touches is allocated at construction.

mod attention;
pub mod kernels;
pub mod pool;
pub mod rope;

use crate::backend::SamplingParams;
use crate::model::{ModelConfig, ModelWeights, Tensor};

use super::sampling::{self, Sampler};
use super::{
    Backend, BackendError, BackendInfo, BackendLimits, BackendOptions, SeqStep, StepOutput,
    kv_bytes_per_token, validate_step,
};
use kernels::{Isa, MatmulTask, WeightView};
use pool::{SharedMut, WorkerPool};
use rope::RopeTable;

/// Norm weights and biases of one layer, widened once (tiny vectors; the matrices are never
/// converted ahead).
#[derive(Debug)]
struct LayerVectors {
    input_norm: Vec<f32>,
    post_norm: Vec<f32>,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    q_bias: Option<Vec<f32>>,
    k_bias: Option<Vec<f32>>,
    v_bias: Option<Vec<f32>>,
    o_bias: Option<Vec<f32>>,
    gate_bias: Option<Vec<f32>>,
    up_bias: Option<Vec<f32>>,
    down_bias: Option<Vec<f32>>,
}

/// Per-step buffers, sized for `max_step_tokens` at construction.
#[derive(Debug)]
struct Scratch {
    /// Residual stream `[T, hidden]`.
    x: Vec<f32>,
    /// Normed input / projection output `[T, hidden]`.
    xn: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    /// Flattened step: token ids, positions, owning batch index.
    tokens: Vec<u32>,
    positions: Vec<u32>,
    owners: Vec<u32>,
    /// Positions that need logits: (flat token index, batch index, copy out, sample).
    logit_rows: Vec<(u32, u32, bool, bool)>,
    /// Rows of the current logits chunk to sample: (row, batch index).
    sample_rows: Vec<(u32, u32)>,
    /// Final-normed rows `[max_seqs, hidden]`.
    head_in: Vec<f32>,
    /// Logits `[max_seqs, vocab]`.
    logits: Vec<f32>,
    /// Attention scores, one `max_context` row per thread.
    scores: Vec<f32>,
}

/// The CPU backend.
pub struct CpuBackend {
    config: ModelConfig,
    weights: ModelWeights,
    vectors: Vec<LayerVectors>,
    final_norm: Vec<f32>,
    limits: BackendLimits,
    pool: WorkerPool,
    isa: Isa,
    rope: RopeTable,
    /// `[pages, layers, 2 (k, v), page_tokens, kv_dim]`
    kv: Vec<f32>,
    /// Host swap area, `[swap_pages, page]` in the layout of `kv` (plain memory: the pool is
    /// host memory too, so a swap is a memcpy).
    swap: Vec<f32>,
    sampler: Sampler,
    scratch: Scratch,
    /// What each slot sampled last (fed to `from_last_sample` entries).
    last_sample: Vec<u32>,
    /// Samples of launched, not yet collected steps (oldest first), each pre-sized.
    pending: [Vec<Option<super::SampledToken>>; 2],
    /// Each pending step's figures (host time; the CPU has no device counters).
    reports: [super::StepReport; 2],
    pending_len: usize,
    pending_head: usize,
    /// Steps launched.
    steps: u64,
    /// Host time of the collected steps, ns.
    host_ns: u64,
}

impl std::fmt::Debug for CpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuBackend")
            .field("limits", &self.limits)
            .field("threads", &self.pool.threads())
            .field("isa", &self.isa)
            .finish()
    }
}

fn check_shape(name: &str, t: &Tensor, want: &[usize]) -> Result<(), BackendError> {
    if t.shape() != want {
        return Err(BackendError::Unsupported(format!(
            "{name} has shape {:?}, expected {want:?}",
            t.shape()
        )));
    }
    Ok(())
}

fn vector(name: &str, t: Option<&Tensor>, len: usize) -> Result<Option<Vec<f32>>, BackendError> {
    t.map(|t| {
        check_shape(name, t, &[len])?;
        Ok(t.to_f32_vec())
    })
    .transpose()
}

impl CpuBackend {
    /// Build the backend: checks every weight's shape against `config`, allocates the KV pool
    /// from `options.kv_budget_bytes` (f32 K and V) and every step buffer, starts the workers.
    pub fn new(
        config: &ModelConfig,
        weights: &ModelWeights,
        options: BackendOptions,
    ) -> Result<Self, BackendError> {
        let c = config;
        if c.num_key_value_heads == 0
            || !c.num_attention_heads.is_multiple_of(c.num_key_value_heads)
            || !c.head_dim.is_multiple_of(2)
            || c.head_dim == 0
        {
            return Err(BackendError::Unsupported(format!(
                "{} heads over {} kv heads of dim {}",
                c.num_attention_heads, c.num_key_value_heads, c.head_dim
            )));
        }
        if c.sliding_window == Some(0) {
            return Err(BackendError::Unsupported("sliding window of 0".into()));
        }
        if options.max_seqs == 0 || options.max_step_tokens == 0 || options.page_tokens == 0 {
            return Err(BackendError::Limits(
                "max_seqs, max_step_tokens and page_tokens must be > 0".into(),
            ));
        }
        if options.max_context == 0 || options.max_context > c.max_position_embeddings {
            return Err(BackendError::Limits(format!(
                "max context {} outside 1..={}",
                options.max_context, c.max_position_embeddings
            )));
        }
        let (h, qd, kvd, inter, vocab) = (
            c.hidden_size,
            c.q_dim(),
            c.kv_dim(),
            c.intermediate_size,
            c.vocab_size,
        );
        check_shape(
            "model.embed_tokens.weight",
            &weights.embed_tokens,
            &[vocab, h],
        )?;
        check_shape("lm_head.weight", &weights.lm_head, &[vocab, h])?;
        if weights.layers.len() != c.num_hidden_layers {
            return Err(BackendError::Unsupported(format!(
                "{} layers in the weights, {} in the config",
                weights.layers.len(),
                c.num_hidden_layers
            )));
        }
        let mut vectors = Vec::with_capacity(c.num_hidden_layers);
        for (i, l) in weights.layers.iter().enumerate() {
            let a = &l.self_attn;
            let m = &l.mlp;
            let p = |s: &str| format!("model.layers.{i}.{s}");
            check_shape(&p("self_attn.q_proj.weight"), &a.q_proj.weight, &[qd, h])?;
            check_shape(&p("self_attn.k_proj.weight"), &a.k_proj.weight, &[kvd, h])?;
            check_shape(&p("self_attn.v_proj.weight"), &a.v_proj.weight, &[kvd, h])?;
            check_shape(&p("self_attn.o_proj.weight"), &a.o_proj.weight, &[h, qd])?;
            check_shape(&p("mlp.gate_proj.weight"), &m.gate_proj.weight, &[inter, h])?;
            check_shape(&p("mlp.up_proj.weight"), &m.up_proj.weight, &[inter, h])?;
            check_shape(&p("mlp.down_proj.weight"), &m.down_proj.weight, &[h, inter])?;
            if c.qk_norm && (a.q_norm.is_none() || a.k_norm.is_none()) {
                return Err(BackendError::Unsupported(p(
                    "self_attn.q_norm/k_norm missing",
                )));
            }
            vectors.push(LayerVectors {
                input_norm: vector(&p("input_layernorm"), Some(&l.input_layernorm), h)?
                    .unwrap_or_default(),
                post_norm: vector(
                    &p("post_attention_layernorm"),
                    Some(&l.post_attention_layernorm),
                    h,
                )?
                .unwrap_or_default(),
                q_norm: vector(&p("q_norm"), a.q_norm.as_ref(), c.head_dim)?,
                k_norm: vector(&p("k_norm"), a.k_norm.as_ref(), c.head_dim)?,
                q_bias: vector(&p("q_proj.bias"), a.q_proj.bias.as_ref(), qd)?,
                k_bias: vector(&p("k_proj.bias"), a.k_proj.bias.as_ref(), kvd)?,
                v_bias: vector(&p("v_proj.bias"), a.v_proj.bias.as_ref(), kvd)?,
                o_bias: vector(&p("o_proj.bias"), a.o_proj.bias.as_ref(), h)?,
                gate_bias: vector(&p("gate_proj.bias"), m.gate_proj.bias.as_ref(), inter)?,
                up_bias: vector(&p("up_proj.bias"), m.up_proj.bias.as_ref(), inter)?,
                down_bias: vector(&p("down_proj.bias"), m.down_proj.bias.as_ref(), h)?,
            });
        }
        let final_norm = vector("model.norm.weight", Some(&weights.norm), h)?.unwrap_or_default();

        let page_bytes = kv_bytes_per_token(c, 4) * options.page_tokens;
        let num_pages = options.kv_budget_bytes / page_bytes.max(1);
        if num_pages == 0 {
            return Err(BackendError::KvBudget {
                budget: options.kv_budget_bytes,
                need: page_bytes,
            });
        }
        let swap_pages = options.swap.pages(page_bytes)?;
        let limits = BackendLimits {
            max_seqs: options.max_seqs,
            max_step_tokens: options.max_step_tokens,
            page_tokens: options.page_tokens,
            num_pages,
            max_context: options.max_context,
            swap_pages,
        };
        let threads = if options.threads == 0 {
            std::thread::available_parallelism().map_or(1, usize::from)
        } else {
            options.threads
        };
        let pool = WorkerPool::new(threads)
            .map_err(|e| BackendError::Device(format!("cannot start worker threads: {e}")))?;
        let t = options.max_step_tokens;
        let s = options.max_seqs;
        let scratch = Scratch {
            x: vec![0.0; t * h],
            xn: vec![0.0; t * h],
            q: vec![0.0; t * qd],
            k: vec![0.0; t * kvd],
            v: vec![0.0; t * kvd],
            attn: vec![0.0; t * qd],
            gate: vec![0.0; t * inter],
            up: vec![0.0; t * inter],
            tokens: Vec::with_capacity(t),
            positions: Vec::with_capacity(t),
            owners: Vec::with_capacity(t),
            logit_rows: Vec::with_capacity(t),
            sample_rows: Vec::with_capacity(s),
            head_in: vec![0.0; s * h],
            logits: vec![0.0; s * vocab],
            scores: vec![0.0; threads * options.max_context],
        };
        Ok(CpuBackend {
            config: c.clone(),
            weights: weights.clone(),
            vectors,
            final_norm,
            limits,
            pool,
            isa: Isa::from_env(),
            rope: RopeTable::new(c, options.max_context),
            kv: vec![0.0; num_pages * page_bytes / 4],
            // Zeroed lazily by the OS (calloc): untouched swap pages cost no memory.
            swap: vec![0.0; swap_pages * page_bytes / 4],
            sampler: Sampler::with_threads(vocab, s, threads),
            scratch,
            last_sample: vec![0; s],
            pending: [Vec::with_capacity(s), Vec::with_capacity(s)],
            reports: [super::StepReport::default(); 2],
            pending_len: 0,
            pending_head: 0,
            steps: 0,
            host_ns: 0,
        })
    }

    /// Worker threads (the stepping thread included).
    pub fn threads(&self) -> usize {
        self.pool.threads()
    }

    /// Bytes of weights one decode step reads (every layer matrix plus the LM head).
    pub fn weight_bytes_per_token(&self) -> usize {
        let mut total = self.weights.lm_head.bytes().len();
        for l in &self.weights.layers {
            for t in [
                &l.self_attn.q_proj.weight,
                &l.self_attn.k_proj.weight,
                &l.self_attn.v_proj.weight,
                &l.self_attn.o_proj.weight,
                &l.mlp.gate_proj.weight,
                &l.mlp.up_proj.weight,
                &l.mlp.down_proj.weight,
            ] {
                total += t.bytes().len();
            }
        }
        total
    }

    fn forward(&mut self, batch: &[SeqStep<'_>], out: &mut StepOutput) -> Result<(), BackendError> {
        let c = &self.config;
        let (h, qd, kvd, inter, vocab) = (
            c.hidden_size,
            c.q_dim(),
            c.kv_dim(),
            c.intermediate_size,
            c.vocab_size,
        );
        let hd = c.head_dim;
        let eps = c.rms_norm_eps as f32;
        let s = &mut self.scratch;
        s.tokens.clear();
        s.positions.clear();
        s.owners.clear();
        s.logit_rows.clear();
        for (i, seq) in batch.iter().enumerate() {
            for (k, &tok) in seq.tokens.iter().enumerate() {
                let flat = s.tokens.len() as u32;
                let tok = if seq.from_last_sample && seq.tokens.len() == 1 {
                    self.last_sample[seq.slot as usize]
                } else {
                    tok
                };
                s.tokens.push(tok);
                s.positions.push(seq.start_pos + k as u32);
                s.owners.push(i as u32);
                let last = k + 1 == seq.tokens.len();
                if seq.want_logits || (last && seq.sample) {
                    s.logit_rows
                        .push((flat, i as u32, seq.want_logits, last && seq.sample));
                }
            }
        }
        let t_count = s.tokens.len();

        let embed = WeightView::of(&self.weights.embed_tokens);
        for (t, &tok) in s.tokens.iter().enumerate() {
            embed.row_to_f32(tok as usize, h, &mut s.x[t * h..(t + 1) * h]);
        }

        let pool = &self.pool;
        let isa = self.isa;
        for (li, layer) in self.weights.layers.iter().enumerate() {
            let vecs = &self.vectors[li];
            for t in 0..t_count {
                kernels::rms_norm(
                    &s.x[t * h..(t + 1) * h],
                    &vecs.input_norm,
                    eps,
                    &mut s.xn[t * h..(t + 1) * h],
                );
            }
            let att = &layer.self_attn;
            let xn = &s.xn[..t_count * h];
            project(
                pool,
                isa,
                &att.q_proj.weight,
                vecs.q_bias.as_deref(),
                xn,
                t_count,
                h,
                qd,
                &mut s.q,
            );
            project(
                pool,
                isa,
                &att.k_proj.weight,
                vecs.k_bias.as_deref(),
                xn,
                t_count,
                h,
                kvd,
                &mut s.k,
            );
            project(
                pool,
                isa,
                &att.v_proj.weight,
                vecs.v_bias.as_deref(),
                xn,
                t_count,
                h,
                kvd,
                &mut s.v,
            );
            for t in 0..t_count {
                let pos = s.positions[t] as usize;
                for head in s.q[t * qd..(t + 1) * qd].chunks_exact_mut(hd) {
                    if let Some(w) = &vecs.q_norm {
                        kernels::rms_norm_in_place(head, w, eps);
                    }
                    self.rope.apply(head, pos);
                }
                for head in s.k[t * kvd..(t + 1) * kvd].chunks_exact_mut(hd) {
                    if let Some(w) = &vecs.k_norm {
                        kernels::rms_norm_in_place(head, w, eps);
                    }
                    self.rope.apply(head, pos);
                }
            }
            let geometry = attention::KvGeometry {
                layers: c.num_hidden_layers,
                page_tokens: self.limits.page_tokens,
                kv_dim: kvd,
            };
            for t in 0..t_count {
                let seq = &batch[s.owners[t] as usize];
                let pos = s.positions[t] as usize;
                let page = seq.block_table[pos / geometry.page_tokens] as usize;
                let at = geometry.offset(page, li, 0, pos % geometry.page_tokens);
                self.kv[at..at + kvd].copy_from_slice(&s.k[t * kvd..(t + 1) * kvd]);
                let at = geometry.offset(page, li, 1, pos % geometry.page_tokens);
                self.kv[at..at + kvd].copy_from_slice(&s.v[t * kvd..(t + 1) * kvd]);
            }
            attention::attend(
                pool,
                &attention::AttentionInput {
                    geometry,
                    layer: li,
                    heads: c.num_attention_heads,
                    kv_heads: c.num_key_value_heads,
                    head_dim: hd,
                    window: c.sliding_window,
                    kv: &self.kv,
                    q: &s.q[..t_count * qd],
                    positions: &s.positions,
                    owners: &s.owners,
                    batch,
                    max_context: self.limits.max_context,
                },
                &mut s.attn,
                &mut s.scores,
            );
            project(
                pool,
                isa,
                &att.o_proj.weight,
                vecs.o_bias.as_deref(),
                &s.attn[..t_count * qd],
                t_count,
                qd,
                h,
                &mut s.xn,
            );
            for (x, &o) in s.x[..t_count * h].iter_mut().zip(&s.xn[..t_count * h]) {
                *x += o;
            }
            for t in 0..t_count {
                kernels::rms_norm(
                    &s.x[t * h..(t + 1) * h],
                    &vecs.post_norm,
                    eps,
                    &mut s.xn[t * h..(t + 1) * h],
                );
            }
            let mlp = &layer.mlp;
            let xn = &s.xn[..t_count * h];
            project(
                pool,
                isa,
                &mlp.gate_proj.weight,
                vecs.gate_bias.as_deref(),
                xn,
                t_count,
                h,
                inter,
                &mut s.gate,
            );
            project(
                pool,
                isa,
                &mlp.up_proj.weight,
                vecs.up_bias.as_deref(),
                xn,
                t_count,
                h,
                inter,
                &mut s.up,
            );
            kernels::silu_mul(&mut s.gate[..t_count * inter], &s.up[..t_count * inter]);
            project(
                pool,
                isa,
                &mlp.down_proj.weight,
                vecs.down_bias.as_deref(),
                &s.gate[..t_count * inter],
                t_count,
                inter,
                h,
                &mut s.xn,
            );
            for (x, &o) in s.x[..t_count * h].iter_mut().zip(&s.xn[..t_count * h]) {
                *x += o;
            }
        }

        // Final norm and LM head, only for positions that need logits, in chunks of max_seqs.
        out.samples.clear();
        out.samples.resize(batch.len(), None);
        out.logits.clear();
        let chunk = self.limits.max_seqs;
        let mut done = 0;
        while done < s.logit_rows.len() {
            let rows = &s.logit_rows[done..(done + chunk).min(s.logit_rows.len())];
            for (r, &(flat, ..)) in rows.iter().enumerate() {
                let t = flat as usize;
                kernels::rms_norm(
                    &s.x[t * h..(t + 1) * h],
                    &self.final_norm,
                    eps,
                    &mut s.head_in[r * h..(r + 1) * h],
                );
            }
            let n = rows.len();
            project(
                pool,
                isa,
                &self.weights.lm_head,
                None,
                &s.head_in[..n * h],
                n,
                h,
                vocab,
                &mut s.logits,
            );
            for (r, &(_, _, copy, _)) in rows.iter().enumerate() {
                if copy {
                    out.logits
                        .extend_from_slice(&s.logits[r * vocab..(r + 1) * vocab]);
                }
            }
            // Sample the rows that ask for it, one task per row: slots are distinct within a
            // step (validate_step), scratch is per thread.
            s.sample_rows.clear();
            s.sample_rows.extend(
                rows.iter()
                    .enumerate()
                    .filter(|(_, row)| row.3)
                    .map(|(r, row)| (r as u32, row.1)),
            );
            let (slots, scratches) = self.sampler.parts_mut();
            let slots = SharedMut::new(slots);
            let scratches = SharedMut::new(scratches);
            let logits = SharedMut::new(&mut s.logits[..n * vocab]);
            let samples = SharedMut::new(&mut out.samples[..]);
            let sample_rows = &s.sample_rows;
            pool.run(sample_rows.len(), &|i, thread| {
                let (r, owner) = sample_rows[i];
                let slot = batch[owner as usize].slot as usize;
                // SAFETY: each task has its own row r and its own slot (no slot twice in a
                // step, checked by validate_step); scratch `thread` is used by one thread at a
                // time; `owner` is written by this task alone.
                unsafe {
                    let state = &mut slots.slice_mut(slot, 1)[0];
                    let scratch = &mut scratches.slice_mut(thread, 1)[0];
                    let row = logits.slice_mut(r as usize * vocab, vocab);
                    let token = sampling::sample_slot(state, row, scratch);
                    samples.write(owner as usize, Some(token));
                }
            });
            done += n;
        }
        Ok(())
    }
}

/// `out[..tokens*rows] = x W^T + b`, split by output rows over the pool.
#[allow(clippy::too_many_arguments)]
fn project(
    pool: &WorkerPool,
    isa: Isa,
    weight: &Tensor,
    bias: Option<&[f32]>,
    x: &[f32],
    tokens: usize,
    cols: usize,
    rows: usize,
    out: &mut [f32],
) {
    let w = WeightView::of(weight);
    let out = SharedMut::new(&mut out[..tokens * rows]);
    // About four tasks per thread for balance, in whole row blocks of 8.
    let per_task = rows.div_ceil(pool.threads() * 4).next_multiple_of(8).max(8);
    let tasks = rows.div_ceil(per_task);
    pool.run(tasks, &|task, _| {
        let row_start = task * per_task;
        let row_end = (row_start + per_task).min(rows);
        let job = MatmulTask {
            x,
            tokens,
            cols,
            row_start,
            row_end,
        };
        kernels::matmul_block(isa, w, bias, job, |t, r, v| {
            // SAFETY: this task alone owns output rows row_start..row_end of every token, so
            // index t * rows + r is written by no other task.
            unsafe { out.write(t * rows + r, v) }
        });
    });
}

impl Backend for CpuBackend {
    fn info(&self) -> BackendInfo {
        BackendInfo {
            name: "cpu".into(),
            device: format!(
                "CPU, {} threads, {} kernels",
                self.pool.threads(),
                self.isa.name()
            ),
            kv_bytes_per_token: kv_bytes_per_token(&self.config, 4),
        }
    }

    fn limits(&self) -> BackendLimits {
        self.limits
    }

    fn start_sequence(
        &mut self,
        slot: u32,
        params: &SamplingParams,
        seed: u64,
        prompt: &[u32],
    ) -> Result<(), BackendError> {
        self.sampler.start(slot, params, seed, prompt)
    }

    fn resume_sequence(
        &mut self,
        slot: u32,
        params: &SamplingParams,
        seed: u64,
        prompt: &[u32],
        output: &[u32],
    ) -> Result<(), BackendError> {
        self.sampler.resume(slot, params, seed, prompt, output)
    }

    fn fork_sequence(
        &mut self,
        src: u32,
        dst: u32,
        params: &SamplingParams,
        seed: u64,
    ) -> Result<(), BackendError> {
        self.sampler.fork(src, dst, params, seed)?;
        self.last_sample[dst as usize] = self.last_sample[src as usize];
        Ok(())
    }

    fn copy_page(&mut self, src: u32, dst: u32) -> Result<(), BackendError> {
        let n = self.limits.num_pages;
        if src as usize >= n || dst as usize >= n {
            return Err(BackendError::InvalidInput(format!(
                "page copy {src} -> {dst} out of range"
            )));
        }
        let page = self.kv.len() / n;
        self.kv.copy_within(
            src as usize * page..(src as usize + 1) * page,
            dst as usize * page,
        );
        Ok(())
    }

    /// A plain copy: `launch` runs each step to its end before returning, so every step
    /// launched before this call is done with the pages and none launched after has started.
    fn swap_out(&mut self, pages: &[u32], host: &[u32]) -> Result<(), BackendError> {
        super::validate_swap(&self.limits, pages, host)?;
        let page = self.kv.len() / self.limits.num_pages;
        for (&p, &h) in pages.iter().zip(host) {
            let (p, h) = (p as usize * page, h as usize * page);
            self.swap[h..h + page].copy_from_slice(&self.kv[p..p + page]);
        }
        Ok(())
    }

    /// A plain copy, ordered like [`CpuBackend::swap_out`].
    fn swap_in(&mut self, host: &[u32], pages: &[u32]) -> Result<(), BackendError> {
        super::validate_swap(&self.limits, pages, host)?;
        let page = self.kv.len() / self.limits.num_pages;
        for (&h, &p) in host.iter().zip(pages) {
            let (p, h) = (p as usize * page, h as usize * page);
            self.kv[p..p + page].copy_from_slice(&self.swap[h..h + page]);
        }
        Ok(())
    }

    /// Runs the whole step before returning (the CPU has nothing to overlap it with); collect
    /// hands back its samples in launch order.
    fn launch(&mut self, batch: &[SeqStep<'_>], out: &mut StepOutput) -> Result<(), BackendError> {
        validate_step(&self.limits, self.config.vocab_size, batch)?;
        if self.pending_len == self.pending.len() {
            return Err(BackendError::Limits(format!(
                "{} steps already launched and not collected",
                self.pending_len
            )));
        }
        let entered = std::time::Instant::now();
        self.forward(batch, out)?;
        for (seq, sample) in batch.iter().zip(&out.samples) {
            if let Some(tok) = sample {
                self.last_sample[seq.slot as usize] = tok.token;
            }
        }
        let at = (self.pending_head + self.pending_len) % self.pending.len();
        self.pending[at].clear();
        self.pending[at].extend_from_slice(&out.samples);
        // The work is done here: the step finished when launch returns.
        let finished = std::time::Instant::now();
        self.reports[at] = super::StepReport {
            host_ns: finished.duration_since(entered).as_nanos() as u64,
            finished_at: Some(finished),
            ..super::StepReport::default()
        };
        self.steps += 1;
        self.pending_len += 1;
        Ok(())
    }

    fn collect(&mut self, out: &mut StepOutput) -> Result<(), BackendError> {
        if self.pending_len == 0 {
            return Err(BackendError::InvalidInput(
                "collect without a launched step".into(),
            ));
        }
        out.samples.clear();
        out.samples
            .extend_from_slice(&self.pending[self.pending_head]);
        out.report = self.reports[self.pending_head];
        self.host_ns += out.report.host_ns;
        self.pending_head = (self.pending_head + 1) % self.pending.len();
        self.pending_len -= 1;
        Ok(())
    }

    fn in_flight(&self) -> usize {
        self.pending_len
    }

    fn stats(&self) -> super::BackendStats {
        super::BackendStats {
            steps: self.steps,
            host_ns: self.host_ns,
            ..super::BackendStats::default()
        }
    }
}
