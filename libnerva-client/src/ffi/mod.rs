//! The C ABI of libnerva-client, declared in `include/nerva.h` (generated from this module by
//! cbindgen; see `libnerva-client/cbindgen.toml`).
//!
//! Every entry point is a thin shell over the safe Rust API: it null-checks and copies its
//! arguments, runs the body under the private `boundary` module (no panic crosses into C, one
//! thread per client at a time) and maps errors to [`status::nerva_status`] codes. The names are
//! the C names, so this module allows non-camel-case types.
//!
//! The C layer's `unsafe` is confined to dereferencing C pointers (`boundary`, `params`,
//! `client`), the handle's exclusive access (`boundary::Exclusive`) and setting `errno`
//! (`status`).
#![allow(non_camel_case_types)]

mod boundary;
pub mod client;
pub mod event;
pub mod model;
pub mod params;
pub mod status;
pub mod version;
