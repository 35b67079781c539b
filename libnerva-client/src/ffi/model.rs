//! Asking the daemon about itself from C: the served model and its limits, and tokenize /
//! detokenize through the daemon's tokenizer (as `llama_n_vocab`, `llama_n_ctx`,
//! `llama_tokenize`, `llama_detokenize`).

use core::ffi::{c_char, c_int};

use super::boundary::{FfiResult, arg_out, arg_slice};
use super::client::{ClientState, nerva_client, with_client};
use super::status::nerva_status;
use crate::ModelInfo;

/// Bytes of `nerva_model_info.name` (including the terminating NUL).
pub const NERVA_MODEL_NAME_BYTES: usize = 256;
/// Bytes of the short text fields of `nerva_model_info` (including the terminating NUL).
pub const NERVA_MODEL_FIELD_BYTES: usize = 32;

/// What the daemon serves and the limits it enforces, filled by `nerva_client_model_info`.
/// Text fields are NUL-terminated UTF-8, cut at a character boundary if longer.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct nerva_model_info {
    /// Model name or path.
    pub name: [c_char; NERVA_MODEL_NAME_BYTES],
    /// Architecture, e.g. "Qwen3", "Llama".
    pub architecture: [c_char; NERVA_MODEL_FIELD_BYTES],
    /// Weight storage dtype: "bf16", "f16", "f32" ("none" for the test engine).
    pub dtype: [c_char; NERVA_MODEL_FIELD_BYTES],
    /// Vocabulary size: valid token ids are 0..vocab_size.
    pub vocab_size: u32,
    /// Longest sequence (prompt + max_tokens) the daemon serves.
    pub max_context: u32,
    /// Most sequences the daemon runs at once (`--max-batch`); `n_samples` may not exceed it.
    pub max_batch: u32,
    /// Most samples one request may ask for (NERVA_MAX_SAMPLES).
    pub max_samples: u32,
    /// Most stop strings per request.
    pub max_stop_strings: u32,
    /// Longest stop string in bytes.
    pub max_stop_string_bytes: u32,
    /// Most stop token ids per request.
    pub max_stop_token_ids: u32,
    /// Most top log-probabilities per token.
    pub max_top_logprobs: u32,
    /// Largest ring a client may ask for in `nerva_connect_options`.
    pub max_ring_entries: u32,
    /// Whether `nerva_client_tokenize` / `nerva_client_detokenize` are available.
    pub has_tokenizer: bool,
    /// Largest input area a client may ask for in `nerva_connect_options`.
    pub max_data_bytes: u64,
    /// This client's submission ring entries.
    pub sq_entries: u32,
    /// This client's completion ring entries.
    pub cq_entries: u32,
    /// This client's input area bytes.
    pub data_bytes: u64,
    /// This client's reply area bytes (largest tokenize / detokenize result).
    pub reply_bytes: u64,
}

/// Copy `text` into a fixed C field, NUL-terminated, cut at a character boundary.
fn fill<const N: usize>(field: &mut [c_char; N], text: &str) {
    let mut end = text.len().min(N - 1);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    for (dst, &src) in field.iter_mut().zip(&text.as_bytes()[..end]) {
        *dst = src as c_char;
    }
    field[end..].fill(0);
}

impl From<&ModelInfo> for nerva_model_info {
    fn from(m: &ModelInfo) -> Self {
        let mut out = nerva_model_info {
            name: [0; NERVA_MODEL_NAME_BYTES],
            architecture: [0; NERVA_MODEL_FIELD_BYTES],
            dtype: [0; NERVA_MODEL_FIELD_BYTES],
            vocab_size: m.vocab_size,
            max_context: m.max_context,
            max_batch: m.max_batch,
            max_samples: m.max_samples,
            max_stop_strings: m.max_stop_strings,
            max_stop_string_bytes: m.max_stop_string_bytes,
            max_stop_token_ids: m.max_stop_token_ids,
            max_top_logprobs: m.max_top_logprobs,
            max_ring_entries: m.max_ring_entries,
            has_tokenizer: m.has_tokenizer,
            max_data_bytes: m.max_data_bytes,
            sq_entries: m.sq_entries,
            cq_entries: m.cq_entries,
            data_bytes: m.data_bytes,
            reply_bytes: m.reply_bytes,
        };
        fill(&mut out.name, &m.name);
        fill(&mut out.architecture, &m.architecture);
        fill(&mut out.dtype, &m.dtype);
        out
    }
}

/// Ask the daemon what it serves: model, dtype, vocabulary, context, batch and request limits,
/// and this client's own sizes. One round trip (blocks up to 5 s; events that arrive meanwhile
/// are kept for the next poll).
///
/// Returns NERVA_OK, NERVA_E_INVALID_ARGUMENT (`out` NULL), NERVA_E_RING_FULL,
/// NERVA_E_TIMEOUT, NERVA_E_DAEMON_GONE, NERVA_E_PROTOCOL. `*out` is written only on success.
///
/// # Safety
/// `client` is a live handle; `out` is writable.
#[unsafe(no_mangle)]
#[must_use]
pub unsafe extern "C" fn nerva_client_model_info(
    client: *mut nerva_client,
    out: *mut nerva_model_info,
) -> c_int {
    let body = |state: &mut ClientState| -> FfiResult {
        // SAFETY: `out` is writable (caller's obligation).
        let out = unsafe { arg_out(out) }?;
        let info = state.client.model_info()?;
        *out = nerva_model_info::from(&info);
        Ok(())
    };
    // SAFETY: `client` is NULL or a live handle (caller's obligation).
    unsafe { with_client(client, body) }
}

