//! What a generation asks for: the prompt and the sampling / stopping parameters.

use crate::error::{Error, Result};

/// The prompt of a generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prompt<'a> {
    /// UTF-8 text, tokenized by the daemon with the model's tokenizer.
    Text(&'a str),
    /// Token ids, used as given.
    Tokens(&'a [u32]),
    /// A JSON array of `{"role": ..., "content": ...}` messages, rendered through the model's
    /// chat template with the generation prompt appended.
    Chat(&'a str),
}

/// Sampling and stopping parameters of one generation. `GenerateParams::default()` gives
/// plain sampling at temperature 1 with every filter off, 256 tokens, one sample.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateParams {
    /// Most tokens to generate per sample (≥ 1). Not refused when prompt + `max_tokens`
    /// exceeds the context: generation then stops at the context with
    /// [`crate::FinishReason::ContextLength`]; only a prompt that leaves no room is refused.
    pub max_tokens: u32,
    /// Softmax temperature, finite and ≥ 0; 0 is greedy.
    pub temperature: f32,
    /// Keep only the k most likely tokens; 0 disables.
    pub top_k: u32,
    /// Nucleus mass in (0, 1]; 1 disables.
    pub top_p: f32,
    /// Drop tokens below `min_p × p(max)`, in [0, 1]; 0 disables.
    pub min_p: f32,
    /// CTRL-style repetition penalty, finite and > 0; 1 disables.
    pub repetition_penalty: f32,
    /// OpenAI-style presence penalty in [-2, 2]; 0 disables.
    pub presence_penalty: f32,
    /// OpenAI-style frequency penalty in [-2, 2]; 0 disables.
    pub frequency_penalty: f32,
    /// Seed of the request's random stream; sample i uses `seed + i`.
    pub seed: u64,
    /// Stop when the output contains one of these (the match is not emitted).
    pub stop_strings: Vec<String>,
    /// Stop on any of these token ids (not emitted), besides the model's end-of-sequence ids.
    pub stop_token_ids: Vec<u32>,
    /// Keep generating past the model's end-of-sequence ids.
    pub ignore_eos: bool,
    /// Independent samples sharing the prompt (1..=64); events carry the sample index.
    pub n_samples: u16,
    /// Also report this many most likely alternatives per token (0..=20).
    pub top_logprobs: u8,
    /// Scheduling priority among this client's requests: higher runs first, 0 normal, negative
    /// for background work. Across clients the daemon shares tokens fairly; under KV pressure
    /// lower priority is preempted first.
    pub priority: i8,
    /// Deliver token-id events.
    pub stream_tokens: bool,
    /// Deliver text events.
    pub stream_text: bool,
    /// Fill the log-probability of each sampled token in token events (none otherwise).
    pub logprobs: bool,
    /// Caller-chosen value echoed on every event of this request (io_uring's `user_data`):
    /// e.g. a pointer or index of the caller's own per-request state. Not sent to the daemon.
    pub user_data: u64,
}

impl Default for GenerateParams {
    fn default() -> Self {
        GenerateParams {
            max_tokens: 256,
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0,
            stop_strings: Vec::new(),
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            n_samples: 1,
            top_logprobs: 0,
            priority: 0,
            stream_tokens: true,
            stream_text: true,
            logprobs: false,
            user_data: 0,
        }
    }
}

pub use nerva_rings::MAX_SAMPLES;
pub use nerva_rings::extension::MAX_TOP_LOGPROBS;

impl GenerateParams {
    /// Greedy decoding (temperature 0), otherwise defaults.
    pub fn greedy() -> Self {
        GenerateParams {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// Check every range; the daemon checks again, but a local error is clearer and cheaper.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: &str| Err(Error::InvalidArgument(what.to_string()));
        if self.max_tokens == 0 {
            return bad("max_tokens must be at least 1");
        }
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return bad("temperature must be finite and >= 0");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p must be in (0, 1]");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p must be in [0, 1]");
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return bad("repetition_penalty must be finite and > 0");
        }
        if !(-2.0..=2.0).contains(&self.presence_penalty) {
            return bad("presence_penalty must be in [-2, 2]");
        }
        if !(-2.0..=2.0).contains(&self.frequency_penalty) {
            return bad("frequency_penalty must be in [-2, 2]");
        }
        if self.n_samples == 0 || self.n_samples > MAX_SAMPLES {
            return bad("n_samples must be in 1..=64");
        }
        if self.top_logprobs > MAX_TOP_LOGPROBS {
            return bad("top_logprobs must be at most 20");
        }
        if self.stop_strings.iter().any(String::is_empty) {
            return bad("stop strings must not be empty");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_ranges_are_checked() {
        assert!(GenerateParams::default().validate().is_ok());
        assert!(GenerateParams::greedy().validate().is_ok());
        for p in [
            GenerateParams {
                max_tokens: 0,
                ..Default::default()
            },
            GenerateParams {
                temperature: f32::NAN,
                ..Default::default()
            },
            GenerateParams {
                top_p: 0.0,
                ..Default::default()
            },
            GenerateParams {
                min_p: 1.5,
                ..Default::default()
            },
            GenerateParams {
                repetition_penalty: 0.0,
                ..Default::default()
            },
            GenerateParams {
                n_samples: 65,
                ..Default::default()
            },
            GenerateParams {
                top_logprobs: 21,
                ..Default::default()
            },
            GenerateParams {
                stop_strings: vec![String::new()],
                ..Default::default()
            },
        ] {
            assert!(p.validate().is_err(), "{p:?}");
        }
    }
}
