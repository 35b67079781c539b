//! The `nerva_client` handle and its entry points: connect, submit, poll, wait, cancel, nop,
//! close.

use core::ffi::{CStr, c_char, c_int};
use core::mem::MaybeUninit;
use core::time::Duration;
use std::collections::VecDeque;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use std::os::fd::{AsFd, AsRawFd};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use super::boundary::{FfiResult, Shared, arg_out, arg_ref, arg_slice, guard};
use super::event::{EventSink, nerva_event};
use super::params::nerva_generate_params;
use super::status::nerva_status;
use crate::{Client, ConnectOptions, Event, GenerateParams, Prompt, RingSizes, Tag};

/// A connection to nervad: one shared-memory segment with its rings, and the events received
/// but not yet handed to C. Opaque; create with `nerva_client_connect`, free with
/// `nerva_client_close`. Any thread may call into it; calls serialize (see the header's
/// thread-safety notes).
pub struct nerva_client {
    inner: Shared<ClientState>,
}

pub(crate) struct ClientState {
    pub(crate) client: Client,
    /// Text of the events handed out by the last poll (their `text` pointers point here).
    text_arena: Vec<u8>,
    /// Scratch for `EventSink`: kept to reuse its allocation.
    text_spans: Vec<(usize, usize)>,
    /// Events received but not yet handed out (the caller's array was full).
    overflow: VecDeque<Event>,
}

/// One message of a chat prompt, rendered by the daemon through the model's chat template.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct nerva_chat_message {
    /// NUL-terminated UTF-8 role, e.g. "system", "user", "assistant".
    pub role: *const c_char,
    /// NUL-terminated UTF-8 content.
    pub content: *const c_char,
}

/// Enter a client handle, or fail with `NERVA_E_INVALID_ARGUMENT` for NULL.
///
/// # Safety
/// A non-NULL `client` must come from `nerva_client_connect` and its close must not have
/// begun before this call.
pub(crate) unsafe fn with_client(
    client: *mut nerva_client,
    body: impl FnOnce(&mut ClientState) -> FfiResult,
) -> c_int {
    // SAFETY: the caller's obligation: NULL or a live handle from nerva_client_connect. Only a
    // shared reference is made; access to the state goes through `Shared`'s lock, and close
    // waits for this call to leave before it frees the handle.
    match unsafe { client.cast_const().as_ref() } {
        Some(handle) => handle.inner.enter(body),
        None => nerva_status::NERVA_E_INVALID_ARGUMENT.code(),
    }
}

/// How a client is sized and behaves, for `nerva_client_connect_with`. Start from
/// `nerva_connect_default_options()`; zero sizes mean the daemon's defaults. The daemon's
/// bounds are in `nerva_model_info` (`max_ring_entries`, `max_data_bytes`); a size outside
/// them fails the connect with NERVA_E_INVALID_ARGUMENT.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct nerva_connect_options {
    /// Submission ring entries (a power of two), or 0.
    pub sq_entries: u32,
    /// Completion ring entries (a power of two), or 0. A full completion ring pauses this
    /// client's streams until it polls (they give their batch slots to other clients meanwhile).
    pub cq_entries: u32,
    /// Input area bytes (prompts and stop lists of requests in flight), or 0.
    pub data_bytes: u64,
    /// Microseconds `nerva_client_wait` spins on the ring before it sleeps (0: sleep at once).
    pub spin_us: u32,
}

/// The default connect options: every size the daemon's default, no spinning.
#[unsafe(no_mangle)]
pub extern "C" fn nerva_connect_default_options() -> nerva_connect_options {
    nerva_connect_options::default()
}

