//! The gateway's side of the daemon: a bounded pool of [`Client`] connections that many HTTP
//! requests share, and the one place that waits on a client.
//!
//! Each connection is owned by a *driver*: a task on the async runtime that submits the
//! requests routed to it, reaps the client's events and forwards them into per-request
//! channels. It sleeps on the client's readiness descriptor ([`Client::ready_fd`], through
//! tokio's `AsyncFd`) and on its command channel at once, so no thread is parked per client
//! and a submission never waits for a timer. A connection carries any number of requests at
//! once (the daemon batches them), so HTTP requests never queue behind each other; requests go
//! to the connection with the fewest active ones.
//!
//! Faults: a connection whose daemon goes away fails its requests with
//! [`Failure::DaemonGone`] and reconnects in the background (a restarted daemon on the same
//! socket is picked up); while it is down, new requests fail at once instead of hanging.

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, RawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nerva_client::{
    Client, ConnectOptions, Error, EventRef, FinishReason, GenerateParams, Prompt, Timings,
};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

/// What a request is generated from.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    /// UTF-8 text, tokenized by the daemon.
    Text(String),
    /// Token ids.
    Tokens(Vec<u32>),
    /// A JSON array of `{"role", "content"}` messages, rendered by the daemon's chat template.
    Chat(String),
}

/// Why a request failed as a whole.
#[derive(Debug, Clone, PartialEq)]
pub enum Failure {
    /// The daemon refused it (`status` is the wire's request status).
    Rejected {
        /// The daemon's status code.
        status: u16,
        /// The daemon's detail.
        detail: String,
    },
    /// The client library refused it before sending (bad argument, too large).
    Invalid(String),
    /// The daemon is not reachable (exited, restarting, never started).
    DaemonGone,
    /// The daemon is draining and takes no new work.
    ShuttingDown,
    /// Anything else the client library reported.
    Other(String),
}

/// One event of a request, owned, as it travels from a driver to the HTTP handler.
#[derive(Debug, Clone, PartialEq)]
pub enum GenEvent {
    /// Sampled token ids (only when the request asked for token events).
    Tokens {
        /// Sample index.
        sample: u16,
        /// Ids.
        ids: Vec<u32>,
        /// Their log-probabilities (empty unless asked for).
        logprobs: Vec<f32>,
    },
    /// Alternatives for generated token `position`.
    TopLogprobs {
        /// Sample index.
        sample: u16,
        /// Generated token index.
        position: u32,
        /// Alternative ids, most likely first.
        ids: Vec<u32>,
        /// Their log-probabilities.
        logprobs: Vec<f32>,
    },
    /// Output text (whole code points).
    Text {
        /// Sample index.
        sample: u16,
        /// The piece.
        text: String,
    },
    /// One sample ended.
    Done {
        /// Sample index.
        sample: u16,
        /// Why.
        reason: FinishReason,
        /// The daemon's timings.
        timings: Timings,
    },
    /// The whole request failed; nothing follows.
    Failed(Failure),
}

/// Events of one submission, labelled with the caller's `slot` (several prompts of one HTTP
/// request share one channel).
pub type Labelled = (u32, GenEvent);

enum Command {
    Submit(Submission),
    Cancel { id: u64 },
}

struct Submission {
    id: u64,
    slot: u32,
    prompt: PromptInput,
    params: GenerateParams,
    events: UnboundedSender<Labelled>,
}

struct Connection {
    commands: UnboundedSender<Command>,
    /// Requests routed here and not finished (the driver decrements).
    active: Arc<AtomicUsize>,
    connected: Arc<AtomicBool>,
}

/// A bounded set of daemon connections shared by all HTTP requests.
pub struct Pool {
    connections: Vec<Connection>,
    next_id: AtomicU64,
    admin: Mutex<Option<Client>>,
    socket: Option<PathBuf>,
    /// Token id → its text alone (see [`Pool::token_texts`]).
    token_text: Mutex<HashMap<u32, String>>,
}

/// Cancels its request in the daemon when dropped before [`CancelOnDrop::finished`] (the HTTP
/// client went away mid-stream, or the handler gave up).
pub struct CancelOnDrop {
    commands: UnboundedSender<Command>,
    ids: Vec<u64>,
    armed: bool,
}

