//! The projections alone: our GEMV kernels against the read bandwidth measured in the same run,
//! our tensor-core projection (mma.cuh, the default decode kernel) for 1 to 256 tokens against
//! the bandwidth and the GEMV — beside it the deep one-n-tile variant and the launch the backend
//! makes by default (`KernelTuning::default()`, over tiled weights) — and the fixed-order GEMM
//! (mma.sync, and wgmma on Hopper) and cuBLAS (tensor cores, bf16 in, f32 out) against them for
//! 1 to 2,048 tokens, with the bf16 GEMM peak.
//!
//! ```text
//! cargo bench -p nervad --bench gpu_kernels -- [--tokens 1,2,4,8] [--mma-tokens 1,8,16,32,64,128,256]
//!     [--gemm-tokens 1,8,64,128,256,1024,2048] [--only qwen3-8b/down]
//! ```
//! Weights rotate over copies totalling ≥ 512 MiB, so every launch reads them from HBM, not L2.
//! Each figure is the median over 10 replays of a graph of 20 launches. Without a CUDA device
//! it says so and exits 0.

use clap::Parser;
use nervad::backend::cuda::blas::{Blas, WORKSPACE_BYTES};
use nervad::backend::cuda::driver::{Args, DevBuf, Gpu, Kernel};
use nervad::backend::cuda::{
    GEMM_SPLIT_MAX_BLOCKS_PER_SM, GemmMaps, GemmSplit, KernelTuning, MMA_DEEP, MMA_GEMM,
    MMA_GEMM_MID_TOKENS, MMA_GEMM_NARROW, MMA_GEMM_NARROW_TOKENS, MMA_GEMM_SHARED, MMA_GEMM_TOKENS,
    MMA_GEMM_WIDE_TOKENS, MMA_PERSIST, MMA_RING, MMA_VARIANTS, MMA_WG, MMA_WGS, MMA_WGT,
    MMA_WGT_MID, MMA_WGT_WIDE, MmaLaunch, gemm_form, gemm_plan, gemm_tile_tokens, kernels,
    mma_gemm_shared, mma_launch, mma_threads, one_tile_form, persistent_blocks, prompt_fit,
    ring_form, to_half_grid, wg_gemm_shared, wgs_blocks,
};
use nervad::model::DType;

#[derive(Parser, Debug)]
struct Cli {
    /// Token counts for the GEMV comparison.
    #[arg(long, default_value = "1,2,8")]
    tokens: String,
    /// Token counts for the tensor-core projection.
    #[arg(long, default_value = "1,2,8,16,32,64,128,256")]
    mma_tokens: String,
    /// Token counts for cuBLAS against our kernels.
    #[arg(long, default_value = "1,8,64,128,256,1024,2048")]
    gemm_tokens: String,
    /// Only the shapes whose "model/proj" contains this (e.g. `qwen3-8b/down`), to profile one.
    #[arg(long, default_value = "")]
    only: String,
    /// CUDA device.
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Rms,
    PlainAdd,
    /// RMSNorm + gate|up (rows interleaved in pairs) + silu·mul.
    Glu,
}

struct Shape {
    model: &'static str,
    name: &'static str,
    mode: Mode,
    k: usize,
    r: usize,
}

const SHAPES: &[Shape] = &[
    Shape {
        model: "qwen3-8b",
        name: "qkv",
        mode: Mode::Rms,
        k: 4096,
        r: 6144,
    },
    Shape {
        model: "qwen3-8b",
        name: "o",
        mode: Mode::PlainAdd,
        k: 4096,
        r: 4096,
    },
    Shape {
        model: "qwen3-8b",
        name: "gate_up",
        mode: Mode::Glu,
        k: 4096,
        r: 24576,
    },
    Shape {
        model: "qwen3-8b",
        name: "down",
        mode: Mode::PlainAdd,
        k: 12288,
        r: 4096,
    },
    Shape {
        model: "qwen3-8b",
        name: "lm_head",
        mode: Mode::Rms,
        k: 4096,
        r: 151936,
    },
    Shape {
        model: "qwen3-0.6b",
        name: "qkv",
        mode: Mode::Rms,
        k: 1024,
        r: 4096,
    },
    Shape {
        model: "qwen3-0.6b",
        name: "o",
        mode: Mode::PlainAdd,
        k: 2048,
        r: 1024,
    },
    Shape {
        model: "qwen3-0.6b",
        name: "gate_up",
        mode: Mode::Glu,
        k: 1024,
        r: 6144,
    },
    Shape {
        model: "qwen3-0.6b",
        name: "down",
        mode: Mode::PlainAdd,
        k: 3072,
        r: 1024,
    },
    Shape {
        model: "qwen3-0.6b",
        name: "lm_head",
        mode: Mode::Rms,
        k: 1024,
        r: 151936,
    },
];

