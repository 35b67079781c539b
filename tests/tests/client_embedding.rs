//! Embedding the client in an existing server, against a real daemon (`nervad-under-test`):
//!
//! 1. `libnerva-client/examples/event_loop.c`: one thread, one epoll loop, 8 clients, many
//!    requests, driven only by each client's readiness descriptor; compiled against
//!    `include/nerva.h` and run.
//! 2. The same from Rust: `Client::as_raw_fd` in an epoll set, `user_data` on every event.
//! 3. Asking the daemon about itself: model info, client sizing at connect within the
//!    daemon's bounds, tokenize / detokenize through the daemon's tokenizer (Rust and C).
//! 4. C: close while another thread sleeps in `nerva_client_wait` is defined.

mod c_support;

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::process::Command;
use std::ptr;
use std::time::{Duration, Instant};

use nerva_client::ffi::client::nerva_client as NervaClient;
use nerva_client::ffi::client::{
    nerva_client_close, nerva_client_connect_with, nerva_client_fd, nerva_client_wait,
    nerva_connect_default_options,
};
use nerva_client::ffi::model::{
    nerva_client_detokenize, nerva_client_model_info, nerva_client_tokenize, nerva_model_info,
};
use nerva_client::ffi::status::nerva_status;
use nerva_client::{
    Client, ConnectOptions, Error, EventRef, FinishReason, GenerateParams, Prompt, RingSizes,
    StatusCode,
};
use nerva_tests::daemon_harness::{Daemon, test_engine};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};

const DAEMON: &str = env!("CARGO_BIN_EXE_nervad-under-test");
const OK: i32 = nerva_status::NERVA_OK.code();

#[test]
fn event_loop_example_in_c_serves_eight_clients_from_one_epoll_thread() {
    let dir = c_support::scratch_dir("c-event-loop");
    let exe = dir.join("event_loop");
    c_support::compile_example("event_loop", &exe, &c_support::in_tree_flags());
    let daemon = Daemon::start(DAEMON, &[]);
    let (clients, requests, tokens) = (8, 12, 6);
    let out = Command::new(&exe)
        .arg(daemon.socket())
        .args([clients, requests, tokens].map(|n| n.to_string()))
        .output()
        .expect("run the example");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "event_loop.c failed:\n{stdout}\n{stderr}\n{}",
        daemon.log()
    );
    let total = clients * requests;
    assert!(
        stdout.contains(&format!("event_loop: {total} of {total} requests done")),
        "{stdout}"
    );
    for c in 0..clients {
        let line = format!(
            "client {c}: {requests} requests, {} tokens",
            requests * tokens
        );
        assert!(stdout.contains(&line), "missing {line:?} in:\n{stdout}");
    }
    eprintln!("{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn rust_clients_in_one_epoll_set_get_every_event_with_their_user_data() {
    let daemon = Daemon::start(DAEMON, &[]);
    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).expect("epoll");
    let mut clients: Vec<Client> = (0..4)
        .map(|_| Client::connect(Some(daemon.socket())).expect("connect"))
        .collect();
    let per_client = 5u64;
    // user_data → (tokens seen, done)
    let mut seen: HashMap<u64, (usize, bool)> = HashMap::new();
    for (i, client) in clients.iter_mut().enumerate() {
        epoll
            .add(
                client.as_fd(),
                EpollEvent::new(EpollFlags::EPOLLIN, i as u64),
            )
            .expect("epoll add");
        for r in 0..per_client {
            let user_data = 1000 * (i as u64 + 1) + r;
            let params = GenerateParams {
                max_tokens: 5,
                ignore_eos: true,
                seed: user_data,
                user_data,
                ..GenerateParams::default()
            };
            client
                .submit_generate(Prompt::Text("tell me"), &params)
                .expect("submit");
            seen.insert(user_data, (0, false));
        }
    }
    let mut events = [EpollEvent::empty(); 8];
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen.values().any(|(_, done)| !done) {
        assert!(Instant::now() < deadline, "not done in 60 s: {seen:?}");
        // No timeout-driven polling: if readiness were lost this wait would hang, and the
        // 10 s timeout turns that into a failure.
        let n = epoll
            .wait(&mut events, EpollTimeout::from(10_000u16))
            .expect("epoll_wait");
        assert!(n > 0, "no readiness in 10 s while requests are in flight");
        for ev in &events[..n] {
            let client = &mut clients[ev.data() as usize];
            // Poll until empty: that re-arms the descriptor.
            while client
                .poll_with(|e| {
                    let Some(user_data) = e.user_data() else {
                        return;
                    };
                    let entry = seen.get_mut(&user_data).expect("user_data of this test");
                    match e {
                        EventRef::Tokens { ids, logprobs, .. } => {
                            entry.0 += ids.len();
                            assert!(logprobs.is_empty(), "logprobs were not asked for");
                        }
                        EventRef::Done { reason, .. } => {
                            assert_eq!(reason, FinishReason::Length);
                            entry.1 = true;
                        }
                        EventRef::Error { detail, .. } => panic!("request failed: {detail}"),
                        _ => {}
                    }
                })
                .expect("poll")
                > 0
            {}
        }
    }
    assert!(seen.values().all(|&(tokens, _)| tokens == 5), "{seen:?}");
}

