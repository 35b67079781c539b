//! Turning a client's validated `GENERATE` descriptor plus the bytes copied out of its input
//! region into an engine request. Pure functions over private copies, so they can be fuzzed
//! (`nervad/fuzz`) without a segment.

use std::time::Instant;

use nerva_rings::descriptor::GenerateRequest as WireGenerate;
use nerva_rings::{ExtensionView, GenerateFlags, PromptKind, StatusCode};

use crate::engine::api::{
    ClientId, GenerateRequest, Prompt, RequestError, RequestKey, SamplingParams, StopConditions,
};

/// A request refused before it reached the engine: the status for the ERROR completion and a
/// short detail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// Wire status code.
    pub status: StatusCode,
    /// Short human detail (the completion carries up to 44 bytes of it).
    pub detail: String,
}

impl Rejection {
    fn new(status: StatusCode, detail: impl Into<String>) -> Self {
        Rejection {
            status,
            detail: detail.into(),
        }
    }
}

/// Build the engine request from a descriptor that passed `Descriptor::validate` and
/// `Request::check_regions`, with `prompt` and `extension` the bytes copied out of the input
/// region at the descriptor's ranges (`extension` empty when the descriptor has none).
pub fn decode_generate(
    client: ClientId,
    wire: &WireGenerate,
    prompt: &[u8],
    extension: &[u8],
    received_at: Instant,
) -> Result<(GenerateRequest, GenerateFlags), Rejection> {
    if prompt.is_empty() {
        return Err(Rejection::new(StatusCode::EmptyPrompt, "empty prompt"));
    }
    let prompt = match wire.prompt_kind {
        PromptKind::Text => Prompt::Text(
            std::str::from_utf8(prompt)
                .map_err(|e| Rejection::new(StatusCode::InvalidUtf8, format!("prompt: {e}")))?
                .to_owned(),
        ),
        PromptKind::TokenIds => {
            if !prompt.len().is_multiple_of(4) {
                return Err(Rejection::new(
                    StatusCode::MisalignedTokenIds,
                    "token ids are 4 bytes each",
                ));
            }
            Prompt::Tokens(
                prompt
                    .chunks_exact(4)
                    .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            )
        }
        PromptKind::ChatJson => {
            let text = std::str::from_utf8(prompt)
                .map_err(|e| Rejection::new(StatusCode::InvalidUtf8, format!("chat: {e}")))?;
            check_chat_messages(text)?;
            Prompt::Chat(text.to_owned())
        }
    };
    let mut sampling = SamplingParams {
        temperature: wire.sampling.temperature,
        top_k: wire.sampling.top_k,
        top_p: wire.sampling.top_p,
        min_p: wire.sampling.min_p,
        repetition_penalty: wire.sampling.repetition_penalty,
        seed: wire.sampling.seed,
        ..SamplingParams::default()
    };
    let mut stop = StopConditions::default();
    if wire.extension.is_some() {
        let ext = ExtensionView::parse(extension)
            .map_err(|e| Rejection::new(StatusCode::BadExtension, format!("{e:?}")))?;
        sampling.presence_penalty = ext.presence_penalty;
        sampling.frequency_penalty = ext.frequency_penalty;
        sampling.top_logprobs = ext.top_logprobs;
        stop.ignore_eos = ext.ignore_eos;
        stop.stop_token_ids = ext.stop_token_ids().collect();
        stop.stop_strings = ext.stop_strings().map(str::to_owned).collect();
    }
    let request = GenerateRequest {
        key: RequestKey {
            client,
            tag: wire.tag,
        },
        prompt,
        sampling,
        max_tokens: wire.max_tokens,
        stop,
        n_samples: wire.n_samples,
        // Wire priority is signed around 0 ("normal"); the engine's is unsigned around 128.
        priority: (i16::from(wire.priority) + 128) as u8,
        received_at,
    };
    Ok((request, wire.flags))
}

/// The input of a `TOKENIZE` / `DETOKENIZE` admin query, decoded from the bytes copied out of
/// the input region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminInput<'a> {
    /// Text to tokenize; whether to add special tokens.
    Text(&'a str, bool),
    /// Ids to detokenize; whether to skip special tokens.
    Ids(Vec<u32>, bool),
}

/// Decode a `TOKENIZE` / `DETOKENIZE` input (a private copy of the client's bytes). Refuses
/// text that is not UTF-8 (with the offset) and id bytes that are not whole `u32`s. Pure, so
/// the descriptor fuzz harness runs it too.
pub fn decode_admin_input(
    query: nerva_rings::AdminQuery,
    options: nerva_rings::AdminOptions,
    bytes: &[u8],
) -> Result<AdminInput<'_>, Rejection> {
    use nerva_rings::{AdminOptions, AdminQuery};
    match query {
        AdminQuery::Tokenize => {
            let text = std::str::from_utf8(bytes).map_err(|e| {
                Rejection::new(
                    StatusCode::InvalidUtf8,
                    format!("text is not UTF-8 at byte {}", e.valid_up_to()),
                )
            })?;
            Ok(AdminInput::Text(
                text,
                options.contains(AdminOptions::ADD_SPECIAL_TOKENS),
            ))
        }
        AdminQuery::Detokenize => {
            if !bytes.len().is_multiple_of(4) {
                return Err(Rejection::new(
                    StatusCode::MisalignedTokenIds,
                    format!("{} bytes are not whole u32 ids", bytes.len()),
                ));
            }
            Ok(AdminInput::Ids(
                bytes
                    .chunks_exact(4)
                    .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
                options.contains(AdminOptions::SKIP_SPECIAL_TOKENS),
            ))
        }
        other => Err(Rejection::new(
            StatusCode::BadAdminQuery,
            format!("admin query {other:?} takes no input"),
        )),
    }
}

