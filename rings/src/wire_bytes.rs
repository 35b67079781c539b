//! Little-endian field access and UTF-8 truncation for the byte-encoded wire parts (the
//! completion payload, the extension block, the handshake messages).

/// The little-endian `u16` at `b[at..at + 2]`.
pub(crate) fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// The little-endian `u32` at `b[at..at + 4]`.
pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The little-endian `u64` at `b[at..at + 8]`.
pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// The longest prefix length of `s` that is at most `max` bytes and ends on a code-point
/// boundary.
pub(crate) fn floor_char_boundary(s: &str, max: usize) -> usize {
    let mut end = s.len().min(max);
    // A code point is at most 4 bytes: this walks back at most 3 steps.
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    end
}
