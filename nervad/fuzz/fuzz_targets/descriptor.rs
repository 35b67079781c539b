//! Fuzz target: one 64-byte descriptor plus input-region bytes through the daemon's
//! validation path. See `nervad/fuzz/README.md`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    // The outcome only matters to the stable test's coverage counts; findings are panics.
    let _ = nervad_fuzz::check_descriptor(data);
});