/// Connect to nervad and create a client with the daemon's default sizes.
///
/// `socket_path`: NUL-terminated path of the daemon's socket, or NULL for the default:
/// `$NERVA_SOCKET` if set, else `$XDG_RUNTIME_DIR/nerva/nervad.sock`, else
/// `/run/nerva/nervad.sock` (the daemon's default too).
/// `out`: receives the new client on success and NULL on failure.
///
/// Returns NERVA_OK, or NERVA_E_INVALID_ARGUMENT (`out` NULL, empty path), NERVA_E_NO_DAEMON,
/// NERVA_E_PERMISSION_DENIED, NERVA_E_VERSION_MISMATCH, NERVA_E_TOO_MANY_CLIENTS,
/// NERVA_E_RESOURCE_EXHAUSTED, NERVA_E_SHUTTING_DOWN, NERVA_E_PROTOCOL, NERVA_E_IO. On failure
/// nothing needs to be closed.
///
/// # Safety
/// `socket_path` is NULL or a NUL-terminated string; `out` is NULL or writable.
#[unsafe(no_mangle)]
#[must_use]
pub unsafe extern "C" fn nerva_client_connect(
    socket_path: *const c_char,
    out: *mut *mut nerva_client,
) -> c_int {
    // SAFETY: the caller's obligations are connect_with's; NULL options mean the defaults.
    unsafe { nerva_client_connect_with(socket_path, core::ptr::null(), out) }
}

/// As `nerva_client_connect`, sized by `options` (NULL: `nerva_connect_default_options()`).
/// Sizes the daemon refuses (not a power of two, outside its bounds) fail with
/// NERVA_E_INVALID_ARGUMENT.
///
/// # Safety
/// `socket_path` is NULL or a NUL-terminated string; `options` is NULL or readable; `out` is
/// NULL or writable.
#[unsafe(no_mangle)]
#[must_use]
pub unsafe extern "C" fn nerva_client_connect_with(
    socket_path: *const c_char,
    options: *const nerva_connect_options,
    out: *mut *mut nerva_client,
) -> c_int {
    guard(|| {
        // SAFETY: `out` is NULL or writable (caller's obligation).
        let out = unsafe { arg_out(out) }?;
        *out = core::ptr::null_mut();
        let options = if options.is_null() {
            nerva_connect_options::default()
        } else {
            // SAFETY: non-NULL `options` is readable (caller's obligation).
            *unsafe { arg_ref(options) }?
        };
        let path = if socket_path.is_null() {
            None
        } else {
            // SAFETY: non-NULL and NUL-terminated (caller's obligation).
            let bytes = unsafe { CStr::from_ptr(socket_path) }.to_bytes();
            if bytes.is_empty() {
                return Err(nerva_status::NERVA_E_INVALID_ARGUMENT);
            }
            // Unix paths are bytes; no UTF-8 requirement.
            Some(Path::new(OsStr::from_bytes(bytes)).to_path_buf())
        };
        let client = Client::connect_with(&ConnectOptions {
            socket: path,
            sizes: RingSizes {
                sq_entries: options.sq_entries,
                cq_entries: options.cq_entries,
                data_bytes: options.data_bytes,
            },
            spin: Duration::from_micros(u64::from(options.spin_us)),
        })?;
        let state = ClientState {
            client,
            text_arena: Vec::new(),
            text_spans: Vec::new(),
            overflow: VecDeque::new(),
        };
        let inner = Shared::new(state).map_err(|_| nerva_status::NERVA_E_IO)?;
        *out = Box::into_raw(Box::new(nerva_client { inner }));
        Ok(())
    })
}

/// Disconnect and free a client. The daemon cancels its in-flight requests. Text pointers of
/// its events become invalid. NULL is ignored.
///
/// Calls on other threads that are inside the library on this client when close begins are
/// defined: a sleeping `nerva_client_wait` wakes at once, and each of them returns (with its
/// own result, or NERVA_E_CLOSED if it had not finished) before close frees the handle; close
/// blocks until then. No call may *begin* on the handle once close has begun (as with free()).
///
/// # Safety
/// `client` is NULL or a handle from `nerva_client_connect` not closed yet; no call on it may
/// begin after this one began.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nerva_client_close(client: *mut nerva_client) {
    if client.is_null() {
        return;
    }
    // SAFETY: a live handle from nerva_client_connect (caller's obligation); only shared
    // references exist while other calls may still be inside it.
    let shared = unsafe { &*client };
    // In place: the calls still inside reference this memory.
    shared.inner.close_and_wait();
    // SAFETY: the handle came from Box::into_raw in nerva_client_connect, is closed once
    // (caller's obligation), and no call is inside it any more (waited for above).
    let handle = unsafe { Box::from_raw(client) };
    // Dropping the client closes the socket (the daemon's liveness signal), the eventfds and
    // the mapping. A panic in a destructor must not unwind into C.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        if let Some(state) = handle.inner.into_inner() {
            state.client.close();
        }
    }));
}

