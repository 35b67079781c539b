//! Numeric kernels of the CPU backend: projections over stored weights, RMSNorm, SiLU.
//!
//! Weights stay in their stored dtype; 16-bit values are widened to f32 inside the dot product
//! (bf16 is the top half of an f32, so widening is a shift; f16 uses an exact branch-free
//! conversion) and every accumulation is f32. Each dot product accumulates in 16 lanes in a
//! fixed order and reduces them in a fixed tree, whatever the number of tokens processed with
//! it, so a token's result is bit-identical whether it runs alone or in a batch.
//!
//! The same generic code is compiled twice, plain (SSE2) and with AVX2 enabled (no FMA, so the
//! arithmetic — and thus every result — is identical); the AVX2 copy is picked at run time.

use crate::model::{DType, Tensor};

/// Accumulator lanes per dot product; fixed so results never depend on the batch.
const LANES: usize = 16;
/// Tokens processed together against one weight row (weights read once per group).
const TOKEN_GROUP: usize = 4;
/// Weight rows processed together for each token group (kept in L1 while the group cycles).
const ROW_BLOCK: usize = 8;

/// A weight element that widens to f32 exactly.
pub trait Widen: Copy + Send + Sync {
    /// The exact f32 value.
    fn widen(self) -> f32;
}

/// bfloat16 bits.
#[derive(Clone, Copy, Debug)]
#[repr(transparent)]
pub struct Bf16(pub u16);

/// IEEE half bits.
#[derive(Clone, Copy, Debug)]
#[repr(transparent)]
pub struct F16(pub u16);

impl Widen for Bf16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        f32::from_bits(u32::from(self.0) << 16)
    }
}

impl Widen for F16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        // Exact for every input: the exponent/mantissa bits shifted into f32 position and
        // scaled by 2^112 rebias normals and turn subnormals into the right normal value (the
        // product of an f32 subnormal/normal by a power of two is exact); Inf/NaN keep an
        // all-ones exponent.
        let h = u32::from(self.0);
        let sign = (h & 0x8000) << 16;
        let em = h & 0x7fff;
        let scaled = f32::from_bits(em << 13) * f32::from_bits(0x7780_0000);
        let bits = if em >= 0x7c00 {
            (em << 13) | 0x7f80_0000
        } else {
            scaled.to_bits()
        };
        f32::from_bits(bits | sign)
    }
}

impl Widen for f32 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
}

/// A `[rows, cols]` weight matrix as stored.
#[derive(Clone, Copy, Debug)]
pub enum WeightView<'a> {
    /// f32 values.
    F32(&'a [f32]),
    /// bfloat16 values.
    Bf16(&'a [Bf16]),
    /// half values.
    F16(&'a [F16]),
}

impl<'a> WeightView<'a> {
    /// View a tensor's bytes in its stored dtype.
    pub fn of(t: &'a Tensor) -> Self {
        match t.dtype() {
            DType::F32 => WeightView::F32(t.as_f32().unwrap_or_default()),
            DType::BF16 => WeightView::Bf16(cast16(t.as_bits16().unwrap_or_default())),
            DType::F16 => WeightView::F16(cast16(t.as_bits16().unwrap_or_default())),
        }
    }

    /// Bytes per element.
    pub fn elem_bytes(&self) -> usize {
        match self {
            WeightView::F32(_) => 4,
            _ => 2,
        }
    }

    /// Row `r` of width `cols`, widened into `out`.
    pub fn row_to_f32(&self, r: usize, cols: usize, out: &mut [f32]) {
        fn copy<W: Widen>(w: &[W], out: &mut [f32]) {
            for (o, &v) in out.iter_mut().zip(w) {
                *o = v.widen();
            }
        }
        let range = r * cols..(r + 1) * cols;
        match self {
            WeightView::F32(w) => copy(&w[range], out),
            WeightView::Bf16(w) => copy(&w[range], out),
            WeightView::F16(w) => copy(&w[range], out),
        }
    }
}

fn cast16<T>(bits: &[u16]) -> &[T] {
    const { assert!(std::mem::size_of::<T>() == 2 && std::mem::align_of::<T>() <= 2) };
    // SAFETY: `T` is a `repr(transparent)` wrapper of u16 (size and alignment asserted above),
    // so the same memory is a valid `[T]` of the same length for the same lifetime.
    unsafe { std::slice::from_raw_parts(bits.as_ptr().cast::<T>(), bits.len()) }
}

/// Reduce 16 lanes in a fixed pairwise tree.
#[inline(always)]
fn reduce(mut acc: [f32; LANES]) -> f32 {
    let mut width = LANES / 2;
    while width > 0 {
        for j in 0..width {
            acc[j] += acc[j + width];
        }
        width /= 2;
    }
    acc[0]
}

/// Dot products of one weight row with `S` activation rows.
#[inline(always)]
fn dot_group<const S: usize, W: Widen>(w: &[W], xs: [&[f32]; S]) -> [f32; S] {
    let mut acc = [[0f32; LANES]; S];
    let chunks = w.len() / LANES;
    let (w_main, w_tail) = w.split_at(chunks * LANES);
    for (c, wc) in w_main.chunks_exact(LANES).enumerate() {
        let mut wf = [0f32; LANES];
        for j in 0..LANES {
            wf[j] = wc[j].widen();
        }
        for s in 0..S {
            let x = &xs[s][c * LANES..c * LANES + LANES];
            for j in 0..LANES {
                acc[s][j] += wf[j] * x[j];
            }
        }
    }
    let base = chunks * LANES;
    for (j, &wv) in w_tail.iter().enumerate() {
        let wf = wv.widen();
        for s in 0..S {
            acc[s][j] += wf * xs[s][base + j];
        }
    }
    let mut out = [0f32; S];
    for s in 0..S {
        out[s] = reduce(acc[s]);
    }
    out
}

/// `a · b` in f32 with the same 16-lane order as the projections.
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let [v] = dot_group(&a[..n], [&b[..n]]);
    v
}

/// `acc += p * v`.
pub fn axpy(acc: &mut [f32], p: f32, v: &[f32]) {
    for (a, &x) in acc.iter_mut().zip(v) {
        *a += p * x;
    }
}

/// One task of a projection: output rows `rows` for every token.
#[derive(Clone, Copy)]
pub struct MatmulTask<'a> {
    /// Activations `[tokens, cols]`.
    pub x: &'a [f32],
    /// Tokens (rows of `x`).
    pub tokens: usize,
    /// Input width.
    pub cols: usize,
    /// Output width (row stride of the result).
    pub out_cols: usize,
    /// First output row of this task.
    pub row_start: usize,
    /// One past the last output row.
    pub row_end: usize,
}

