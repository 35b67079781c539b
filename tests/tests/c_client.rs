//! The C ABI against a real daemon (`nervad-under-test`: nervad's own entry point; engine per
//! `NERVA_TEST_ENGINE`, see `nerva_tests::daemon_harness`).
//!
//! 1. `libnerva-client/examples/stream.c`, compiled by the system C compiler against
//!    `include/nerva.h` and linked with the built cdylib, streams a generation and exits 0; its
//!    text equals what the Rust API receives for the same greedy request.
//! 2. Every entry point, called through the C ABI exactly as C calls it: text / token / chat
//!    prompts, stop lists, several samples, one-event polls (the overflow path), cancel, NOP,
//!    wait timeout, one thread waiting while another submits (user_data echoed), two clients
//!    at once, and the daemon's death.

mod c_support;

use std::ffi::{CStr, c_char};
use std::mem::MaybeUninit;
use std::process::Command;
use std::ptr;
use std::time::{Duration, Instant};

// The handle type is imported under another name: `nerva_client` is also the crate's name.
use nerva_client::ffi::client::nerva_client as NervaClient;
use nerva_client::ffi::client::{
    nerva_chat_message, nerva_client_cancel, nerva_client_close, nerva_client_connect,
    nerva_client_nop, nerva_client_poll, nerva_client_submit_chat, nerva_client_submit_text,
    nerva_client_submit_tokens, nerva_client_wait,
};
use nerva_client::ffi::event::{nerva_event, nerva_event_kind, nerva_finish_reason};
use nerva_client::ffi::params::{nerva_generate_default_params, nerva_generate_params};
use nerva_client::ffi::status::nerva_status;
use nerva_client::{Client, EventRef, Prompt};
use nerva_tests::daemon_harness::{Daemon, test_engine};

const DAEMON: &str = env!("CARGO_BIN_EXE_nervad-under-test");
const OK: i32 = nerva_status::NERVA_OK.code();

#[test]
fn stream_example_in_c_streams_the_same_text_as_the_rust_api() {
    let dir = c_support::scratch_dir("c-stream");
    let exe = dir.join("stream");
    c_support::compile_example("stream", &exe, &c_support::in_tree_flags());

    let daemon = Daemon::start(DAEMON, &[]);
    let prompt = "Once upon a time";
    let max_tokens = 24;
    let out = Command::new(&exe)
        .arg(daemon.socket())
        .arg(prompt)
        .arg(max_tokens.to_string())
        .output()
        .expect("run the example");
    let stdout = String::from_utf8(out.stdout).expect("the example writes UTF-8");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stream.c failed:\n{stderr}\n{}",
        daemon.log()
    );
    assert!(
        !stdout.trim().is_empty(),
        "stream.c printed no text; stderr:\n{stderr}"
    );
    assert!(stderr.contains("finish reason: "), "stderr:\n{stderr}");
    eprintln!("stream.c: {stdout:?}\n{stderr}");

    // stream.c asks for greedy decoding without ignore_eos; the reference asks the same through
    // the Rust API (ignore_eos only matters if the model emits EOS: compare like for like).
    let mut client = Client::connect(Some(daemon.socket())).expect("connect");
    let params = nerva_client::GenerateParams {
        max_tokens,
        temperature: 0.0,
        ..Default::default()
    };
    let tag = client
        .submit_generate(Prompt::Text(prompt), &params)
        .expect("submit");
    let (mut text, mut done) = (String::new(), false);
    while !done {
        assert!(client.wait(Some(Duration::from_secs(30))).expect("wait"));
        client
            .poll_with(|e| match e {
                EventRef::Text {
                    tag: t,
                    text: piece,
                    ..
                } if t == tag => text.push_str(piece),
                EventRef::Done { tag: t, .. } if t == tag => done = true,
                _ => {}
            })
            .expect("poll");
    }
    assert_eq!(
        stdout,
        format!("{text}\n"),
        "C and Rust clients saw different text"
    );

    // No socket argument: connect(NULL) finds the daemon through $NERVA_SOCKET.
    let by_default = Command::new(&exe)
        .env("NERVA_SOCKET", daemon.socket())
        .args(["", prompt, &max_tokens.to_string()])
        .output()
        .expect("run the example");
    assert_eq!(by_default.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&by_default.stdout), stdout);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A client handle owned by a test; closed on drop.