/// Token ids of `text` through the daemon's tokenizer (as `llama_tokenize`).
/// `add_special`: add what a text prompt gets (e.g. BOS), so the count equals what a
/// generation of this text would process.
///
/// `ids`/`cap`: the output array; `*n_out` receives the number of ids. When they do not fit
/// (`*n_out` > `cap`), nothing is written to `ids`, `*n_out` is the count needed and the call
/// returns NERVA_E_TOO_LARGE: call again with a larger array. Empty text gives 0 ids.
///
/// Returns NERVA_OK, NERVA_E_INVALID_ARGUMENT (NULL, text not UTF-8), NERVA_E_TOO_LARGE,
/// NERVA_E_REJECTED (the engine has no tokenizer), NERVA_E_RING_FULL, NERVA_E_TIMEOUT,
/// NERVA_E_DAEMON_GONE.
///
/// # Safety
/// `client` is a live handle; `text` is readable for `text_len` bytes; `ids` is writable for
/// `cap` ids (may be NULL with `cap` 0); `n_out` is writable.
#[unsafe(no_mangle)]
#[must_use]
pub unsafe extern "C" fn nerva_client_tokenize(
    client: *mut nerva_client,
    text: *const c_char,
    text_len: usize,
    add_special: bool,
    ids: *mut u32,
    cap: usize,
    n_out: *mut usize,
) -> c_int {
    let body = |state: &mut ClientState| -> FfiResult {
        // SAFETY: `n_out` is writable (caller's obligation).
        let n_out = unsafe { arg_out(n_out) }?;
        *n_out = 0;
        // SAFETY: `text` is readable for `text_len` bytes (caller's obligation).
        let bytes = unsafe { arg_slice(text.cast::<u8>(), text_len) }?;
        let text =
            core::str::from_utf8(bytes).map_err(|_| nerva_status::NERVA_E_INVALID_ARGUMENT)?;
        if ids.is_null() && cap != 0 {
            return Err(nerva_status::NERVA_E_INVALID_ARGUMENT);
        }
        let tokens = state.client.tokenize(text, add_special)?;
        *n_out = tokens.len();
        if tokens.len() > cap {
            return Err(nerva_status::NERVA_E_TOO_LARGE);
        }
        if !tokens.is_empty() {
            if !ids.is_aligned() {
                return Err(nerva_status::NERVA_E_INVALID_ARGUMENT);
            }
            // SAFETY: `ids` is non-NULL (cap ≥ len > 0), aligned (checked) and writable for
            // `cap` ≥ `tokens.len()` ids (caller's obligation); the regions cannot overlap
            // (`tokens` is our own allocation).
            unsafe { core::ptr::copy_nonoverlapping(tokens.as_ptr(), ids, tokens.len()) };
        }
        Ok(())
    };
    // SAFETY: `client` is NULL or a live handle (caller's obligation).
    unsafe { with_client(client, body) }
}

/// Text of `ids` through the daemon's tokenizer (as `llama_detokenize`); `skip_special` leaves
/// special tokens out.
///
/// `buf`/`cap`: the output buffer; the text is written followed by a NUL, and `*len_out`
/// receives its length without the NUL. When it does not fit (`*len_out` + 1 > `cap`),
/// nothing is written, `*len_out` is the length needed (without the NUL) and the call returns
/// NERVA_E_TOO_LARGE.
///
/// Returns NERVA_OK, NERVA_E_INVALID_ARGUMENT (NULL), NERVA_E_TOO_LARGE, NERVA_E_REJECTED (an
/// id outside the vocabulary, or no tokenizer), NERVA_E_RING_FULL, NERVA_E_TIMEOUT,
/// NERVA_E_DAEMON_GONE.
///
/// # Safety
/// `client` is a live handle; `ids` is readable for `n_ids` ids; `buf` is writable for `cap`
/// bytes (may be NULL with `cap` 0); `len_out` is writable.
#[unsafe(no_mangle)]
#[must_use]
pub unsafe extern "C" fn nerva_client_detokenize(
    client: *mut nerva_client,
    ids: *const u32,
    n_ids: usize,
    skip_special: bool,
    buf: *mut c_char,
    cap: usize,
    len_out: *mut usize,
) -> c_int {
    let body = |state: &mut ClientState| -> FfiResult {
        // SAFETY: `len_out` is writable (caller's obligation).
        let len_out = unsafe { arg_out(len_out) }?;
        *len_out = 0;
        // SAFETY: `ids` is readable for `n_ids` ids (caller's obligation).
        let ids = unsafe { arg_slice(ids, n_ids) }?;
        if buf.is_null() && cap != 0 {
            return Err(nerva_status::NERVA_E_INVALID_ARGUMENT);
        }
        let text = state.client.detokenize(ids, skip_special)?;
        *len_out = text.len();
        if text.len() >= cap {
            return Err(nerva_status::NERVA_E_TOO_LARGE);
        }
        // SAFETY: `buf` is non-NULL (cap > len ≥ 0 means cap ≥ 1) and writable for `cap` >
        // `text.len()` bytes (caller's obligation); `text` is our own allocation.
        unsafe {
            core::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), text.len());
            *buf.add(text.len()) = 0;
        }
        Ok(())
    };
    // SAFETY: `client` is NULL or a live handle (caller's obligation).
    unsafe { with_client(client, body) }
}