#[inline(always)]
fn matmul_block_generic<W: Widen>(
    w: &[W],
    bias: Option<&[f32]>,
    task: MatmulTask<'_>,
    mut store: impl FnMut(usize, usize, f32),
) {
    let MatmulTask {
        x,
        tokens,
        cols,
        row_start,
        row_end,
        ..
    } = task;
    let xrow = |t: usize| &x[t * cols..(t + 1) * cols];
    let mut rb = row_start;
    while rb < row_end {
        let rb_end = (rb + ROW_BLOCK).min(row_end);
        let mut t = 0;
        while t < tokens {
            let n = (tokens - t).min(TOKEN_GROUP);
            for r in rb..rb_end {
                let wr = &w[r * cols..(r + 1) * cols];
                let b = bias.map_or(0.0, |b| b[r]);
                match n {
                    4 => {
                        let y = dot_group(wr, [xrow(t), xrow(t + 1), xrow(t + 2), xrow(t + 3)]);
                        for (k, v) in y.into_iter().enumerate() {
                            store(t + k, r, v + b);
                        }
                    }
                    3 => {
                        let y = dot_group(wr, [xrow(t), xrow(t + 1), xrow(t + 2)]);
                        for (k, v) in y.into_iter().enumerate() {
                            store(t + k, r, v + b);
                        }
                    }
                    2 => {
                        let y = dot_group(wr, [xrow(t), xrow(t + 1)]);
                        for (k, v) in y.into_iter().enumerate() {
                            store(t + k, r, v + b);
                        }
                    }
                    _ => {
                        let [v] = dot_group(wr, [xrow(t)]);
                        store(t, r, v + b);
                    }
                }
            }
            t += n;
        }
        rb = rb_end;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn matmul_block_avx2<W: Widen>(
    w: &[W],
    bias: Option<&[f32]>,
    task: MatmulTask<'_>,
    store: impl FnMut(usize, usize, f32),
) {
    matmul_block_generic(w, bias, task, store);
}

fn matmul_block_plain<W: Widen>(
    w: &[W],
    bias: Option<&[f32]>,
    task: MatmulTask<'_>,
    store: impl FnMut(usize, usize, f32),
) {
    matmul_block_generic(w, bias, task, store);
}

/// Which compiled copy of the kernels runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// Baseline x86-64 (SSE2) or the target's default.
    Baseline,
    /// AVX2 (same arithmetic, wider vectors).
    Avx2,
}

impl Isa {
    /// The best copy this CPU runs.
    pub fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2") {
                return Isa::Avx2;
            }
        }
        Isa::Baseline
    }
}

