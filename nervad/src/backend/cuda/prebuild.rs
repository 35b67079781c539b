//! `nervad compile-kernels`: fill the kernel cache for chosen GPU architectures without a GPU.
//!
//! A daemon's first start on a machine compiles every module with NVRTC (about two minutes of
//! its start-up on a 16-core host). A container image or a fleet's provisioning step can do that
//! once, ahead of time, on any host with NVRTC and the CUDA headers: the entries are the very
//! files the daemon looks up (same expanded source, options, architecture and NVRTC version), so
//! a daemon started on the same NVRTC version and header path loads them instead of compiling.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;

use super::kernels::{MODULES, build_in, cache_dir, nvrtc_version, resource_report};
use crate::backend::BackendError;

/// `nervad compile-kernels` flags.
#[derive(Debug, Clone, Args)]
pub struct CompileKernelsArgs {
    /// Compute capability to compile for, as major×10 + minor (80 for A100, 86, 89, 90 for
    /// H100/H200); repeat or separate with commas for several.
    #[arg(long, required = true, value_delimiter = ',', value_parser = parse_arch)]
    pub arch: Vec<u32>,
    /// Cache directory to fill [default: the daemon's, $XDG_CACHE_HOME/nerva/kernels, else
    /// ~/.cache/nerva/kernels].
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
}

/// What `compile-kernels` did for one architecture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchReport {
    /// Compute capability (e.g. 90).
    pub arch: u32,
    /// Modules compiled now.
    pub compiled: usize,
    /// Modules whose cache entry already verified.
    pub cached: usize,
    /// Kernels compiled now that spill registers: (module, kernel, bytes spilled).
    pub spills: Vec<(&'static str, String, u32)>,
}

fn parse_arch(s: &str) -> Result<u32, String> {
    let arch: u32 = s
        .trim()
        .trim_start_matches("sm_")
        .parse()
        .map_err(|_| format!("{s:?} is not a compute capability such as 80 or 90"))?;
    if !(80..=199).contains(&arch) {
        return Err(format!(
            "sm_{arch}: nervad needs compute capability 8.0 or newer (80, 86, 89, 90, ...)"
        ));
    }
    Ok(arch)
}

/// The directory to fill: `--cache-dir`, else the daemon's.
fn target_dir(args: &CompileKernelsArgs) -> Result<PathBuf, BackendError> {
    args.cache_dir.clone().or_else(cache_dir).ok_or_else(|| {
        BackendError::Device(
            "no cache directory: pass --cache-dir, or set XDG_CACHE_HOME or HOME".into(),
        )
    })
}

/// Compile (or verify) every module for each of `args.arch` into the cache directory.
pub fn compile_kernels(args: &CompileKernelsArgs) -> Result<Vec<ArchReport>, BackendError> {
    let names: Vec<&str> = MODULES.iter().map(|m| m.name).collect();
    compile_modules(args, &names)
}

/// `compile_kernels` for the modules named (file names under `kernels/`) only.
pub fn compile_modules(
    args: &CompileKernelsArgs,
    names: &[&str],
) -> Result<Vec<ArchReport>, BackendError> {
    let dir = target_dir(args)?;
    args.arch
        .iter()
        .map(|&arch| {
            let modules = build_in(arch, names, Some(&dir))?;
            let compiled = modules.iter().filter(|m| !m.cached).count();
            let spills = modules
                .iter()
                .flat_map(|m| {
                    resource_report(&m.log)
                        .into_iter()
                        .filter(|(_, _, spill)| *spill > 0)
                        .map(move |(kernel, _, spill)| (m.name, kernel, spill))
                })
                .collect();
            Ok(ArchReport {
                arch,
                compiled,
                cached: modules.len() - compiled,
                spills,
            })
        })
        .collect()
}

/// The subcommand: compile, then one line per architecture on stdout.
pub fn run_compile_kernels(args: CompileKernelsArgs) -> Result<(), BackendError> {
    let (major, minor) = nvrtc_version()?;
    let start = Instant::now();
    for r in compile_kernels(&args)? {
        println!(
            "sm_{}: {} modules compiled, {} already cached (NVRTC {major}.{minor})",
            r.arch, r.compiled, r.cached
        );
        for (module, kernel, spill) in &r.spills {
            println!("  {module} {kernel}: {spill} bytes spilled");
        }
    }
    let dir = target_dir(&args)?;
    println!(
        "cache {} filled in {:.1} s",
        dir.display(),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn architectures_parse_and_old_ones_are_refused() {
        assert_eq!(parse_arch("90"), Ok(90));
        assert_eq!(parse_arch("sm_86"), Ok(86));
        let old = parse_arch("75").unwrap_err();
        assert!(old.contains("8.0 or newer"), "{old}");
        assert!(
            parse_arch("hopper")
                .unwrap_err()
                .contains("not a compute capability")
        );
    }
}
