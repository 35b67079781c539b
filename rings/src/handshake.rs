//! Connection handshake over the daemon's Unix socket (`SOCK_SEQPACKET`, so each message
//! keeps its boundary and its ancillary data).
//!
//! 1. The client connects and sends one [`Hello`] (64 bytes).
//! 2. The daemon checks the peer's credentials (`SO_PEERCRED`) against its access policy and the
//!    ABI version, then answers one [`Welcome`] (128 bytes). On success the same message carries,
//!    with `SCM_RIGHTS`, exactly three descriptors in this order: the segment memfd, the
//!    submission doorbell eventfd (the client writes it to wake a sleeping daemon) and the
//!    completion doorbell eventfd (the daemon writes it to wake a client blocked in `wait`).
//!    On refusal no descriptor is passed and `message` says why.
//! 3. The socket stays open for the life of the client: hang-up is the liveness signal.
//!
//! Both messages are encoded field by field in little-endian, never transmuted: the peer is
//! another process and its bytes are validated like any other input.

use crate::wire_bytes::{floor_char_boundary, u32_at, u64_at};

/// `Hello::magic`: "NRVH".
pub const HELLO_MAGIC: u32 = u32::from_le_bytes(*b"NRVH");
/// `Welcome::magic`: "NRVW".
pub const WELCOME_MAGIC: u32 = u32::from_le_bytes(*b"NRVW");
/// Where the daemon listens unless told otherwise, and where clients look:
/// `$XDG_RUNTIME_DIR/nerva/nervad.sock`, else `/run/nerva/nervad.sock`.
pub fn default_socket_path() -> std::path::PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(dir) if !dir.is_empty() => std::path::PathBuf::from(dir)
            .join("nerva")
            .join("nervad.sock"),
        _ => std::path::PathBuf::from("/run/nerva/nervad.sock"),
    }
}

/// Version of the whole wire (handshake, segment layout, descriptors, completions).
/// Bumped on any incompatible change; both sides refuse a mismatch.
pub const ABI_VERSION: u32 = 1;
/// Encoded size of [`Hello`].
pub const HELLO_LEN: usize = 64;
/// Encoded size of [`Welcome`].
pub const WELCOME_LEN: usize = 128;
/// Bytes of the refusal message carried in [`Welcome`].
pub const WELCOME_MESSAGE_LEN: usize = 88;
/// Descriptors passed with a successful [`Welcome`].
pub const WELCOME_FDS: usize = 3;

/// What the client asks for. Zero in a size field means "daemon default".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Hello {
    /// Must be [`HELLO_MAGIC`].
    pub magic: u32,
    /// The client's [`ABI_VERSION`].
    pub abi_version: u32,
    /// Requested submission ring entries (power of two) or 0.
    pub sq_entries: u32,
    /// Requested completion ring entries (power of two) or 0.
    pub cq_entries: u32,
    /// Requested data area bytes or 0.
    pub data_bytes: u64,
    /// Reserved flags; must be 0 in this version.
    pub flags: u32,
}

/// Outcome of a handshake, in [`Welcome::status`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum HandshakeStatus {
    /// Connected; three descriptors follow.
    Accepted = 0,
    /// The peer's uid/gid is outside the daemon's access policy.
    PermissionDenied = 1,
    /// ABI versions differ.
    VersionMismatch = 2,
    /// The hello was malformed or asked for impossible sizes.
    BadRequest = 3,
    /// The daemon serves its maximum number of clients.
    TooManyClients = 4,
    /// The daemon is shutting down.
    ShuttingDown = 5,
    /// The daemon could not create the segment (out of memory, limits).
    ResourceExhausted = 6,
}

impl HandshakeStatus {
    /// Decode a status word; unknown values are `None`.
    pub fn from_u32(value: u32) -> Option<Self> {
        Some(match value {
            0 => Self::Accepted,
            1 => Self::PermissionDenied,
            2 => Self::VersionMismatch,
            3 => Self::BadRequest,
            4 => Self::TooManyClients,
            5 => Self::ShuttingDown,
            6 => Self::ResourceExhausted,
            _ => return None,
        })
    }
}

