//! The engine: requests, scheduling over a paged KV pool, sampling, detokenization.
//!
//! `api` is the boundary the server drives; everything else here is behind it.

pub mod api;

pub use api::{
    ClientId, EngineEvent, EngineInfo, EventSink, FinishReason, GenerateRequest, InferenceEngine,
    Prompt, RequestError, RequestKey, RequestTimings, SamplingParams, StopConditions,
};
