//! The CPU backend against a naive f64 transformer written here from the Hugging Face
//! definitions, on tiny random weights: one test per architecture feature, plus the batching,
//! paging and chunking invariants (bit-for-bit).

use nervad::backend::cpu::CpuBackend;
use nervad::backend::{Backend, BackendOptions, SeqStep, StepOutput};
use nervad::engine::SamplingParams;
use nervad::model::{
    Architecture, Attention, DType, DecoderLayer, Linear, Mlp, ModelConfig, ModelWeights,
    RopeScaling, Tensor,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn config(arch: Architecture) -> ModelConfig {
    ModelConfig {
        architecture: arch,
        vocab_size: 53,
        hidden_size: 32,
        intermediate_size: 40,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 8,
        rms_norm_eps: 1e-6,
        rope_theta: 10000.0,
        rope_scaling: RopeScaling::None,
        max_position_embeddings: 64,
        tie_word_embeddings: false,
        attention_bias: false,
        o_proj_bias: false,
        mlp_bias: false,
        qk_norm: false,
        sliding_window: None,
        dtype: DType::F32,
        bos_token_id: None,
        eos_token_ids: vec![],
    }
}

/// Random weights stored in `c.dtype`, plus the exact f64 values the reference uses.
struct Model {
    weights: ModelWeights,
    /// name → f64 values (after rounding to the stored dtype).
    exact: std::collections::HashMap<String, Vec<f64>>,
}

fn make_tensor(
    rng: &mut ChaCha8Rng,
    dtype: DType,
    shape: Vec<usize>,
    scale: f32,
    offset: f32,
) -> (Tensor, Vec<f64>) {
    let n: usize = shape.iter().product();
    let vals: Vec<f32> = (0..n)
        .map(|_| offset + scale * (rng.random::<f32>() * 2.0 - 1.0))
        .collect();
    match dtype {
        DType::F32 => (
            Tensor::from_f32(shape, &vals),
            vals.iter().map(|&v| f64::from(v)).collect(),
        ),
        DType::BF16 => {
            let bits: Vec<u16> = vals
                .iter()
                .map(|&v| half::bf16::from_f32(v).to_bits())
                .collect();
            let exact = bits
                .iter()
                .map(|&b| f64::from(half::bf16::from_bits(b).to_f32()))
                .collect();
            (Tensor::from_bits16(dtype, shape, &bits), exact)
        }
        DType::F16 => {
            let bits: Vec<u16> = vals
                .iter()
                .map(|&v| half::f16::from_f32(v).to_bits())
                .collect();
            let exact = bits
                .iter()
                .map(|&b| f64::from(half::f16::from_bits(b).to_f32()))
                .collect();
            (Tensor::from_bits16(dtype, shape, &bits), exact)
        }
    }
}

fn build(c: &ModelConfig, seed: u64) -> Model {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut exact = std::collections::HashMap::new();
    let mut t = |name: &str, shape: Vec<usize>, scale: f32, offset: f32| {
        let (tensor, vals) = make_tensor(&mut rng, c.dtype, shape, scale, offset);
        exact.insert(name.to_string(), vals);
        tensor
    };
    let (h, qd, kvd, i) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
    let embed = t("embed", vec![c.vocab_size, h], 1.0, 0.0);
    let mut layers = Vec::new();
    for l in 0..c.num_hidden_layers {
        let mut lin = |name: &str, out: usize, inp: usize, bias: bool| Linear {
            weight: t(
                &format!("{l}.{name}"),
                vec![out, inp],
                1.5 / (inp as f32).sqrt(),
                0.0,
            ),
            bias: bias.then(|| t(&format!("{l}.{name}.b"), vec![out], 0.5, 0.0)),
        };
        let q = lin("q", qd, h, c.attention_bias);
        let k = lin("k", kvd, h, c.attention_bias);
        let v = lin("v", kvd, h, c.attention_bias);
        let o = lin("o", h, qd, c.o_proj_bias);
        let gate = lin("gate", i, h, c.mlp_bias);
        let up = lin("up", i, h, c.mlp_bias);
        let down = lin("down", h, i, c.mlp_bias);
        let norms = c.qk_norm.then(|| {
            (
                t(&format!("{l}.qn"), vec![c.head_dim], 0.2, 1.0),
                t(&format!("{l}.kn"), vec![c.head_dim], 0.2, 1.0),
            )
        });
        let (q_norm, k_norm) = match norms {
            Some((a, b)) => (Some(a), Some(b)),
            None => (None, None),
        };
        layers.push(DecoderLayer {
            input_layernorm: t(&format!("{l}.ln1"), vec![h], 0.2, 1.0),
            self_attn: Attention {
                q_proj: q,
                k_proj: k,
                v_proj: v,
                o_proj: o,
                q_norm,
                k_norm,
            },
            post_attention_layernorm: t(&format!("{l}.ln2"), vec![h], 0.2, 1.0),
            mlp: Mlp {
                gate_proj: gate,
                up_proj: up,
                down_proj: down,
            },
        });
    }
    let norm = t("norm", vec![h], 0.2, 1.0);
    let lm_head = if c.tie_word_embeddings {
        exact.insert("lm_head".into(), exact["embed"].clone());
        embed.clone()
    } else {
        t(
            "lm_head",
            vec![c.vocab_size, h],
            1.0 / (h as f32).sqrt(),
            0.0,
        )
    };
    Model {
        weights: ModelWeights {
            embed_tokens: embed,
            layers,
            norm,
            lm_head,
        },
        exact,
    }
}

/// inv_freq in f64 from the transformers formulas.
fn inv_freq(c: &ModelConfig) -> Vec<f64> {
    let d = c.head_dim;
    let mut inv: Vec<f64> = (0..d / 2)
        .map(|i| 1.0 / c.rope_theta.powf((2 * i) as f64 / d as f64))
        .collect();
    match c.rope_scaling {
        RopeScaling::None => {}
        RopeScaling::Linear { factor } => inv.iter_mut().for_each(|f| *f /= factor),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => {
            let old = original_max_position_embeddings as f64;
            let low = old / low_freq_factor;
            let high = old / high_freq_factor;
            for f in &mut inv {
                let wl = 2.0 * std::f64::consts::PI / *f;
                if wl < high {
                } else if wl > low {
                    *f /= factor;
                } else {
                    let s = (old / wl - low_freq_factor) / (high_freq_factor - low_freq_factor);
                    *f = (1.0 - s) * *f / factor + s * *f;
                }
            }
        }
    }
    inv
}

/// Logits `[n, vocab]` of every position of `tokens`, in f64.
fn reference(c: &ModelConfig, m: &Model, tokens: &[u32]) -> Vec<Vec<f64>> {
    let e = &m.exact;
    let (h, hd, nh, nkv, inter) = (
        c.hidden_size,
        c.head_dim,
        c.num_attention_heads,
        c.num_key_value_heads,
        c.intermediate_size,
    );
    let eps = c.rms_norm_eps;
    let rms = |x: &[f64], w: &[f64]| -> Vec<f64> {
        let var = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
        let r = 1.0 / (var + eps).sqrt();
        x.iter().zip(w).map(|(v, w)| v * r * w).collect()
    };
    let lin = |name: &str, x: &[f64], out: usize| -> Vec<f64> {
        let w = &e[name];
        let inp = x.len();
        let b = e.get(&format!("{name}.b"));
        (0..out)
            .map(|r| (0..inp).map(|i| w[r * inp + i] * x[i]).sum::<f64>() + b.map_or(0.0, |b| b[r]))
            .collect()
    };
    let inv = inv_freq(c);
    let rope = |v: &mut [f64], pos: usize| {
        let half = hd / 2;
        for i in 0..half {
            let a = pos as f64 * inv[i];
            let (x1, x2) = (v[i], v[i + half]);
            v[i] = x1 * a.cos() - x2 * a.sin();
            v[i + half] = x2 * a.cos() + x1 * a.sin();
        }
    };
    let n = tokens.len();
    let mut xs: Vec<Vec<f64>> = tokens
        .iter()
        .map(|&t| e["embed"][t as usize * h..(t as usize + 1) * h].to_vec())
        .collect();
    for l in 0..c.num_hidden_layers {
        let mut qs = Vec::new();
        let mut ks = Vec::new();
        let mut vs = Vec::new();
        for (pos, x) in xs.iter().enumerate() {
            let xn = rms(x, &e[&format!("{l}.ln1")]);
            let mut q = lin(&format!("{l}.q"), &xn, nh * hd);
            let mut k = lin(&format!("{l}.k"), &xn, nkv * hd);
            let v = lin(&format!("{l}.v"), &xn, nkv * hd);
            for head in q.chunks_mut(hd) {
                if c.qk_norm {
                    let normed = rms(head, &e[&format!("{l}.qn")]);
                    head.copy_from_slice(&normed);
                }
                rope(head, pos);
            }
            for head in k.chunks_mut(hd) {
                if c.qk_norm {
                    let normed = rms(head, &e[&format!("{l}.kn")]);
                    head.copy_from_slice(&normed);
                }
                rope(head, pos);
            }
            qs.push(q);
            ks.push(k);
            vs.push(v);
        }
        for pos in 0..n {
            let mut attn = vec![0.0; nh * hd];
            for head in 0..nh {
                let kvh = head / (nh / nkv);
                let first = c.sliding_window.map_or(0, |w| (pos + 1).saturating_sub(w));
                let q = &qs[pos][head * hd..(head + 1) * hd];
                let scores: Vec<f64> = (first..=pos)
                    .map(|j| {
                        let k = &ks[j][kvh * hd..(kvh + 1) * hd];
                        q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>() / (hd as f64).sqrt()
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let exps: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = exps.iter().sum();
                for (i, j) in (first..=pos).enumerate() {
                    for d in 0..hd {
                        attn[head * hd + d] += exps[i] / sum * vs[j][kvh * hd + d];
                    }
                }
            }
            let o = lin(&format!("{l}.o"), &attn, h);
            for (x, o) in xs[pos].iter_mut().zip(o) {
                *x += o;
            }
            let xn = rms(&xs[pos], &e[&format!("{l}.ln2")]);
            let g = lin(&format!("{l}.gate"), &xn, inter);
            let u = lin(&format!("{l}.up"), &xn, inter);
            let act: Vec<f64> = g
                .iter()
                .zip(&u)
                .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                .collect();
            let d = lin(&format!("{l}.down"), &act, h);
            for (x, d) in xs[pos].iter_mut().zip(d) {
                *x += d;
            }
        }
    }
    xs.iter()
        .map(|x| {
            let xn = rms(x, &e["norm"]);
            lin("lm_head", &xn, c.vocab_size)
        })
        .collect()
}

fn backend(c: &ModelConfig, m: &Model, page_tokens: usize, pages: usize) -> CpuBackend {
    let per_token = c.num_hidden_layers * 2 * c.kv_dim() * 4;
    CpuBackend::new(
        c,
        &m.weights,
        BackendOptions {
            max_seqs: 4,
            max_step_tokens: 32,
            page_tokens,
            kv_budget_bytes: per_token * page_tokens * pages,
            max_context: c.max_position_embeddings,
            threads: 2,
            swap: nervad::backend::SwapSpace::None,
        },
    )
    .expect("backend builds")
}

/// Prefill `tokens` in one step and decode `extra` greedy tokens; every position's logits.
fn run_sequence(
    b: &mut CpuBackend,
    table: &[u32],
    tokens: &[u32],
    extra: usize,
) -> (Vec<u32>, Vec<Vec<f32>>) {
    b.start_sequence(0, &SamplingParams::default(), 0, tokens)
        .unwrap();
    let mut out = StepOutput::default();
    let mut all = tokens.to_vec();
    let mut logits = Vec::new();
    let step = SeqStep {
        slot: 0,
        tokens,
        start_pos: 0,
        block_table: table,
        sample: true,
        want_logits: true,
        from_last_sample: false,
    };
    b.step(&[step], &mut out).unwrap();
    let width = out.logits.len() / tokens.len();
    logits.extend(out.logits.chunks(width).map(<[f32]>::to_vec));
    for _ in 0..extra {
        let next = out.samples[0].unwrap().token;
        let pos = all.len() as u32;
        all.push(next);
        let step = SeqStep {
            slot: 0,
            tokens: &all[pos as usize..],
            start_pos: pos,
            block_table: table,
            sample: true,
            want_logits: true,
            from_last_sample: false,
        };
        b.step(&[step], &mut out).unwrap();
        logits.push(out.logits.clone());
    }
    (all, logits)
}

fn check_against_reference(c: &ModelConfig, seed: u64, prompt_len: usize, extra: usize) {
    let m = build(c, seed);
    let mut b = backend(c, &m, 4, 16);
    let mut rng = ChaCha8Rng::seed_from_u64(seed + 1);
    let prompt: Vec<u32> = (0..prompt_len)
        .map(|_| rng.random_range(0..c.vocab_size as u32))
        .collect();
    let table: Vec<u32> = (0..16).collect();
    let (all, logits) = run_sequence(&mut b, &table, &prompt, extra);
    let want = reference(c, &m, &all[..prompt_len + extra]);
    assert_eq!(logits.len(), want.len());
    for (pos, (got, want)) in logits.iter().zip(&want).enumerate() {
        let scale = want.iter().fold(0f64, |a, v| a.max(v.abs()));
        let err = got
            .iter()
            .zip(want)
            .fold(0f64, |a, (g, w)| a.max((f64::from(*g) - w).abs()));
        assert!(
            err <= 1e-5 * scale.max(1.0),
            "{:?} position {pos}: max |Δ| {err:e} (scale {scale})",
            c.architecture
        );
        // Greedy decode picked the argmax of its logits.
        if pos + 1 < all.len() && pos + 1 >= prompt_len {
            let arg = got
                .iter()
                .enumerate()
                .fold(
                    (0, f32::NEG_INFINITY),
                    |a, (i, &v)| if v > a.1 { (i, v) } else { a },
                )
                .0;
            assert_eq!(all[pos + 1] as usize, arg);
        }
    }
}

#[test]
fn llama_plain_f32() {
    check_against_reference(&config(Architecture::Llama), 1, 9, 4);
}

#[test]
fn qwen3_qk_norm_bf16_tied() {
    let mut c = config(Architecture::Qwen3);
    c.qk_norm = true;
    c.dtype = DType::BF16;
    c.tie_word_embeddings = true;
    check_against_reference(&c, 2, 7, 5);
}

#[test]
fn qwen2_bias_f16() {
    let mut c = config(Architecture::Qwen2);
    c.attention_bias = true;
    c.dtype = DType::F16;
    check_against_reference(&c, 3, 6, 4);
}

#[test]
fn llama_biases_everywhere_and_mha() {
    let mut c = config(Architecture::Llama);
    c.attention_bias = true;
    c.o_proj_bias = true;
    c.mlp_bias = true;
    c.num_key_value_heads = 4;
    check_against_reference(&c, 4, 5, 3);
}

#[test]
fn llama3_rope_scaling() {
    let mut c = config(Architecture::Llama);
    // Small original context so all three frequency bands occur at head_dim 8.
    c.rope_theta = 500000.0;
    c.rope_scaling = RopeScaling::Llama3 {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 64,
    };
    c.head_dim = 16;
    c.num_attention_heads = 2;
    c.num_key_value_heads = 1;
    check_against_reference(&c, 5, 8, 4);
}

#[test]
fn linear_rope_scaling() {
    let mut c = config(Architecture::Llama);
    c.rope_scaling = RopeScaling::Linear { factor: 4.0 };
    check_against_reference(&c, 6, 8, 3);
}

#[test]
fn mistral_sliding_window() {
    let mut c = config(Architecture::Mistral);
    c.sliding_window = Some(4);
    check_against_reference(&c, 7, 10, 4);
}

/// Logits of each sequence alone, then all in one step: identical bits.
#[test]
fn batched_equals_unbatched_bit_for_bit() {
    let mut c = config(Architecture::Qwen3);
    c.qk_norm = true;
    c.dtype = DType::BF16;
    let m = build(&c, 8);
    let prompts: [&[u32]; 3] = [&[1, 2, 3, 4, 5, 6], &[7, 8], &[9, 10, 11, 12, 13]];
    let tables: [Vec<u32>; 3] = [vec![0, 1], vec![2], vec![3, 4]];
    let mut alone = Vec::new();
    for (p, t) in prompts.iter().zip(&tables) {
        let mut b = backend(&c, &m, 4, 8);
        b.start_sequence(0, &SamplingParams::default(), 0, p)
            .unwrap();
        let mut out = StepOutput::default();
        b.step(
            &[SeqStep {
                slot: 0,
                tokens: p,
                start_pos: 0,
                block_table: t,
                sample: true,
                want_logits: true,
                from_last_sample: false,
            }],
            &mut out,
        )
        .unwrap();
        alone.push((out.logits.clone(), out.samples[0]));
    }
    let mut b = backend(&c, &m, 4, 8);
    let steps: Vec<SeqStep<'_>> = prompts
        .iter()
        .zip(&tables)
        .enumerate()
        .map(|(i, (p, t))| {
            b.start_sequence(i as u32, &SamplingParams::default(), 0, p)
                .unwrap();
            SeqStep {
                slot: i as u32,
                tokens: p,
                start_pos: 0,
                block_table: t,
                sample: true,
                want_logits: true,
                from_last_sample: false,
            }
        })
        .collect();
    let mut out = StepOutput::default();
    b.step(&steps, &mut out).unwrap();
    let mut joined = Vec::new();
    for (l, _) in &alone {
        joined.extend_from_slice(l);
    }
    assert_eq!(
        out.logits.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        joined.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    for (i, (_, s)) in alone.iter().enumerate() {
        assert_eq!(out.samples[i], *s);
    }
}

/// Shuffled page ids and chunked prefill give the same bits as contiguous pages and one chunk.
#[test]
fn shuffled_pages_and_chunked_prefill_are_exact() {
    let mut c = config(Architecture::Mistral);
    c.sliding_window = Some(6);
    let m = build(&c, 9);
    let prompt: Vec<u32> = (0..13).map(|i| (i * 7 % 53) as u32).collect();
    let straight: Vec<u32> = (0..8).collect();
    let (_, want) = run_sequence(&mut backend(&c, &m, 4, 8), &straight, &prompt, 3);

    let shuffled: Vec<u32> = vec![5, 2, 7, 0, 3, 6, 1, 4];
    let mut b = backend(&c, &m, 4, 8);
    let (_, got) = run_sequence(&mut b, &shuffled, &prompt, 3);
    assert_eq!(got, want);

    // Chunks of 5, 5, 3 tokens.
    let mut b = backend(&c, &m, 4, 8);
    b.start_sequence(0, &SamplingParams::default(), 0, &prompt)
        .unwrap();
    let mut out = StepOutput::default();
    let mut logits = Vec::new();
    for (i, chunk) in prompt.chunks(5).enumerate() {
        b.step(
            &[SeqStep {
                slot: 0,
                tokens: chunk,
                start_pos: (i * 5) as u32,
                block_table: &shuffled,
                sample: (i + 1) * 5 >= prompt.len(),
                want_logits: true,
                from_last_sample: false,
            }],
            &mut out,
        )
        .unwrap();
        logits.extend(out.logits.chunks(c.vocab_size).map(<[f32]>::to_vec));
    }
    assert_eq!(logits, want[..prompt.len()].to_vec());
}

#[test]
fn bad_steps_are_refused() {
    let c = config(Architecture::Llama);
    let m = build(&c, 10);
    let mut b = backend(&c, &m, 4, 4);
    let mut out = StepOutput::default();
    let table = [0u32, 1];
    let ok = SeqStep {
        slot: 0,
        tokens: &[1, 2, 3],
        start_pos: 0,
        block_table: &table,
        sample: true,
        want_logits: false,
        from_last_sample: false,
    };
    for bad in [
        SeqStep {
            tokens: &[99],
            ..ok
        },
        SeqStep { slot: 9, ..ok },
        SeqStep { start_pos: 6, ..ok },
        SeqStep {
            block_table: &[7],
            ..ok
        },
        SeqStep { tokens: &[], ..ok },
        SeqStep {
            start_pos: 63,
            ..ok
        },
    ] {
        assert!(b.step(&[bad], &mut out).is_err(), "{bad:?}");
    }
    assert!(b.step(&[ok, ok], &mut out).is_err(), "same slot twice");
    assert!(b.step(&[ok], &mut out).is_ok());
    assert!(b.copy_page(0, 4).is_err());
}
