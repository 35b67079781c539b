//! [`Client`]: one connection to the daemon, with its own segment, rings and doorbells.

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::marker::PhantomData;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nerva_rings::completion::Event as WireEvent;
use nerva_rings::descriptor::GenerateRequest as WireGenerate;
use nerva_rings::handshake::ABI_VERSION;
use nerva_rings::{
    AdminOptions, AdminQuery, ByteRange, ClientEnd, Completion, Descriptor, EventFd, EventKind,
    Extension, GenerateFlags, Notifier, PromptKind, PushError, SamplingParams, Segment,
    SegmentMapping, StatusCode,
};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};

use crate::connection::{RingSizes, connect_to, default_socket_path};
use crate::error::{Error, Result};
use crate::event::{Event, EventRef, FinishReason, Tag, Timings};
use crate::input_arena::{ArenaError, InputArena};
use crate::params::{GenerateParams, Prompt};
use crate::text_assembly::TextAssembler;

/// Tags with this bit are the library's own (NOP, admin); user requests count up from 1.
const INTERNAL_TAG: u64 = 1 << 63;
/// How often a non-blocking call that finds nothing checks the socket for a daemon hang-up.
const LIVENESS_INTERVAL: Duration = Duration::from_millis(2);
/// How long the blocking NOP and admin calls wait for their reply.
const REPLY_TIMEOUT: Duration = Duration::from_secs(5);
/// Completions decoded per ring refresh in one `poll`.
const POLL_BATCH: usize = 64;

/// Options for [`Client::connect_with`].
#[derive(Debug, Clone, Default)]
pub struct ConnectOptions {
    /// Socket path; `None` for [`crate::default_socket_path`].
    pub socket: Option<PathBuf>,
    /// Ring and region sizes to ask for (zero: the daemon's defaults).
    pub sizes: RingSizes,
    /// How long [`Client::wait`] spins on the completion ring before it sleeps on the doorbell.
    pub spin: Duration,
}

struct InFlight {
    samples_left: u16,
    next_seq: u32,
    user_data: u64,
    /// Whether the request asked for log-probabilities (without, token events carry none).
    logprobs: bool,
}

/// What the daemon serves and the limits it enforces ([`Client::model_info`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelInfo {
    /// Model name or path.
    pub name: String,
    /// Architecture (e.g. `Qwen3`, `Llama`).
    pub architecture: String,
    /// Storage dtype of the weights (`bf16`, `f16`, `f32`; `none` for the test engine).
    pub dtype: String,
    /// Vocabulary size: valid token ids are `0..vocab_size`.
    pub vocab_size: u32,
    /// Longest sequence (prompt + generated tokens) the daemon serves.
    pub max_context: u32,
    /// Whether [`Client::tokenize`] / [`Client::detokenize`] are available.
    pub has_tokenizer: bool,
    /// Most sequences (samples) the daemon runs at once (`--max-batch`); a request's
    /// `n_samples` may not exceed it.
    pub max_batch: u32,
    /// Most samples one request may ask for on the wire.
    pub max_samples: u32,
    /// Most stop strings per request.
    pub max_stop_strings: u32,
    /// Longest stop string in bytes.
    pub max_stop_string_bytes: u32,
    /// Most stop token ids per request.
    pub max_stop_token_ids: u32,
    /// Most top log-probabilities per token.
    pub max_top_logprobs: u32,
    /// Largest ring a client may ask for at connect ([`RingSizes`]).
    pub max_ring_entries: u32,
    /// Largest input region a client may ask for at connect.
    pub max_data_bytes: u64,
    /// This client's submission ring entries.
    pub sq_entries: u32,
    /// This client's completion ring entries.
    pub cq_entries: u32,
    /// This client's input region bytes (prompts, token ids, stop lists of requests in flight).
    pub data_bytes: u64,
    /// This client's output region bytes (largest admin / tokenize reply).
    pub reply_bytes: u64,
}

impl ModelInfo {
    fn from_json(text: &str) -> Result<Self> {
        let v: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| Error::Protocol(format!("model info is not JSON: {e}")))?;
        let field = |path: &[&str]| -> Result<&serde_json::Value> {
            let mut at = &v;
            for key in path {
                at = at.get(key).ok_or_else(|| {
                    Error::Protocol(format!("model info lacks {}", path.join(".")))
                })?;
            }
            Ok(at)
        };
        let text = |path: &[&str]| -> Result<String> {
            field(path)?
                .as_str()
                .map(str::to_owned)
                .ok_or_else(|| Error::Protocol(format!("model info {}", path.join("."))))
        };
        let num = |path: &[&str]| -> Result<u64> {
            field(path)?
                .as_u64()
                .ok_or_else(|| Error::Protocol(format!("model info {}", path.join("."))))
        };
        let small = |path: &[&str]| -> Result<u32> {
            u32::try_from(num(path)?)
                .map_err(|_| Error::Protocol(format!("model info {}", path.join("."))))
        };
        Ok(ModelInfo {
            name: text(&["name"])?,
            architecture: text(&["architecture"])?,
            dtype: text(&["dtype"])?,
            vocab_size: small(&["vocab_size"])?,
            max_context: small(&["max_context"])?,
            has_tokenizer: field(&["tokenizer"])?.as_bool().unwrap_or(false),
            max_batch: small(&["limits", "max_batch"])?,
            max_samples: small(&["limits", "max_samples"])?,
            max_stop_strings: small(&["limits", "max_stop_strings"])?,
            max_stop_string_bytes: small(&["limits", "max_stop_string_bytes"])?,
            max_stop_token_ids: small(&["limits", "max_stop_token_ids"])?,
            max_top_logprobs: small(&["limits", "max_top_logprobs"])?,
            max_ring_entries: small(&["limits", "max_ring_entries"])?,
            max_data_bytes: num(&["limits", "max_data_bytes"])?,
            sq_entries: small(&["client", "sq_entries"])?,
            cq_entries: small(&["client", "cq_entries"])?,
            data_bytes: num(&["client", "data_bytes"])?,
            reply_bytes: num(&["client", "reply_bytes"])?,
        })
    }
}