/// Bytes of weights the rotation covers at least (twice the largest L2 of these parts).
const ROTATE_BYTES: usize = 512 << 20;
const LAUNCHES: usize = 20;
const REPLAYS: usize = 10;

type Res<T> = Result<T, nervad::backend::BackendError>;

struct Bench {
    gpu: Gpu,
    weights: DevBuf,
    x: DevBuf,
    xa: DevBuf,
    norm: DevBuf,
    y: DevBuf,
    /// The chain-split GEMM's partial tiles and per-tile counters (zero between launches).
    gemm_ws: DevBuf,
    gemm_done: DevBuf,
    /// Multiprocessors (the to_half grid).
    sms: usize,
    start: nervad::backend::cuda::driver::Event,
    end: nervad::backend::cuda::driver::Event,
}

fn parse_list(s: &str) -> Vec<usize> {
    s.split(',').filter_map(|v| v.trim().parse().ok()).collect()
}

/// Deterministic pseudo-random bytes (xorshift), as 16-bit values of magnitude < ~0.06 when
/// `bf16`, else f32 in [-1, 1).
fn fill(gpu: &mut Gpu, buf: DevBuf, seed: u64, f32s: bool) -> Res<()> {
    const BLOCK: usize = 16 << 20;
    let mut s = seed | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let mut host = vec![0u8; BLOCK.min(buf.bytes)];
    for chunk in host.chunks_mut(4) {
        let u = (next() >> 40) as u32; // 24 bits
        let f = (u as f32 / (1u32 << 23) as f32) - 1.0;
        if f32s {
            chunk.copy_from_slice(&f.to_le_bytes()[..chunk.len()]);
        } else {
            let h = half::bf16::from_f32(f * 0.0625).to_le_bytes();
            let g = half::bf16::from_f32(-f * 0.03).to_le_bytes();
            let b = [h[0], h[1], g[0], g[1]];
            chunk.copy_from_slice(&b[..chunk.len()]);
        }
    }
    let mut off = 0;
    while off < buf.bytes {
        let n = host.len().min(buf.bytes - off);
        gpu.upload(buf.at(off), &host[..n])?;
        off += n;
    }
    gpu.synchronize()
}

impl Bench {
    /// Median ms of one launch of `enqueue(i)` (i = launch index), captured 20 to a graph.
    fn time(&mut self, mut enqueue: impl FnMut(&mut Gpu, usize) -> Res<()>) -> Res<f64> {
        let before = self.gpu.counters.launches;
        self.gpu.begin_capture()?;
        for i in 0..LAUNCHES {
            if let Err(e) = enqueue(&mut self.gpu, i) {
                let _ = self.gpu.end_capture(before);
                return Err(e);
            }
        }
        let graph = self.gpu.end_capture(before)?;
        let mut times = Vec::with_capacity(REPLAYS);
        for rep in 0..REPLAYS + 2 {
            self.gpu.record(&self.start)?;
            self.gpu.replay(&graph)?;
            self.gpu.record(&self.end)?;
            self.gpu.wait(&self.end, true)?;
            if rep >= 2 {
                times.push(self.gpu.elapsed_ms(&self.start, &self.end)? as f64 / LAUNCHES as f64);
            }
        }
        times.sort_by(f64::total_cmp);
        Ok(times[times.len() / 2])
    }

    /// Median ms of our projection kernel for `t` tokens of `shape`, `rows` rows per block.
    fn gemv(&mut self, family: &[Kernel], rows: u32, shape: &Shape, t: usize) -> Res<f64> {
        let kernel = family[match t {
            1 => 0,
            2 => 1,
            3 | 4 => 2,
            _ => 3,
        }];
        let (x, norm, y, wbase) = (self.x.ptr, self.norm.ptr, self.y.ptr, self.weights.ptr);
        let region = self.weights.bytes;
        let x_stride = shape.k as i32;
        let (k, r, ti) = (shape.k as i32, shape.r as i32, t as i32);
        let (eps, null) = (1e-6f32, 0u64);
        self.time(|gpu, i| {
            let w = wbase + weight_offset(shape, region, i);
            // SAFETY: gemv_*(w, bias, x, x_stride, rows, norm, eps, K, R, T, y, y_stride): w
            // covers R×K bf16 inside the weights region, x holds T rows of x_stride f32, y T
            // rows of R f32 (scratch), norm K f32; bias and rows are null.
            unsafe {
                gpu.launch(
                    kernel,
                    ((shape.r as u32).div_ceil(rows), 1, 1),
                    128,
                    Args::new()
                        .arg(&w)
                        .arg(&null)
                        .arg(&x)
                        .arg(&x_stride)
                        .arg(&null)
                        .arg(&norm)
                        .arg(&eps)
                        .arg(&k)
                        .arg(&r)
                        .arg(&ti)
                        .arg(&y)
                        .arg(&r),
                )
            }
        })
    }