/// Submit the shared tail of the three submit calls.
///
/// # Safety
/// `params` is NULL or a readable `nerva_generate_params` whose lists satisfy
/// [`nerva_generate_params::into_rust`]; `tag_out` is NULL or writable.
unsafe fn submit(
    client: *mut nerva_client,
    params: *const nerva_generate_params,
    tag_out: *mut u64,
    prompt: impl FnOnce() -> Result<PromptBuf, nerva_status>,
) -> c_int {
    let body = |state: &mut ClientState| -> FfiResult {
        // SAFETY: `tag_out` is NULL or writable (caller's obligation).
        let tag_out = unsafe { arg_out(tag_out) }?;
        let params = if params.is_null() {
            GenerateParams::default()
        } else {
            // SAFETY: non-NULL `params` is readable and its lists valid (caller's obligation).
            unsafe { arg_ref(params)?.into_rust() }?
        };
        let prompt = prompt()?;
        let tag = state.client.submit_generate(prompt.as_prompt(), &params)?;
        *tag_out = tag.0;
        Ok(())
    };
    // SAFETY: `client` is NULL or a live handle (caller's obligation).
    unsafe { with_client(client, body) }
}

/// A prompt copied out of C memory.
enum PromptBuf {
    Text(String),
    Tokens(Vec<u32>),
    Chat(String),
}

impl PromptBuf {
    fn as_prompt(&self) -> Prompt<'_> {
        match self {
            PromptBuf::Text(text) => Prompt::Text(text),
            PromptBuf::Tokens(ids) => Prompt::Tokens(ids),
            PromptBuf::Chat(json) => Prompt::Chat(json),
        }
    }
}

/// Queue a generation from a UTF-8 text prompt (tokenized by the daemon).
///
/// `text`/`text_len`: the prompt, `text_len` bytes of UTF-8 (no NUL needed), at least 1 byte.
/// `params`: NULL for `nerva_generate_default_params()`.
/// `tag_out`: receives the request's tag; every event of the request carries it.
///
/// Returns NERVA_OK, NERVA_E_INVALID_ARGUMENT (NULL, empty or non-UTF-8 text, parameter out of
/// range), NERVA_E_RING_FULL (retry after polling), NERVA_E_TOO_LARGE, NERVA_E_SHUTTING_DOWN,
/// NERVA_E_DAEMON_GONE. On failure nothing was sent and `*tag_out` is unchanged.
///
/// # Safety
/// `client` is a live handle; `text` is readable for `text_len` bytes; `params` is NULL or
/// readable with valid stop lists; `tag_out` is writable.
#[unsafe(no_mangle)]
#[must_use]
pub unsafe extern "C" fn nerva_client_submit_text(
    client: *mut nerva_client,
    text: *const c_char,
    text_len: usize,
    params: *const nerva_generate_params,
    tag_out: *mut u64,
) -> c_int {
    let prompt = || {
        // SAFETY: `text` is readable for `text_len` bytes (caller's obligation).
        let bytes = unsafe { arg_slice(text.cast::<u8>(), text_len) }?;
        let text =
            core::str::from_utf8(bytes).map_err(|_| nerva_status::NERVA_E_INVALID_ARGUMENT)?;
        if text.is_empty() {
            return Err(nerva_status::NERVA_E_INVALID_ARGUMENT);
        }
        Ok(PromptBuf::Text(text.to_owned()))
    };
    // SAFETY: the caller's obligations on `client`, `params` and `tag_out` are submit's.
    unsafe { submit(client, params, tag_out, prompt) }
}

