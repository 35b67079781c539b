//! Everything the server needs to know, resolved from the command line.

use std::path::PathBuf;
use std::time::Duration;

/// Resolved server settings (see `nervad serve --help` for what each one means).
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Socket path.
    pub socket: PathBuf,
    /// Create the socket's parent directory if missing (only for the default location: an
    /// explicit path's directory is the operator's to create).
    pub create_socket_dir: bool,
    /// Socket file mode.
    pub socket_mode: u32,
    /// Admitted uids (empty with `allow_gids` empty: the daemon's uid and the socket's group).
    pub allow_uids: Vec<u32>,
    /// Admitted gids.
    pub allow_gids: Vec<u32>,
    /// How long the poll thread spins on empty rings before it sleeps.
    pub spin: Duration,
    /// Most clients served at once.
    pub max_clients: u32,
    /// Default submission ring entries (power of two).
    pub sq_entries: u32,
    /// Default completion ring entries (power of two).
    pub cq_entries: u32,
    /// Default input region bytes (prompts, extension blocks).
    pub data_bytes: u64,
    /// Output region bytes (admin replies).
    pub reply_bytes: u64,
    /// Largest ring a client may ask for.
    pub max_ring_entries: u32,
    /// Largest input region a client may ask for.
    pub max_data_bytes: u64,
    /// Segments created ahead of connects.
    pub segment_pool: u32,
    /// Try hugetlb-backed segments.
    pub hugetlb: bool,
    /// Lock segments and arenas in memory where allowed.
    pub mlock: bool,
    /// How long SIGTERM waits for in-flight work before cancelling it.
    pub drain_timeout: Duration,
    /// Descriptors taken from one client before the poll thread moves to the next.
    pub batch_per_client: u32,
}

impl ServeConfig {
    /// Defaults for everything but the socket path.
    pub fn with_socket(socket: PathBuf) -> Self {
        ServeConfig {
            socket,
            create_socket_dir: true,
            socket_mode: 0o660,
            allow_uids: Vec::new(),
            allow_gids: Vec::new(),
            spin: Duration::from_micros(50),
            max_clients: 256,
            sq_entries: 256,
            cq_entries: 1024,
            data_bytes: 1 << 20,
            reply_bytes: 256 << 10,
            max_ring_entries: 1 << 16,
            max_data_bytes: 64 << 20,
            segment_pool: 4,
            hugetlb: true,
            mlock: true,
            drain_timeout: Duration::from_secs(10),
            batch_per_client: 32,
        }
    }
}