    /// Median ms of the tensor-core projection of `t` tokens launched as `launch` (`kernels`:
    /// the mode's `MMA_VARIANTS`; `prep`: its to_half kernel, launched first when the launch
    /// reads prepared inputs, as the backend does).
    fn mma(
        &mut self,
        kernels: &[Kernel],
        prep: Kernel,
        shape: &Shape,
        t: usize,
        launch: MmaLaunch,
    ) -> Res<f64> {
        let kernel = kernels[launch.variant];
        let sms = self.sms;
        let (rows, tiles) = (launch.rows, launch.token_tiles as i32);
        let (x, xa, norm, y, wbase) = (
            self.x.ptr,
            self.xa.ptr,
            self.norm.ptr,
            self.y.ptr,
            self.weights.ptr,
        );
        let (ws, done, split_plan) = (self.gemm_ws.ptr, self.gemm_done.ptr, launch.split_plan());
        let gemm = gemm_tile_tokens(launch.variant).is_some();
        // The wgmma GEMM reads its inputs in its own order (to_half's wg_order).
        let wg_order = ((MMA_WG..MMA_RING).contains(&launch.variant)
            || matches!(launch.variant, MMA_WGT_WIDE | MMA_WGT_MID)) as i32;
        let region = self.weights.bytes;
        let x_stride = shape.k as i32;
        let (k, r, ti) = (shape.k as i32, shape.r as i32, t as i32);
        let (eps, null, t0, no_half) = (1e-6f32, 0u64, 0i32, 0i32);
        let xh = if launch.prepared { xa } else { 0 };
        let units = launch.units((shape.r as u32).div_ceil(rows) * launch.token_tiles);
        // The warp-specialized GEMM and the persistent one-n-tile forms as the backend
        // launches them (NERVA_WG_PERSISTENT, NERVA_MMA_PERSISTENT_BLOCKS), the environment
        // read once, not per timed launch.
        let blocks = match launch.variant {
            MMA_WGS | MMA_WGT | MMA_WGT_WIDE | MMA_WGT_MID => {
                wgs_blocks(units as usize, sms, &KernelTuning::from_env())
            }
            MMA_PERSIST.. => persistent_blocks(units as usize, sms, &KernelTuning::from_env()),
            _ => units,
        };
        self.time(|gpu, i| {
            let w = wbase + weight_offset(shape, region, i);
            if launch.prepared {
                // SAFETY: to_half_*(x, x_stride, t0, rows, norm, eps, K, wg_order, out): x holds
                // t rows of K f32, xa t × K bf16, norm K f32; rows null; every K is a multiple
                // of 64.
                unsafe {
                    gpu.launch(
                        prep,
                        to_half_grid(t, shape.k, sms),
                        128,
                        Args::new()
                            .arg(&x)
                            .arg(&x_stride)
                            .arg(&t0)
                            .arg(&null)
                            .arg(&norm)
                            .arg(&eps)
                            .arg(&k)
                            .arg(&wg_order)
                            .arg(&xa),
                    )
                }?;
            }
            let args = Args::new()
                .arg(&w)
                .arg(&null)
                .arg(&x)
                .arg(&x_stride)
                .arg(&xh)
                .arg(&null)
                .arg(&norm)
                .arg(&eps)
                .arg(&k)
                .arg(&r)
                .arg(&ti)
                .arg(&y)
                .arg(&r)
                .arg(&tiles)
                .arg(&null)
                .arg(&no_half);
            let args = if gemm {
                args.arg(&ws).arg(&done).arg(&split_plan)
            } else {
                args.arg(&null)
            };
            // The TMA form's maps of this launch's weights and inputs.
            let maps = GemmMaps::for_variant(launch.variant, w, shape.r, shape.k, xh, t)?;
            let args = GemmMaps::append(maps.as_ref(), args);
            // SAFETY: mma_*(w, bias, x, x_stride, xh, rows, norm, eps, K, R, T, y, y_stride,
            // token_tiles, yh, yh_wg: no 16-bit copy), then the one-tile forms' ssq (null: the
            // prologue reads the rows) or the GEMM's (ws, counters, split_plan),
            // the grid the launch's units (`MmaLaunch::units`; the warp-specialized GEMM: any
            // number of blocks walking those units): w covers R×K bf16 inside the weights region, x T
            // rows of K f32, xh null or T × K bf16, y T rows of R f32 (scratch), norm K f32;
            // bias and rows null; a split launch stays within GEMM_SPLIT_MAX_BLOCKS_PER_SM × SMs
            // blocks (gemm_plan), which ws and the zeroed counters cover; the warp-specialized
            // GEMM runs with the 384 threads it is built for, its TMA form with the maps of
            // this w and xh.
            unsafe { gpu.launch(kernel, (blocks, 1, 1), mma_threads(launch.variant), args) }
        })
    }

