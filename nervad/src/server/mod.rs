//! The server: socket, handshake, per-client segments, the poll loop and the engine thread.
pub mod alloc_count;
pub mod config;
pub mod listener;
pub mod policy;
pub mod segment;
pub mod signals;
pub mod stats;

pub use config::ServeConfig;
