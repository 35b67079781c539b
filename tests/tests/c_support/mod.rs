//! Shared by the C ABI tests: where the workspace, the built library and the C compiler are,
//! and how to build a C program against `include/nerva.h`.
#![allow(dead_code)] // each test binary uses a different subset

use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace root (parent of `tests/`).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ lives inside the workspace")
        .to_path_buf()
}

/// `target/<profile>` of this test binary (`target/<profile>/deps/<test>-<hash>`).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    exe.parent()
        .and_then(Path::parent)
        .expect("test binaries live in target/<profile>/deps")
        .to_path_buf()
}

/// The library cargo built for this test run (`libnerva_client.so` or `.a`). nerva-client is
/// a dependency of this crate, so cargo builds every crate type it declares (rlib, cdylib,
/// staticlib) into `target/<profile>/deps/`; it copies them up to `target/<profile>/` only when
/// nerva-client itself is selected (`cargo test --workspace`, not `-p nerva-tests`). Take the
/// newer of the two so a stale copy from an earlier build never wins.
pub fn built_library(file_name: &str) -> PathBuf {
    let profile = profile_dir();
    let candidates = [
        profile.join(file_name),
        profile.join("deps").join(file_name),
    ];
    candidates
        .iter()
        .filter_map(|p| Some((std::fs::metadata(p).ok()?.modified().ok()?, p)))
        .max_by_key(|(modified, _)| *modified)
        .map(|(_, p)| p.clone())
        .unwrap_or_else(|| {
            panic!(
                "{file_name} not found in {} or its deps/: build nerva-client first \
                 (cargo test -p nerva-tests builds it)",
                profile.display()
            )
        })
}

/// The system C compiler (`$CC`, else `cc`).
pub fn c_compiler() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".to_owned())
}

/// A fresh scratch directory under the system temp dir, removed by the caller.
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("nerva-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

/// Compile `libnerva-client/examples/<example>.c` as strict C99 with `flags` (include path and
/// libraries). Panics with the compiler's output on failure.
pub fn compile_example(example: &str, output: &Path, flags: &[String]) {
    let root = workspace_root();
    let source = root.join(format!("libnerva-client/examples/{example}.c"));
    let cc = c_compiler();
    let result = Command::new(&cc)
        .args([
            "-std=c99",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-pedantic",
            "-O1",
        ])
        .arg(&source)
        .arg("-o")
        .arg(output)
        .args(flags)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler {cc}: {e}"));
    assert!(
        result.status.success(),
        "{cc} failed to build {}:\n{}",
        source.display(),
        String::from_utf8_lossy(&result.stderr)
    );
}

/// Flags to build against the workspace: `include/` and the cdylib in `target/<profile>/`,
/// with an rpath so the program runs in place.
pub fn in_tree_flags() -> Vec<String> {
    let lib = built_library("libnerva_client.so");
    let dir = lib.parent().expect("library dir").display().to_string();
    vec![
        format!("-I{}", workspace_root().join("include").display()),
        format!("-L{dir}"),
        format!("-Wl,-rpath,{dir}"),
        "-lnerva_client".to_owned(),
    ]
}
