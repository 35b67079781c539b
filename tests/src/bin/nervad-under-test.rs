//! The daemon under test: exactly `nervad`'s entry point (same CLI, same counting allocator),
//! built inside the tests package so integration tests can find it through
//! `CARGO_BIN_EXE_nervad-under-test`. The test engine is compiled in (feature `test-engine`)
//! but only serves when a test passes `--engine test`.

use std::process::ExitCode;

#[global_allocator]
static ALLOCATOR: nervad::server::alloc_count::CountingAllocator =
    nervad::server::alloc_count::CountingAllocator;

fn main() -> ExitCode {
    nervad::server::cli::main()
}
