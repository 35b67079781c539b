//! nervad: the Nerva inference daemon.
//!
//! Layers, bottom up: `model` (config, safetensors, tokenizer, checkpoint generator),
//! `backend` (one batched step over a paged KV pool; `cpu` is the exact reference),
//! `engine` (requests, scheduler, sampling, detokenization), `server` (socket, segments, poll loop).

pub mod backend;
pub mod engine;
pub mod model;
pub mod server;
#[cfg(feature = "test-engine")]
pub mod test_engine;