impl CancelOnDrop {
    /// Every submission ended on its own: nothing to cancel.
    pub fn finished(&mut self) {
        self.armed = false;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if self.armed {
            for &id in &self.ids {
                // A driver that is gone has nothing left to cancel.
                let _ = self.commands.send(Command::Cancel { id });
            }
        }
    }
}

/// A submitted group of prompts: their events and the cancel guard.
pub struct Submitted {
    /// Events of every prompt, labelled with its slot.
    pub events: UnboundedReceiver<Labelled>,
    /// Cancels the prompts still running when dropped while armed.
    pub guard: CancelOnDrop,
}

impl Pool {
    /// Start `connections` drivers on `socket` (None: the client library's default path) as
    /// tasks of the current tokio runtime (call from inside it). Connecting happens in the
    /// background; [`Pool::connected`] tells when one is up.
    pub fn start(socket: Option<PathBuf>, connections: usize) -> Arc<Pool> {
        let connections = (0..connections.max(1))
            .map(|i: usize| {
                let (tx, rx) = unbounded_channel();
                let active = Arc::new(AtomicUsize::new(0));
                let connected = Arc::new(AtomicBool::new(false));
                let driver = Driver {
                    socket: socket.clone(),
                    commands: rx,
                    active: Arc::clone(&active),
                    connected: Arc::clone(&connected),
                    live: None,
                    waiting: VecDeque::new(),
                    by_tag: HashMap::new(),
                    tag_of: HashMap::new(),
                };
                tokio::spawn(driver.run(i));
                Connection {
                    commands: tx,
                    active,
                    connected,
                }
            })
            .collect();
        Arc::new(Pool {
            connections,
            next_id: AtomicU64::new(1),
            admin: Mutex::new(None),
            socket,
            token_text: Mutex::new(HashMap::new()),
        })
    }

    /// Whether any connection is up.
    pub fn connected(&self) -> bool {
        self.connections
            .iter()
            .any(|c| c.connected.load(Ordering::Relaxed))
    }

    /// Requests submitted and not finished, over all connections.
    pub fn active(&self) -> usize {
        self.connections
            .iter()
            .map(|c| c.active.load(Ordering::Relaxed))
            .sum()
    }

    /// Submit `prompts` (slot = index) with one parameter set; every prompt goes to the same
    /// connection, the least busy of those that are up.
    pub fn submit(&self, prompts: Vec<PromptInput>, params: &GenerateParams) -> Submitted {
        let conn = self
            .connections
            .iter()
            .min_by_key(|c| {
                (
                    !c.connected.load(Ordering::Relaxed),
                    c.active.load(Ordering::Relaxed),
                )
            })
            .unwrap_or_else(|| unreachable!("the pool has at least one connection"));
        let (tx, rx) = unbounded_channel();
        let mut ids = Vec::with_capacity(prompts.len());
        for (slot, prompt) in prompts.into_iter().enumerate() {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            ids.push(id);
            conn.active.fetch_add(1, Ordering::Relaxed);
            let sub = Submission {
                id,
                slot: slot as u32,
                prompt,
                params: params.clone(),
                events: tx.clone(),
            };
            if let Err(tokio::sync::mpsc::error::SendError(Command::Submit(sub))) =
                conn.commands.send(Command::Submit(sub))
            {
                conn.active.fetch_sub(1, Ordering::Relaxed);
                let _ = sub
                    .events
                    .send((sub.slot, GenEvent::Failed(Failure::DaemonGone)));
            }
        }
        Submitted {
            events: rx,
            guard: CancelOnDrop {
                commands: conn.commands.clone(),
                ids,
                armed: true,
            },
        }
    }

    /// One admin query on the pool's own admin connection (blocking: call from a blocking
    /// context). Reconnects once when the daemon went away since the last query.
    pub fn admin(&self, query: AdminQuery) -> Result<String, Error> {
        let mut guard = self.admin.lock().unwrap_or_else(|p| p.into_inner());
        for attempt in 0..2 {
            if guard.is_none() {
                *guard = Some(Client::connect_with(&ConnectOptions {
                    socket: self.socket.clone(),
                    ..ConnectOptions::default()
                })?);
            }
            let Some(client) = guard.as_mut() else {
                unreachable!("connected above")
            };
            let result = match query {
                AdminQuery::Status => client.status(),
                AdminQuery::Stats => client.stats(),
                AdminQuery::Clients => client.clients(),
            };
            match result {
                Err(Error::DaemonGone | Error::ShuttingDown) if attempt == 0 => *guard = None,
                Err(e) => {
                    *guard = None;
                    return Err(e);
                }
                Ok(s) => return Ok(s),
            }
        }
        Err(Error::DaemonGone)
    }
}

