//! Generation parameters as a plain C struct, and their conversion into the Rust API's
//! [`GenerateParams`] (every field range-checked, every string copied and checked for UTF-8).

use core::ffi::{CStr, c_char};

use super::boundary::arg_slice;
use super::status::nerva_status;
use crate::GenerateParams;

/// Most samples one request may ask for (`n_samples`).
pub const NERVA_MAX_SAMPLES: u32 = 64;
/// Most alternatives per token (`top_logprobs`).
pub const NERVA_MAX_TOP_LOGPROBS: u32 = 20;
/// Most stop strings per request.
pub const NERVA_MAX_STOP_STRINGS: usize = 16;
/// Most bytes of one stop string.
pub const NERVA_MAX_STOP_STRING_BYTES: usize = 256;
/// Most stop token ids per request.
pub const NERVA_MAX_STOP_TOKEN_IDS: usize = 64;

// The C constants are literals (cbindgen emits them as plain #defines); these keep them equal
// to the Rust API's and the wire's limits.
const _: () = {
    assert!(NERVA_MAX_SAMPLES == crate::MAX_SAMPLES as u32);
    assert!(NERVA_MAX_TOP_LOGPROBS == crate::MAX_TOP_LOGPROBS as u32);
    assert!(NERVA_MAX_STOP_STRINGS == nerva_rings::extension::MAX_STOP_STRINGS);
    assert!(NERVA_MAX_STOP_STRING_BYTES == nerva_rings::extension::MAX_STOP_STRING_BYTES);
    assert!(NERVA_MAX_STOP_TOKEN_IDS == nerva_rings::extension::MAX_STOP_TOKENS);
};

/// Sampling and stopping parameters of one generation.
///
/// Start from `nerva_generate_default_params()` and change the fields you need: new fields may
/// be added in later ABI versions, and the defaults keep old code meaningful.
///
/// The stop arrays are only read during the submit call (the library copies them).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct nerva_generate_params {
    /// Most tokens to generate per sample; at least 1. Default 256.
    pub max_tokens: u32,
    /// Softmax temperature, finite and >= 0; 0 is greedy. Default 1.
    pub temperature: f32,
    /// Keep only the k most likely tokens; 0 disables. Default 0.
    pub top_k: u32,
    /// Nucleus probability mass in (0, 1]; 1 disables. Default 1.
    pub top_p: f32,
    /// Drop tokens below `min_p` times the top probability, in [0, 1]; 0 disables. Default 0.
    pub min_p: f32,
    /// CTRL-style repetition penalty, finite and > 0; 1 disables. Default 1.
    pub repetition_penalty: f32,
    /// OpenAI-style presence penalty in [-2, 2]; 0 disables. Default 0.
    pub presence_penalty: f32,
    /// OpenAI-style frequency penalty in [-2, 2]; 0 disables. Default 0.
    pub frequency_penalty: f32,
    /// Seed of the request's random stream; sample i uses `seed + i`. Default 0.
    pub seed: u64,
    /// Independent samples sharing the prompt, 1..=NERVA_MAX_SAMPLES; events carry the sample
    /// index. Default 1.
    pub n_samples: u32,
    /// Also report this many most likely alternatives per token (NERVA_EVENT_TOP_LOGPROBS
    /// events), 0..=NERVA_MAX_TOP_LOGPROBS. Default 0.
    pub top_logprobs: u32,
    /// Scheduling priority in -128..=127 among the same client's requests: higher runs first,
    /// 0 is normal, negative is background work (across clients the daemon shares tokens fairly;
    /// under KV pressure lower priority is preempted first). Default 0.
    pub priority: i32,
    /// Keep generating past the model's end-of-sequence ids. Default false.
    pub ignore_eos: bool,
    /// Deliver NERVA_EVENT_TOKENS events with the sampled token ids. Default true.
    pub stream_tokens: bool,
    /// Deliver NERVA_EVENT_TEXT events with the detokenized text. Default true.
    pub stream_text: bool,
    /// Fill `logprobs` (the log-probability of each sampled token) in NERVA_EVENT_TOKENS
    /// events. Default false.
    pub logprobs: bool,
    /// `n_stop_strings` (at most NERVA_MAX_STOP_STRINGS) NUL-terminated UTF-8 strings of
    /// 1..=NERVA_MAX_STOP_STRING_BYTES bytes; generation stops when the output contains one
    /// (the match is not emitted). May be NULL when `n_stop_strings` is 0.
    pub stop_strings: *const *const c_char,
    /// Number of entries in `stop_strings`.
    pub n_stop_strings: usize,
    /// `n_stop_token_ids` (at most NERVA_MAX_STOP_TOKEN_IDS) token ids that stop generation
    /// (not emitted), besides the model's end-of-sequence ids. May be NULL when
    /// `n_stop_token_ids` is 0.
    pub stop_token_ids: *const u32,
    /// Number of entries in `stop_token_ids`.
    pub n_stop_token_ids: usize,
    /// Caller-chosen value echoed in `nerva_event.user_data` of every event of this request
    /// (io_uring's `user_data`: e.g. a pointer to the caller's per-request state). Never sent
    /// to the daemon. Default 0.
    pub user_data: u64,
}

impl From<&GenerateParams> for nerva_generate_params {
    /// The C view of Rust parameters, without the stop lists (which C owns).
    fn from(p: &GenerateParams) -> Self {
        nerva_generate_params {
            max_tokens: p.max_tokens,
            temperature: p.temperature,
            top_k: p.top_k,
            top_p: p.top_p,
            min_p: p.min_p,
            repetition_penalty: p.repetition_penalty,
            presence_penalty: p.presence_penalty,
            frequency_penalty: p.frequency_penalty,
            seed: p.seed,
            n_samples: u32::from(p.n_samples),
            top_logprobs: u32::from(p.top_logprobs),
            priority: i32::from(p.priority),
            ignore_eos: p.ignore_eos,
            stream_tokens: p.stream_tokens,
            stream_text: p.stream_text,
            logprobs: p.logprobs,
            stop_strings: core::ptr::null(),
            n_stop_strings: 0,
            stop_token_ids: core::ptr::null(),
            n_stop_token_ids: 0,
            user_data: p.user_data,
        }
    }
}

