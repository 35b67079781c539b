//! Shared measurement helpers for the lab binaries (`src/bin/NN_*.rs`).
//!
//! Every experiment prints a markdown table as its last output so that results paste straight
//! into `lab/README.md`. The helpers here are deliberately small: a clock, percentiles, CPU
//! pinning, a memfd-backed shared mapping with fork, and the table printer. `unsafe` (syscalls,
//! shared memory) lives in `affinity`, `arena`, `eventfd`, `futex`, `shm`, `shm_ring` and the
//! ablation replica `ring_replica`; the binaries only call `SharedRegion::at` (04, via
//! `cacheline`) and declare two 64-byte probe entry types `Pod` (02), each with its argument.
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
