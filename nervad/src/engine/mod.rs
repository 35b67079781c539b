//! The engine: requests, scheduling over a paged KV pool, sampling, detokenization.
//!
//! `api` is the boundary the server drives; everything else here is behind it.

pub mod api;
pub mod core;
pub mod detok;
pub mod dump;
pub mod kv_pool;
pub mod ledger;
pub mod model;
pub mod prefix_cache;
pub mod scheduler;
pub mod swap_slots;

pub use api::{
    ClientId, EngineEvent, EngineInfo, EventSink, FinishReason, GenerateRequest, InferenceEngine,
    Prompt, RequestError, RequestKey, RequestTimings, SamplingParams, StopConditions,
};
pub use core::{AheadMiss, Engine, EngineOptions, LaunchAhead};
pub use detok::TokenTable;
pub use model::{EngineModel, PromptEncoder, TextCodec};
pub use scheduler::Preemption;
