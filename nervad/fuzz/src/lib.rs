//! The harness behind the `descriptor` fuzz target: feed one 64-byte descriptor and the bytes of
//! an input region through the checks the daemon runs on client-written memory, in the daemon's
//! order (copy once, validate the copy, check ranges against the region sizes, copy the ranges
//! out, decode them with the daemon's own `server::intake::decode_generate`), and assert the
//! properties the daemon relies on. A finding is a panic.
//!
//! The same function runs on stable in CI for a fixed set of generated inputs
//! (`tests/tests/c_fuzz_descriptor.rs` includes this file), so it uses nothing but
//! `nerva_rings`, `nervad` and `std`.

use std::time::Instant;

use nerva_rings::{
    AdminQuery, Descriptor, DescriptorError, Extension, ExtensionView, PromptKind, Request,
    StatusCode,
};
use nervad::engine::api::{ClientId, Prompt};
use nervad::server::intake::{AdminInput, decode_admin_input, decode_generate};

/// Bytes of the output region the harness pretends the segment has (admin replies point into
/// it; nothing is read from it, only ranges are checked).
pub const OUTPUT_REGION_BYTES: u64 = 1 << 16;

/// Bytes of an encoded descriptor.
pub const DESCRIPTOR_BYTES: usize = 64;

/// How far an input got; the stable test counts these to prove it reaches every stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Fewer than 64 bytes: not a descriptor.
    TooShort,
    /// `Descriptor::validate` refused it with this wire status.
    Refused(StatusCode),
    /// Valid descriptor whose ranges fall outside the regions (this status).
    OutOfRange(StatusCode),
    /// A valid `NOP`, `CANCEL` or `ADMIN` without input.
    Control,
    /// A valid `TOKENIZE` / `DETOKENIZE` whose input was copied and decoded by the daemon's
    /// own `decode_admin_input`: `Ok` or the status of its refusal.
    AdminInput {
        /// Which query.
        query: AdminQuery,
        /// The intake's verdict.
        intake: Result<(), StatusCode>,
    },
    /// A valid `GENERATE` whose prompt bytes were copied and decoded.
    Generate {
        /// The prompt kind.
        kind: PromptKind,
        /// The prompt decoded (UTF-8 text / whole token ids).
        prompt_decoded: bool,
        /// `None` without an extension block; else whether it parsed.
        extension: Option<bool>,
        /// The daemon's intake: `Ok` (an engine request) or the status of its refusal.
        intake: Result<(), StatusCode>,
    },
}

/// Run one input: `data[..64]` is the descriptor, `data[64..]` the input region.
pub fn check_descriptor(data: &[u8]) -> Outcome {
    let Some((head, input)) = data.split_first_chunk::<DESCRIPTOR_BYTES>() else {
        return Outcome::TooShort;
    };
    // The daemon's first step: one copy of the slot into private memory.
    let descriptor = Descriptor::from_bytes(head);
    let request = match descriptor.validate() {
        Ok(request) => request,
        Err(error) => return Outcome::Refused(refusal_status(&error)),
    };
    check_canonical(head, &request);

    let input_len = input.len() as u64;
    if let Err(error) = request.check_regions(input_len, OUTPUT_REGION_BYTES) {
        return Outcome::OutOfRange(refusal_status(&error));
    }
    if let Request::Admin {
        query,
        input: Some(range),
        options,
        ..
    } = request
    {
        let bytes = input
            .get(range.as_usize_range())
            .expect("an admin input range that passed check_regions lies inside the input region");
        assert!(!bytes.is_empty(), "empty admin input passed validation");
        let intake = match decode_admin_input(query, options, bytes) {
            Ok(AdminInput::Text(text, _)) => {
                assert_eq!(query, AdminQuery::Tokenize);
                assert_eq!(text.as_bytes(), bytes, "text decoded from other bytes");
                Ok(())
            }
            Ok(AdminInput::Ids(ids, _)) => {
                assert_eq!(query, AdminQuery::Detokenize);
                assert_eq!(ids.len() * 4, bytes.len(), "ids decoded from other bytes");
                Ok(())
            }
            Err(rejection) => {
                let allowed = match query {
                    AdminQuery::Tokenize => StatusCode::InvalidUtf8,
                    _ => StatusCode::MisalignedTokenIds,
                };
                assert_eq!(rejection.status, allowed, "{query:?}: {rejection:?}");
                Err(rejection.status)
            }
        };
        return Outcome::AdminInput { query, intake };
    }
    let Request::Generate(generate) = request else {
        return Outcome::Control;
    };
    // Ranges passed `check_regions`: slicing must be in bounds (a panic here is a finding).
    let prompt = input
        .get(generate.prompt.as_usize_range())
        .expect("a prompt range that passed check_regions lies inside the input region");
    let prompt_decoded = match generate.prompt_kind {
        PromptKind::Text | PromptKind::ChatJson => core::str::from_utf8(prompt).is_ok(),
        PromptKind::TokenIds => {
            // validate() guarantees whole ids.
            assert_eq!(
                prompt.len() % 4,
                0,
                "token-id prompt of partial ids passed validation"
            );
            let ids = prompt
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]));
            ids.count() == prompt.len() / 4
        }
    };
    let block = match generate.extension {
        Some(range) => input
            .get(range.as_usize_range())
            .expect("an extension range that passed check_regions lies inside the input region"),
        None => &[],
    };
    let extension = generate.extension.map(|_| check_extension(block));
    let intake = check_intake(&generate, prompt, block, prompt_decoded, extension);
    Outcome::Generate {
        kind: generate.prompt_kind,
        prompt_decoded,
        extension,
        intake,
    }
}

