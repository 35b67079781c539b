//! Helpers shared by Nerva's cross-crate tests.