/// Queue a generation from token ids (used as given; the daemon checks them against the
/// model's vocabulary and reports NERVA_REQUEST_TOKEN_OUT_OF_VOCAB in an ERROR event).
///
/// `tokens`/`n_tokens`: at least one id. Otherwise as `nerva_client_submit_text`.
///
/// # Safety
/// `client` is a live handle; `tokens` is readable for `n_tokens` ids; `params` is NULL or
/// readable with valid stop lists; `tag_out` is writable.
#[unsafe(no_mangle)]
#[must_use]
pub unsafe extern "C" fn nerva_client_submit_tokens(
    client: *mut nerva_client,
    tokens: *const u32,
    n_tokens: usize,
    params: *const nerva_generate_params,
    tag_out: *mut u64,
) -> c_int {
    let prompt = || {
        // SAFETY: `tokens` is readable for `n_tokens` ids (caller's obligation).
        let ids = unsafe { arg_slice(tokens, n_tokens) }?;
        if ids.is_empty() {
            return Err(nerva_status::NERVA_E_INVALID_ARGUMENT);
        }
        Ok(PromptBuf::Tokens(ids.to_vec()))
    };
    // SAFETY: the caller's obligations on `client`, `params` and `tag_out` are submit's.
    unsafe { submit(client, params, tag_out, prompt) }
}

/// Queue a generation from chat messages, rendered by the daemon through the model's chat
/// template with the assistant's turn opened. A model without a template fails the request
/// with an ERROR event (NERVA_REQUEST_BAD_CHAT_MESSAGES).
///
/// `messages`/`n_messages`: at least one message; every role and content non-NULL UTF-8.
/// Otherwise as `nerva_client_submit_text`.
///
/// # Safety
/// `client` is a live handle; `messages` is readable for `n_messages` entries whose strings
/// are NUL-terminated; `params` is NULL or readable with valid stop lists; `tag_out` is
/// writable.
#[unsafe(no_mangle)]
#[must_use]
pub unsafe extern "C" fn nerva_client_submit_chat(
    client: *mut nerva_client,
    messages: *const nerva_chat_message,
    n_messages: usize,
    params: *const nerva_generate_params,
    tag_out: *mut u64,
) -> c_int {
    let prompt = || {
        let invalid = nerva_status::NERVA_E_INVALID_ARGUMENT;
        // SAFETY: `messages` is readable for `n_messages` entries (caller's obligation).
        let messages = unsafe { arg_slice(messages, n_messages) }?;
        if messages.is_empty() {
            return Err(invalid);
        }
        let text = |ptr: *const c_char| -> Result<&str, nerva_status> {
            if ptr.is_null() {
                return Err(invalid);
            }
            // SAFETY: non-NULL and NUL-terminated (caller's obligation).
            core::str::from_utf8(unsafe { CStr::from_ptr(ptr) }.to_bytes()).map_err(|_| invalid)
        };
        let mut list = Vec::with_capacity(messages.len());
        for message in messages {
            list.push(serde_json::json!({
                "role": text(message.role)?,
                "content": text(message.content)?,
            }));
        }
        // serde_json escapes every string, so any role or content yields valid JSON.
        let json = serde_json::to_string(&list).map_err(|_| invalid)?;
        Ok(PromptBuf::Chat(json))
    };
    // SAFETY: the caller's obligations on `client`, `params` and `tag_out` are submit's.
    unsafe { submit(client, params, tag_out, prompt) }
}