/// The daemon's decoding of the copied bytes into an engine request: it must agree with the
/// descriptor and with the wire-level checks above, and refuse only with the statuses that
/// belong to this stage.
fn check_intake(
    wire: &nerva_rings::GenerateRequest,
    prompt: &[u8],
    block: &[u8],
    prompt_decoded: bool,
    extension: Option<bool>,
) -> Result<(), StatusCode> {
    let client = ClientId {
        slot: 3,
        generation: 1,
    };
    match decode_generate(client, wire, prompt, block, Instant::now()) {
        Ok((request, flags)) => {
            assert!(
                prompt_decoded,
                "intake accepted a prompt that does not decode"
            );
            assert_ne!(
                extension,
                Some(false),
                "intake accepted a malformed extension"
            );
            assert_eq!(request.key.client, client);
            assert_eq!(request.key.tag, wire.tag);
            assert_eq!(request.max_tokens, wire.max_tokens);
            assert_eq!(request.n_samples, wire.n_samples);
            assert_eq!(flags, wire.flags);
            match (&request.prompt, wire.prompt_kind) {
                (Prompt::Text(text), PromptKind::Text)
                | (Prompt::Chat(text), PromptKind::ChatJson) => {
                    assert_eq!(text.as_bytes(), prompt)
                }
                (Prompt::Tokens(ids), PromptKind::TokenIds) => {
                    assert_eq!(ids.len() * 4, prompt.len())
                }
                (decoded, kind) => panic!("{kind:?} prompt decoded as {decoded:?}"),
            }
            Ok(())
        }
        Err(rejection) => {
            assert!(
                matches!(
                    rejection.status,
                    StatusCode::EmptyPrompt
                        | StatusCode::InvalidUtf8
                        | StatusCode::MisalignedTokenIds
                        | StatusCode::BadChatMessages
                        | StatusCode::BadExtension
                ),
                "intake refused with a status of another stage: {rejection:?}"
            );
            if rejection.status == StatusCode::BadExtension {
                assert_eq!(extension, Some(false), "a parsable extension was refused");
            }
            assert!(!rejection.detail.is_empty());
            Err(rejection.status)
        }
    }
}

/// The wire status the daemon would send for a refusal: a known, non-OK code, and the error
/// must render (the daemon logs it).
fn refusal_status(error: &DescriptorError) -> StatusCode {
    let status = error.status();
    assert_ne!(status, StatusCode::Ok, "{error:?} maps to OK");
    assert_eq!(StatusCode::from_u16(status.as_u16()), Some(status));
    assert!(!error.to_string().is_empty());
    status
}

/// A valid descriptor has exactly one encoding: re-encoding what `validate` returned gives the
/// same 64 bytes (nothing a client sets can be silently ignored) and validates to the same
/// request.
fn check_canonical(bytes: &[u8; DESCRIPTOR_BYTES], request: &Request) {
    let again = Descriptor::from_request(request).expect("a validated request re-encodes");
    assert_eq!(
        &again.to_bytes(),
        bytes,
        "validate() accepted a non-canonical descriptor: {request:?}"
    );
    assert_eq!(again.validate().as_ref(), Ok(request));
}

/// Parse an extension block; when it parses, its owned form must survive encode → parse.
fn check_extension(block: &[u8]) -> bool {
    let Ok(view) = ExtensionView::parse(block) else {
        return false;
    };
    let owned: Extension = view.to_owned();
    assert_eq!(view.stop_token_ids().count(), owned.stop_token_ids.len());
    let encoded = owned.encode().expect("a parsed extension re-encodes");
    let reparsed = ExtensionView::parse(&encoded).expect("a re-encoded extension parses");
    assert_eq!(
        reparsed.to_owned(),
        owned,
        "extension changed through encode/parse"
    );
    true
}