struct Handle(*mut NervaClient);

// SAFETY: a nerva_client may be used from any thread (the header's thread-safety rule).
unsafe impl Send for Handle {}
// SAFETY: calls on one client from several threads serialize inside the library (the
// header's thread-safety rule); the reaper test shares a handle on purpose to use that.
unsafe impl Sync for Handle {}

impl Handle {
    /// The raw handle (a method, so closures capture the `Sync` wrapper, not the pointer).
    fn raw(&self) -> *mut NervaClient {
        self.0
    }

    fn connect(daemon: &Daemon) -> Handle {
        let path = std::ffi::CString::new(daemon.socket().as_os_str().as_encoded_bytes())
            .expect("no NUL in the socket path");
        let mut client = ptr::null_mut();
        // SAFETY: a NUL-terminated path and a writable out pointer.
        let rc = unsafe { nerva_client_connect(path.as_ptr(), &mut client) };
        assert_eq!(rc, OK, "connect: {}", strerror(rc));
        assert!(!client.is_null());
        Handle(client)
    }

    fn submit_text(&self, text: &str, params: &nerva_generate_params) -> Result<u64, i32> {
        let mut tag = 0;
        // SAFETY: live handle, text readable for its length, params and tag valid.
        let rc = unsafe {
            nerva_client_submit_text(self.0, text.as_ptr().cast(), text.len(), params, &mut tag)
        };
        if rc == OK { Ok(tag) } else { Err(rc) }
    }