    fn read_bandwidth(&mut self, k: Kernel) -> Res<f64> {
        let n = (self.weights.bytes / 16) as u64;
        let (src, sink) = (self.weights.ptr, self.y.ptr);
        let ms = self.time(|gpu, _| {
            // SAFETY: read_bandwidth(const uint4*, size_t, unsigned*): n uint4 lie inside the
            // weights region; sink is a live f32 buffer.
            unsafe {
                gpu.launch(
                    k,
                    (1024 * 8, 1, 1),
                    512,
                    Args::new().arg(&src).arg(&n).arg(&sink),
                )
            }
        })?;
        Ok(self.weights.bytes as f64 / (ms / 1e3))
    }
}

fn main() {
    let cli = Cli::parse();
    if let Err(why) = nervad::backend::cuda::probe(cli.device) {
        println!("gpu_kernels: skipped: {why}");
        return;
    }
    if let Err(e) = run(&cli) {
        eprintln!("gpu_kernels: {e}");
        std::process::exit(1);
    }
}

fn run(cli: &Cli) -> Res<()> {
    let (mut gpu, facts) = Gpu::open(cli.device)?;
    let arch = (facts.capability.0 * 10 + facts.capability.1) as u32;
    let largest = SHAPES.iter().map(|s| s.k * s.r * 2).max().unwrap_or(0);
    let weights_bytes = largest.max(ROTATE_BYTES) + (64 << 20);
    let max_t = 2048;
    let max_k = 12288;
    let x_bytes = max_t * 2 * max_k * 4;
    let y_bytes = max_t * 151936 * 4;
    gpu.allocate_arena(
        weights_bytes + 2 * x_bytes + y_bytes + (WORKSPACE_BYTES << 1) + (128 << 20),
    )?;
    let weights = gpu.carve(weights_bytes)?;
    let x = gpu.carve(x_bytes)?;
    let xa = gpu.carve(x_bytes)?;
    let norm = gpu.carve(max_k * 4)?;
    let y = gpu.carve(y_bytes)?;
    let workspace = gpu.carve(WORKSPACE_BYTES)?;
    let split_blocks = GEMM_SPLIT_MAX_BLOCKS_PER_SM * facts.sms as usize;
    let gemm_ws = gpu.carve(split_blocks * 128 * MMA_GEMM_TOKENS * 4)?;
    let gemm_done = gpu.carve(split_blocks * 4)?;
    gpu.zero(gemm_done.ptr, gemm_done.bytes)?;
    fill(&mut gpu, weights, 1, false)?;
    fill(&mut gpu, x, 2, true)?;
    fill(&mut gpu, xa, 3, false)?;
    fill(&mut gpu, norm, 4, true)?;

    let compiled = kernels::build_all(arch)?;
    let find = |name: &str| compiled.iter().find(|c| c.name == name).expect("module");
    let bw_kernel = gpu.load(&find("bench.cu").cubin, &["read_bandwidth"])?[0];
    let modes = [
        ("rms", Mode::Rms),
        ("plain_add", Mode::PlainAdd),
        ("glu", Mode::Glu),
    ];
    // Per mode: 4 rows per block, and 2 where the kernel file has them.
    let mut families = Vec::new();
    let mut two_rows = Vec::new();
    for (mode, m) in modes {
        let names = |suffix: &str| -> Vec<String> {
            [1, 2, 4, 8]
                .iter()
                .map(|t| format!("gemv_{mode}_bf16_t{t}{suffix}"))
                .collect()
        };
        let load = |gpu: &mut Gpu, n: Vec<String>| {
            let refs: Vec<&str> = n.iter().map(String::as_str).collect();
            gpu.load(&find("gemv.cu").cubin, &refs)
        };
        families.push((m, load(&mut gpu, names(""))?));
        if m != Mode::Glu {
            two_rows.push((m, load(&mut gpu, names("_r2"))?));
        }
    }
    // Tensor-core projections: per mode its variants (MMA_VARIANTS) and its input preparation.
    let mut mma_families = Vec::new();
    for (mode, m) in modes {
        let names: Vec<String> = MMA_VARIANTS
            .iter()
            .map(|v| format!("mma_{mode}_bf16_{v}"))
            .collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut ks = gpu.load(&find("mma.cu").cubin, &refs)?;
        // The same kernels over tiled weights: the benchmark's weights are random bits either
        // way, so only the addresses (and the time) differ.
        let mut tiled = gpu.load(&find("mma_tiled.cu").cubin, &refs)?;
        let mut shared = vec![
            (MMA_GEMM, MMA_GEMM_SHARED),
            (MMA_GEMM_NARROW, mma_gemm_shared(MMA_GEMM_NARROW_TOKENS)),
        ];
        if arch == 90 {
            shared.push((MMA_WG, wg_gemm_shared(MMA_GEMM_TOKENS)));
            shared.push((MMA_WG + 1, wg_gemm_shared(MMA_GEMM_NARROW_TOKENS)));
            shared.push((MMA_WGS, wg_gemm_shared(MMA_GEMM_TOKENS)));
            shared.push((MMA_WGT, wg_gemm_shared(MMA_GEMM_TOKENS)));
            shared.push((MMA_WGT_WIDE, wg_gemm_shared(MMA_GEMM_WIDE_TOKENS)));
            shared.push((MMA_WGT_MID, wg_gemm_shared(MMA_GEMM_MID_TOKENS)));
        }
        for (v, bytes) in shared {
            ks[v] = gpu.with_dynamic_shared(ks[v], bytes)?;
            tiled[v] = gpu.with_dynamic_shared(tiled[v], bytes)?;
        }
        // The one-n-tile variants' ring forms, as the backend sets them up (each with its own
        // carveout: one for every kernel, `KernelTuning::carveout`, is about kernels sharing
        // SMs within a step, which kernels timed alone do not).
        for form in 0..3 {
            for k in [&mut ks[MMA_RING + form], &mut tiled[MMA_RING + form]] {
                *k = ring_form(&gpu, *k, form, arch, None)?;
            }
        }
        let prep = if m == Mode::PlainAdd {
            "to_half_plain_bf16"
        } else {
            "to_half_rms_bf16"
        };
        let prep = gpu.load(&find("prefill.cu").cubin, &[prep])?[0];
        mma_families.push((m, ks, tiled, prep));
    }
    let blas = if Blas::present() {
        Some(Blas::new(&gpu, workspace, DType::BF16)?)
    } else {
        println!("cuBLAS: libcublas not found, its rows are skipped");
        None
    };
    let start = gpu.event(true)?;
    let end = gpu.event(true)?;
    let mut b = Bench {
        gpu,
        weights,
        x,
        xa,
        norm,
        y,
        gemm_ws,
        gemm_done,
        sms: facts.sms as usize,
        start,
        end,
    };

    let picked = |s: &Shape| format!("{}/{}", s.model, s.name).contains(&cli.only);
    println!("device: {} (sm_{arch}, {} SMs)", facts.name, facts.sms);
    let bw = b.read_bandwidth(bw_kernel)?;
    println!(
        "read bandwidth: {:.3} TB/s ({} MiB, 16-byte streaming loads)",
        bw / 1e12,
        b.weights.bytes >> 20
    );
    println!();
    println!(
        "{:<11} {:<8} {:>6} {:>7} {:>3} | {:>9} {:>8} | {:>12} {:>8}",
        "model", "proj", "K", "R", "T", "GEMV (us)", "% of bw", "2 rows (us)", "% of bw"
    );
    for shape in SHAPES.iter().filter(|s| picked(s)) {
        let fam = families
            .iter()
            .find(|(m, _)| *m == shape.mode)
            .expect("family")
            .1
            .clone();
        let fam2 = two_rows
            .iter()
            .find(|(m, _)| *m == shape.mode)
            .map(|f| f.1.clone());
        let bytes = shape.k * shape.r * 2;
        let pct = |ms: f64| bytes as f64 / (ms / 1e3) / bw * 100.0;
        for &t in &parse_list(&cli.tokens) {
            let ms = b.gemv(&fam, 4, shape, t)?;
            let two = match &fam2 {
                Some(f) => {
                    let ms2 = b.gemv(f, 2, shape, t)?;
                    format!("{:>12.2} {:>7.1}%", ms2 * 1e3, pct(ms2))
                }
                None => format!("{:>12} {:>8}", "-", "-"),
            };
            println!(
                "{:<11} {:<8} {:>6} {:>7} {:>3} | {:>9.2} {:>7.1}% | {two}",
                shape.model,
                shape.name,
                shape.k,
                shape.r,
                t,
                ms * 1e3,
                pct(ms)
            );
        }
    }

    println!();
    println!(
        "{:<11} {:<8} {:>4} | {:>9} {:>8} {:>8} | {:>9} {:>8} | {:>15} {:>9} {:>8} | {:>9} {:>7}",
        "model",
        "proj",
        "T",
        "mma (us)",
        "% of bw",
        "TFLOP/s",
        "deep (us)",
        "% of bw",
        "default launch",
        "(us)",
        "% of bw",
        "GEMV (us)",
        "ratio"
    );
    // "mma": the baseline launch over row-major weights; "deep": the deep one-n-tile variant
    // wherever n1 runs; "default launch": what the backend launches (KernelTuning's default
    // variants, or those the NERVA_* settings pick, over tiled weights).
    let sms = facts.sms as usize;
    let baseline = KernelTuning::baseline();
    let defaults = KernelTuning::from_env();
    for shape in SHAPES.iter().filter(|s| picked(s)) {
        let (_, ks, tiled, prep) = mma_families
            .iter()
            .find(|(m, _, _, _)| *m == shape.mode)
            .expect("mma family")
            .clone();
        let fam = families
            .iter()
            .find(|(m, _)| *m == shape.mode)
            .expect("family")
            .1
            .clone();
        let bytes = shape.k * shape.r * 2;
        for &t in &parse_list(&cli.mma_tokens) {
            let plain = mma_launch(t, shape.r, shape.k, sms, &baseline);
            let ms = b.mma(&ks, prep, shape, t, plain)?;
            let deep = if plain.variant == 0 {
                let launch = MmaLaunch {
                    variant: MMA_DEEP,
                    ..plain
                };
                Some(b.mma(&ks, prep, shape, t, launch)?)
            } else {
                None
            };
            let launch = mma_launch(t, shape.r, shape.k, sms, &defaults);
            let tiles = shape.r.div_ceil(launch.rows as usize) * launch.token_tiles as usize;
            let launch = MmaLaunch {
                variant: one_tile_form(launch.variant, tiles, sms, &defaults),
                ..launch
            };
            let tuned_ms = Some((launch, b.mma(&tiled, prep, shape, t, launch)?));
            let gemv = if t <= 64 {
                Some(b.gemv(&fam, 4, shape, t)?)
            } else {
                None
            };
            let flops = 2.0 * (t * shape.k * shape.r) as f64;
            let pct = |ms: f64| bytes as f64 / (ms / 1e3) / bw * 100.0;
            let us = |v: Option<f64>| v.map_or("-".into(), |d| format!("{:.2}", d * 1e3));
            let share = |v: Option<f64>| v.map_or("-".into(), |d| format!("{:.1}%", pct(d)));
            let name = tuned_ms.map_or("-".into(), |(l, _)| {
                format!("{} x{}", MMA_VARIANTS[l.variant], l.token_tiles)
            });
            let tuned_ms = tuned_ms.map(|(_, ms)| ms);
            println!(
                "{:<11} {:<8} {:>4} | {:>9.2} {:>7.1}% {:>8.1} | {:>9} {:>8} | {:>15} {:>9} {:>8} | {:>9} {:>7}",
                shape.model,
                shape.name,
                t,
                ms * 1e3,
                pct(ms),
                flops / (ms / 1e3) / 1e12,
                us(deep),
                share(deep),
                name,
                us(tuned_ms),
                share(tuned_ms),
                us(gemv),
                gemv.map_or("-".into(), |g| format!("{:.2}x", g / ms)),
            );
        }
    }

    let Some(mut blas) = blas else { return Ok(()) };
    println!();
    println!(
        "{:<11} {:<8} {:>5} | {:>11} {:>8} | {:>11} {:>8} {:>3} | {:>11} {:>8} {:>3} | {:>11} {:>8} | {:>11} {:>8} | {:>11} {:>8} | {:>11} {:>8} | {:>11} {:>8} | {:>11} {:>8} | {:>11} {:>8} | {:>7} | pick",
        "model",
        "proj",
        "M",
        "GEMV (us)",
        "TFLOP/s",
        "GEMM (us)",
        "TFLOP/s",
        "spl",
        "GEMM64 (us)",
        "TFLOP/s",
        "spl",
        "WG (us)",
        "TFLOP/s",
        "WG64 (us)",
        "TFLOP/s",
        "WGS (us)",
        "TFLOP/s",
        "WGT (us)",
        "TFLOP/s",
        "WGT192 (us)",
        "TFLOP/s",
        "WGT144 (us)",
        "TFLOP/s",
        "cuBLAS (us)",
        "TFLOP/s",
        "ratio"
    );
    // The launch the backend picks, in this table's columns (KernelTuning from the environment,
    // wgmma only on sm_90 as the backend grants it).
    let tuned = KernelTuning {
        wgmma: defaults.wgmma && arch == 90,
        ..defaults
    };
    // (Not the streamed form of the 64-token tiles, which NERVA_WG_STREAM turns on.)
    let picked_column = |m: usize, shape: &Shape| {
        let l = mma_launch(m, shape.r, shape.k, sms, &tuned);
        let wg = tuned.wgmma && shape.k.is_multiple_of(64);
        let name = MMA_VARIANTS[gemm_form(l.variant, wg, &tuned)];
        let plan = if l.whole > 0 { "t" } else { "x" };
        format!("{name} {plan}{}", l.splits)
    };
    for shape in SHAPES.iter().filter(|s| s.name != "lm_head" && picked(s)) {
        let fam = families
            .iter()
            .find(|(m, _)| *m == shape.mode)
            .expect("family")
            .1
            .clone();
        for &m in &parse_list(&cli.gemm_tokens) {
            let flops = 2.0 * (m * shape.k * shape.r) as f64;
            // Our kernel walks tiles of 8 tokens: past 256 it is not a contender.
            let ours = if m <= 256 {
                Some(b.gemv(&fam, 4, shape, m)?)
            } else {
                None
            };
            // The fixed-order GEMM (mma.cuh, tiled weights) on 128- and 64-token tiles, its input
            // preparation included as the backend launches it.
            let (_, _, tiled, prep) = mma_families
                .iter()
                .find(|(md, _, _, _)| *md == shape.mode)
                .expect("mma family")
                .clone();
            // Chain splits as the backend picks them (`gemm_plan`, with NERVA_MMA_GEMM_TAIL as
            // the backend reads it).
            let tail = tuned.gemm_tail;
            let mut gemm_tiles = |variant, tile: usize, split| -> Res<Option<(f64, (u32, u32))>> {
                if m <= 8 {
                    return Ok(None);
                }
                let token_tiles = m.div_ceil(tile);
                // (Priced by the fit the backend would price it by, as mma_launch does.)
                let fit = prompt_fit(m, shape.k, &tuned);
                let (splits, whole) =
                    gemm_plan(m, (shape.r, shape.k), sms, (tile, fit), split, tail);
                let launch = MmaLaunch {
                    variant,
                    rows: 128,
                    token_tiles: token_tiles as u32,
                    prepared: true,
                    splits,
                    whole,
                };
                Ok(Some((
                    b.mma(&tiled, prep, shape, m, launch)?,
                    (splits, whole),
                )))
            };
            let gemm = gemm_tiles(MMA_GEMM, MMA_GEMM_TOKENS, GemmSplit::Auto)?;
            let gemm64 = gemm_tiles(MMA_GEMM_NARROW, MMA_GEMM_NARROW_TOKENS, GemmSplit::Auto)?;
            // The same launches on wgmma (Hopper only), with the same splits.
            let (wg, wg64, wgs, wgt, wgt192, wgt144) = if arch == 90 {
                (
                    gemm_tiles(MMA_WG, MMA_GEMM_TOKENS, GemmSplit::Auto)?,
                    gemm_tiles(MMA_WG + 1, MMA_GEMM_NARROW_TOKENS, GemmSplit::Auto)?,
                    gemm_tiles(MMA_WGS, MMA_GEMM_TOKENS, GemmSplit::Auto)?,
                    gemm_tiles(MMA_WGT, MMA_GEMM_TOKENS, GemmSplit::Auto)?,
                    gemm_tiles(MMA_WGT_WIDE, MMA_GEMM_WIDE_TOKENS, GemmSplit::Auto)?,
                    gemm_tiles(MMA_WGT_MID, MMA_GEMM_MID_TOKENS, GemmSplit::Auto)?,
                )
            } else {
                (None, None, None, None, None, None)
            };
            let (xa, yp, wbase, region) = (b.xa.ptr, b.y.ptr, b.weights.ptr, b.weights.bytes);
            let cublas = b.time(|_, i| {
                let w = wbase + weight_offset(shape, region, i);
                // SAFETY: xa holds m×K bf16, w R×K bf16, y m×R f32 (scratch).
                unsafe { blas.gemm(xa, w, m, shape.r, shape.k, yp, shape.r, false) }
            })?;
            let tf = |ms: f64| flops / (ms / 1e3) / 1e12;
            let (o_us, o_tf) = ours.map_or(("-".to_string(), "-".to_string()), |o| {
                (format!("{:.2}", o * 1e3), format!("{:.1}", tf(o)))
            });
            let cells = |v: Option<f64>| {
                v.map_or(("-".to_string(), "-".to_string()), |o| {
                    (format!("{:.2}", o * 1e3), format!("{:.1}", tf(o)))
                })
            };
            let (g_us, g_tf) = cells(gemm.map(|g| g.0));
            let (n_us, n_tf) = cells(gemm64.map(|g| g.0));
            let (w_us, w_tf) = cells(wg.map(|g| g.0));
            let (w64_us, w64_tf) = cells(wg64.map(|g| g.0));
            let (ws_us, ws_tf) = cells(wgs.map(|g| g.0));
            let (wt_us, wt_tf) = cells(wgt.map(|g| g.0));
            let (ww_us, ww_tf) = cells(wgt192.map(|g| g.0));
            let (wm_us, wm_tf) = cells(wgt144.map(|g| g.0));
            // The plan of the 128-token tiles (GEMM, WG, WGS, WGT) and the 64-token ones: "x4",
            // or "t4" where only the last partial wave's tiles split.
            let splits = |g: Option<(f64, (u32, u32))>| {
                g.map_or("-".to_string(), |(_, (s, whole))| {
                    format!("{}{s}", if whole > 0 { "t" } else { "x" })
                })
            };
            // Ours (the faster GEMM where it runs, else the GEMV) against cuBLAS.
            let best = [gemm, gemm64, wg, wg64, wgs, wgt, wgt192, wgt144]
                .iter()
                .flatten()
                .map(|g| g.0)
                .min_by(f64::total_cmp)
                .or(ours);
            let ratio = best.map_or("-".to_string(), |o| format!("{:.2}x", o / cublas));
            println!(
                "{:<11} {:<8} {:>5} | {:>11} {:>8} | {:>11} {:>8} {:>3} | {:>11} {:>8} {:>3} | {:>11} {:>8} | {:>11} {:>8} | {:>11} {:>8} | {:>11} {:>8} | {:>11} {:>8} | {:>11} {:>8} | {:>11.2} {:>8.1} | {:>7} | {}",
                shape.model,
                shape.name,
                m,
                o_us,
                o_tf,
                g_us,
                g_tf,
                splits(gemm),
                n_us,
                n_tf,
                splits(gemm64),
                w_us,
                w_tf,
                w64_us,
                w64_tf,
                ws_us,
                ws_tf,
                wt_us,
                wt_tf,
                ww_us,
                ww_tf,
                wm_us,
                wm_tf,
                cublas * 1e3,
                tf(cublas),
                ratio,
                picked_column(m, shape)
            );
        }
    }
    // The bf16 GEMM peak: 8192 × 8192 × 8192 through the same cuBLAS call.
    let n = 8192usize;
    if n * n * 2 <= b.weights.bytes && n * n * 2 <= b.xa.bytes && n * n * 4 <= b.y.bytes {
        let (w, xa, yp) = (b.weights.ptr, b.xa.ptr, b.y.ptr);
        let ms = b.time(|_, _| {
            // SAFETY: 8192² bf16 fit in weights and xa, 8192² f32 in y.
            unsafe { blas.gemm(xa, w, n, n, n, yp, n, false) }
        })?;
        println!();
        println!(
            "bf16 GEMM peak (cuBLAS {n}^3, f32 out): {:.3} ms -> {:.0} TFLOP/s",
            ms,
            2.0 * (n as f64).powi(3) / (ms / 1e3) / 1e12
        );
    }
    Ok(())
}

/// Offset of launch `i`'s copy of `shape`'s weights: copies rotate over ≥ ROTATE_BYTES where
/// the region of `region` bytes holds that many.
fn weight_offset(shape: &Shape, region: usize, i: usize) -> u64 {
    let bytes = shape.k * shape.r * 2;
    let copies = ROTATE_BYTES.div_ceil(bytes).min(region / bytes).max(1);
    ((i % copies) * bytes) as u64
}
