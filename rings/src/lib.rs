//! Nerva's wire: everything the daemon and its clients share.
#![deny(missing_docs)]

pub mod handshake;
