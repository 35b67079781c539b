//! Version queries: which C ABI the library implements, and a human-readable build string.

use core::ffi::c_char;

/// Version of this C ABI (functions, structs, codes in `nerva.h`). Bumped on any incompatible
/// change. Compare `nerva_abi_version()` (the library you linked) with this constant (the header
/// you compiled against) at start-up; they must be equal.
pub const NERVA_ABI_VERSION: u32 = 1;

/// The C ABI version the linked library implements; equal to the header's `NERVA_ABI_VERSION`
/// when header and library match.
#[unsafe(no_mangle)]
pub extern "C" fn nerva_abi_version() -> u32 {
    NERVA_ABI_VERSION
}

/// Build string with the client library's version, its C ABI version and the wire version it
/// speaks to the daemon, e.g. "nerva-client 0.1.0 (c-abi 1, wire 1)". NUL-terminated, static
/// storage: never NULL, never to be freed.
#[unsafe(no_mangle)]
pub extern "C" fn nerva_version_string() -> *const c_char {
    VERSION_STRING.as_ptr()
}

const VERSION_STRING: &core::ffi::CStr = {
    // The wire version is a `u32` constant of the rings crate; `concat!` takes literals only, so
    // the test below pins the text to it instead.
    match core::ffi::CStr::from_bytes_with_nul(
        concat!(
            "nerva-client ",
            env!("CARGO_PKG_VERSION"),
            " (c-abi 1, wire 1)\0"
        )
        .as_bytes(),
    ) {
        Ok(s) => s,
        Err(_) => panic!("version string has an interior NUL"),
    }
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_string_names_the_abi_and_wire_versions_in_force() {
        let text = VERSION_STRING.to_str().expect("ASCII");
        assert!(
            text.contains(&format!("c-abi {NERVA_ABI_VERSION},")),
            "{text}"
        );
        assert!(
            text.contains(&format!("wire {})", nerva_rings::handshake::ABI_VERSION)),
            "{text}"
        );
        assert_eq!(nerva_abi_version(), NERVA_ABI_VERSION);
    }
}
