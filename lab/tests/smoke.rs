//! Runs every experiment with `--quick` and checks that it succeeds and ends with a markdown
//! table (the contract that lets results paste into lab/README.md). Sizes under `--quick` are
//! tiny; the numbers themselves are not checked (benchmarks are never timed tests).

use std::process::Command;

fn run_quick(exe: &str) {
    run_quick_with(exe, &[]);
}

fn run_quick_with(exe: &str, extra: &[&str]) {
    let out = Command::new(exe)
        .arg("--quick")
        .args(extra)
        .output()
        .expect("spawn experiment");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{exe} failed: {}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let last = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    assert!(
        last.starts_with('|') && last.ends_with('|'),
        "{exe}: last line is not a table row: {last:?}"
    );
    assert!(
        stdout.contains("| --- |"),
        "{exe}: no markdown table header separator"
    );
}

#[test]
fn false_sharing_quick() {
    run_quick(env!("CARGO_BIN_EXE_01_false_sharing"));
}

#[test]
fn ring_compare_quick() {
    run_quick(env!("CARGO_BIN_EXE_02_ring_compare"));
}

#[test]
fn hugepages_quick() {
    // Never touch /proc/sys/vm/nr_hugepages from a test: other suites running in parallel may
    // reserve hugetlb pages themselves, and a restore could clobber theirs.
    run_quick_with(env!("CARGO_BIN_EXE_03_hugepages_tlb"), &["--no-reserve"]);
}

#[test]
fn wakeup_cost_quick() {
    run_quick(env!("CARGO_BIN_EXE_04_wakeup_cost"));
}

#[test]
fn doorbell_batching_quick() {
    run_quick(env!("CARGO_BIN_EXE_05_doorbell_batching"));
}

#[test]
fn memory_ordering_quick() {
    run_quick(env!("CARGO_BIN_EXE_06_memory_ordering"));
}