/// Collect events without blocking: writes up to `cap` events to `events` and their number to
/// `*n_out` (0 when none are ready). Events of one request arrive in order; events that do not
/// fit wait for the next call, none are dropped.
///
/// Text pointers inside the events (and those of the previous poll, which this call
/// invalidates) stay valid until the next `nerva_client_poll` or `nerva_client_close` on this
/// client.
///
/// `events` need not be initialized; only the first `*n_out` entries are written. A caller that
/// polls slowly leaves completions in the shared ring, which makes the daemon pause this
/// client's streams (no event is ever dropped).
///
/// Returns NERVA_OK, NERVA_E_INVALID_ARGUMENT (`events` NULL with `cap` > 0, `n_out` NULL),
/// NERVA_E_DAEMON_GONE (after the last event the daemon sent was handed out), NERVA_E_PROTOCOL.
/// `*n_out` is 0 on failure.
///
/// # Safety
/// `client` is a live handle; `events` is writable for `cap` entries; `n_out` is writable.
#[unsafe(no_mangle)]
#[must_use]
pub unsafe extern "C" fn nerva_client_poll(
    client: *mut nerva_client,
    events: *mut nerva_event,
    cap: usize,
    n_out: *mut usize,
) -> c_int {
    let body = |state: &mut ClientState| -> FfiResult {
        // SAFETY: `n_out` is writable (caller's obligation).
        let n_out = unsafe { arg_out(n_out) }?;
        *n_out = 0;
        let out: &mut [MaybeUninit<nerva_event>] = if events.is_null() {
            if cap != 0 {
                return Err(nerva_status::NERVA_E_INVALID_ARGUMENT);
            }
            &mut []
        } else {
            if !events.is_aligned() || cap > isize::MAX as usize / size_of::<nerva_event>() {
                return Err(nerva_status::NERVA_E_INVALID_ARGUMENT);
            }
            // SAFETY: non-NULL, aligned, within isize::MAX bytes (checked above) and writable
            // for `cap` entries (caller's obligation). Viewed as MaybeUninit because C may pass
            // uninitialized memory: entries are only written, never read.
            unsafe {
                core::slice::from_raw_parts_mut(events.cast::<MaybeUninit<nerva_event>>(), cap)
            }
        };
        let ClientState {
            client,
            text_arena,
            text_spans,
            overflow,
        } = state;
        let mut sink = EventSink::new(out, text_arena, text_spans, overflow);
        sink.drain_overflow();
        // Read the ring only when the caller has room: a caller that polls slowly leaves
        // completions in the ring, where a full ring pauses its streams in the daemon
        // (backpressure), instead of growing the overflow queue here without bound.
        let received = if sink.is_full() {
            Ok(0)
        } else {
            client.poll_with(|event| sink.push(event))
        };
        *n_out = sink.finish();
        if !overflow.is_empty() && client.external_wait() {
            // Events wait in this layer, not in the ring: keep the readiness descriptor
            // readable so an event loop polls again.
            client.wake_ready_fd();
        }
        // Events delivered before a failure are still handed out; the failure is reported by
        // the first poll that has nothing left to deliver.
        match received {
            Ok(_) => Ok(()),
            Err(_) if *n_out > 0 => Ok(()),
            Err(error) => Err(error.into()),
        }
    };
    // SAFETY: `client` is NULL or a live handle (caller's obligation).
    unsafe { with_client(client, body) }
}

/// Block until events are ready or `timeout_ms` passes. Sleeps on the client's readiness
/// descriptor (no busy loop) *without* holding the client: other threads may submit, cancel and
/// poll meanwhile (one thread reaps while others submit). `timeout_ms` < 0 waits forever; 0
/// only checks.
///
/// Returns NERVA_OK when events are ready (call `nerva_client_poll`), NERVA_E_TIMEOUT,
/// NERVA_E_DAEMON_GONE (within milliseconds of the daemon's death, once every event it sent
/// was handed out), NERVA_E_CLOSED (another thread closed the client), NERVA_E_PROTOCOL,
/// NERVA_E_IO.
///
/// # Safety
/// `client` is a live handle.
#[unsafe(no_mangle)]
#[must_use]
pub unsafe extern "C" fn nerva_client_wait(client: *mut nerva_client, timeout_ms: c_int) -> c_int {
    // SAFETY: the caller's obligation: NULL or a live handle; close waits for this call.
    let Some(handle) = (unsafe { client.cast_const().as_ref() }) else {
        return nerva_status::NERVA_E_INVALID_ARGUMENT.code();
    };
    // Negative: no timeout.
    let deadline = u64::try_from(timeout_ms)
        .ok()
        .map(|ms| std::time::Instant::now() + Duration::from_millis(ms));
    handle.inner.enter_unlocked(|locked, close_bell| {
        loop {
            let mut ready = false;
            let mut fd = -1;
            locked(&mut |state: &mut ClientState| {
                ready = !state.overflow.is_empty() || state.client.prepare_wait()?;
                fd = state.client.wait_fd().as_raw_fd();
                Ok(())
            })?;
            if ready {
                return Ok(());
            }
            let left = deadline.map(|d| d.saturating_duration_since(std::time::Instant::now()));
            if left.is_some_and(|l| l.is_zero()) {
                return Err(nerva_status::NERVA_E_TIMEOUT);
            }
            let timeout = match left {
                None => PollTimeout::NONE,
                // Round up so a sub-millisecond remainder still sleeps instead of spinning.
                Some(l) => PollTimeout::try_from(l + Duration::from_micros(999))
                    .unwrap_or(PollTimeout::MAX),
            };
            // SAFETY: `fd` is the client's readiness descriptor, owned by the client, which
            // stays open until close, and close waits for this call to return.
            let ready_fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
            let mut fds = [
                PollFd::new(ready_fd, PollFlags::POLLIN),
                PollFd::new(close_bell.as_fd(), PollFlags::POLLIN),
            ];
            match poll(&mut fds, timeout) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(crate::Error::from(e).into()),
            }
            if fds[1].revents().is_some_and(|r| !r.is_empty()) {
                return Err(nerva_status::NERVA_E_CLOSED);
            }
            // Loop: the locked check says whether events (or the daemon's death) woke us.
        }
    })
}