/// A connection to `nervad`.
///
/// `Send` but not `Sync`: use a client from one thread at a time (move it between threads
/// freely). A process may open many clients; each has its own segment, rings and doorbells, so
/// clients never contend with each other.
///
/// Dropping the client (or [`Client::close`]) closes the socket; the daemon cancels whatever
/// was still in flight and reclaims the segment.
///
/// ```
/// fn is_send<T: Send>() {}
/// is_send::<nerva_client::Client>();
/// ```
/// ```compile_fail
/// fn is_sync<T: Sync>() {}
/// is_sync::<nerva_client::Client>(); // one thread at a time: not Sync
/// ```
pub struct Client {
    end: ClientEnd,
    sq_bell: Notifier,
    cq_bell: EventFd,
    socket: OwnedFd,
    /// The readiness descriptor: an epoll set over the completion doorbell and the socket
    /// (readable when the doorbell rang or the daemon hung up).
    ready_fd: Epoll,
    /// Set once the caller took the readiness descriptor: from then on every poll leaves the
    /// doorbell armed (or the descriptor readable), so an external event loop never misses an
    /// event. Off by default: arming costs the daemon an eventfd write per completion pass.
    external_wait: Cell<bool>,
    arena: InputArena,
    /// Descriptors pushed so far (wrapping); the submission sequence number of the next one.
    submitted: u32,
    next_tag: u64,
    next_internal: u64,
    in_flight: HashMap<u64, InFlight>,
    /// Events received while a blocking call waited for its own reply.
    pending: VecDeque<Event>,
    /// Completions copied out of the ring by `drain` (allocated once: a poll that finds
    /// nothing should not zero 4 KiB of stack first).
    drained: Box<[Completion; POLL_BATCH]>,
    text: TextAssembler,
    spin: Duration,
    /// How long the blocking NOP, admin and tokenize calls wait for their reply.
    reply_timeout: Duration,
    last_liveness: Instant,
    shutting_down: bool,
    gone: bool,
    daemon_pid: u32,
    slot: u32,
    /// The slot's generation (see [`Client::generation`]).
    generation: u32,
    page_bytes: u64,
    epoch: Instant,
    // The rings' halves are already !Sync; this states the contract explicitly.
    _not_sync: PhantomData<Cell<()>>,
}

/// This library's wire ABI version (the daemon must speak the same).
pub fn abi_version() -> u32 {
    ABI_VERSION
}

impl Client {
    /// Connect to the daemon at `path` (or the default socket path) with default sizes.
    pub fn connect(path: Option<&Path>) -> Result<Client> {
        Self::connect_with(&ConnectOptions {
            socket: path.map(Path::to_path_buf),
            ..ConnectOptions::default()
        })
    }

