//! Causal grouped-query attention over the paged f32 KV pool.
//!
//! One task per (token, query head): scores against every visible cached position (all earlier
//! positions, or the last `window` of them with a sliding window, as transformers' mask
//! `q - window < kv <= q`), softmax in f32 (the normalizer summed in f64), then the
//! probability-weighted sum of the value rows.

use super::kernels;
use super::pool::{SharedMut, WorkerPool};
use crate::backend::SeqStep;

/// Where a (page, layer, k|v, slot) row lives in the pool.
#[derive(Debug, Clone, Copy)]
pub struct KvGeometry {
    pub layers: usize,
    pub page_tokens: usize,
    pub kv_dim: usize,
}

impl KvGeometry {
    /// Offset of the `kv_dim` row of `which` (0 = K, 1 = V) for slot `slot` of `page`.
    pub fn offset(&self, page: usize, layer: usize, which: usize, slot: usize) -> usize {
        (((page * self.layers + layer) * 2 + which) * self.page_tokens + slot) * self.kv_dim
    }
}

pub struct AttentionInput<'a> {
    pub geometry: KvGeometry,
    pub layer: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub window: Option<usize>,
    pub kv: &'a [f32],
    /// Rotated queries `[T, heads * head_dim]`.
    pub q: &'a [f32],
    pub positions: &'a [u32],
    pub owners: &'a [u32],
    pub batch: &'a [SeqStep<'a>],
    pub max_context: usize,
}

/// `out[t, head]` = attention of token `t`'s query head over its sequence's cached K/V.
pub fn attend(pool: &WorkerPool, input: &AttentionInput<'_>, out: &mut [f32], scores: &mut [f32]) {
    let hd = input.head_dim;
    let heads = input.heads;
    let group = heads / input.kv_heads;
    let tokens = input.positions.len();
    let q_dim = heads * hd;
    let scale = (hd as f64).powf(-0.5) as f32;
    let out = SharedMut::new(&mut out[..tokens * q_dim]);
    let scores = SharedMut::new(scores);
    let g = input.geometry;
    pool.run(tokens * heads, &|task, thread| {
        let t = task / heads;
        let head = task % heads;
        let kvh = head / group;
        let pos = input.positions[t] as usize;
        let table = input.batch[input.owners[t] as usize].block_table;
        let first = match input.window {
            Some(w) => (pos + 1).saturating_sub(w),
            None => 0,
        };
        let q = &input.q[t * q_dim + head * hd..t * q_dim + (head + 1) * hd];
        // SAFETY: a thread runs one task at a time and row `thread` of the score buffer is used
        // only by that thread.
        let sc = unsafe { scores.slice_mut(thread * input.max_context, input.max_context) };
        let span = pos + 1 - first;
        let mut max = f32::NEG_INFINITY;
        for (i, j) in (first..=pos).enumerate() {
            let page = table[j / g.page_tokens] as usize;
            let at = g.offset(page, input.layer, 0, j % g.page_tokens) + kvh * hd;
            let s = kernels::dot_f32(q, &input.kv[at..at + hd]) * scale;
            sc[i] = s;
            max = max.max(s);
        }
        let mut sum = 0f64;
        for s in &mut sc[..span] {
            *s = (*s - max).exp();
            sum += f64::from(*s);
        }
        let inv = sum as f32;
        // SAFETY: task (t, head) alone writes this head's slice of token t's output row.
        let o = unsafe { out.slice_mut(t * q_dim + head * hd, hd) };
        o.fill(0.0);
        for (i, j) in (first..=pos).enumerate() {
            let page = table[j / g.page_tokens] as usize;
            let at = g.offset(page, input.layer, 1, j % g.page_tokens) + kvh * hd;
            kernels::axpy(o, sc[i] / inv, &input.kv[at..at + hd]);
        }
    });
}
