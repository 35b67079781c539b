//! Tests of model loading, the tokenizer byte table, chat templates and the generator.
//! Only tiny presets are generated here (each takes well under a second).

mod chat;
mod checkpoint;
mod config_parsing;
mod load_errors;
mod tokenizer_bytes;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::generate::{Preset, make_checkpoint};

/// A directory removed on drop.
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    pub(crate) fn new(tag: &str) -> TempDir {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("nerva-model-test-{}-{tag}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The tiny checkpoint of `preset` (seed 7), generated once per test process and shared
/// read-only; tests that damage files work on a [`copy_snapshot`].
pub(crate) fn shared_checkpoint(preset: Preset) -> PathBuf {
    static DIRS: OnceLock<(TempDir, Vec<(Preset, PathBuf)>)> = OnceLock::new();
    let (_, dirs) = DIRS.get_or_init(|| {
        let root = TempDir::new("shared");
        let dirs = Preset::TINY
            .iter()
            .map(|&p| {
                let dir = root.path().join(p.name());
                make_checkpoint(p, &dir, 7, None).unwrap();
                (p, dir)
            })
            .collect();
        (root, dirs)
    });
    dirs.iter()
        .find(|(p, _)| *p == preset)
        .map(|(_, d)| d.clone())
        .expect("only tiny presets are shared")
}

/// Copy every file of a snapshot into a new temporary directory.
pub(crate) fn copy_snapshot(src: &Path, tag: &str) -> TempDir {
    let dst = TempDir::new(tag);
    for entry in std::fs::read_dir(src).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dst.path().join(entry.file_name())).unwrap();
    }
    dst
}