    /// Connect with explicit options.
    pub fn connect_with(options: &ConnectOptions) -> Result<Client> {
        let path = options.socket.clone().unwrap_or_else(default_socket_path);
        let conn = connect_to(&path, options.sizes)?;
        let len = usize::try_from(conn.welcome.segment_bytes)
            .map_err(|_| Error::Protocol("segment size".into()))?;
        let mapping = SegmentMapping::map_fd(conn.map_fd.as_fd(), len)?;
        drop(conn.map_fd);
        let segment: Arc<Segment> =
            Segment::open(mapping).map_err(|e| Error::Protocol(format!("segment header: {e}")))?;
        let end = segment
            .client_end()
            .map_err(|e| Error::Protocol(format!("segment: {e}")))?;
        let sq_bell = Notifier::new(
            end.daemon_sleeping.clone(),
            EventFd::from_owned(conn.sq_doorbell)?,
        );
        let cq_bell = EventFd::from_owned(conn.cq_doorbell)?;
        let ready_fd = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        ready_fd.add(cq_bell.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, 0))?;
        ready_fd.add(
            conn.socket.as_fd(),
            EpollEvent::new(
                EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP | EpollFlags::EPOLLHUP,
                1,
            ),
        )?;
        let arena = InputArena::new(end.input.len());
        Ok(Client {
            end,
            sq_bell,
            cq_bell,
            socket: conn.socket,
            ready_fd,
            external_wait: Cell::new(false),
            arena,
            submitted: 0,
            next_tag: 1,
            next_internal: 1,
            in_flight: HashMap::new(),
            pending: VecDeque::new(),
            drained: Box::new([Completion::default(); POLL_BATCH]),
            text: TextAssembler::default(),
            spin: options.spin,
            reply_timeout: REPLY_TIMEOUT,
            last_liveness: Instant::now(),
            shutting_down: false,
            gone: false,
            daemon_pid: conn.welcome.daemon_pid,
            slot: conn.welcome.client_slot,
            generation: conn.welcome.client_generation,
            page_bytes: conn.welcome.page_bytes,
            epoch: Instant::now(),
            _not_sync: PhantomData,
        })
    }

    /// Close the connection. In-flight requests are cancelled by the daemon.
    pub fn close(self) {
        drop(self);
    }

    /// The daemon's pid.
    pub fn daemon_pid(&self) -> u32 {
        self.daemon_pid
    }

    /// This client's slot in the daemon (as `nervactl clients` shows it).
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// How many times the daemon has handed out this client's slot: with [`Client::slot`], it
    /// names this connection among all the daemon has served (the token ledger's
    /// `client_slot` and `client_generation`).
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// Page size backing the shared segment.
    pub fn page_bytes(&self) -> u64 {
        self.page_bytes
    }

    /// Requests submitted whose samples have not all finished.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Set how long the blocking calls (NOP, admin queries, model info, tokenize) wait for
    /// their reply before [`Error::Timeout`] (default 5 s).
    pub fn set_reply_timeout(&mut self, timeout: Duration) {
        self.reply_timeout = timeout;
    }

    /// Set how long [`Client::wait`] spins before sleeping on the doorbell (0: sleep at once).
    pub fn set_spin(&mut self, spin: Duration) {
        self.spin = spin;
    }

    /// The readiness descriptor, for an application's own event loop (epoll, poll, kqueue
    /// emulation, tokio's `AsyncFd`); the same as [`AsRawFd::as_raw_fd`].
    ///
    /// It becomes readable (`POLLIN`) when events are ready or the daemon went away; it is
    /// itself an epoll descriptor over the completion doorbell and the socket, owned by the
    /// client (do not close it; it closes with the client).
    ///
    /// Contract (liburing's eventfd model): after the first call, every [`Client::poll`] /
    /// [`Client::poll_with`] that returns leaves either the doorbell armed (the daemon rings it
    /// with its next completion) or the descriptor readable (events are still waiting). So an
    /// event loop waits for readability, then polls until a poll delivers nothing, and never
    /// misses an event. It is level-triggered; with edge-triggered epoll, poll until empty.
    /// The daemon's hang-up also makes it readable: the next poll reports
    /// [`Error::DaemonGone`] once every event is delivered.
    pub fn ready_fd(&self) -> RawFd {
        if !self.external_wait.replace(true) {
            // First use: arm now, so events on their way ring the doorbell, and make the
            // descriptor readable once so the loop's first poll collects what already arrived.
            self.end.client_waiting.prepare_sleep();
            self.wake_ready_fd();
        }
        self.ready_fd.0.as_raw_fd()
    }

    /// Arm the completion doorbell, or make the readiness descriptor readable when events
    /// are already waiting.
    fn arm_external(&mut self) {
        // Need-wakeup handshake as in `block`: announce, then re-check the ring.
        self.end.client_waiting.prepare_sleep();
        if !self.pending.is_empty() || self.has_completions().unwrap_or(true) {
            self.wake_ready_fd();
        }
    }

    /// Make the readiness descriptor readable (a write to our own doorbell).
    pub(crate) fn wake_ready_fd(&self) {
        // A failed write leaves the counter as it was (EAGAIN: already readable).
        let _ = self.cq_bell.signal();
    }

    /// Whether the readiness descriptor was taken ([`Client::ready_fd`]).
    pub(crate) fn external_wait(&self) -> bool {
        self.external_wait.get()
    }

    /// The readiness descriptor without switching to external-wait mode (for a wait that
    /// arms the doorbell itself through [`Client::prepare_wait`]).
    pub(crate) fn wait_fd(&self) -> BorrowedFd<'_> {
        self.ready_fd.0.as_fd()
    }

    /// For a caller that sleeps *outside* the client, e.g. with the client behind a mutex so
    /// other threads keep submitting while one thread waits:
    ///
    /// ```no_run
    /// # use std::sync::Mutex;
    /// # use std::os::fd::AsRawFd;
    /// # let client = Mutex::new(nerva_client::Client::connect(None)?);
    /// let fd = client.lock().unwrap().as_raw_fd();
    /// loop {
    ///     if client.lock().unwrap().prepare_wait()? {
    ///         break; // events are ready: poll them
    ///     }
    ///     // Sleep without the lock: submitters are never blocked behind this thread.
    ///     let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    ///     // SAFETY: one valid pollfd.
    ///     unsafe { libc::poll(&mut pfd, 1, 1000) };
    /// }
    /// # Ok::<(), nerva_client::Error>(())
    /// ```
    ///
    /// Returns `Ok(true)` when events are ready (poll them), or arms the completion doorbell
    /// and returns `Ok(false)`: then sleep until [`Client::ready_fd`] is readable and call
    /// again. Fails with [`Error::DaemonGone`] once the daemon hung up and every event it sent
    /// was delivered.
    pub fn prepare_wait(&mut self) -> Result<bool> {
        if !self.pending.is_empty() {
            return Ok(true);
        }
        self.check_usable()?;
        // A stale doorbell count would keep the descriptor readable and spin the sleeper.
        let _ = self.cq_bell.drain();
        if !self.has_completions()? {
            // Need-wakeup handshake as in `block`: announce, then re-check.
            self.end.client_waiting.prepare_sleep();
            if !self.has_completions()? {
                self.check_alive(PollTimeout::ZERO)?;
                return Ok(false);
            }
        }
        if !self.external_wait.get() {
            self.end.client_waiting.finish_sleep();
        }
        Ok(true)
    }

    fn check_usable(&self) -> Result<()> {
        if self.gone {
            return Err(Error::DaemonGone);
        }
        Ok(())
    }

    /// Submit a generation. Returns its tag; events for it follow through [`Client::poll`].
    ///
    /// Never blocks: if the submission ring or the input region is full, returns
    /// [`Error::QueueFull`] (poll for events, then retry).
    pub fn submit_generate(&mut self, prompt: Prompt<'_>, params: &GenerateParams) -> Result<Tag> {
        self.check_usable()?;
        if self.shutting_down {
            return Err(Error::ShuttingDown);
        }
        params.validate()?;
        let token_bytes;
        let (kind, bytes): (PromptKind, &[u8]) = match prompt {
            Prompt::Text(t) => (PromptKind::Text, t.as_bytes()),
            Prompt::Chat(c) => (PromptKind::ChatJson, c.as_bytes()),
            Prompt::Tokens(ids) => {
                token_bytes = ids
                    .iter()
                    .flat_map(|id| id.to_le_bytes())
                    .collect::<Vec<u8>>();
                (PromptKind::TokenIds, &token_bytes[..])
            }
        };
        if bytes.is_empty() {
            return Err(Error::InvalidArgument("empty prompt".into()));
        }
        let ext = Extension {
            stop_token_ids: params.stop_token_ids.clone(),
            stop_strings: params.stop_strings.clone(),
            presence_penalty: params.presence_penalty,
            frequency_penalty: params.frequency_penalty,
            top_logprobs: params.top_logprobs,
            ignore_eos: params.ignore_eos,
        };
        let ext_bytes = if ext.is_default() {
            Vec::new()
        } else {
            ext.encode()
                .map_err(|e| Error::InvalidArgument(format!("stop conditions: {e:?}")))?
        };
        let total = bytes.len() as u64 + ext_bytes.len() as u64;
        self.reclaim_input()?;
        let (offset, end) = match self.arena.reserve(total) {
            Ok(r) => r,
            Err(ArenaError::TooLarge) => {
                return Err(Error::TooLarge {
                    needed: total,
                    capacity: self.arena.size(),
                });
            }
            Err(ArenaError::Full) => return Err(Error::QueueFull),
        };
        let offset32 = u32::try_from(offset).map_err(|_| Error::Protocol("input offset".into()))?;
        let prompt_len = u32::try_from(bytes.len()).map_err(|_| Error::TooLarge {
            needed: total,
            capacity: self.arena.size(),
        })?;
        let tag = self.next_tag;
        let mut flags = GenerateFlags::NONE;
        if params.stream_tokens {
            flags = flags | GenerateFlags::STREAM_TOKENS;
        }
        if params.stream_text {
            flags = flags | GenerateFlags::STREAM_TEXT;
        }
        if params.logprobs {
            flags = flags | GenerateFlags::LOGPROBS;
        }
        let request = WireGenerate {
            tag,
            prompt_kind: kind,
            prompt: ByteRange::new(offset32, prompt_len),
            max_tokens: params.max_tokens,
            sampling: SamplingParams {
                temperature: params.temperature,
                top_k: params.top_k,
                top_p: params.top_p,
                min_p: params.min_p,
                repetition_penalty: params.repetition_penalty,
                seed: params.seed,
            },
            n_samples: params.n_samples,
            priority: params.priority,
            flags,
            extension: (!ext_bytes.is_empty())
                .then(|| ByteRange::new(offset32 + prompt_len, ext_bytes.len() as u32)),
        };
        let descriptor =
            Descriptor::generate(&request).map_err(|e| Error::InvalidArgument(format!("{e:?}")))?;
        // Bytes first, then the descriptor: the ring's Release publish orders them.
        self.end
            .input
            .write(offset32, bytes)
            .and_then(|()| self.end.input.write(offset32 + prompt_len, &ext_bytes))
            .map_err(|e| Error::Protocol(format!("input region: {e:?}")))?;
        self.push(descriptor)?;
        self.arena.commit(self.submitted.wrapping_sub(1), end);
        self.next_tag += 1;
        self.in_flight.insert(
            tag,
            InFlight {
                samples_left: params.n_samples,
                next_seq: 0,
                user_data: params.user_data,
                logprobs: params.logprobs,
            },
        );
        Ok(Tag(tag))
    }

    /// Ask the daemon to cancel `tag`. Its samples end with `Done { reason: Cancelled }` (or
    /// normally, if they finished first).
    pub fn cancel(&mut self, tag: Tag) -> Result<()> {
        self.check_usable()?;
        if !self.in_flight.contains_key(&tag.0) {
            return Err(Error::UnknownTag(tag.0));
        }
        self.push(Descriptor::cancel(tag.0))
    }

    fn push(&mut self, descriptor: Descriptor) -> Result<()> {
        match self.end.submissions.push(descriptor) {
            Ok(()) => {}
            Err(PushError::Full(_)) => return Err(Error::QueueFull),
            Err(PushError::Corrupt(_, e)) => return Err(Error::Protocol(e.to_string())),
        }
        self.submitted = self.submitted.wrapping_add(1);
        self.sq_bell.notify()?;
        Ok(())
    }

    /// Release input bytes of descriptors the daemon has consumed.
    fn reclaim_input(&mut self) -> Result<()> {
        let free = self
            .end
            .submissions
            .free_slots()
            .map_err(|e| Error::Protocol(e.to_string()))?;
        let queued = self.end.submissions.capacity() - free;
        self.arena
            .release_before(self.submitted.wrapping_sub(queued));
        Ok(())
    }

    /// Round trip of one `NOP` through the daemon (measures the transport: rings, doorbells,
    /// the daemon's poll loop). Blocks up to 5 s; other events that arrive meanwhile are kept
    /// for the next [`Client::poll`].
    pub fn nop(&mut self) -> Result<Duration> {
        self.check_usable()?;
        let tag = INTERNAL_TAG | self.next_internal;
        self.next_internal += 1;
        let sent = self.epoch.elapsed().as_nanos() as u64;
        let start = Instant::now();
        self.push(Descriptor::nop(tag, sent))?;
        match self.await_reply(tag, EventKind::NopReply)? {
            WireEvent::NopReply { payload } if payload == sent => Ok(start.elapsed()),
            _ => Err(Error::Protocol(
                "NOP reply does not echo the payload".into(),
            )),
        }
    }

    /// The daemon's status as JSON (model, backend, device, arenas, page size, uptime).
    pub fn status(&mut self) -> Result<String> {
        self.admin(AdminQuery::Status)
    }

    /// Connected clients as JSON (pid, uid, ring occupancy, in-flight, tokens served).
    pub fn clients(&mut self) -> Result<String> {
        self.admin(AdminQuery::Clients)
    }

    /// Throughput and latency percentiles as JSON.
    pub fn stats(&mut self) -> Result<String> {
        self.admin(AdminQuery::Stats)
    }

    /// The token ledger of recent samples as JSON: each sample's sums and its per-token records
    /// (wall latency, observation lag, device time, launches, syncs by class, copies,
    /// allocations). The daemon leaves out the oldest samples when the whole does not fit this
    /// client's output region (`omitted_samples` counts them).
    pub fn ledger(&mut self) -> Result<String> {
        self.admin(AdminQuery::Ledger)
    }

    /// Ask the daemon to drain and exit (subject to its access policy). Returns its
    /// acknowledgement as JSON.
    pub fn shutdown_daemon(&mut self) -> Result<String> {
        self.admin(AdminQuery::Shutdown)
    }

    /// What the daemon serves and the limits it enforces (model name, architecture, dtype,
    /// vocabulary size, context length, batch / sample / stop-list limits) and this client's
    /// own ring and region sizes. One round trip (blocks up to 5 s; other events are kept).
    pub fn model_info(&mut self) -> Result<ModelInfo> {
        let json = self.admin(AdminQuery::ModelInfo)?;
        ModelInfo::from_json(&json)
    }

    /// Token ids of `text` through the daemon's tokenizer. `add_special_tokens` adds what a
    /// text prompt gets (e.g. a leading BOS), so the count is what a generation would process.
    /// One round trip (blocks up to 5 s; other events are kept for the next poll).
    pub fn tokenize(&mut self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        if text.is_empty() {
            return Ok(Vec::new());
        }
        let options = if add_special_tokens {
            AdminOptions::ADD_SPECIAL_TOKENS
        } else {
            AdminOptions::NONE
        };
        let reply = self.admin_bytes(AdminQuery::Tokenize, Some((text.as_bytes(), options)))?;
        if !reply.len().is_multiple_of(4) {
            return Err(Error::Protocol("tokenize reply is not whole ids".into()));
        }
        Ok(reply
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// Text of `ids` through the daemon's tokenizer; `skip_special_tokens` leaves special
    /// tokens out. An id outside the vocabulary is refused ([`Error::Refused`] with
    /// `TokenOutOfVocab`). One round trip.
    pub fn detokenize(&mut self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        if ids.is_empty() {
            return Ok(String::new());
        }
        let options = if skip_special_tokens {
            AdminOptions::SKIP_SPECIAL_TOKENS
        } else {
            AdminOptions::NONE
        };
        let bytes: Vec<u8> = ids.iter().flat_map(|id| id.to_le_bytes()).collect();
        let reply = self.admin_bytes(AdminQuery::Detokenize, Some((&bytes, options)))?;
        String::from_utf8(reply)
            .map_err(|_| Error::Protocol("detokenize reply is not UTF-8".into()))
    }

    fn admin(&mut self, query: AdminQuery) -> Result<String> {
        let bytes = self.admin_bytes(query, None)?;
        String::from_utf8(bytes).map_err(|_| Error::Protocol("admin reply is not UTF-8".into()))
    }

    /// One blocking admin round trip; `input` goes through the input region like a prompt.
    fn admin_bytes(
        &mut self,
        query: AdminQuery,
        input: Option<(&[u8], AdminOptions)>,
    ) -> Result<Vec<u8>> {
        self.check_usable()?;
        let tag = INTERNAL_TAG | self.next_internal;
        // Blocking call on `&mut self`: no other admin reply can be in flight, so the whole
        // output region is this reply's buffer.
        let cap = u32::try_from(self.end.output.len()).unwrap_or(u32::MAX);
        let reply_range = ByteRange::new(0, cap);
        let mut reserved = None;
        let descriptor = match input {
            None => Descriptor::admin(tag, query, reply_range),
            Some((bytes, options)) => {
                let capacity = self.arena.size();
                let too_large = || Error::TooLarge {
                    needed: bytes.len() as u64,
                    capacity,
                };
                self.reclaim_input()?;
                let (offset, end) = match self.arena.reserve(bytes.len() as u64) {
                    Ok(r) => r,
                    Err(ArenaError::TooLarge) => return Err(too_large()),
                    Err(ArenaError::Full) => return Err(Error::QueueFull),
                };
                let offset = u32::try_from(offset).map_err(|_| too_large())?;
                let len = u32::try_from(bytes.len()).map_err(|_| too_large())?;
                self.end
                    .input
                    .write(offset, bytes)
                    .map_err(|e| Error::Protocol(format!("input region: {e:?}")))?;
                reserved = Some(end);
                Descriptor::admin_with_input(
                    tag,
                    query,
                    reply_range,
                    ByteRange::new(offset, len),
                    options,
                )
            }
        };
        self.next_internal += 1;
        self.push(descriptor)?;
        if let Some(end) = reserved {
            self.arena.commit(self.submitted.wrapping_sub(1), end);
        }
        let WireEvent::AdminReply(reply) = self.await_reply(tag, EventKind::AdminReply)? else {
            return Err(Error::Protocol("admin reply expected".into()));
        };
        if reply.status != StatusCode::Ok.as_u16() {
            return Err(match StatusCode::from_u16(reply.status) {
                Some(StatusCode::ReplyTruncated) => Error::TooLarge {
                    needed: u64::from(reply.required),
                    capacity: u64::from(cap),
                },
                Some(code) => Error::Rejected(code),
                None => Error::Protocol(format!("admin status {}", reply.status)),
            });
        }
        self.end
            .output
            .read_range(ByteRange::new(reply.offset, reply.len))
            .map_err(|e| Error::Protocol(format!("admin reply range: {e:?}")))
    }

    /// Wait for the completion `tag`/`kind` (or an ERROR for `tag`, returned as
    /// [`Error::Refused`]), stashing every other event in `pending`.
    fn await_reply(&mut self, tag: u64, kind: EventKind) -> Result<WireEvent> {
        let deadline = Instant::now() + self.reply_timeout;
        loop {
            let mut found = None;
            let mut stash = Vec::new();
            self.drain(
                |c| {
                    let ours = c.kind() == Some(kind) || c.kind() == Some(EventKind::Error);
                    if c.tag() == tag && ours && found.is_none() {
                        found = Some(*c);
                        false
                    } else {
                        true
                    }
                },
                &mut |e| stash.push(e.to_owned()),
            )?;
            self.pending.extend(stash);
            if let Some(c) = found {
                return match c.event().map_err(|e| Error::Protocol(e.to_string()))? {
                    WireEvent::Error { status, detail } => {
                        Err(match StatusCode::from_u16(status) {
                            Some(status) => Error::Refused {
                                status,
                                detail: detail.as_str().to_owned(),
                            },
                            None => Error::Protocol(format!("unknown status {status}")),
                        })
                    }
                    event => Ok(event),
                };
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout);
            }
            self.block(Some(left))?;
        }
    }

    /// Deliver available events to `f` without blocking; returns how many were delivered.
    /// Borrowed data in an event is valid during the call to `f` only.
    pub fn poll_with(&mut self, mut f: impl FnMut(EventRef<'_>)) -> Result<usize> {
        let external = self.external_wait.get();
        if external {
            // Reset the readiness descriptor before looking at the ring: a completion pushed
            // after this read rings it again (the flag is re-armed below).
            let _ = self.cq_bell.drain();
        }
        let mut n = 0;
        while let Some(e) = self.pending.pop_front() {
            f(e.to_ref());
            n += 1;
        }
        if self.gone {
            return if n > 0 { Ok(n) } else { Err(Error::DaemonGone) };
        }
        let got = self.drain(|_| true, &mut |e| {
            f(e);
        });
        if external {
            // Whatever happened, leave the doorbell armed or the descriptor readable.
            self.arm_external();
        }
        n += got?;
        // An event loop woke us: the hang-up may be what made the descriptor readable, so
        // check at once instead of every LIVENESS_INTERVAL.
        if n == 0 && (external || self.last_liveness.elapsed() >= LIVENESS_INTERVAL) {
            self.last_liveness = Instant::now();
            self.check_alive(PollTimeout::ZERO)?;
        }
        Ok(n)
    }

    /// Append available events to `events` without blocking; returns how many were added.
    pub fn poll(&mut self, events: &mut Vec<Event>) -> Result<usize> {
        self.poll_with(|e| events.push(e.to_owned()))
    }

    /// Block until an event is available, the timeout passes (`Ok(false)`), or the daemon
    /// goes away (`Err(DaemonGone)`). Spins first for the configured spin time, then sleeps on
    /// the completion doorbell together with the socket (so a daemon crash wakes it).
    pub fn wait(&mut self, timeout: Option<Duration>) -> Result<bool> {
        if !self.pending.is_empty() {
            return Ok(true);
        }
        self.check_usable()?;
        self.block(timeout)
    }

    fn has_completions(&mut self) -> Result<bool> {
        self.end
            .completions
            .has_pending()
            .map_err(|e| Error::Protocol(e.to_string()))
    }

    fn block(&mut self, timeout: Option<Duration>) -> Result<bool> {
        let start = Instant::now();
        let deadline = timeout.map(|t| start + t);
        if !self.spin.is_zero() {
            while start.elapsed() < self.spin {
                if self.has_completions()? {
                    return Ok(true);
                }
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Ok(false);
                }
                std::hint::spin_loop();
            }
        }
        loop {
            if self.has_completions()? {
                return Ok(true);
            }
            // Need-wakeup handshake: announce, re-check, then sleep.
            self.end.client_waiting.prepare_sleep();
            if self.has_completions()? {
                self.end.client_waiting.finish_sleep();
                return Ok(true);
            }
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if left.is_some_and(|l| l.is_zero()) {
                self.end.client_waiting.finish_sleep();
                return Ok(false);
            }
            let timeout = match left {
                None => PollTimeout::NONE,
                // Round up so a sub-millisecond remainder still sleeps instead of spinning.
                Some(l) => PollTimeout::try_from(l + Duration::from_micros(999))
                    .unwrap_or(PollTimeout::MAX),
            };
            let woke = self.sleep_on_doorbell(timeout);
            self.end.client_waiting.finish_sleep();
            let _ = self.cq_bell.drain();
            if self.external_wait.get() {
                self.arm_external();
            }
            woke?;
        }
    }

    /// poll(2) on the completion doorbell and the socket.
    fn sleep_on_doorbell(&mut self, timeout: PollTimeout) -> Result<()> {
        let mut fds = [
            PollFd::new(self.cq_bell.as_fd(), PollFlags::POLLIN),
            PollFd::new(self.socket.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, timeout) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
        let sock = fds[1].revents().unwrap_or(PollFlags::empty());
        if !sock.is_empty() {
            self.check_alive(PollTimeout::ZERO)?;
        }
        Ok(())
    }

    /// The daemon never writes to the socket after the welcome: readable means EOF or error,
    /// i.e. the daemon is gone.
    fn check_alive(&mut self, timeout: PollTimeout) -> Result<()> {
        let mut fds = [PollFd::new(self.socket.as_fd(), PollFlags::POLLIN)];
        let ready = poll(&mut fds, timeout).unwrap_or(0);
        let revents = fds[0].revents().unwrap_or(PollFlags::empty());
        if ready > 0 && !revents.is_empty() {
            // Anything readable (EOF, error, or stray bytes from a broken daemon) ends it, but
            // completions already in the ring are still delivered first.
            if self.has_completions().unwrap_or(false) {
                return Ok(());
            }
            self.gone = true;
            return Err(Error::DaemonGone);
        }
        Ok(())
    }

    /// Decode completions from the ring. `keep(c)` false means "the caller took this one"
    /// (internal replies); everything else goes to `f` as an event.
    fn drain(
        &mut self,
        mut keep: impl FnMut(&Completion) -> bool,
        f: &mut dyn FnMut(EventRef<'_>),
    ) -> Result<usize> {
        let mut delivered = 0;
        loop {
            let n = self
                .end
                .completions
                .pop_slice(&mut self.drained[..])
                .map_err(|e| Error::Protocol(e.to_string()))?;
            for i in 0..n {
                let c = self.drained[i];
                if !keep(&c) {
                    continue;
                }
                delivered += self.deliver(&c, f)?;
            }
            if n < POLL_BATCH {
                return Ok(delivered);
            }
        }
    }

    fn deliver(&mut self, c: &Completion, f: &mut dyn FnMut(EventRef<'_>)) -> Result<usize> {
        let raw_tag = c.tag();
        let tag = Tag(raw_tag);
        let sample = c.sample();
        if c.kind() == Some(EventKind::Shutdown) {
            self.shutting_down = true;
            f(EventRef::Shutdown);
            return Ok(1);
        }
        if raw_tag & INTERNAL_TAG != 0 {
            // A late reply to a blocking call that already timed out: nothing waits for it.
            return Ok(0);
        }
        let Some(state) = self.in_flight.get_mut(&raw_tag) else {
            return Err(Error::Protocol(format!(
                "completion for tag {raw_tag}, which is not in flight"
            )));
        };
        if c.seq() != state.next_seq {
            return Err(Error::Protocol(format!(
                "tag {raw_tag}: completion seq {} where {} was due",
                c.seq(),
                state.next_seq
            )));
        }
        state.next_seq = state.next_seq.wrapping_add(1);
        let user_data = state.user_data;
        let wants_logprobs = state.logprobs;
        // Text is reassembled from raw bytes so a split code point is joined, not refused.
        if let Some(bytes) = c.text_bytes() {
            if bytes.is_empty() {
                return Err(Error::Protocol(format!(
                    "empty TEXT completion for tag {raw_tag}"
                )));
            }
            let text = self.text.push(raw_tag, sample, bytes);
            if text.is_empty() {
                return Ok(0);
            }
            f(EventRef::Text {
                tag,
                user_data,
                sample,
                text,
            });
            return Ok(1);
        }
        let event = c.event().map_err(|e| Error::Protocol(e.to_string()))?;
        match event {
            WireEvent::Tokens(chunk) => f(EventRef::Tokens {
                tag,
                user_data,
                sample,
                ids: chunk.ids(),
                // The daemon fills the slots with NaN when not asked; the header promises
                // none at all then.
                logprobs: if wants_logprobs {
                    chunk.logprobs()
                } else {
                    &[]
                },
            }),
            WireEvent::TopLogprobs(top) => {
                let mut ids = [0u32; nerva_rings::INLINE_TOP_LOGPROBS];
                let mut lps = [0f32; nerva_rings::INLINE_TOP_LOGPROBS];
                let pairs = top.pairs();
                for (i, (id, lp)) in pairs.iter().enumerate() {
                    ids[i] = *id;
                    lps[i] = *lp;
                }
                f(EventRef::TopLogprobs {
                    tag,
                    user_data,
                    sample,
                    position: top.position,
                    ids: &ids[..pairs.len()],
                    logprobs: &lps[..pairs.len()],
                });
            }
            WireEvent::Done(info) => {
                let mut delivered = 0;
                let tail = self.text.finish(raw_tag, sample);
                if !tail.is_empty() {
                    f(EventRef::Text {
                        tag,
                        user_data,
                        sample,
                        text: tail,
                    });
                    delivered += 1;
                }
                let reason = match info.finish {
                    nerva_rings::FinishReason::Stop => FinishReason::Stop,
                    nerva_rings::FinishReason::Length => FinishReason::Length,
                    nerva_rings::FinishReason::ContextLength => FinishReason::ContextLength,
                    nerva_rings::FinishReason::Cancelled => FinishReason::Cancelled,
                    nerva_rings::FinishReason::Error => FinishReason::Error,
                    nerva_rings::FinishReason::Shutdown => FinishReason::Shutdown,
                };
                let timings = Timings {
                    queue: Duration::from_micros(info.queue_us),
                    time_to_first_token: Duration::from_micros(info.first_token_us),
                    decode: Duration::from_micros(info.decode_us),
                    prompt_tokens: info.prompt_tokens,
                    generated_tokens: info.generated_tokens,
                };
                if let Some(state) = self.in_flight.get_mut(&raw_tag) {
                    state.samples_left = state.samples_left.saturating_sub(1);
                    if state.samples_left == 0 {
                        self.in_flight.remove(&raw_tag);
                    }
                }
                f(EventRef::Done {
                    tag,
                    user_data,
                    sample,
                    reason,
                    timings,
                });
                return Ok(delivered + 1);
            }
            WireEvent::Error { status, detail } => {
                self.in_flight.remove(&raw_tag);
                f(EventRef::Error {
                    tag,
                    user_data,
                    status,
                    detail: detail.as_str(),
                });
            }
            WireEvent::Text(_)
            | WireEvent::Shutdown { .. }
            | WireEvent::NopReply { .. }
            | WireEvent::AdminReply(_) => {
                return Err(Error::Protocol(format!(
                    "unexpected completion kind for tag {raw_tag}"
                )));
            }
        }
        Ok(1)
    }
}

impl AsRawFd for Client {
    /// The readiness descriptor ([`Client::ready_fd`]).
    fn as_raw_fd(&self) -> RawFd {
        self.ready_fd()
    }
}

impl AsFd for Client {
    /// The readiness descriptor ([`Client::ready_fd`]), borrowed for the client's lifetime.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.ready_fd();
        self.ready_fd.0.as_fd()
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("slot", &self.slot)
            .field("daemon_pid", &self.daemon_pid)
            .field("in_flight", &self.in_flight.len())
            .field("gone", &self.gone)
            .finish()
    }
}