    /// Poll with room for `cap` events until every tag in `tags` has all its samples DONE (or
    /// ERROR), returning the events as owned copies.
    fn collect(&self, tags: &[u64], samples: u32, cap: usize) -> Vec<OwnedEvent> {
        let mut events = Vec::new();
        let mut buf: Vec<MaybeUninit<nerva_event>> =
            (0..cap).map(|_| MaybeUninit::uninit()).collect();
        let finished = |events: &Vec<OwnedEvent>| {
            tags.iter().all(|&tag| {
                let done = events
                    .iter()
                    .filter(|e| e.tag == tag && e.kind == nerva_event_kind::NERVA_EVENT_DONE)
                    .count();
                let failed = events
                    .iter()
                    .any(|e| e.tag == tag && e.kind == nerva_event_kind::NERVA_EVENT_ERROR);
                failed || done == samples as usize
            })
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !finished(&events) {
            assert!(Instant::now() < deadline, "requests did not finish in 60 s");
            // SAFETY: live handle.
            let rc = unsafe { nerva_client_wait(self.0, 1000) };
            assert!(
                rc == OK || rc == nerva_status::NERVA_E_TIMEOUT.code(),
                "wait: {}",
                strerror(rc)
            );
            let mut n = usize::MAX;
            // SAFETY: live handle, `buf` writable for `cap` events, `n` writable.
            let rc = unsafe { nerva_client_poll(self.0, buf.as_mut_ptr().cast(), cap, &mut n) };
            assert_eq!(rc, OK, "poll: {}", strerror(rc));
            assert!(n <= cap);
            // Copy now: text pointers live until the next poll.
            for slot in &buf[..n] {
                // SAFETY: poll wrote the first `n` entries.
                events.push(OwnedEvent::from(unsafe { slot.assume_init_ref() }));
            }
        }
        events
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: the handle came from nerva_client_connect and is not used after this.
        unsafe { nerva_client_close(self.0) };
    }
}

fn strerror(rc: i32) -> String {
    // SAFETY: nerva_strerror returns a static NUL-terminated string.
    unsafe { CStr::from_ptr(nerva_client::ffi::status::nerva_strerror(rc)) }
        .to_string_lossy()
        .into_owned()
}

#[derive(Debug, Clone)]
struct OwnedEvent {
    tag: u64,
    user_data: u64,
    kind: nerva_event_kind,
    sample: u32,
    status: u32,
    finish: nerva_finish_reason,
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    text: String,
    generated_tokens: u32,
}

impl From<&nerva_event> for OwnedEvent {
    fn from(e: &nerva_event) -> Self {
        assert!(e.n_tokens as usize <= e.tokens.len());
        assert!(e.n_logprobs == 0 || e.n_logprobs == e.n_tokens);
        let text = if e.text.is_null() {
            assert_eq!(e.text_len, 0);
            String::new()
        } else {
            // SAFETY: text_len bytes plus a NUL, valid until the next poll (we are before it).
            let bytes = unsafe { std::slice::from_raw_parts(e.text.cast::<u8>(), e.text_len + 1) };
            assert_eq!(bytes[e.text_len], 0, "text is NUL-terminated");
            String::from_utf8(bytes[..e.text_len].to_vec()).expect("whole UTF-8 code points")
        };
        OwnedEvent {
            tag: e.tag,
            user_data: e.user_data,
            kind: e.kind,
            sample: e.sample,
            status: e.status,
            finish: e.finish_reason,
            tokens: e.tokens[..e.n_tokens as usize].to_vec(),
            logprobs: e.logprobs[..e.n_logprobs as usize].to_vec(),
            text,
            generated_tokens: e.timings.generated_tokens,
        }
    }
}

fn of_kind(events: &[OwnedEvent], tag: u64, kind: nerva_event_kind) -> Vec<&OwnedEvent> {
    events
        .iter()
        .filter(|e| e.tag == tag && e.kind == kind)
        .collect()
}

#[test]
fn every_entry_point_behaves_as_documented_against_a_live_daemon() {
    // Slow steps (test engine) keep a long request in flight for the cancel checks.
    let extra: &[&str] = if test_engine() {
        &["--test-step-us", "500"]
    } else {
        &[]
    };
    let daemon = Daemon::start(DAEMON, extra);
    let client = Handle::connect(&daemon);

    // NOP round trip.
    let mut rtt = 0u64;
    // SAFETY: live handle, writable out.
    assert_eq!(unsafe { nerva_client_nop(client.0, &mut rtt) }, OK);
    assert!(rtt > 0);
    // SAFETY: live handle; NULL out pointer is refused before use.
    let rc = unsafe { nerva_client_nop(client.0, ptr::null_mut()) };
    assert_eq!(rc, nerva_status::NERVA_E_INVALID_ARGUMENT.code());

    // Nothing in flight: a short wait times out.
    // SAFETY: live handle.
    let rc = unsafe { nerva_client_wait(client.0, 10) };
    assert_eq!(rc, nerva_status::NERVA_E_TIMEOUT.code());

    // Refused locally, nothing sent.
    let mut bad = nerva_generate_default_params();
    bad.temperature = f32::NAN;
    assert_eq!(
        client.submit_text("hi", &bad),
        Err(nerva_status::NERVA_E_INVALID_ARGUMENT.code())
    );
    let mut tag = 0;
    let not_utf8 = [0xffu8, 0xfe];
    // SAFETY: live handle, 2 readable bytes, NULL params (defaults), writable tag.
    let rc = unsafe {
        nerva_client_submit_text(client.0, not_utf8.as_ptr().cast(), 2, ptr::null(), &mut tag)
    };
    assert_eq!(rc, nerva_status::NERVA_E_INVALID_ARGUMENT.code());
    assert_eq!(tag, 0, "tag_out untouched on failure");

    // Token prompt, log-probabilities, polled one event at a time (overflow + split paths).
    let mut params = nerva_generate_default_params();
    params.max_tokens = 40;
    params.temperature = 0.0;
    params.ignore_eos = true;
    params.logprobs = true;
    let ids = [1u32, 2, 3, 4];
    let mut token_tag = 0;
    // SAFETY: live handle, 4 readable ids, params valid, writable tag.
    let rc = unsafe {
        nerva_client_submit_tokens(client.0, ids.as_ptr(), ids.len(), &params, &mut token_tag)
    };
    assert_eq!(rc, OK, "submit_tokens: {}", strerror(rc));
    let events = client.collect(&[token_tag], 1, 1);
    let done = of_kind(&events, token_tag, nerva_event_kind::NERVA_EVENT_DONE);
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].finish, nerva_finish_reason::NERVA_FINISH_LENGTH);
    let streamed: Vec<u32> = of_kind(&events, token_tag, nerva_event_kind::NERVA_EVENT_TOKENS)
        .iter()
        .flat_map(|e| {
            assert_eq!(e.logprobs.len(), e.tokens.len(), "logprobs requested");
            e.tokens.clone()
        })
        .collect();
    assert_eq!(streamed.len(), 40);
    assert_eq!(done[0].generated_tokens, 40);
    let text: String = of_kind(&events, token_tag, nerva_event_kind::NERVA_EVENT_TEXT)
        .iter()
        .map(|e| e.text.as_str())
        .collect();
    assert!(!text.is_empty());

    // The same request polled in big batches gives the same ids (nothing lost or reordered).
    let mut again = 0;
    // SAFETY: as above.
    let rc = unsafe {
        nerva_client_submit_tokens(client.0, ids.as_ptr(), ids.len(), &params, &mut again)
    };
    assert_eq!(rc, OK);
    let batch = client.collect(&[again], 1, 64);
    let batch_ids: Vec<u32> = of_kind(&batch, again, nerva_event_kind::NERVA_EVENT_TOKENS)
        .iter()
        .flat_map(|e| e.tokens.clone())
        .collect();
    assert_eq!(batch_ids, streamed);

    // Chat prompt, two samples, stop lists.
    let role = c"user";
    let content = c"Tell me a story.";
    let system = c"You are terse.";
    let messages = [
        nerva_chat_message {
            role: c"system".as_ptr(),
            content: system.as_ptr(),
        },
        nerva_chat_message {
            role: role.as_ptr(),
            content: content.as_ptr(),
        },
    ];
    let stops = [c"\n\n".as_ptr(), c"THE END".as_ptr()];
    let stop_ids = [3u32];
    let mut chat_params = nerva_generate_default_params();
    chat_params.max_tokens = 16;
    chat_params.n_samples = 2;
    chat_params.seed = 7;
    chat_params.stop_strings = stops.as_ptr();
    chat_params.n_stop_strings = stops.len();
    chat_params.stop_token_ids = stop_ids.as_ptr();
    chat_params.n_stop_token_ids = stop_ids.len();
    let mut chat_tag = 0;
    // SAFETY: live handle, two messages with NUL-terminated strings, valid params and lists.
    let rc = unsafe {
        nerva_client_submit_chat(client.0, messages.as_ptr(), 2, &chat_params, &mut chat_tag)
    };
    assert_eq!(rc, OK, "submit_chat: {}", strerror(rc));
    let chat = client.collect(&[chat_tag], 2, 8);
    let errors = of_kind(&chat, chat_tag, nerva_event_kind::NERVA_EVENT_ERROR);
    assert!(
        errors.is_empty(),
        "chat failed: status {}",
        errors[0].status
    );
    let mut samples: Vec<u32> = of_kind(&chat, chat_tag, nerva_event_kind::NERVA_EVENT_DONE)
        .iter()
        .map(|e| e.sample)
        .collect();
    samples.sort_unstable();
    assert_eq!(samples, [0, 1], "one DONE per sample");
    for e in of_kind(&chat, chat_tag, nerva_event_kind::NERVA_EVENT_TOKENS) {
        assert!(!e.tokens.contains(&3), "a stop token id was emitted");
    }
    let mut bad_message = messages;
    bad_message[1].content = ptr::null();
    let mut unused = 0;
    // SAFETY: NULL content is refused before use.
    let rc = unsafe {
        nerva_client_submit_chat(client.0, bad_message.as_ptr(), 2, &chat_params, &mut unused)
    };
    assert_eq!(rc, nerva_status::NERVA_E_INVALID_ARGUMENT.code());

    // Cancel: a long request ends with DONE/CANCELLED; an unknown tag is reported.
    if test_engine() {
        let mut long = nerva_generate_default_params();
        // Within the test engine's context (8192), about 4 s of 500 µs steps.
        long.max_tokens = 8000;
        long.ignore_eos = true;
        let long_tag = client.submit_text("a long story", &long).expect("submit");
        // SAFETY: live handle.
        assert_eq!(unsafe { nerva_client_cancel(client.0, long_tag) }, OK);
        let cancelled = client.collect(&[long_tag], 1, 16);
        let done = of_kind(&cancelled, long_tag, nerva_event_kind::NERVA_EVENT_DONE);
        let errors = of_kind(&cancelled, long_tag, nerva_event_kind::NERVA_EVENT_ERROR);
        assert!(
            errors.is_empty(),
            "request failed: status {}",
            errors[0].status
        );
        assert_eq!(done[0].finish, nerva_finish_reason::NERVA_FINISH_CANCELLED);
    }
    // SAFETY: live handle.
    let rc = unsafe { nerva_client_cancel(client.0, 0xdead) };
    assert_eq!(rc, nerva_status::NERVA_E_UNKNOWN_TAG.code());

    // One thread reaps (asleep in wait) while another submits on the same client: the submit
    // is not held up by the sleeper, and the sleeper wakes for the new request's events, which
    // carry the caller's user_data.
    let mut p = nerva_generate_default_params();
    p.max_tokens = 4;
    p.user_data = 0x5eed_f00d_cafe;
    let (woke_tag, submit_took, wait_rc, slept) = std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            let start = Instant::now();
            // SAFETY: live handle; calls from two threads on one client serialize inside.
            let rc = unsafe { nerva_client_wait(client.raw(), 30_000) };
            (rc, start.elapsed())
        });
        std::thread::sleep(Duration::from_millis(200)); // let the waiter fall asleep
        let start = Instant::now();
        let tag = client.submit_text("wake the reaper", &p).expect("submit");
        let took = start.elapsed();
        let (rc, slept) = waiter.join().expect("waiter");
        (tag, took, rc, slept)
    });
    assert_eq!(wait_rc, OK, "wait: {}", strerror(wait_rc));
    assert!(
        submit_took < Duration::from_millis(500),
        "submit waited behind the sleeping reaper: {submit_took:?}"
    );
    assert!(slept < Duration::from_secs(30), "the reaper did not wake");
    let events = client.collect(&[woke_tag], 1, 16);
    assert!(
        events
            .iter()
            .all(|e| e.tag == woke_tag && e.user_data == 0x5eed_f00d_cafe),
        "user_data not echoed on every event: {events:?}"
    );
    assert!(
        events
            .iter()
            .all(|e| e.kind != nerva_event_kind::NERVA_EVENT_TOKENS || e.logprobs.is_empty()),
        "token events carry logprobs the request did not ask for"
    );

    // Two clients in one process, each on its own thread, each sees only its own events.
    std::thread::scope(|s| {
        for n in 0..2 {
            let daemon = &daemon;
            s.spawn(move || {
                let other = Handle::connect(daemon);
                let mut p = nerva_generate_default_params();
                p.max_tokens = 8;
                let tag = other
                    .submit_text(&format!("thread {n}"), &p)
                    .expect("submit");
                let events = other.collect(&[tag], 1, 4);
                assert!(
                    events.iter().all(|e| e.tag == tag),
                    "foreign event on client {n}"
                );
            });
        }
    });

    // The daemon dies: a blocked wait returns DAEMON_GONE (not a timeout), later calls too.
    daemon.signal(nix::sys::signal::Signal::SIGKILL);
    let start = Instant::now();
    // SAFETY: live handle (the client outlives its daemon).
    let rc = unsafe { nerva_client_wait(client.0, 10_000) };
    let elapsed = start.elapsed();
    assert_eq!(
        rc,
        nerva_status::NERVA_E_DAEMON_GONE.code(),
        "{}",
        strerror(rc)
    );
    eprintln!("daemon SIGKILL noticed by nerva_client_wait after {elapsed:?}");
    let mut n = 0usize;
    let mut buf = [const { MaybeUninit::<nerva_event>::uninit() }; 4];
    // SAFETY: live handle, 4 writable events.
    let rc = unsafe { nerva_client_poll(client.0, buf.as_mut_ptr().cast(), 4, &mut n) };
    assert_eq!(rc, nerva_status::NERVA_E_DAEMON_GONE.code());
    assert_eq!(n, 0);
    assert_eq!(
        client.submit_text("anyone?", &nerva_generate_default_params()),
        Err(nerva_status::NERVA_E_DAEMON_GONE.code())
    );
}

#[test]
fn connect_reports_a_missing_daemon_and_leaves_out_null() {
    let dir = c_support::scratch_dir("c-no-daemon");
    let path = std::ffi::CString::new(dir.join("nothing.sock").as_os_str().as_encoded_bytes())
        .expect("path");
    let mut client: *mut NervaClient = ptr::NonNull::dangling().as_ptr();
    // SAFETY: NUL-terminated path, writable out.
    let rc = unsafe { nerva_client_connect(path.as_ptr().cast::<c_char>(), &mut client) };
    assert_eq!(rc, nerva_status::NERVA_E_NO_DAEMON.code());
    assert!(client.is_null());
    let _ = std::fs::remove_dir_all(&dir);
}