/// The client's readiness descriptor, for the caller's own event loop (epoll, poll, libuv,
/// tokio's AsyncFd): it is readable when events are ready or the daemon hung up. Owned by the
/// client: do not close or read it; it stays valid until `nerva_client_close`.
///
/// Contract (liburing's eventfd model, level-triggered): after this call, every
/// `nerva_client_poll` leaves the descriptor either readable (events still waiting) or armed
/// (the daemon makes it readable with its next event). So: wait for readability, then call
/// `nerva_client_poll` until it returns no events, and go back to waiting. Taking the
/// descriptor costs the daemon one eventfd write per completion burst for this client.
///
/// Returns NERVA_OK, NERVA_E_INVALID_ARGUMENT (`fd_out` NULL).
///
/// # Safety
/// `client` is a live handle; `fd_out` is writable.
#[unsafe(no_mangle)]
#[must_use]
pub unsafe extern "C" fn nerva_client_fd(client: *mut nerva_client, fd_out: *mut c_int) -> c_int {
    let body = |state: &mut ClientState| -> FfiResult {
        // SAFETY: `fd_out` is writable (caller's obligation).
        let fd_out = unsafe { arg_out(fd_out) }?;
        *fd_out = state.client.ready_fd();
        Ok(())
    };
    // SAFETY: `client` is NULL or a live handle (caller's obligation).
    unsafe { with_client(client, body) }
}

/// Ask the daemon to stop the request `tag` early. Its samples end with DONE events carrying
/// NERVA_FINISH_CANCELLED (events already on their way still arrive first).
///
/// Returns NERVA_OK, NERVA_E_UNKNOWN_TAG (not in flight: already done or never submitted),
/// NERVA_E_RING_FULL (retry after polling), NERVA_E_DAEMON_GONE.
///
/// # Safety
/// `client` is a live handle.
#[unsafe(no_mangle)]
#[must_use]
pub unsafe extern "C" fn nerva_client_cancel(client: *mut nerva_client, tag: u64) -> c_int {
    let body = |state: &mut ClientState| -> FfiResult {
        state.client.cancel(Tag(tag))?;
        Ok(())
    };
    // SAFETY: `client` is NULL or a live handle (caller's obligation).
    unsafe { with_client(client, body) }
}

/// Measure one round trip to the daemon: send a NOP and block until its reply. Events that
/// arrive meanwhile are kept for the next poll. `*rtt_ns_out` receives the round trip in
/// nanoseconds.
///
/// Returns NERVA_OK, NERVA_E_INVALID_ARGUMENT (`rtt_ns_out` NULL), NERVA_E_RING_FULL,
/// NERVA_E_TIMEOUT (no reply within 5 s), NERVA_E_DAEMON_GONE.
///
/// # Safety
/// `client` is a live handle; `rtt_ns_out` is writable.
#[unsafe(no_mangle)]
#[must_use]
pub unsafe extern "C" fn nerva_client_nop(
    client: *mut nerva_client,
    rtt_ns_out: *mut u64,
) -> c_int {
    let body = |state: &mut ClientState| -> FfiResult {
        // SAFETY: `rtt_ns_out` is writable (caller's obligation).
        let rtt_out = unsafe { arg_out(rtt_ns_out) }?;
        let rtt = state.client.nop()?;
        *rtt_out = u64::try_from(rtt.as_nanos()).unwrap_or(u64::MAX);
        Ok(())
    };
    // SAFETY: `client` is NULL or a live handle (caller's obligation).
    unsafe { with_client(client, body) }
}
