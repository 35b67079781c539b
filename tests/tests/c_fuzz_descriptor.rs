//! The `descriptor` fuzz target's harness (`nervad/fuzz/src/lib.rs`) on stable, for CI:
//! 100,000 deterministic inputs, three quarters of them valid descriptors and data areas with
//! one to four hostile edits (so they reach the deep checks), one quarter raw random bytes.
//! Any panic in the harness is a finding. The test also fails if the generator stops reaching
//! a stage of the validation path, so it cannot pass by testing nothing.
//!
//! Coverage-guided fuzzing of the same function: see `nervad/fuzz/README.md`.

#[path = "../../nervad/fuzz/src/lib.rs"]
mod harness;

use std::collections::{BTreeMap, HashSet};

use harness::{DESCRIPTOR_BYTES, Outcome, check_descriptor};
use nerva_rings::{
    AdminOptions, AdminQuery, ByteRange, Descriptor, Extension, GenerateFlags, GenerateRequest,
    PromptKind, SamplingParams, StatusCode,
};
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

const INPUTS: usize = 100_000;

fn random_bytes(rng: &mut ChaCha8Rng, len: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    rng.fill_bytes(&mut bytes);
    bytes
}

fn ascii(rng: &mut ChaCha8Rng, len: usize) -> Vec<u8> {
    (0..len).map(|_| rng.random_range(b' '..=b'~')).collect()
}

fn random_extension(rng: &mut ChaCha8Rng) -> Extension {
    Extension {
        stop_token_ids: (0..rng.random_range(0..5)).map(|_| rng.random()).collect(),
        stop_strings: (0..rng.random_range(0..4))
            .map(|_| {
                let len = rng.random_range(1..12);
                String::from_utf8(ascii(rng, len)).expect("ASCII")
            })
            .collect(),
        presence_penalty: rng.random_range(-2.0..=2.0),
        frequency_penalty: rng.random_range(-2.0..=2.0),
        top_logprobs: rng.random_range(0..=20),
        ignore_eos: rng.random(),
    }
}

/// A descriptor the daemon accepts, followed by a consistent input region.
fn valid_input(rng: &mut ChaCha8Rng) -> Vec<u8> {
    let tag = rng.random();
    let input_len = rng.random_range(0..1024);
    let mut input = random_bytes(rng, input_len);
    let descriptor = match rng.random_range(0..9) {
        0 => Descriptor::nop(tag, rng.random()),
        1 => Descriptor::cancel(tag),
        8 => {
            // TOKENIZE / DETOKENIZE with their input in the input region: text (sometimes cut
            // inside a code point) or ids (sometimes not whole).
            let (query, bytes) = if rng.random_bool(0.5) {
                let mut text = "héllo wörld ".repeat(rng.random_range(1..8)).into_bytes();
                let cut = rng.random_range(1..=text.len());
                text.truncate(cut);
                (AdminQuery::Tokenize, text)
            } else {
                let len = 4 * rng.random_range(1..32) + usize::from(rng.random_bool(0.1));
                (AdminQuery::Detokenize, random_bytes(rng, len))
            };
            let at = input.len();
            input.extend_from_slice(&bytes);
            let options = AdminOptions::from_bits(rng.random_range(0..=AdminOptions::ALL.bits()))
                .expect("defined bits");
            Descriptor::admin_with_input(
                tag,
                query,
                ByteRange::new(rng.random_range(0..4096), rng.random_range(1..4096)),
                ByteRange::new(at as u32, bytes.len() as u32),
                options,
            )
        }
        2 => {
            let query = AdminQuery::from_u8(rng.random_range(0..5)).expect("known query");
            let offset = rng.random_range(0..4096);
            Descriptor::admin(
                tag,
                query,
                ByteRange::new(offset, rng.random_range(1..4096)),
            )
        }
        _ => {
            let kind = PromptKind::from_u8(rng.random_range(0..3)).expect("known kind");
            let prompt_len = rng.random_range(1..256);
            let prompt = match kind {
                PromptKind::TokenIds => random_bytes(rng, 4 * (prompt_len / 4 + 1)),
                PromptKind::Text => ascii(rng, prompt_len),
                PromptKind::ChatJson => br#"[{"role":"user","content":"hi"}]"#.to_vec(),
            };
            let prompt_at = input.len();
            input.extend_from_slice(&prompt);
            let mut request = GenerateRequest::new(
                tag,
                kind,
                ByteRange::new(prompt_at as u32, prompt.len() as u32),
            );
            request.max_tokens = rng.random_range(1..4096);
            request.sampling = SamplingParams {
                temperature: rng.random_range(0.0..2.0),
                top_k: rng.random_range(0..100),
                top_p: rng.random_range(0.01..=1.0),
                min_p: rng.random_range(0.0..=1.0),
                repetition_penalty: rng.random_range(0.5..2.0),
                seed: rng.random(),
            };
            request.n_samples = rng.random_range(1..=nerva_rings::MAX_SAMPLES);
            request.priority = rng.random();
            request.flags =
                GenerateFlags::from_bits(rng.random_range(0..=GenerateFlags::ALL.bits()))
                    .expect("defined bits");
            if rng.random_bool(0.6) {
                let block = random_extension(rng)
                    .encode()
                    .expect("valid extension encodes");
                let at = input.len();
                input.extend_from_slice(&block);
                request.extension = Some(ByteRange::new(at as u32, block.len() as u32));
            }
            Descriptor::generate(&request).expect("a valid request encodes")
        }
    };
    let mut data = descriptor.to_bytes().to_vec();
    data.extend_from_slice(&input);
    data
}