impl Pool {
    /// The text of each token of `ids` on its own (for log-probability entries), through the
    /// daemon's tokenizer; cached, since a vocabulary is fixed while the daemon runs. Ids the
    /// daemon cannot decode are left out of the map (blocking: call from a blocking context).
    pub fn token_texts(&self, ids: &[u32]) -> HashMap<u32, String> {
        let mut out = HashMap::with_capacity(ids.len());
        let cache = self.token_text.lock().unwrap_or_else(|p| p.into_inner());
        let mut missing = Vec::new();
        for &id in ids {
            match cache.get(&id) {
                Some(t) => {
                    out.insert(id, t.clone());
                }
                None => missing.push(id),
            }
        }
        drop(cache);
        if missing.is_empty() {
            return out;
        }
        let mut admin = self.admin.lock().unwrap_or_else(|p| p.into_inner());
        for id in missing {
            if admin.is_none() {
                match Client::connect_with(&ConnectOptions {
                    socket: self.socket.clone(),
                    ..ConnectOptions::default()
                }) {
                    Ok(c) => *admin = Some(c),
                    Err(_) => break,
                }
            }
            let Some(client) = admin.as_mut() else { break };
            match client.detokenize(&[id], false) {
                Ok(text) => {
                    self.token_text
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(id, text.clone());
                    out.insert(id, text);
                }
                // Refused (no tokenizer, id outside the vocabulary): leave it to the caller.
                Err(Error::Refused { .. }) => {}
                Err(_) => {
                    *admin = None;
                    break;
                }
            }
        }
        out
    }
}

/// Admin queries the gateway uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminQuery {
    /// Model, backend, arenas.
    Status,
    /// Throughput and latency.
    Stats,
    /// Connected clients.
    Clients,
}

struct Running {
    id: u64,
    slot: u32,
    samples_left: u16,
    events: UnboundedSender<Labelled>,
}

/// The readiness descriptor as `AsyncFd` wants it; the client owns (and closes) it.
struct ReadyFd(RawFd);

impl AsRawFd for ReadyFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// A connected client and its registration with the runtime.
struct Live {
    // Declared before `client`: deregistered from the runtime before the client closes the
    // descriptor.
    ready: AsyncFd<ReadyFd>,
    client: Client,
}

/// Owns one [`Client`]; see the module docs.
struct Driver {
    socket: Option<PathBuf>,
    commands: UnboundedReceiver<Command>,
    active: Arc<AtomicUsize>,
    connected: Arc<AtomicBool>,
    live: Option<Live>,
    /// Accepted by the pool, not yet in the daemon's submission ring (it was full).
    waiting: VecDeque<Submission>,
    by_tag: HashMap<u64, Running>,
    tag_of: HashMap<u64, u64>,
}

/// Delay between reconnect attempts while the daemon is away.
const RECONNECT_EVERY: Duration = Duration::from_millis(100);
/// Longest sleep while submissions wait for ring space (completions normally wake us first).
const RING_FULL_RETRY: Duration = Duration::from_millis(1);

/// What ended a driver's sleep.
enum Wake {
    Command(Option<Command>),
    Ready(std::io::Result<()>),
    Timer,
}

