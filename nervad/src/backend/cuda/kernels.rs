//! The CUDA C sources of `kernels/`, embedded in the daemon, compiled with NVRTC for the device's
//! architecture at start and cached on disk.
//!
//! Each `.cu` is one module; its `#include "x.cuh"` lines are expanded here from the embedded
//! headers, so NVRTC needs only the toolkit headers (`cuda_bf16.h`). Cache entries live in
//! `$XDG_CACHE_HOME/nerva/kernels/` (else `~/.cache/nerva/kernels/`), named by a hash of the
//! expanded source, the options, the architecture and the NVRTC version; each file carries a
//! checksum of its cubin, and an entry that fails it (truncated, corrupted) is rebuilt.

use std::ffi::{CStr, CString, c_char, c_int};
use std::path::{Path, PathBuf};

use cudarc::nvrtc::sys as nvrtc;

use crate::backend::BackendError;

/// One module: file name and source.
#[derive(Debug, Clone, Copy)]
pub struct Source {
    /// File name under `kernels/`.
    pub name: &'static str,
    /// Its text.
    pub text: &'static str,
}

macro_rules! kernel_file {
    ($name:literal) => {
        Source {
            name: $name,
            text: include_str!(concat!("../../../../kernels/", $name)),
        }
    };
}

/// Shared headers.
pub const HEADERS: [Source; 10] = [
    kernel_file!("common.cuh"),
    kernel_file!("tensor_core.cuh"),
    kernel_file!("attn_mma.cuh"),
    kernel_file!("kv.cuh"),
    kernel_file!("norm.cuh"),
    kernel_file!("rope.cuh"),
    kernel_file!("activation.cuh"),
    kernel_file!("wgmma.cuh"),
    kernel_file!("mbarrier.cuh"),
    kernel_file!("mma.cuh"),
];

/// The modules, one per op family.
pub const MODULES: [Source; 9] = [
    kernel_file!("gemv.cu"),
    kernel_file!("embedding.cu"),
    kernel_file!("rope_kv.cu"),
    kernel_file!("attention.cu"),
    kernel_file!("sampling.cu"),
    kernel_file!("bench.cu"),
    kernel_file!("prefill.cu"),
    kernel_file!("mma.cu"),
    kernel_file!("mma_tiled.cu"),
];

/// A compiled module.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// Module file name.
    pub name: &'static str,
    /// The cubin.
    pub cubin: Vec<u8>,
    /// NVRTC's log (ptxas `-v` lines: registers and spills per kernel).
    pub log: String,
    /// Loaded from the disk cache rather than compiled.
    pub cached: bool,
}

/// `#include "x.cuh"` expanded from the embedded headers (each once), `#pragma once` dropped.
pub fn expand(source: &Source) -> Result<String, BackendError> {
    fn walk(
        text: &str,
        seen: &mut Vec<&'static str>,
        out: &mut String,
    ) -> Result<(), BackendError> {
        for line in text.lines() {
            let trimmed = line.trim();
            if trimmed == "#pragma once" {
                continue;
            }
            if let Some(rest) = trimmed.strip_prefix("#include \"") {
                let name = rest.trim_end_matches('"');
                let header = HEADERS.iter().find(|h| h.name == name).ok_or_else(|| {
                    BackendError::Device(format!("kernel source includes unknown header {name}"))
                })?;
                if !seen.contains(&header.name) {
                    seen.push(header.name);
                    walk(header.text, seen, out)?;
                }
                continue;
            }
            out.push_str(line);
            out.push('\n');
        }
        Ok(())
    }
    let mut out = String::with_capacity(source.text.len() * 2);
    walk(source.text, &mut Vec::new(), &mut out)?;
    Ok(out)
}

/// FNV-1a, 64 bit: a stable file-name key (not a security boundary: entries are checksummed and
/// rebuilt when they do not verify).
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in *part {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Where the toolkit headers (`cuda_bf16.h`) are: `$NERVA_CUDA_INCLUDE`, `$CUDA_HOME/include`,
/// `$CUDA_PATH/include`, `/usr/local/cuda/include`.
pub fn cuda_include_dir() -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(p) = std::env::var_os("NERVA_CUDA_INCLUDE") {
        candidates.push(PathBuf::from(p));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(p) = std::env::var_os(var) {
            candidates.push(PathBuf::from(p).join("include"));
        }
    }
    candidates.push(PathBuf::from("/usr/local/cuda/include"));
    candidates
        .into_iter()
        .find(|dir| dir.join("cuda_bf16.h").is_file())
}