/// Values that sit on the edges of the checks, written over a 4-byte field.
fn interesting_word(rng: &mut ChaCha8Rng, data_len: usize) -> u32 {
    let input_len = data_len.saturating_sub(DESCRIPTOR_BYTES) as u32;
    let choices = [
        0,
        1,
        2,
        3,
        4,
        u32::MAX,
        0x8000_0000,
        0x7fff_ffff,
        input_len,
        input_len.wrapping_add(1),
        input_len.wrapping_sub(1),
        f32::NAN.to_bits(),
        f32::INFINITY.to_bits(),
        (-1.0f32).to_bits(),
        (-0.0f32).to_bits(),
        1.5f32.to_bits(),
    ];
    choices[rng.random_range(0..choices.len())]
}

/// One hostile edit, as a client that owns the memory could make it.
fn mutate(rng: &mut ChaCha8Rng, data: &mut Vec<u8>) {
    match rng.random_range(0..5) {
        0 => {
            let at = rng.random_range(0..data.len());
            data[at] ^= 1 << rng.random_range(0..8);
        }
        1 => {
            let at = rng.random_range(0..data.len());
            data[at] = rng.random();
        }
        2 | 3 => {
            // Descriptor fields and the extension header are 4-byte aligned words.
            let limit = data.len().min(DESCRIPTOR_BYTES + 2048) / 4;
            if limit == 0 {
                return;
            }
            let at = 4 * rng.random_range(0..limit);
            let word = interesting_word(rng, data.len());
            if let Some(field) = data.get_mut(at..at + 4) {
                field.copy_from_slice(&word.to_le_bytes());
            }
        }
        _ => {
            let keep = rng.random_range(0..=data.len());
            data.truncate(keep);
            if data.is_empty() {
                data.push(rng.random());
            }
        }
    }
}