impl Driver {
    async fn run(mut self, index: usize) {
        loop {
            if self.live.is_none() && !self.reconnect(index).await {
                return;
            }
            loop {
                match self.commands.try_recv() {
                    Ok(cmd) => self.command(cmd),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return,
                }
            }
            match self.pump() {
                Err(e) => {
                    self.connection_lost(&e);
                    continue;
                }
                // The descriptor's contract: poll until a poll delivers nothing. Yield between
                // rounds so a connection that never runs dry cannot starve the HTTP tasks.
                Ok(delivered) if delivered > 0 => {
                    tokio::task::yield_now().await;
                    continue;
                }
                Ok(_) => {}
            }
            let Some(live) = self.live.as_ref() else {
                continue;
            };
            // Nothing left: the doorbell is armed. Sleep until the daemon or a command wakes
            // us (the daemon's hang-up also makes the descriptor readable).
            let retry = !self.waiting.is_empty();
            let wake = tokio::select! {
                cmd = self.commands.recv() => Wake::Command(cmd),
                ready = live.ready.readable() => Wake::Ready(ready.map(|mut g| g.clear_ready())),
                _ = tokio::time::sleep(RING_FULL_RETRY), if retry => Wake::Timer,
            };
            match wake {
                Wake::Command(Some(cmd)) => self.command(cmd),
                Wake::Command(None) => return,
                Wake::Ready(Ok(())) | Wake::Timer => {}
                Wake::Ready(Err(e)) => self.connection_lost(&Error::Io(e)),
            }
        }
    }

    /// Connect (retrying while commands come in, failing them at once). False when the pool
    /// is gone.
    async fn reconnect(&mut self, index: usize) -> bool {
        loop {
            let options = ConnectOptions {
                socket: self.socket.clone(),
                ..ConnectOptions::default()
            };
            // The handshake blocks (up to its 5 s timeout against a stuck daemon).
            let connected = tokio::task::spawn_blocking(move || Client::connect_with(&options))
                .await
                .map_err(|e| Error::Protocol(format!("connect task: {e}")))
                .and_then(|r| r);
            let live = connected.and_then(|client| {
                let fd = ReadyFd(client.ready_fd());
                // SAFETY: the descriptor is the client's readiness descriptor, open until the
                // client drops; `Live` keeps the client beside the `AsyncFd` and declares the
                // `AsyncFd` first, so it is deregistered and dropped before the client closes
                // the descriptor, and `ReadyFd` always returns this same descriptor.
                let ready = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
                    .map_err(std::io::Error::from)?;
                Ok(Live { ready, client })
            });
            match live {
                Ok(live) => {
                    self.live = Some(live);
                    self.connected.store(true, Ordering::Relaxed);
                    return true;
                }
                Err(e) => {
                    if index == 0 && !self.waiting.is_empty() {
                        eprintln!("nerva-gateway: daemon unreachable: {e}");
                    }
                    let failed = self.waiting.len();
                    for s in self.waiting.drain(..) {
                        let _ = s
                            .events
                            .send((s.slot, GenEvent::Failed(Failure::DaemonGone)));
                    }
                    self.active.fetch_sub(failed, Ordering::Relaxed);
                    let deadline = tokio::time::Instant::now() + RECONNECT_EVERY;
                    loop {
                        match tokio::time::timeout_at(deadline, self.commands.recv()).await {
                            Ok(Some(Command::Submit(s))) => {
                                self.active.fetch_sub(1, Ordering::Relaxed);
                                let _ = s
                                    .events
                                    .send((s.slot, GenEvent::Failed(Failure::DaemonGone)));
                            }
                            Ok(Some(Command::Cancel { .. })) => {}
                            Err(_) => break,
                            Ok(None) => return false,
                        }
                    }
                }
            }
        }
    }

    fn command(&mut self, cmd: Command) {
        match cmd {
            Command::Submit(s) => self.waiting.push_back(s),
            Command::Cancel { id } => {
                if let Some(pos) = self.waiting.iter().position(|s| s.id == id) {
                    self.waiting.remove(pos);
                    self.active.fetch_sub(1, Ordering::Relaxed);
                } else if let Some(&tag) = self.tag_of.get(&id)
                    && let Some(live) = self.live.as_mut()
                {
                    // UnknownTag: it finished meanwhile. QueueFull: the ring is full of
                    // this client's own work; the dropped receiver cancels it on its next
                    // event instead (see `route`).
                    let _ = live.client.cancel(nerva_client::Tag(tag));
                }
            }
        }
    }

