//! Rotary position embedding, computed the way transformers computes it in f32.
//!
//! transformers builds `inv_freq = 1 / base^(arange(0, dim, 2) / dim)` as f32 tensors, applies
//! the rope-type adjustment on those f32 values (`_compute_llama3_parameters`, linear: divide by
//! the factor), then `freqs = inv_freq * position` (one f32 product) and `cos`/`sin` of that in
//! f32. We precompute the same table for every position up to the context length.

use crate::model::{ModelConfig, RopeScaling};

/// `cos`/`sin` for every position and frequency.
#[derive(Debug)]
pub struct RopeTable {
    half: usize,
    /// `[positions, half]`
    cos: Vec<f32>,
    /// `[positions, half]`
    sin: Vec<f32>,
}

/// Inverse frequencies as transformers computes them (f32 arithmetic).
pub fn inv_freq(config: &ModelConfig) -> Vec<f32> {
    let dim = config.head_dim;
    let base = config.rope_theta as f32;
    let mut inv: Vec<f32> = (0..dim / 2)
        .map(|i| {
            let exponent = (2 * i) as f32 / dim as f32;
            1.0 / base.powf(exponent)
        })
        .collect();
    match config.rope_scaling {
        RopeScaling::None => {}
        RopeScaling::Linear { factor } => {
            let factor = factor as f32;
            for f in &mut inv {
                *f /= factor;
            }
        }
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => {
            // Python floats (f64) for the scalars, f32 tensors for the per-frequency values.
            let old = original_max_position_embeddings as f64;
            let low_wavelen = (old / low_freq_factor) as f32;
            let high_wavelen = (old / high_freq_factor) as f32;
            let pi2 = (2.0 * std::f64::consts::PI) as f32;
            for f in &mut inv {
                let wavelen = pi2 / *f;
                let llama = if wavelen > low_wavelen {
                    *f / factor as f32
                } else {
                    *f
                };
                let medium = wavelen >= high_wavelen && wavelen <= low_wavelen;
                *f = if medium {
                    let smooth = ((old as f32) / wavelen - low_freq_factor as f32)
                        / (high_freq_factor - low_freq_factor) as f32;
                    (1.0 - smooth) * llama / factor as f32 + smooth * llama
                } else {
                    llama
                };
            }
        }
    }
    inv
}

impl RopeTable {
    /// The table for positions `0..positions`.
    pub fn new(config: &ModelConfig, positions: usize) -> Self {
        let inv = inv_freq(config);
        let half = inv.len();
        let mut cos = Vec::with_capacity(positions * half);
        let mut sin = Vec::with_capacity(positions * half);
        for p in 0..positions {
            for &f in &inv {
                let angle = p as f32 * f;
                // cos/sin of the f32 angle, evaluated in f64 and rounded: within half an ulp of
                // the true value (torch's f32 kernels are within about one ulp).
                cos.push(f64::from(angle).cos() as f32);
                sin.push(f64::from(angle).sin() as f32);
            }
        }
        RopeTable { half, cos, sin }
    }

    /// The `[positions, head_dim / 2]` cosine and sine tables (uploaded as is by the CUDA
    /// backend, so both backends rotate with the very same values).
    pub fn tables(&self) -> (&[f32], &[f32]) {
        (&self.cos, &self.sin)
    }

    /// Rotate one head vector at `pos` in place (`rotate_half` convention: pairs `i`, `i + d/2`).
    pub fn apply(&self, head: &mut [f32], pos: usize) {
        let h = self.half;
        let cos = &self.cos[pos * h..(pos + 1) * h];
        let sin = &self.sin[pos * h..(pos + 1) * h];
        let (a, b) = head.split_at_mut(h);
        for i in 0..h {
            let x1 = a[i];
            let x2 = b[i];
            a[i] = x1 * cos[i] - x2 * sin[i];
            b[i] = x2 * cos[i] + x1 * sin[i];
        }
    }
}