/// Load NVRTC: `$NERVA_NVRTC_LIB` (an absolute path, loaded first so the by-name lookup finds it
/// already resident), else the usual library names on the loader path.
pub fn nvrtc_available() -> Result<(), BackendError> {
    if let Some(path) = std::env::var_os("NERVA_NVRTC_LIB") {
        let c = CString::new(path.to_string_lossy().as_bytes())
            .map_err(|_| BackendError::Device("NERVA_NVRTC_LIB contains a NUL byte".into()))?;
        // SAFETY: dlopen of a shared library by path; the handle is kept for the process
        // lifetime (never closed) so symbols resolved from it stay valid.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        if handle.is_null() {
            return Err(BackendError::Device(format!(
                "NERVA_NVRTC_LIB={} cannot be loaded",
                path.to_string_lossy()
            )));
        }
        preload_builtins(Path::new(&path));
    }
    // SAFETY: only tries to dlopen NVRTC by its usual names.
    if unsafe { nvrtc::is_culib_present() } {
        Ok(())
    } else {
        Err(BackendError::Device(
            "NVRTC (libnvrtc.so.13 or .12) not found: install the CUDA toolkit's NVRTC or the \
             nvidia-cuda-nvrtc wheel and point NERVA_NVRTC_LIB at libnvrtc.so"
                .into(),
        ))
    }
}

/// NVRTC opens its builtins library (`libnvrtc-builtins.so.13.0`) by name when it first
/// compiles, and some wheels' NVRTC finds it only on the loader path: a library that
/// `NERVA_NVRTC_LIB` names outside that path then fails every compile. Loading the builtins
/// that lie beside it first makes that by-name open find them resident. (Best effort: where
/// none are found, NVRTC looks them up as before and reports what it could not open.)
fn preload_builtins(nvrtc_lib: &Path) {
    let Some(dir) = nvrtc_lib.parent() else {
        return;
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        // The `.alt` builtins are another variant with the same soname; one is enough.
        if !name.starts_with("libnvrtc-builtins.so.") {
            continue;
        }
        let Ok(c) = CString::new(entry.path().to_string_lossy().as_bytes()) else {
            continue;
        };
        // SAFETY: dlopen of a shared library by path, kept open for the process lifetime.
        unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    }
}

/// NVRTC's version.
pub fn nvrtc_version() -> Result<(i32, i32), BackendError> {
    nvrtc_available()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: nvrtcVersion writes two ints through valid pointers.
    let r = unsafe { nvrtc::nvrtcVersion(&mut major, &mut minor) };
    check(r, "nvrtcVersion")?;
    Ok((major, minor))
}

fn check(r: nvrtc::nvrtcResult, what: &str) -> Result<(), BackendError> {
    if r == nvrtc::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(BackendError::Device(format!("{what} failed: {r:?}")))
    }
}

/// The options every module is compiled with for `arch` (e.g. 90 for sm_90).
pub fn options(arch: u32, include: &Path) -> Vec<String> {
    vec![
        // Hopper gets its arch-specific target (sm_90a): the wgmma GEMM needs it, and the
        // cubin runs on compute capability 9.0 only, which is what `arch` 90 names.
        if arch == 90 {
            "--gpu-architecture=sm_90a".to_string()
        } else {
            format!("--gpu-architecture=sm_{arch}")
        },
        format!("-I{}", include.display()),
        "--std=c++17".into(),
        "-Xptxas=-v".into(),
        "-lineinfo".into(),
        "-default-device".into(),
    ]
    .into_iter()
    .chain(experiment_defines())
    .collect()
}

/// `NERVA_KERNEL_DEFINES="A=1 B"`: extra `-D` options for kernel experiments on the GPU machine
/// (one binary, several settings of a kernel's compile-time knobs). They enter the cache key
/// with the other options. Unset on every default path.
fn experiment_defines() -> Vec<String> {
    std::env::var("NERVA_KERNEL_DEFINES")
        .map(|v| v.split_whitespace().map(|d| format!("-D{d}")).collect())
        .unwrap_or_default()
}

