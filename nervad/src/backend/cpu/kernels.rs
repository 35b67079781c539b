//! Numeric kernels of the CPU backend: projections over stored weights, RMSNorm, SiLU.
//!
//! Weights stay in their stored dtype; 16-bit values are widened to f32 inside the dot product
//! (bf16 is the top half of an f32, so widening is a shift; f16 uses an exact branch-free
//! conversion) and every accumulation is f32. Each dot product accumulates in 16 lanes in a
//! fixed order and reduces them in a fixed tree, whatever the number of tokens processed with
//! it, so a token's result is bit-identical whether it runs alone or in a batch.
//!
//! The dot product exists twice: portable Rust, and AVX2/F16C intrinsics picked at run time;
//! both do the same per-lane multiply-then-add (no FMA), so every result is bit-identical.

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
    /// First output row of this task.
    pub row_start: usize,
    /// One past the last output row.
    pub row_end: usize,
}

/// A dot-product kernel over weights of type `W` (one compiled copy per instruction set).
trait Dot<W> {
    /// Tokens processed against one weight row at once (1..=8; registers decide).
    const GROUP: usize = TOKEN_GROUP;
    /// `[w · xs[0], ..., w · xs[S-1]]`, every result computed exactly like [`dot_group`].
    fn dot<const S: usize>(&self, w: &[W], xs: [&[f32]; S]) -> [f32; S];
}

/// The portable kernel.
struct PlainDot;

impl<W: Widen> Dot<W> for PlainDot {
    #[inline(always)]
    fn dot<const S: usize>(&self, w: &[W], xs: [&[f32]; S]) -> [f32; S] {
        dot_group(w, xs)
    }
}