/// Compute rows `task.row_start..task.row_end` of `y = x W^T + b` for every token, handing each
/// result to `store(token, row, value)`.
pub fn matmul_block(
    isa: Isa,
    w: WeightView<'_>,
    bias: Option<&[f32]>,
    task: MatmulTask<'_>,
    store: impl FnMut(usize, usize, f32),
) {
    debug_assert!(task.x.len() >= task.tokens * task.cols);
    match (isa, w) {
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2, WeightView::F32(w)) => {
            // SAFETY: Isa::Avx2 is only produced by `detect` after the CPU reported AVX2.
            unsafe { matmul_block_avx2(w, bias, task, store) }
        }
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2, WeightView::Bf16(w)) => {
            // SAFETY: as above.
            unsafe { matmul_block_avx2(w, bias, task, store) }
        }
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2, WeightView::F16(w)) => {
            // SAFETY: as above.
            unsafe { matmul_block_avx2(w, bias, task, store) }
        }
        (_, WeightView::F32(w)) => matmul_block_plain(w, bias, task, store),
        (_, WeightView::Bf16(w)) => matmul_block_plain(w, bias, task, store),
        (_, WeightView::F16(w)) => matmul_block_plain(w, bias, task, store),
    }
}

/// `out = x * rsqrt(mean(x^2) + eps) * weight`, computed like transformers' RMSNorm in f32
/// (the mean of squares accumulated in f64, then rounded).
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let sum: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    let var = (sum / x.len() as f64) as f32;
    let r = 1.0 / (var + eps).sqrt();
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = w * (v * r);
    }
}

/// In-place RMSNorm (per head for QK-norm).
pub fn rms_norm_in_place(x: &mut [f32], weight: &[f32], eps: f32) {
    let sum: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    let var = (sum / x.len() as f64) as f32;
    let r = 1.0 / (var + eps).sqrt();
    for (v, &w) in x.iter_mut().zip(weight) {
        *v = w * (*v * r);
    }
}

/// `gate = silu(gate) * up`.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        let s = *g / (1.0 + (-*g).exp());
        *g = s * u;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_widen_matches_half_for_every_value() {
        for bits in 0..=u16::MAX {
            let ours = F16(bits).widen();
            let theirs = half::f16::from_bits(bits).to_f32();
            if theirs.is_nan() {
                assert!(ours.is_nan(), "{bits:#x}");
            } else {
                assert_eq!(ours.to_bits(), theirs.to_bits(), "{bits:#x}");
            }
        }
    }

    #[test]
    fn bf16_widen_is_exact() {
        for bits in [0u16, 0x3f80, 0xbf80, 0x7f80, 0x0001, 0x4049] {
            assert_eq!(
                Bf16(bits).widen().to_bits(),
                half::bf16::from_bits(bits).to_f32().to_bits()
            );
        }
    }

    fn run(
        isa: Isa,
        w: WeightView<'_>,
        x: &[f32],
        tokens: usize,
        cols: usize,
        rows: usize,
    ) -> Vec<f32> {
        let mut y = vec![0f32; tokens * rows];
        let task = MatmulTask {
            x,
            tokens,
            cols,
            out_cols: rows,
            row_start: 0,
            row_end: rows,
        };
        matmul_block(isa, w, None, task, |t, r, v| y[t * rows + r] = v);
        y
    }

    #[test]
    fn batch_grouping_and_isa_do_not_change_bits() {
        let cols = 37;
        let rows = 11;
        let tokens = 7;
        let w: Vec<u16> = (0..rows * cols)
            .map(|i| half::bf16::from_f32(((i * 7919) % 101) as f32 / 50.0 - 1.0).to_bits())
            .collect();
        let wv = WeightView::Bf16(cast16(&w));
        let x: Vec<f32> = (0..tokens * cols)
            .map(|i| ((i * 104729) % 89) as f32 / 44.0 - 1.0)
            .collect();
        let all = run(Isa::Baseline, wv, &x, tokens, cols, rows);
        for t in 0..tokens {
            let one = run(
                Isa::Baseline,
                wv,
                &x[t * cols..(t + 1) * cols],
                1,
                cols,
                rows,
            );
            assert_eq!(&all[t * rows..(t + 1) * rows], &one[..]);
        }
        assert_eq!(all, run(Isa::detect(), wv, &x, tokens, cols, rows));
        // And close to an f64 reference.
        for t in 0..tokens {
            for r in 0..rows {
                let exact: f64 = (0..cols)
                    .map(|i| f64::from(Bf16(w[r * cols + i]).widen()) * f64::from(x[t * cols + i]))
                    .sum();
                assert!((exact - f64::from(all[t * rows + r])).abs() < 1e-5);
            }
        }
    }
}