/// Compile `source` to a cubin for `arch` with NVRTC. A compile error carries the log and the
/// options.
pub fn compile(source: &Source, arch: u32, include: &Path) -> Result<Compiled, BackendError> {
    nvrtc_available()?;
    let text = expand(source)?;
    let opts = options(arch, include);
    let src =
        CString::new(text).map_err(|_| BackendError::Device("NUL in kernel source".into()))?;
    let name = CString::new(source.name).expect("file names have no NUL");
    let mut prog: nvrtc::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: src and name are NUL-terminated and outlive the call; no headers are passed.
    let r = unsafe {
        nvrtc::nvrtcCreateProgram(
            &mut prog,
            src.as_ptr(),
            name.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    check(r, "nvrtcCreateProgram")?;
    let c_opts: Vec<CString> = opts
        .iter()
        .map(|o| CString::new(o.as_str()).expect("options have no NUL"))
        .collect();
    let ptrs: Vec<*const c_char> = c_opts.iter().map(|o| o.as_ptr()).collect();
    // SAFETY: prog was created above; ptrs point to NUL-terminated options alive for the call.
    let compiled = unsafe { nvrtc::nvrtcCompileProgram(prog, ptrs.len() as c_int, ptrs.as_ptr()) };
    let log = program_log(prog);
    let cubin = || -> Result<Vec<u8>, BackendError> {
        let mut size = 0usize;
        // SAFETY: prog compiled successfully; size is written through a valid pointer.
        let r = unsafe { nvrtc::nvrtcGetCUBINSize(prog, &mut size) };
        check(r, "nvrtcGetCUBINSize")?;
        let mut cubin = vec![0u8; size];
        // SAFETY: cubin has exactly `size` writable bytes.
        let r = unsafe { nvrtc::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast()) };
        check(r, "nvrtcGetCUBIN")?;
        Ok(cubin)
    };
    // The program is destroyed below on every path, the error paths included.
    let result = if compiled != nvrtc::nvrtcResult::NVRTC_SUCCESS {
        Err(BackendError::Device(format!(
            "NVRTC could not compile kernels/{} ({compiled:?}) with options {opts:?}:\n{log}",
            source.name
        )))
    } else {
        cubin().map(|cubin| Compiled {
            name: source.name,
            cubin,
            log,
            cached: false,
        })
    };
    // SAFETY: prog is destroyed once.
    unsafe { nvrtc::nvrtcDestroyProgram(&mut prog) };
    result
}

fn program_log(prog: nvrtc::nvrtcProgram) -> String {
    let mut size = 0usize;
    // SAFETY: prog is valid; size is written through a valid pointer.
    if unsafe { nvrtc::nvrtcGetProgramLogSize(prog, &mut size) }
        != nvrtc::nvrtcResult::NVRTC_SUCCESS
        || size == 0
    {
        return String::new();
    }
    let mut buf = vec![0u8; size];
    // SAFETY: buf has `size` writable bytes (the log includes its NUL).
    if unsafe { nvrtc::nvrtcGetProgramLog(prog, buf.as_mut_ptr().cast()) }
        != nvrtc::nvrtcResult::NVRTC_SUCCESS
    {
        return String::new();
    }
    CStr::from_bytes_until_nul(&buf)
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// `$XDG_CACHE_HOME/nerva/kernels`, else `~/.cache/nerva/kernels`.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|x| !x.is_empty()) {
        return Some(PathBuf::from(x).join("nerva/kernels"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/nerva/kernels"))
}

const CACHE_MAGIC: &[u8; 8] = b"NERVCUB1";

/// The cache file of `source` for `arch`, options and NVRTC version.
fn cache_path(
    dir: &Path,
    source: &Source,
    arch: u32,
    include: &Path,
) -> Result<PathBuf, BackendError> {
    let (major, minor) = nvrtc_version()?;
    let text = expand(source)?;
    let opts = options(arch, include).join(" ");
    let key = fnv1a(&[text.as_bytes(), opts.as_bytes()]);
    let stem = source.name.trim_end_matches(".cu");
    Ok(dir.join(format!(
        "{stem}-{key:016x}-sm{arch}-nvrtc{major}.{minor}.cubin"
    )))
}

fn read_cached(path: &Path) -> Option<Vec<u8>> {
    let bytes = std::fs::read(path).ok()?;
    if bytes.len() < 24 || &bytes[..8] != CACHE_MAGIC {
        return None;
    }
    let len = u64::from_le_bytes(bytes[8..16].try_into().ok()?) as usize;
    let sum = u64::from_le_bytes(bytes[16..24].try_into().ok()?);
    let body = &bytes[24..];
    (body.len() == len && fnv1a(&[body]) == sum).then(|| body.to_vec())
}

fn write_cached(path: &Path, cubin: &[u8]) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mut bytes = Vec::with_capacity(cubin.len() + 24);
    bytes.extend_from_slice(CACHE_MAGIC);
    bytes.extend_from_slice(&(cubin.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&fnv1a(&[cubin]).to_le_bytes());
    bytes.extend_from_slice(cubin);
    // Write then rename: a reader never sees a half-written entry.
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, &bytes)?;
    std::fs::rename(&tmp, path)
}

/// Every module for `arch`: from the cache where an entry verifies, else compiled (and cached).
pub fn build_all(arch: u32) -> Result<Vec<Compiled>, BackendError> {
    let names: Vec<&str> = MODULES.iter().map(|m| m.name).collect();
    build(arch, &names)
}

/// The modules named (file names under `kernels/`), in that order, for `arch`: from the cache
/// where an entry verifies, else compiled (and cached). Each module compiles on a thread of its
/// own (NVRTC programs are independent), so a cold start waits for the slowest module rather
/// than for all of them in turn.
pub fn build(arch: u32, names: &[&str]) -> Result<Vec<Compiled>, BackendError> {
    build_in(arch, names, cache_dir().as_deref())
}

/// `build` with the cache in `dir` (None: compile every module, cache nothing).
pub fn build_in(
    arch: u32,
    names: &[&str],
    dir: Option<&Path>,
) -> Result<Vec<Compiled>, BackendError> {
    let include = cuda_include_dir().ok_or_else(|| {
        BackendError::Device(
            "CUDA headers (cuda_bf16.h) not found: set NERVA_CUDA_INCLUDE, CUDA_HOME or install \
             the toolkit headers under /usr/local/cuda/include"
                .into(),
        )
    })?;
    let include = &include;
    std::thread::scope(|scope| {
        let builds: Vec<_> = names
            .iter()
            .map(|name| scope.spawn(move || build_one(name, arch, include, dir)))
            .collect();
        builds
            .into_iter()
            .map(|b| {
                b.join().unwrap_or_else(|_| {
                    Err(BackendError::Device(
                        "a kernel compile thread panicked".into(),
                    ))
                })
            })
            .collect()
    })
}

/// One module: from the cache in `dir` where its entry verifies, else compiled (and cached).
fn build_one(
    name: &str,
    arch: u32,
    include: &Path,
    dir: Option<&Path>,
) -> Result<Compiled, BackendError> {
    let source = MODULES
        .iter()
        .find(|m| m.name == name)
        .ok_or_else(|| BackendError::Device(format!("no kernel module {name}")))?;
    let path = match dir {
        Some(d) => Some(cache_path(d, source, arch, include)?),
        None => None,
    };
    if let Some(cubin) = path.as_deref().and_then(read_cached) {
        return Ok(Compiled {
            name: source.name,
            cubin,
            log: String::new(),
            cached: true,
        });
    }
    let compiled = compile(source, arch, include)?;
    if let Some(path) = &path
        && let Err(e) = write_cached(path, &compiled.cubin)
    {
        tracing::warn!(path = %path.display(), error = %e, "cannot cache compiled kernels");
    }
    Ok(compiled)
}

/// Per-kernel (name, registers, spill store bytes) parsed from a ptxas `-v` log.
pub fn resource_report(log: &str) -> Vec<(String, u32, u32)> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for line in log.lines() {
        if let Some(i) = line.find("Compiling entry function '") {
            let rest = &line[i + "Compiling entry function '".len()..];
            current = rest.split('\'').next().map(str::to_string);
        } else if let Some(i) = line.find("bytes spill stores") {
            // "... N bytes stack frame, S bytes spill stores, L bytes spill loads"
            let head = &line[..i];
            let spill = head
                .rsplit(|c: char| !c.is_ascii_digit())
                .find(|s| !s.is_empty())
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            if let Some(name) = &current {
                out.push((name.clone(), 0, spill));
            }
        } else if let Some(i) = line.find("Used ") {
            let regs = line[i + 5..]
                .split_whitespace()
                .next()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            if let Some(last) = out.last_mut()
                && Some(&last.0) == current.as_ref()
            {
                last.1 = regs;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn includes_expand_once_and_unknown_headers_fail() {
        let text = expand(&MODULES[0]).unwrap();
        assert!(
            !text.contains("#include \""),
            "every local include is expanded"
        );
        assert_eq!(text.matches("struct StepMeta").count(), 1);
        let bad = Source {
            name: "bad.cu",
            text: "#include \"missing.cuh\"\n",
        };
        assert!(expand(&bad).is_err());
    }

    #[test]
    fn corrupt_cache_entries_are_rejected() {
        let dir = std::env::temp_dir().join(format!("nerva-kcache-{}", std::process::id()));
        let path = dir.join("x.cubin");
        write_cached(&path, b"cubin bytes").unwrap();
        assert_eq!(read_cached(&path).as_deref(), Some(&b"cubin bytes"[..]));
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(
            read_cached(&path),
            None,
            "a flipped byte fails the checksum"
        );
        std::fs::write(&path, &bytes[..10]).unwrap();
        assert_eq!(read_cached(&path), None, "a truncated entry is rejected");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn ptxas_report_is_parsed() {
        let log = "ptxas info    : Compiling entry function 'gemv_rms_bf16_t1' for 'sm_90'\n\
                   ptxas info    : Function properties for gemv_rms_bf16_t1\n\
                   ptxas         .     0 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads\n\
                   ptxas info    : Used 64 registers, used 1 barriers\n";
        assert_eq!(
            resource_report(log),
            vec![("gemv_rms_bf16_t1".to_string(), 64, 8)]
        );
    }
}
