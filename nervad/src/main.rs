//! `nervad`: the Nerva inference daemon. The command line lives in `nervad::server::cli`.

use std::process::ExitCode;

/// Counts allocations per thread so the poll loop can prove it allocates nothing per
/// descriptor (reported in `nervactl stats` and asserted in the daemon tests).
#[global_allocator]
static ALLOCATOR: nervad::server::alloc_count::CountingAllocator =
    nervad::server::alloc_count::CountingAllocator;

fn main() -> ExitCode {
    nervad::server::cli::main()
}