#[inline(always)]
fn matmul_block_generic<W: Widen, K: Dot<W>>(
    kernel: &K,
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
            let n = (tokens - t).min(K::GROUP);
            for r in rb..rb_end {
                let wr = &w[r * cols..(r + 1) * cols];
                let b = bias.map_or(0.0, |b| b[r]);
                macro_rules! group {
                    ($($k:literal),+) => {{
                        let y = kernel.dot(wr, [$(xrow(t + $k)),+]);
                        for (k, v) in y.into_iter().enumerate() {
                            store(t + k, r, v + b);
                        }
                    }};
                }
                match n {
                    8 => group!(0, 1, 2, 3, 4, 5, 6, 7),
                    7 => group!(0, 1, 2, 3, 4, 5, 6),
                    6 => group!(0, 1, 2, 3, 4, 5),
                    5 => group!(0, 1, 2, 3, 4),
                    4 => group!(0, 1, 2, 3),
                    3 => group!(0, 1, 2),
                    2 => group!(0, 1),
                    _ => group!(0),
                }
            }
            t += n;
        }
        rb = rb_end;
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! AVX2 copies of [`super::dot_group`]: the same 16 lanes (two 8-wide registers), the same
    //! multiply-then-add per lane (no FMA), the same tail and reduction, so results are
    //! bit-identical to the portable kernel.

    use std::arch::x86_64::*;

    use super::{Bf16, Dot, F16, LANES, Widen, reduce};

    /// Proof that the CPU runs AVX2 and F16C; only [`Avx2Dot::detect`] makes one.
    #[derive(Clone, Copy, Debug)]
    pub struct Avx2Dot(());

    impl Avx2Dot {
        pub fn detect() -> Option<Self> {
            (std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("f16c"))
                .then_some(Avx2Dot(()))
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn load_bf16(p: *const Bf16) -> (__m256, __m256) {
        // SAFETY: the caller guarantees 16 readable elements at `p`.
        let raw = unsafe { _mm256_loadu_si256(p.cast::<__m256i>()) };
        let lo = _mm256_cvtepu16_epi32(_mm256_castsi256_si128(raw));
        let hi = _mm256_cvtepu16_epi32(_mm256_extracti128_si256::<1>(raw));
        (
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(lo)),
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(hi)),
        )
    }

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn load_f16(p: *const F16) -> (__m256, __m256) {
        // SAFETY: the caller guarantees 16 readable elements at `p`. VCVTPH2PS is exact for
        // every finite half (subnormals included), like `F16::widen`.
        unsafe {
            let lo = _mm_loadu_si128(p.cast::<__m128i>());
            let hi = _mm_loadu_si128(p.add(8).cast::<__m128i>());
            (_mm256_cvtph_ps(lo), _mm256_cvtph_ps(hi))
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn load_f32(p: *const f32) -> (__m256, __m256) {
        // SAFETY: the caller guarantees 16 readable elements at `p`.
        unsafe { (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))) }
    }

    macro_rules! avx2_dot {
        ($name:ident, $w:ty, $load:ident) => {
            /// # Safety
            /// The CPU must support AVX2 and F16C.
            #[target_feature(enable = "avx2,f16c")]
            unsafe fn $name<const S: usize>(w: &[$w], xs: [&[f32]; S]) -> [f32; S] {
                let n = w.len();
                for x in &xs {
                    assert!(x.len() >= n, "activation row shorter than weight row");
                }
                let chunks = n / LANES;
                let mut lo = [_mm256_setzero_ps(); S];
                let mut hi = [_mm256_setzero_ps(); S];
                for c in 0..chunks {
                    // SAFETY: c * 16 + 16 <= n elements of `w`, and of every `xs[s]`
                    // (asserted above).
                    unsafe {
                        let (wl, wh) = $load(w.as_ptr().add(c * LANES));
                        for s in 0..S {
                            let xp = xs[s].as_ptr().add(c * LANES);
                            lo[s] = _mm256_add_ps(lo[s], _mm256_mul_ps(wl, _mm256_loadu_ps(xp)));
                            hi[s] =
                                _mm256_add_ps(hi[s], _mm256_mul_ps(wh, _mm256_loadu_ps(xp.add(8))));
                        }
                    }
                }
                let base = chunks * LANES;
                let mut out = [0f32; S];
                for s in 0..S {
                    let mut acc = [0f32; LANES];
                    // SAFETY: `acc` has room for 16 f32.
                    unsafe {
                        _mm256_storeu_ps(acc.as_mut_ptr(), lo[s]);
                        _mm256_storeu_ps(acc.as_mut_ptr().add(8), hi[s]);
                    }
                    for (j, &wv) in w[base..].iter().enumerate() {
                        acc[j] += wv.widen() * xs[s][base + j];
                    }
                    out[s] = reduce(acc);
                }
                out
            }
        };
    }

    avx2_dot!(dot_bf16, Bf16, load_bf16);
    avx2_dot!(dot_f16, F16, load_f16);
    avx2_dot!(dot_f32, f32, load_f32);

    impl Dot<Bf16> for Avx2Dot {
        #[inline]
        fn dot<const S: usize>(&self, w: &[Bf16], xs: [&[f32]; S]) -> [f32; S] {
            // SAFETY: an Avx2Dot exists only after the CPU reported AVX2 and F16C.
            unsafe { dot_bf16(w, xs) }
        }
    }

    impl Dot<F16> for Avx2Dot {
        #[inline]
        fn dot<const S: usize>(&self, w: &[F16], xs: [&[f32]; S]) -> [f32; S] {
            // SAFETY: as above.
            unsafe { dot_f16(w, xs) }
        }
    }

    impl Dot<f32> for Avx2Dot {
        #[inline]
        fn dot<const S: usize>(&self, w: &[f32], xs: [&[f32]; S]) -> [f32; S] {
            // SAFETY: as above.
            unsafe { dot_f32(w, xs) }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    //! AVX-512 copies of [`super::dot_group`]: the 16 lanes are one register, multiply then add
    //! per lane (no FMA), the same tail and reduction — bit-identical to the portable kernel.
    //! 32 registers hold accumulators for 8 tokens at once.

    use std::arch::x86_64::*;

    use super::{Bf16, Dot, F16, LANES, Widen, reduce};

    /// Proof that the CPU runs AVX-512F; only [`Avx512Dot::detect`] makes one.
    #[derive(Clone, Copy, Debug)]
    pub struct Avx512Dot(());

    impl Avx512Dot {
        pub fn detect() -> Option<Self> {
            std::is_x86_feature_detected!("avx512f").then_some(Avx512Dot(()))
        }
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load_bf16(p: *const Bf16) -> __m512 {
        // SAFETY: the caller guarantees 16 readable elements at `p`.
        let raw = unsafe { _mm256_loadu_si256(p.cast::<__m256i>()) };
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(raw)))
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load_f16(p: *const F16) -> __m512 {
        // SAFETY: the caller guarantees 16 readable elements at `p`; the conversion is exact.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast::<__m256i>())) }
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load_f32(p: *const f32) -> __m512 {
        // SAFETY: the caller guarantees 16 readable elements at `p`.
        unsafe { _mm512_loadu_ps(p) }
    }

    macro_rules! avx512_dot {
        ($name:ident, $w:ty, $load:ident) => {
            /// # Safety
            /// The CPU must support AVX-512F.
            #[target_feature(enable = "avx512f")]
            unsafe fn $name<const S: usize>(w: &[$w], xs: [&[f32]; S]) -> [f32; S] {
                let n = w.len();
                for x in &xs {
                    assert!(x.len() >= n, "activation row shorter than weight row");
                }
                let chunks = n / LANES;
                let mut acc = [_mm512_setzero_ps(); S];
                for c in 0..chunks {
                    // SAFETY: c * 16 + 16 <= n elements of `w` and of every `xs[s]`.
                    unsafe {
                        let wv = $load(w.as_ptr().add(c * LANES));
                        for s in 0..S {
                            let xv = _mm512_loadu_ps(xs[s].as_ptr().add(c * LANES));
                            acc[s] = _mm512_add_ps(acc[s], _mm512_mul_ps(wv, xv));
                        }
                    }
                }
                let base = chunks * LANES;
                let mut out = [0f32; S];
                for s in 0..S {
                    let mut lanes = [0f32; LANES];
                    // SAFETY: `lanes` has room for 16 f32.
                    unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), acc[s]) };
                    for (j, &wv) in w[base..].iter().enumerate() {
                        lanes[j] += wv.widen() * xs[s][base + j];
                    }
                    out[s] = reduce(lanes);
                }
                out
            }
        };
    }

    avx512_dot!(dot_bf16, Bf16, load_bf16);
    avx512_dot!(dot_f16, F16, load_f16);
    avx512_dot!(dot_f32, f32, load_f32);

    macro_rules! impl_dot {
        ($w:ty, $f:ident) => {
            impl Dot<$w> for Avx512Dot {
                const GROUP: usize = 8;
                #[inline]
                fn dot<const S: usize>(&self, w: &[$w], xs: [&[f32]; S]) -> [f32; S] {
                    // SAFETY: an Avx512Dot exists only after the CPU reported AVX-512F.
                    unsafe { $f(w, xs) }
                }
            }
        };
    }
    impl_dot!(Bf16, dot_bf16);
    impl_dot!(F16, dot_f16);
    impl_dot!(f32, dot_f32);
}

