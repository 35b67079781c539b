//! Property tests: random sequences of ring operations against a `VecDeque` model, single
//! threaded (so the model is exact), across many wrap-arounds; plus descriptor/completion
//! decoding of arbitrary bytes.
#![cfg(not(loom))]

use std::collections::VecDeque;

use nerva_rings::{
    Completion, Descriptor, Extension, ExtensionView, GenerateFlags, GenerateRequest, PromptKind,
    PushError, SamplingParams, SpscRing,
};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Push(u64),
    PushSlice(Vec<u64>),
    Stage(u64),
    Commit,
    Pop,
    PopSlice(usize),
    Consume(usize),
    FreeSlots,
    Available,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => any::<u64>().prop_map(Op::Push),
        2 => proptest::collection::vec(any::<u64>(), 0..12).prop_map(Op::PushSlice),
        2 => any::<u64>().prop_map(Op::Stage),
        1 => Just(Op::Commit),
        4 => Just(Op::Pop),
        2 => (0usize..12).prop_map(Op::PopSlice),
        2 => (0usize..12).prop_map(Op::Consume),
        1 => Just(Op::FreeSlots),
        1 => Just(Op::Available),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: if cfg!(debug_assertions) { 256 } else { 2048 },
        ..ProptestConfig::default()
    })]

    #[test]
    fn ring_matches_vecdeque_model(
        capacity_log2 in 0u32..4,
        ops in proptest::collection::vec(op(), 1..300),
    ) {
        let capacity = 1u32 << capacity_log2;
        let cap = capacity as usize;
        let (mut p, mut c) = SpscRing::<u64>::with_capacity(capacity).expect("ring");
        // Published entries the consumer may read, and staged ones it may not yet.
        let mut published: VecDeque<u64> = VecDeque::new();
        let mut staged: Vec<u64> = Vec::new();
        for op in ops {
            let used = published.len() + staged.len();
            match op {
                Op::Push(v) => {
                    let r = p.push(v);
                    if used < cap {
                        prop_assert_eq!(r, Ok(()));
                        published.extend(staged.drain(..));
                        published.push_back(v);
                    } else {
                        prop_assert_eq!(r, Err(PushError::Full(v)));
                    }
                }
                Op::PushSlice(vs) => {
                    let n = p.push_slice(&vs).expect("no corruption");
                    prop_assert_eq!(n, vs.len().min(cap - used));
                    published.extend(staged.drain(..));
                    published.extend(vs[..n].iter().copied());
                }
                Op::Stage(v) => {
                    let r = p.stage(v);
                    if used < cap {
                        prop_assert_eq!(r, Ok(()));
                        staged.push(v);
                    } else {
                        prop_assert_eq!(r, Err(PushError::Full(v)));
                    }
                    prop_assert_eq!(p.staged() as usize, staged.len());
                }
                Op::Commit => {
                    p.commit();
                    published.extend(staged.drain(..));
                }
                Op::Pop => {
                    prop_assert_eq!(c.pop().expect("no corruption"), published.pop_front());
                }
                Op::PopSlice(n) => {
                    let mut out = vec![0u64; n];
                    let got = c.pop_slice(&mut out).expect("no corruption");
                    prop_assert_eq!(got, n.min(published.len()));
                    let expected: Vec<u64> = published.drain(..got).collect();
                    prop_assert_eq!(&out[..got], &expected[..]);
                }
                Op::Consume(n) => {
                    let mut seen = Vec::new();
                    let got = c.consume(n, |v| seen.push(v)).expect("no corruption");
                    prop_assert_eq!(got, n.min(published.len()));
                    let expected: Vec<u64> = published.drain(..got).collect();
                    prop_assert_eq!(seen, expected);
                }
                Op::FreeSlots => {
                    prop_assert_eq!(p.free_slots().expect("ok") as usize, cap - used);
                }
                Op::Available => {
                    prop_assert_eq!(c.available().expect("ok") as usize, published.len());
                }
            }
        }
    }

    #[test]
    fn arbitrary_descriptor_bytes_never_panic(bytes in proptest::array::uniform32(any::<u8>()),
                                              more in proptest::array::uniform32(any::<u8>())) {
        let mut raw = [0u8; 64];
        raw[..32].copy_from_slice(&bytes);
        raw[32..].copy_from_slice(&more);
        let d = Descriptor::from_bytes(&raw);
        prop_assert_eq!(d.to_bytes(), raw);
        if let Ok(request) = d.validate() {
            let _ = request.check_regions(u64::from(u32::MAX), 4096);
            // A valid descriptor re-encodes to itself.
            let again = Descriptor::from_request(&request).expect("valid encodes");
            prop_assert_eq!(again.to_bytes(), raw);
        }
    }

    #[test]
    fn arbitrary_completion_bytes_never_panic(bytes in proptest::array::uniform32(any::<u8>()),
                                              more in proptest::array::uniform32(any::<u8>())) {
        let mut raw = [0u8; 64];
        raw[..32].copy_from_slice(&bytes);
        raw[32..].copy_from_slice(&more);
        let c = Completion::from_bytes(&raw);
        prop_assert_eq!(c.to_bytes(), raw);
        let _ = c.event();
        let _ = format!("{c:?}");
    }

    #[test]
    fn valid_generate_requests_round_trip(
        tag in any::<u64>(),
        kind in 0u8..3,
        offset in any::<u32>(),
        len in 1u32..1_000_000,
        max_tokens in 1u32..100_000,
        temperature in 0.0f32..10.0,
        top_k in any::<u32>(),
        top_p in 0.001f32..=1.0,
        min_p in 0.0f32..=1.0,
        repetition_penalty in 0.01f32..10.0,
        seed in any::<u64>(),
        n_samples in 1u16..=64,
        priority in any::<i8>(),
        flags in 0u16..8,
    ) {
        let prompt_kind = PromptKind::from_u8(kind).expect("kind");
        let len = if prompt_kind == PromptKind::TokenIds { len * 4 } else { len };
        let request = GenerateRequest {
            max_tokens,
            sampling: SamplingParams { temperature, top_k, top_p, min_p, repetition_penalty, seed },
            n_samples,
            priority,
            flags: GenerateFlags::from_bits(flags).expect("defined bits"),
            ..GenerateRequest::new(tag, prompt_kind, nerva_rings::ByteRange::new(offset, len))
        };
        let d = Descriptor::generate(&request).expect("valid");
        prop_assert_eq!(d.validate(), Ok(nerva_rings::Request::Generate(request)));
    }

    #[test]
    fn extension_round_trips_and_garbage_never_panics(
        stop_token_ids in proptest::collection::vec(any::<u32>(), 0..64),
        stop_strings in proptest::collection::vec("[a-zé✓\\n ]{1,20}", 0..16),
        presence in -2.0f32..=2.0,
        frequency in -2.0f32..=2.0,
        top_logprobs in 0u8..=20,
        ignore_eos in any::<bool>(),
        garbage in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        let ext = Extension {
            stop_token_ids, stop_strings,
            presence_penalty: presence, frequency_penalty: frequency, top_logprobs, ignore_eos,
        };
        let bytes = ext.encode().expect("valid");
        prop_assert_eq!(ExtensionView::parse(&bytes).expect("parses").to_owned(), ext);
        let _ = ExtensionView::parse(&garbage);
        // Corrupt one byte of a valid block: parse returns Ok or Err, never panics.
        let mut corrupted = bytes.clone();
        if !corrupted.is_empty() {
            let i = garbage.first().map_or(0, |&g| usize::from(g)) % corrupted.len();
            corrupted[i] ^= 0x5a;
            let _ = ExtensionView::parse(&corrupted);
        }
    }
}
