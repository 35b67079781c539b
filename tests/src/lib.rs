//! Helpers shared by Nerva's cross-crate tests.

pub mod daemon_harness;
pub mod daemon_raw;
