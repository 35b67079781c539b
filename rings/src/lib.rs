//! Nerva's wire (being built under issue 2).
#![deny(missing_docs)]
