//! Backends: one batched step over a paged KV pool, sampling included.
