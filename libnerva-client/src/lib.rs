//! Client library for nervad (being built under issue 3).
pub mod ffi;
