//! Every kernel in `kernels/` compiles with NVRTC to a cubin for sm_80 and sm_90, with no GPU:
//! NVRTC and the CUDA headers come from the `nvidia-cuda-nvrtc` / `nvidia-cuda-runtime` wheels
//! (`.ci/run` installs them and points `NERVA_NVRTC_LIB` / `NERVA_CUDA_INCLUDE` at them).
//! Prints registers and spill bytes per kernel (ptxas -v). Skips with a reason when NVRTC or
//! the headers are not installed. With `NERVA_CUBIN_DIR` set, the cubins are written there;
//! `NERVA_KERNEL_MODULES=attention.cu,...` compiles only those modules (a quick check while
//! editing one).

use nervad::backend::cuda::kernels::{
    MODULES, build_in, compile, cuda_include_dir, nvrtc_available, resource_report,
};

#[test]
fn every_kernel_compiles_for_sm80_and_sm90() {
    if let Err(why) = nvrtc_available() {
        // CI points NERVA_NVRTC_LIB at the wheel: there a missing NVRTC is a failure.
        assert!(
            std::env::var_os("NERVA_NVRTC_LIB").is_none(),
            "NERVA_NVRTC_LIB is set but NVRTC does not load: {why}"
        );
        println!("skipped: {why}");
        return;
    }
    if cuda_include_dir().is_none() {
        println!("skipped: CUDA headers not found (set NERVA_CUDA_INCLUDE)");
        return;
    }
    let only = std::env::var("NERVA_KERNEL_MODULES").ok();
    let chosen = |name: &str| {
        only.as_deref()
            .is_none_or(|o| o.split(',').any(|m| m == name))
    };
    let sources: Vec<_> = MODULES.iter().filter(|m| chosen(m.name)).collect();
    let names: Vec<&str> = sources.iter().map(|m| m.name).collect();
    let mut kernels = 0;
    for arch in [80, 90] {
        // As the daemon builds them (one thread per module), with no cache: every module is
        // compiled and reports its resources.
        let built =
            build_in(arch, &names, None).unwrap_or_else(|e| panic!("kernels for sm_{arch}: {e}"));
        for (source, compiled) in sources.iter().zip(&built) {
            assert_eq!(source.name, compiled.name);
            assert!(!compiled.cached);
            assert!(compiled.cubin.len() > 64, "{}: empty cubin", source.name);
            // NERVA_CUBIN_DIR: keep the cubins, to read their SASS (nvdisasm, cuobjdump -sass).
            if let Some(dir) = std::env::var_os("NERVA_CUBIN_DIR") {
                let stem = source.name.trim_end_matches(".cu");
                let path = std::path::Path::new(&dir).join(format!("{stem}_sm{arch}.cubin"));
                std::fs::write(&path, &compiled.cubin)
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            }
            // ptxas falls back to waiting for every wgmma where it cannot prove its registers
            // safe ("wgmma.mma_async instructions are serialized"): correct, but the GEMM's
            // pipeline is gone. That is a failure, not a warning to scroll past. Except in
            // attn_prefill_wg, which waits for each batch of its wgmma at once anyway (the
            // softmax needs the scores, the fold the values), so serialized steps cost it only
            // the overlap inside a batch: measured with it (BENCHMARKS.md).
            let notable = |l: &&str| l.contains("warning") || l.contains("Performance Loss");
            for line in compiled.log.lines().filter(notable) {
                println!("sm_{arch} {:<14} {line}", source.name);
                let waits_anyway = line.contains("'attn_prefill_wg_");
                assert!(
                    !line.contains("serialized") || waits_anyway,
                    "{}: {line}",
                    source.name
                );
            }
            for (name, regs, spill) in resource_report(&compiled.log) {
                println!(
                    "sm_{arch} {:<14} {name:<28} {regs:>4} registers {spill:>4} B spilled",
                    source.name
                );
                // A block of the size the backend launches must fit the 64 K registers of a
                // multiprocessor, or the launch fails on the device
                // (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES).
                let threads = launch_threads(&name);
                assert!(
                    regs * threads <= 65536,
                    "{name}: {regs} registers × {threads} threads exceed 65536"
                );
                kernels += 1;
            }
        }
    }
    assert!(
        kernels > 40 || only.is_some(),
        "ptxas reported {kernels} kernels"
    );
}

/// The largest block the CUDA backend launches each kernel with (nervad/src/backend/cuda).
fn launch_threads(kernel: &str) -> u32 {
    if kernel == "sample_rows" {
        1024
    } else if kernel == "read_bandwidth" {
        512
    } else if kernel.ends_with("_wgs") || kernel.contains("_wgt") {
        384
    } else {
        256
    }
}

#[test]
fn a_compile_error_shows_the_log_and_the_options() {
    if nvrtc_available().is_err() {
        println!("skipped: NVRTC not installed");
        return;
    }
    let Some(include) = cuda_include_dir() else {
        println!("skipped: CUDA headers not found");
        return;
    };
    let bad = nervad::backend::cuda::kernels::Source {
        name: "broken.cu",
        text: "extern \"C\" __global__ void k() { this_is_not_defined(); }\n",
    };
    let err = compile(&bad, 90, &include).unwrap_err().to_string();
    assert!(err.contains("this_is_not_defined"), "log missing: {err}");
    assert!(
        err.contains("--gpu-architecture=sm_90"),
        "options missing: {err}"
    );
}

/// `nervad compile-kernels` fills a cache that a later build reads: the first run compiles, the
/// second finds every entry verified, and the daemon's own lookup (`build_in` on that
/// directory) loads the same cubin. One small module, so the check stays quick.
#[test]
fn compile_kernels_fills_the_cache_the_daemon_reads() {
    use nervad::backend::cuda::prebuild::{CompileKernelsArgs, compile_modules};
    if let Err(why) = nvrtc_available() {
        println!("skipped: {why}");
        return;
    }
    if cuda_include_dir().is_none() {
        println!("skipped: CUDA headers not found (set NERVA_CUDA_INCLUDE)");
        return;
    }
    let dir = std::env::temp_dir().join(format!("nerva-prebuild-{}", std::process::id()));
    let args = CompileKernelsArgs {
        arch: vec![90],
        cache_dir: Some(dir.clone()),
    };
    let first = compile_modules(&args, &["bench.cu"]).expect("compile");
    assert_eq!(
        (first[0].arch, first[0].compiled, first[0].cached),
        (90, 1, 0)
    );
    let again = compile_modules(&args, &["bench.cu"]).expect("verify");
    assert_eq!((again[0].compiled, again[0].cached), (0, 1));
    let fresh = build_in(90, &["bench.cu"], None).expect("compile without a cache");
    let daemon = build_in(90, &["bench.cu"], Some(&dir)).expect("load");
    assert!(daemon[0].cached, "the daemon's lookup finds the entry");
    assert_eq!(
        daemon[0].cubin, fresh[0].cubin,
        "the cached cubin is the compiled one"
    );
    std::fs::remove_dir_all(&dir).ok();
}
