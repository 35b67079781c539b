//! Shared measurement helpers for the lab binaries (`src/bin/NN_*.rs`).
//!
//! Every experiment prints a markdown table as its last output so that results paste straight
//! into `lab/README.md`. The helpers here are deliberately small: a clock, percentiles, CPU
//! pinning, a memfd-backed shared mapping with fork, and the table printer. The few `unsafe`
//! blocks (syscalls, shared memory) live in `affinity`, `arena`, `shm`, `futex` and `eventfd`.
#![deny(missing_docs)]

pub mod affinity;
pub mod arena;
pub mod args;
pub mod cacheline;
pub mod eventfd;
pub mod futex;
pub mod machine;
pub mod pair;
pub mod report;
pub mod ring_replica;
pub mod shm;
pub mod shm_ring;
pub mod stats;