#[test]
fn descriptor_harness_survives_100k_hostile_inputs_and_reaches_every_stage() {
    let mut rng = ChaCha8Rng::seed_from_u64(0x6e65_7276_615f_667a);
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    let mut refusals = HashSet::new();
    let mut range_refusals = HashSet::new();
    let (mut control, mut decoded, mut undecoded) = (0usize, 0usize, 0usize);
    let (mut ext_ok, mut ext_bad) = (0usize, 0usize);
    let mut intake_ok = 0usize;
    let mut intake_refusals = HashSet::new();
    let mut admin_inputs: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..INPUTS {
        let data = if i % 4 == 0 {
            let len = rng.random_range(0..DESCRIPTOR_BYTES + 256);
            random_bytes(&mut rng, len)
        } else {
            let mut data = valid_input(&mut rng);
            // Keep a few untouched: the valid path must be exercised as well.
            for _ in 0..rng.random_range(0..=4) {
                mutate(&mut rng, &mut data);
            }
            data
        };
        let outcome = check_descriptor(&data);
        match outcome {
            Outcome::Refused(status) => {
                refusals.insert(status);
            }
            Outcome::OutOfRange(status) => {
                range_refusals.insert(status);
            }
            Outcome::Control => control += 1,
            Outcome::AdminInput { query, intake } => {
                *admin_inputs
                    .entry(format!(
                        "{query:?}:{}",
                        intake.map_or_else(|s| s.name(), |()| "ok")
                    ))
                    .or_default() += 1;
            }
            Outcome::Generate {
                prompt_decoded,
                extension,
                intake,
                ..
            } => {
                match intake {
                    Ok(()) => intake_ok += 1,
                    Err(status) => {
                        intake_refusals.insert(status);
                    }
                }
                if prompt_decoded {
                    decoded += 1
                } else {
                    undecoded += 1
                }
                match extension {
                    Some(true) => ext_ok += 1,
                    Some(false) => ext_bad += 1,
                    None => {}
                }
            }
            Outcome::TooShort => {}
        }
        let key = match outcome {
            Outcome::Refused(s) => format!("refused:{}", s.name()),
            Outcome::OutOfRange(s) => format!("out_of_range:{}", s.name()),
            other => format!("{other:?}"),
        };
        *outcomes.entry(key).or_default() += 1;
    }
    eprintln!("{INPUTS} inputs through the descriptor harness:");
    for (outcome, count) in &outcomes {
        eprintln!("  {count:>6}  {outcome}");
    }

    // The generator must keep reaching every stage of the validation path.
    for status in [
        StatusCode::UnknownOpcode,
        StatusCode::UnsupportedVersion,
        StatusCode::ReservedFlags,
        StatusCode::ReservedNonZero,
        StatusCode::BadPromptKind,
        StatusCode::BadTemperature,
        StatusCode::BadTopP,
        StatusCode::BadRepetitionPenalty,
        StatusCode::BadSampleCount,
    ] {
        assert!(
            refusals.contains(&status),
            "no input was refused with {status:?}"
        );
    }
    for status in [
        StatusCode::PromptOutOfRange,
        StatusCode::ExtensionOutOfRange,
    ] {
        assert!(range_refusals.contains(&status), "no input hit {status:?}");
    }
    assert!(control > 1000, "only {control} valid NOP/CANCEL/ADMIN");
    assert!(
        decoded > 1000 && undecoded > 0,
        "prompts decoded {decoded}, refused {undecoded}"
    );
    assert!(
        intake_ok > 1000,
        "only {intake_ok} requests reached the engine side"
    );
    for status in [
        StatusCode::InvalidUtf8,
        StatusCode::BadChatMessages,
        StatusCode::BadExtension,
    ] {
        assert!(
            intake_refusals.contains(&status),
            "intake never refused with {status:?}"
        );
    }
    assert!(
        ext_ok > 1000 && ext_bad > 100,
        "extensions parsed {ext_ok}, refused {ext_bad}"
    );
    // Tokenize / detokenize inputs reach the daemon's decoding, both ways.
    for key in [
        "Tokenize:ok",
        "Tokenize:invalid_utf8",
        "Detokenize:ok",
        "Detokenize:misaligned_token_ids",
    ] {
        assert!(
            admin_inputs.get(key).is_some_and(|&n| n > 50),
            "admin input outcome {key} reached too rarely: {admin_inputs:?}"
        );
    }
    for status in [StatusCode::EmptyPrompt, StatusCode::ReservedNonZero] {
        assert!(
            refusals.contains(&status),
            "no input refused with {status:?}"
        );
    }
}