/// Which compiled copy of the kernels runs.
#[derive(Clone, Copy, Debug)]
pub enum Isa {
    /// Baseline x86-64 (SSE2) or the target's default.
    Baseline,
    /// AVX2 + F16C intrinsics (same arithmetic, wider vectors).
    #[cfg(target_arch = "x86_64")]
    Avx2(avx2::Avx2Dot),
    /// AVX-512F intrinsics (same arithmetic, 8 tokens per weight row pass).
    #[cfg(target_arch = "x86_64")]
    Avx512(avx512::Avx512Dot),
}

impl Isa {
    /// The best copy this CPU runs.
    pub fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if let Some(k) = avx512::Avx512Dot::detect() {
                return Isa::Avx512(k);
            }
            if let Some(k) = avx2::Avx2Dot::detect() {
                return Isa::Avx2(k);
            }
        }
        Isa::Baseline
    }

    /// The copy named by `NERVA_CPU_KERNELS` (`baseline`, `avx2`, `avx512`) when this CPU runs
    /// it, else the best one: a knob for benchmarks comparing the copies.
    pub fn from_env() -> Self {
        let wanted = std::env::var("NERVA_CPU_KERNELS").unwrap_or_default();
        Isa::available()
            .into_iter()
            .find(|isa| isa.name() == wanted)
            .unwrap_or_else(Isa::detect)
    }

    /// Every copy this CPU runs (tests compare them).
    pub fn available() -> Vec<Isa> {
        #[allow(unused_mut)]
        let mut all = vec![Isa::Baseline];
        #[cfg(target_arch = "x86_64")]
        {
            all.extend(avx2::Avx2Dot::detect().map(Isa::Avx2));
            all.extend(avx512::Avx512Dot::detect().map(Isa::Avx512));
        }
        all
    }

    /// Name for status displays.
    pub fn name(&self) -> &'static str {
        match self {
            Isa::Baseline => "baseline",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2(_) => "avx2",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512(_) => "avx512",
        }
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
        (Isa::Avx2(k), WeightView::F32(w)) => matmul_block_generic(&k, w, bias, task, store),
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2(k), WeightView::Bf16(w)) => matmul_block_generic(&k, w, bias, task, store),
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2(k), WeightView::F16(w)) => matmul_block_generic(&k, w, bias, task, store),
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx512(k), WeightView::F32(w)) => matmul_block_generic(&k, w, bias, task, store),
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx512(k), WeightView::Bf16(w)) => matmul_block_generic(&k, w, bias, task, store),
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx512(k), WeightView::F16(w)) => matmul_block_generic(&k, w, bias, task, store),
        (_, WeightView::F32(w)) => matmul_block_generic(&PlainDot, w, bias, task, store),
        (_, WeightView::Bf16(w)) => matmul_block_generic(&PlainDot, w, bias, task, store),
        (_, WeightView::F16(w)) => matmul_block_generic(&PlainDot, w, bias, task, store),
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
        let tokens = 11;
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
        for isa in Isa::available() {
            assert_eq!(all, run(isa, wv, &x, tokens, cols, rows), "{isa:?}");
        }
        // The other dtypes through both copies, with a tail (37 = 2 * 16 + 5).
        let w16: Vec<u16> = w
            .iter()
            .map(|&b| half::f16::from_f32(Bf16(b).widen()).to_bits())
            .collect();
        let wf: Vec<f32> = w.iter().map(|&b| Bf16(b).widen()).collect();
        for view in [WeightView::F16(cast16(&w16)), WeightView::F32(&wf)] {
            let plain = run(Isa::Baseline, view, &x, tokens, cols, rows);
            for isa in Isa::available() {
                assert_eq!(plain, run(isa, view, &x, tokens, cols, rows), "{isa:?}");
                let one = run(isa, view, &x[..cols], 1, cols, rows);
                assert_eq!(&plain[..rows], &one[..], "{isa:?}");
            }
        }
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