/// The daemon's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Welcome {
    /// Must be [`WELCOME_MAGIC`].
    pub magic: u32,
    /// The daemon's [`ABI_VERSION`].
    pub abi_version: u32,
    /// Outcome.
    pub status: HandshakeStatus,
    /// The daemon's id for this client (slot), for logs and `nervactl clients`.
    pub client_slot: u32,
    /// Generation of the slot.
    pub client_generation: u32,
    /// Size of the segment memfd in bytes (the client maps exactly this much).
    pub segment_bytes: u64,
    /// Page size backing the segment (4096, 2 MiB THP or hugetlb).
    pub page_bytes: u64,
    /// The daemon's pid.
    pub daemon_pid: u32,
    /// UTF-8 reason on refusal (NUL-padded); empty on success.
    pub message: [u8; WELCOME_MESSAGE_LEN],
}

/// A handshake message could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HandshakeError {
    /// Wrong length for the message type.
    Length {
        /// Bytes received.
        got: usize,
        /// Bytes expected.
        expected: usize,
    },
    /// The magic word does not match.
    Magic(u32),
    /// A status word this version does not know.
    UnknownStatus(u32),
    /// Reserved bits were set.
    ReservedBits,
}

impl core::fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Length { got, expected } => {
                write!(f, "handshake message of {got} bytes, expected {expected}")
            }
            Self::Magic(m) => write!(f, "bad handshake magic {m:#010x}"),
            Self::UnknownStatus(s) => write!(f, "unknown handshake status {s}"),
            Self::ReservedBits => write!(f, "reserved handshake flags set"),
        }
    }
}

impl std::error::Error for HandshakeError {}

impl Hello {
    /// A hello for this build's ABI with daemon-default sizes.
    pub fn new() -> Self {
        Hello {
            magic: HELLO_MAGIC,
            abi_version: ABI_VERSION,
            ..Default::default()
        }
    }

    /// Encode to the wire.
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[0..4].copy_from_slice(&self.magic.to_le_bytes());
        b[4..8].copy_from_slice(&self.abi_version.to_le_bytes());
        b[8..12].copy_from_slice(&self.sq_entries.to_le_bytes());
        b[12..16].copy_from_slice(&self.cq_entries.to_le_bytes());
        b[16..24].copy_from_slice(&self.data_bytes.to_le_bytes());
        b[24..28].copy_from_slice(&self.flags.to_le_bytes());
        b
    }

    /// Decode from the wire. Checks length, magic and reserved bits; the version is checked
    /// by the daemon so it can answer `VersionMismatch` instead of dropping the peer.
    pub fn decode(b: &[u8]) -> Result<Self, HandshakeError> {
        if b.len() != HELLO_LEN {
            return Err(HandshakeError::Length {
                got: b.len(),
                expected: HELLO_LEN,
            });
        }
        let magic = u32_at(b, 0);
        if magic != HELLO_MAGIC {
            return Err(HandshakeError::Magic(magic));
        }
        let hello = Hello {
            magic,
            abi_version: u32_at(b, 4),
            sq_entries: u32_at(b, 8),
            cq_entries: u32_at(b, 12),
            data_bytes: u64_at(b, 16),
            flags: u32_at(b, 24),
        };
        if hello.flags != 0 || b[28..].iter().any(|&x| x != 0) {
            return Err(HandshakeError::ReservedBits);
        }
        Ok(hello)
    }
}

impl Welcome {
    /// A refusal carrying `reason` (truncated at a UTF-8 boundary to fit).
    pub fn refused(status: HandshakeStatus, daemon_pid: u32, reason: &str) -> Self {
        let mut message = [0u8; WELCOME_MESSAGE_LEN];
        let end = floor_char_boundary(reason, WELCOME_MESSAGE_LEN);
        message[..end].copy_from_slice(&reason.as_bytes()[..end]);
        Welcome {
            magic: WELCOME_MAGIC,
            abi_version: ABI_VERSION,
            status,
            client_slot: 0,
            client_generation: 0,
            segment_bytes: 0,
            page_bytes: 0,
            daemon_pid,
            message,
        }
    }

