//! Shared helpers for the lab binaries.