/// Chat prompts must be a JSON array of objects with string `role` and `content`.
fn check_chat_messages(text: &str) -> Result<(), Rejection> {
    let bad = |why: &str| Rejection::new(StatusCode::BadChatMessages, why);
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|_| bad("chat prompt is not JSON"))?;
    let messages = value
        .as_array()
        .ok_or_else(|| bad("chat prompt must be an array"))?;
    if messages.is_empty() {
        return Err(bad("no chat messages"));
    }
    for m in messages {
        let ok = m.get("role").is_some_and(|r| r.is_string())
            && m.get("content").is_some_and(|c| c.is_string());
        if !ok {
            return Err(bad("each message needs string role and content"));
        }
    }
    Ok(())
}

/// The wire status for an engine refusal.
pub fn status_for(error: &RequestError, prompt_was_chat: bool) -> StatusCode {
    match error {
        RequestError::InvalidPrompt(_) if prompt_was_chat => StatusCode::BadChatMessages,
        RequestError::InvalidPrompt(_) => StatusCode::EmptyPrompt,
        RequestError::TooLong { .. } => StatusCode::PromptTooLong,
        RequestError::TooManySamples { .. } => StatusCode::BadSampleCount,
        RequestError::BadToken(_) => StatusCode::TokenOutOfVocab,
        RequestError::InvalidParameter(name) => match *name {
            "temperature" => StatusCode::BadTemperature,
            "top_p" => StatusCode::BadTopP,
            "min_p" => StatusCode::BadMinP,
            "repetition_penalty" => StatusCode::BadRepetitionPenalty,
            "n_samples" => StatusCode::BadSampleCount,
            "max_tokens" => StatusCode::BadMaxTokens,
            _ => StatusCode::BadExtension,
        },
        RequestError::DuplicateTag => StatusCode::DuplicateTag,
        RequestError::Busy => StatusCode::Overloaded,
        RequestError::NoChatTemplate => StatusCode::BadChatMessages,
        RequestError::Backend(_) => StatusCode::Internal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nerva_rings::{ByteRange, Extension};

    fn client() -> ClientId {
        ClientId {
            slot: 1,
            generation: 2,
        }
    }

    #[test]
    fn decodes_each_prompt_kind_and_the_extension() {
        let mut wire = WireGenerate::new(9, PromptKind::Text, ByteRange::new(0, 5));
        let ext = Extension {
            stop_strings: vec!["end".into()],
            stop_token_ids: vec![7],
            presence_penalty: 0.5,
            ignore_eos: true,
            ..Default::default()
        }
        .encode()
        .expect("encodes");
        wire.extension = Some(ByteRange::new(5, ext.len() as u32));
        let (req, _) =
            decode_generate(client(), &wire, b"hello", &ext, Instant::now()).expect("ok");
        assert_eq!(req.prompt, Prompt::Text("hello".into()));
        assert_eq!(req.stop.stop_strings, vec!["end".to_string()]);
        assert_eq!(req.stop.stop_token_ids, vec![7]);
        assert!(req.stop.ignore_eos);
        assert_eq!(req.sampling.presence_penalty, 0.5);
        assert_eq!(req.priority, 128);

        wire.extension = None;
        wire.prompt_kind = PromptKind::TokenIds;
        let ids: Vec<u8> = [1u32, 2, 3].iter().flat_map(|i| i.to_le_bytes()).collect();
        let (req, _) = decode_generate(client(), &wire, &ids, &[], Instant::now()).expect("ok");
        assert_eq!(req.prompt, Prompt::Tokens(vec![1, 2, 3]));
    }

    #[test]
    fn rejects_bad_bytes_with_specific_codes() {
        let mut wire = WireGenerate::new(9, PromptKind::Text, ByteRange::new(0, 2));
        let e = decode_generate(client(), &wire, &[0xff, 0xfe], &[], Instant::now()).unwrap_err();
        assert_eq!(e.status, StatusCode::InvalidUtf8);
        wire.prompt_kind = PromptKind::ChatJson;
        let e = decode_generate(client(), &wire, b"{}", &[], Instant::now()).unwrap_err();
        assert_eq!(e.status, StatusCode::BadChatMessages);
        wire.prompt_kind = PromptKind::Text;
        wire.extension = Some(ByteRange::new(2, 3));
        let e = decode_generate(client(), &wire, b"hi", &[1, 2, 3], Instant::now()).unwrap_err();
        assert_eq!(e.status, StatusCode::BadExtension);
    }
}