/// The default parameters (the Rust API's `GenerateParams::default()`), by value: greedy off
/// (temperature 1), every filter and penalty off, 256 tokens, one sample, no stop lists.
#[unsafe(no_mangle)]
pub extern "C" fn nerva_generate_default_params() -> nerva_generate_params {
    // Cannot panic: the default holds empty lists, which do not allocate.
    nerva_generate_params::from(&GenerateParams::default())
}

impl nerva_generate_params {
    /// Copy into the Rust API's parameters, refusing anything out of range.
    ///
    /// # Safety
    /// `stop_strings` must point to `n_stop_strings` readable pointers, each NULL or a
    /// NUL-terminated string, and `stop_token_ids` to `n_stop_token_ids` readable ids (either
    /// may be NULL when its count is 0), all unchanged during the call.
    pub(crate) unsafe fn into_rust(self) -> Result<GenerateParams, nerva_status> {
        let invalid = nerva_status::NERVA_E_INVALID_ARGUMENT;
        // SAFETY: the caller's obligation covers the (stop_strings, n_stop_strings) pair.
        let stop_ptrs = unsafe { arg_slice(self.stop_strings, self.n_stop_strings) }?;
        let mut stop_strings = Vec::with_capacity(stop_ptrs.len());
        for &ptr in stop_ptrs {
            if ptr.is_null() {
                return Err(invalid);
            }
            // SAFETY: non-NULL and, by the caller's obligation, NUL-terminated and unchanged.
            let bytes = unsafe { CStr::from_ptr(ptr) }.to_bytes();
            stop_strings.push(core::str::from_utf8(bytes).map_err(|_| invalid)?.to_owned());
        }
        // SAFETY: the caller's obligation covers the (stop_token_ids, n_stop_token_ids) pair.
        let stop_token_ids = unsafe { arg_slice(self.stop_token_ids, self.n_stop_token_ids) }?;
        let params = GenerateParams {
            max_tokens: self.max_tokens,
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed: self.seed,
            stop_strings,
            stop_token_ids: stop_token_ids.to_vec(),
            ignore_eos: self.ignore_eos,
            n_samples: u16::try_from(self.n_samples).map_err(|_| invalid)?,
            top_logprobs: u8::try_from(self.top_logprobs).map_err(|_| invalid)?,
            priority: i8::try_from(self.priority).map_err(|_| invalid)?,
            stream_tokens: self.stream_tokens,
            stream_text: self.stream_text,
            logprobs: self.logprobs,
            user_data: self.user_data,
        };
        params.validate().map_err(|_| invalid)?;
        Ok(params)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_round_trip_through_the_c_struct() {
        let c = nerva_generate_default_params();
        // SAFETY: the default holds NULL lists with zero counts.
        let back = unsafe { c.into_rust() }.expect("defaults are valid");
        assert_eq!(back, GenerateParams::default());
    }

    #[test]
    fn out_of_range_fields_and_bad_lists_are_refused() {
        let bad = |edit: &dyn Fn(&mut nerva_generate_params)| {
            let mut p = nerva_generate_default_params();
            edit(&mut p);
            // SAFETY: every list pointer below is NULL or points to live, terminated data.
            unsafe { p.into_rust() }.err()
        };
        let invalid = Some(nerva_status::NERVA_E_INVALID_ARGUMENT);
        assert_eq!(bad(&|p| p.max_tokens = 0), invalid);
        assert_eq!(bad(&|p| p.temperature = f32::NAN), invalid);
        assert_eq!(bad(&|p| p.top_p = 0.0), invalid);
        assert_eq!(bad(&|p| p.n_samples = 70_000), invalid);
        assert_eq!(bad(&|p| p.top_logprobs = 300), invalid);
        assert_eq!(bad(&|p| p.priority = 128), invalid);
        assert_eq!(bad(&|p| p.n_stop_strings = 1), invalid);
        assert_eq!(bad(&|p| p.n_stop_token_ids = 2), invalid);
        let null_entry = [core::ptr::null::<c_char>()];
        assert_eq!(
            bad(&|p| {
                p.stop_strings = null_entry.as_ptr();
                p.n_stop_strings = 1;
            }),
            invalid
        );
        let not_utf8 = [c"\xff".as_ptr()];
        assert_eq!(
            bad(&|p| {
                p.stop_strings = not_utf8.as_ptr();
                p.n_stop_strings = 1;
            }),
            invalid
        );
        let empty = [c"".as_ptr()];
        assert_eq!(
            bad(&|p| {
                p.stop_strings = empty.as_ptr();
                p.n_stop_strings = 1;
            }),
            invalid
        );
    }

    #[test]
    fn stop_lists_are_copied() {
        let strings = [c"\n\n".as_ptr(), c"END".as_ptr()];
        let ids = [7u32, 9];
        let mut p = nerva_generate_default_params();
        p.stop_strings = strings.as_ptr();
        p.n_stop_strings = strings.len();
        p.stop_token_ids = ids.as_ptr();
        p.n_stop_token_ids = ids.len();
        // SAFETY: both lists point to live arrays of the stated lengths.
        let rust = unsafe { p.into_rust() }.expect("valid");
        assert_eq!(rust.stop_strings, ["\n\n", "END"]);
        assert_eq!(rust.stop_token_ids, [7, 9]);
    }
}