    /// The refusal message as text (lossy on invalid UTF-8 from a hostile peer).
    pub fn message_text(&self) -> String {
        let end = self
            .message
            .iter()
            .position(|&c| c == 0)
            .unwrap_or(WELCOME_MESSAGE_LEN);
        String::from_utf8_lossy(&self.message[..end]).into_owned()
    }

    /// Encode to the wire.
    pub fn encode(&self) -> [u8; WELCOME_LEN] {
        let mut b = [0u8; WELCOME_LEN];
        b[0..4].copy_from_slice(&self.magic.to_le_bytes());
        b[4..8].copy_from_slice(&self.abi_version.to_le_bytes());
        b[8..12].copy_from_slice(&(self.status as u32).to_le_bytes());
        b[12..16].copy_from_slice(&self.client_slot.to_le_bytes());
        b[16..20].copy_from_slice(&self.client_generation.to_le_bytes());
        b[20..24].copy_from_slice(&self.daemon_pid.to_le_bytes());
        b[24..32].copy_from_slice(&self.segment_bytes.to_le_bytes());
        b[32..40].copy_from_slice(&self.page_bytes.to_le_bytes());
        b[40..].copy_from_slice(&self.message);
        b
    }

    /// Decode from the wire.
    pub fn decode(b: &[u8]) -> Result<Self, HandshakeError> {
        if b.len() != WELCOME_LEN {
            return Err(HandshakeError::Length {
                got: b.len(),
                expected: WELCOME_LEN,
            });
        }
        let magic = u32_at(b, 0);
        if magic != WELCOME_MAGIC {
            return Err(HandshakeError::Magic(magic));
        }
        let status_word = u32_at(b, 8);
        let status = HandshakeStatus::from_u32(status_word)
            .ok_or(HandshakeError::UnknownStatus(status_word))?;
        let mut message = [0u8; WELCOME_MESSAGE_LEN];
        message.copy_from_slice(&b[40..]);
        Ok(Welcome {
            magic,
            abi_version: u32_at(b, 4),
            status,
            client_slot: u32_at(b, 12),
            client_generation: u32_at(b, 16),
            daemon_pid: u32_at(b, 20),
            segment_bytes: u64_at(b, 24),
            page_bytes: u64_at(b, 32),
            message,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_round_trips_and_rejects_garbage() {
        let hello = Hello {
            sq_entries: 256,
            cq_entries: 1024,
            data_bytes: 1 << 20,
            ..Hello::new()
        };
        assert_eq!(Hello::decode(&hello.encode()), Ok(hello));
        let mut bad = hello.encode();
        bad[0] ^= 1;
        assert!(matches!(Hello::decode(&bad), Err(HandshakeError::Magic(_))));
        let mut reserved = hello.encode();
        reserved[40] = 1;
        assert_eq!(Hello::decode(&reserved), Err(HandshakeError::ReservedBits));
        assert!(matches!(
            Hello::decode(&hello.encode()[..10]),
            Err(HandshakeError::Length { .. })
        ));
    }

    #[test]
    fn welcome_round_trips_and_truncates_on_char_boundary() {
        let long = "é".repeat(100);
        let w = Welcome::refused(HandshakeStatus::PermissionDenied, 42, &long);
        let back = Welcome::decode(&w.encode()).expect("decodes");
        assert_eq!(back, w);
        assert_eq!(back.message_text(), "é".repeat(WELCOME_MESSAGE_LEN / 2));
        let mut bad = w.encode();
        bad[8] = 99;
        assert_eq!(
            Welcome::decode(&bad),
            Err(HandshakeError::UnknownStatus(99))
        );
    }
}