#[test]
fn model_info_sizing_and_tokenize_through_the_daemon() {
    let daemon = Daemon::start(DAEMON, &["--max-batch", "6", "--max-context", "128"]);
    let sizes = RingSizes {
        sq_entries: 16,
        cq_entries: 64,
        data_bytes: 64 << 10,
    };
    let mut client = Client::connect_with(&ConnectOptions {
        socket: Some(daemon.socket().to_path_buf()),
        sizes,
        ..ConnectOptions::default()
    })
    .expect("connect with sizes");
    let info = client.model_info().expect("model info");
    eprintln!("{info:?}");
    assert_eq!(
        (info.sq_entries, info.cq_entries, info.data_bytes),
        (16, 64, 64 << 10)
    );
    assert_eq!(info.max_samples, u32::from(nerva_client::MAX_SAMPLES));
    assert_eq!(info.max_stop_strings, 16);
    assert!(info.max_ring_entries >= 1024 && info.max_data_bytes >= 1 << 20);
    assert!(info.max_context > 0 && info.vocab_size > 0);

    // Sizes outside the daemon's bounds are refused at connect, with the bound in the text.
    let refused = Client::connect_with(&ConnectOptions {
        socket: Some(daemon.socket().to_path_buf()),
        sizes: RingSizes {
            data_bytes: info.max_data_bytes + 1,
            ..RingSizes::default()
        },
        ..ConnectOptions::default()
    })
    .expect_err("too large a data area");
    assert!(
        matches!(&refused, Error::InvalidArgument(m) if m.contains(&info.max_data_bytes.to_string())),
        "{refused}"
    );

    if test_engine() {
        assert!(!info.has_tokenizer);
        let err = client.tokenize("hi", false).expect_err("no tokenizer");
        assert!(
            matches!(
                err,
                Error::Refused {
                    status: StatusCode::BadAdminQuery,
                    ..
                }
            ),
            "{err}"
        );
        return;
    }
    assert_eq!(info.max_batch, 6);
    assert_eq!(info.max_context, 128);

    // Refusals carry their numbers: n_samples above --max-batch, a prompt filling the context.
    let refusal = |client: &mut Client, prompt: Prompt<'_>, params: &GenerateParams| {
        let tag = client.submit_generate(prompt, params).expect("submit");
        let mut refused = None;
        while refused.is_none() {
            assert!(client.wait(Some(Duration::from_secs(30))).expect("wait"));
            client
                .poll_with(|e| match e {
                    EventRef::Error {
                        tag: t,
                        status,
                        detail,
                        ..
                    } if t == tag => refused = Some((status, detail.to_owned())),
                    EventRef::Done { tag: t, .. } if t == tag => panic!("not refused"),
                    _ => {}
                })
                .expect("poll");
        }
        refused.expect("refused")
    };
    let (status, detail) = refusal(
        &mut client,
        Prompt::Text("hi"),
        &GenerateParams {
            n_samples: 7,
            ..GenerateParams::default()
        },
    );
    assert_eq!(status, StatusCode::BadSampleCount.as_u16());
    assert_eq!(detail, "n_samples 7 > max batch 6");
    let (status, detail) = refusal(
        &mut client,
        Prompt::Tokens(&[1; 200]),
        &GenerateParams::default(),
    );
    assert_eq!(status, StatusCode::PromptTooLong.as_u16());
    assert_eq!(detail, "prompt 200 tokens > limit 127");
    // max_tokens beyond the context is not refused: generation stops at the context.
    let tag = client
        .submit_generate(
            Prompt::Tokens(&[1; 100]),
            &GenerateParams {
                max_tokens: 1000,
                ignore_eos: true,
                ..GenerateParams::default()
            },
        )
        .expect("submit");
    let mut finish = None;
    while finish.is_none() {
        assert!(client.wait(Some(Duration::from_secs(30))).expect("wait"));
        client
            .poll_with(|e| {
                if let EventRef::Done {
                    tag: t,
                    reason,
                    timings,
                    ..
                } = e
                    && t == tag
                {
                    finish = Some((reason, timings.generated_tokens));
                }
            })
            .expect("poll");
    }
    assert_eq!(finish, Some((FinishReason::ContextLength, 28)));
    assert!(
        matches!(info.dtype.as_str(), "bf16" | "f16" | "f32"),
        "{info:?}"
    );
    assert!(info.has_tokenizer);

    let text = "Once upon a time, héllo wörld";
    let ids = client.tokenize(text, false).expect("tokenize");
    assert!(!ids.is_empty() && ids.iter().all(|&id| id < info.vocab_size));
    assert_eq!(client.detokenize(&ids, false).expect("detokenize"), text);
    assert_eq!(client.tokenize("", true).expect("empty"), Vec::<u32>::new());

    // The count with special tokens is what a generation of this text processes.
    let with_special = client.tokenize(text, true).expect("tokenize");
    let tag = client
        .submit_generate(
            Prompt::Text(text),
            &GenerateParams {
                max_tokens: 1,
                ..GenerateParams::default()
            },
        )
        .expect("submit");
    let mut prompt_tokens = None;
    while prompt_tokens.is_none() {
        assert!(client.wait(Some(Duration::from_secs(30))).expect("wait"));
        client
            .poll_with(|e| {
                if let EventRef::Done {
                    tag: t, timings, ..
                } = e
                    && t == tag
                {
                    prompt_tokens = Some(timings.prompt_tokens as usize);
                }
            })
            .expect("poll");
    }
    assert_eq!(prompt_tokens, Some(with_special.len()));

    // Bad input: an id outside the vocabulary is refused with the id in the detail.
    let bad = info.vocab_size + 7;
    match client.detokenize(&[1, bad], false) {
        Err(Error::Refused {
            status: StatusCode::TokenOutOfVocab,
            detail,
        }) => assert!(detail.contains(&bad.to_string()), "{detail}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    // A text larger than the data area never fits.
    let huge = "x".repeat(128 << 10);
    assert!(matches!(
        client.tokenize(&huge, false),
        Err(Error::TooLarge { .. })
    ));
    // The client is still usable afterwards.
    assert_eq!(client.detokenize(&ids, false).expect("again"), text);
}

#[test]
fn c_model_info_tokenize_detokenize_and_close_during_wait() {
    let daemon = Daemon::start(DAEMON, &[]);
    let path = std::ffi::CString::new(daemon.socket().as_os_str().as_encoded_bytes())
        .expect("no NUL in the socket path");
    let mut options = nerva_connect_default_options();
    options.cq_entries = 128;
    let mut raw: *mut NervaClient = ptr::null_mut();
    // SAFETY: NUL-terminated path, readable options, writable out.
    let rc = unsafe { nerva_client_connect_with(path.as_ptr(), &options, &mut raw) };
    assert_eq!(rc, OK);
    let mut info = std::mem::MaybeUninit::<nerva_model_info>::uninit();
    // SAFETY: live handle, writable info.
    let rc = unsafe { nerva_client_model_info(raw, info.as_mut_ptr()) };
    assert_eq!(rc, OK);
    // SAFETY: written on success.
    let info = unsafe { info.assume_init() };
    assert_eq!(info.cq_entries, 128);
    // SAFETY: the name is NUL-terminated within its array.
    let name = unsafe { std::ffi::CStr::from_ptr(info.name.as_ptr()) };
    assert!(!name.to_bytes().is_empty());

    // Bad sizes: refused, nothing to close.
    let mut bad = nerva_connect_default_options();
    bad.sq_entries = 3;
    let mut none: *mut NervaClient = ptr::NonNull::dangling().as_ptr();
    // SAFETY: as above.
    let rc = unsafe { nerva_client_connect_with(path.as_ptr(), &bad, &mut none) };
    assert_eq!(rc, nerva_status::NERVA_E_INVALID_ARGUMENT.code());
    assert!(none.is_null());

    if info.has_tokenizer {
        let text = "Hello there";
        let mut n = 0usize;
        // Sizing call: no room, the count comes back with TOO_LARGE.
        // SAFETY: live handle, readable text, NULL array with cap 0, writable count.
        let rc = unsafe {
            nerva_client_tokenize(
                raw,
                text.as_ptr().cast(),
                text.len(),
                false,
                ptr::null_mut(),
                0,
                &mut n,
            )
        };
        assert_eq!(rc, nerva_status::NERVA_E_TOO_LARGE.code());
        assert!(n > 0);
        let mut ids = vec![0u32; n];
        // SAFETY: as above, `ids` writable for `n`.
        let rc = unsafe {
            nerva_client_tokenize(
                raw,
                text.as_ptr().cast(),
                text.len(),
                false,
                ids.as_mut_ptr(),
                n,
                &mut n,
            )
        };
        assert_eq!(rc, OK);
        let mut buf = [0 as std::ffi::c_char; 64];
        let mut len = 0usize;
        // SAFETY: live handle, readable ids, writable buffer and length.
        let rc = unsafe {
            nerva_client_detokenize(
                raw,
                ids.as_ptr(),
                ids.len(),
                false,
                buf.as_mut_ptr(),
                buf.len(),
                &mut len,
            )
        };
        assert_eq!(rc, OK);
        // SAFETY: NUL-terminated on success.
        let back = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
        assert_eq!(back.to_str(), Ok(text));
        assert_eq!(len, text.len());
        let out_of_vocab = [info.vocab_size];
        // SAFETY: as above.
        let rc = unsafe {
            nerva_client_detokenize(
                raw,
                out_of_vocab.as_ptr(),
                1,
                false,
                buf.as_mut_ptr(),
                buf.len(),
                &mut len,
            )
        };
        assert_eq!(rc, nerva_status::NERVA_E_REJECTED.code());
    }

    let mut fd = -1;
    // SAFETY: live handle, writable fd.
    assert_eq!(unsafe { nerva_client_fd(raw, &mut fd) }, OK);
    assert!(fd >= 0);

    // Close while another thread sleeps in wait: the waiter wakes with NERVA_E_CLOSED and
    // close returns only after it left (no leak, no use after free).
    struct SendPtr(*mut NervaClient);
    // SAFETY: the handle may be used from any thread (header's thread-safety rule).
    unsafe impl Send for SendPtr {}
    let shared = SendPtr(raw);
    let waiter = std::thread::spawn(move || {
        let handle = shared;
        let start = Instant::now();
        // SAFETY: live handle; close on the other thread waits for this call to return.
        let rc = unsafe { nerva_client_wait(handle.0, 60_000) };
        (rc, start.elapsed())
    });
    std::thread::sleep(Duration::from_millis(200));
    let start = Instant::now();
    // SAFETY: the handle is closed once; the only other call on it is the waiter's.
    unsafe { nerva_client_close(raw) };
    let close_took = start.elapsed();
    let (rc, slept) = waiter.join().expect("waiter");
    assert_eq!(rc, nerva_status::NERVA_E_CLOSED.code());
    assert!(slept < Duration::from_secs(10) && close_took < Duration::from_secs(10));
}