    /// Submit what waits and deliver what arrived, without blocking; returns how many events
    /// the client delivered.
    fn pump(&mut self) -> Result<usize, Error> {
        let Some(live) = self.live.as_mut() else {
            return Ok(0);
        };
        let client = &mut live.client;
        while let Some(s) = self.waiting.pop_front() {
            let prompt = match &s.prompt {
                PromptInput::Text(t) => Prompt::Text(t),
                PromptInput::Tokens(t) => Prompt::Tokens(t),
                PromptInput::Chat(c) => Prompt::Chat(c),
            };
            match client.submit_generate(prompt, &s.params) {
                Ok(tag) => {
                    self.tag_of.insert(s.id, tag.0);
                    self.by_tag.insert(
                        tag.0,
                        Running {
                            id: s.id,
                            slot: s.slot,
                            samples_left: s.params.n_samples,
                            events: s.events,
                        },
                    );
                }
                Err(Error::QueueFull) => {
                    self.waiting.push_front(s);
                    break;
                }
                Err(e @ (Error::DaemonGone | Error::Protocol(_) | Error::Io(_))) => {
                    self.waiting.push_front(s);
                    return Err(e);
                }
                Err(e) => {
                    let failure = match e {
                        Error::ShuttingDown => Failure::ShuttingDown,
                        Error::InvalidArgument(m) => Failure::Invalid(m),
                        e @ Error::TooLarge { .. } => Failure::Invalid(e.to_string()),
                        e => Failure::Other(e.to_string()),
                    };
                    self.active.fetch_sub(1, Ordering::Relaxed);
                    let _ = s.events.send((s.slot, GenEvent::Failed(failure)));
                }
            }
        }
        let mut abandoned = Vec::new();
        let mut finished = 0usize;
        let by_tag = &mut self.by_tag;
        let tag_of = &mut self.tag_of;
        let n = client.poll_with(|e| {
            let Some(tag) = e.tag() else {
                return; // Shutdown: the client refuses new work itself from now on.
            };
            let Some(run) = by_tag.get_mut(&tag.0) else {
                return;
            };
            let (event, last) = match e {
                EventRef::Tokens {
                    sample,
                    ids,
                    logprobs,
                    ..
                } => (
                    GenEvent::Tokens {
                        sample,
                        ids: ids.to_vec(),
                        logprobs: logprobs.to_vec(),
                    },
                    false,
                ),
                EventRef::TopLogprobs {
                    sample,
                    position,
                    ids,
                    logprobs,
                    ..
                } => (
                    GenEvent::TopLogprobs {
                        sample,
                        position,
                        ids: ids.to_vec(),
                        logprobs: logprobs.to_vec(),
                    },
                    false,
                ),
                EventRef::Text { sample, text, .. } => (
                    GenEvent::Text {
                        sample,
                        text: text.to_string(),
                    },
                    false,
                ),
                EventRef::Done {
                    sample,
                    reason,
                    timings,
                    ..
                } => {
                    run.samples_left = run.samples_left.saturating_sub(1);
                    (
                        GenEvent::Done {
                            sample,
                            reason,
                            timings,
                        },
                        run.samples_left == 0,
                    )
                }
                EventRef::Error { status, detail, .. } => (
                    GenEvent::Failed(Failure::Rejected {
                        status,
                        detail: detail.to_string(),
                    }),
                    true,
                ),
                EventRef::Shutdown => return,
            };
            if run.events.send((run.slot, event)).is_err() && !last {
                abandoned.push(tag);
            }
            if last {
                let run = by_tag.remove(&tag.0);
                if let Some(run) = run {
                    tag_of.remove(&run.id);
                }
                finished += 1;
            }
        })?;
        self.active.fetch_sub(finished, Ordering::Relaxed);
        for tag in abandoned {
            // The HTTP side is gone; stop spending the daemon on it (UnknownTag: it ended).
            let _ = client.cancel(tag);
        }
        Ok(n)
    }

    /// The connection died: fail everything it carried, reconnect on the next turn.
    fn connection_lost(&mut self, error: &Error) {
        let failure = match error {
            Error::DaemonGone | Error::ShuttingDown => Failure::DaemonGone,
            e => Failure::Other(e.to_string()),
        };
        self.live = None;
        self.connected.store(false, Ordering::Relaxed);
        let mut failed = 0;
        for (_, run) in self.by_tag.drain() {
            let _ = run
                .events
                .send((run.slot, GenEvent::Failed(failure.clone())));
            failed += 1;
        }
        // Submissions that never reached the daemon stay: a restarted daemon gets them on
        // reconnect; `reconnect` fails them if no daemon answers.
        self.tag_of.clear();
        self.active.fetch_sub(failed, Ordering::Relaxed);
    }
}
