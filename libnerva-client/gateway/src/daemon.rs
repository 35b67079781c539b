//! The gateway's side of the daemon: a bounded pool of [`Client`] connections that many HTTP
//! requests share, and the one place that waits on a client.
//!
//! Each connection is owned by a *driver*: a thread that submits the requests routed to it,
//! reaps the client's events and forwards them into per-request tokio channels. A connection
//! carries any number of requests at once (the daemon batches them), so HTTP requests never
//! queue behind each other; requests go to the connection with the fewest active ones.
//!
//! Why a thread and not the async runtime: today's client announces sleep (and so gets its
//! doorbell rung) only inside its own blocking [`Client::wait`], so no external event loop can
//! wait on it. When the client exposes a readiness descriptor, [`Driver::run`] becomes a tokio
//! task on `AsyncFd`; nothing outside this module changes.
//!
//! Faults: a connection whose daemon goes away fails its requests with
//! [`Failure::DaemonGone`] and reconnects in the background (a restarted daemon on the same
//! socket is picked up); while it is down, new requests fail at once instead of hanging.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nerva_client::{
    Client, ConnectOptions, Error, EventRef, FinishReason, GenerateParams, Prompt, Timings,
};
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
    commands: mpsc::Sender<Command>,
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
}

/// Cancels its request in the daemon when dropped before [`CancelOnDrop::finished`] (the HTTP
/// client went away mid-stream, or the handler gave up).
pub struct CancelOnDrop {
    commands: mpsc::Sender<Command>,
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
    /// Start `connections` drivers on `socket` (None: the client library's default path).
    /// Connecting happens in the background; [`Pool::connected`] tells when one is up.
    pub fn start(socket: Option<PathBuf>, connections: usize) -> Arc<Pool> {
        let connections = (0..connections.max(1))
            .map(|i| {
                let (tx, rx) = mpsc::channel();
                let active = Arc::new(AtomicUsize::new(0));
                let connected = Arc::new(AtomicBool::new(false));
                let driver = Driver {
                    socket: socket.clone(),
                    commands: rx,
                    active: Arc::clone(&active),
                    connected: Arc::clone(&connected),
                    client: None,
                    waiting: VecDeque::new(),
                    by_tag: HashMap::new(),
                    tag_of: HashMap::new(),
                };
                std::thread::Builder::new()
                    .name(format!("nerva-conn-{i}"))
                    .spawn(move || driver.run())
                    .unwrap_or_else(|e| panic!("cannot start connection thread: {e}"));
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
            if let Err(mpsc::SendError(Command::Submit(sub))) =
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

/// Owns one [`Client`]; see the module docs.
struct Driver {
    socket: Option<PathBuf>,
    commands: mpsc::Receiver<Command>,
    active: Arc<AtomicUsize>,
    connected: Arc<AtomicBool>,
    client: Option<Client>,
    /// Accepted by the pool, not yet in the daemon's submission ring (it was full).
    waiting: VecDeque<Submission>,
    by_tag: HashMap<u64, Running>,
    tag_of: HashMap<u64, u64>,
}

/// How long an idle connection sleeps before checking the daemon is still there.
const IDLE_CHECK: Duration = Duration::from_millis(50);
/// How long a busy connection sleeps on the doorbell before looking at new commands. Bounds
/// the delay of a submission that arrives while earlier requests are generating.
const BUSY_WAIT: Duration = Duration::from_millis(1);
/// Delay between reconnect attempts while the daemon is away.
const RECONNECT_EVERY: Duration = Duration::from_millis(100);

impl Driver {
    fn run(mut self) {
        loop {
            if self.client.is_none() && !self.reconnect() {
                return;
            }
            let idle = self.by_tag.is_empty() && self.waiting.is_empty();
            if idle {
                match self.commands.recv_timeout(IDLE_CHECK) {
                    Ok(cmd) => self.command(cmd),
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            }
            loop {
                match self.commands.try_recv() {
                    Ok(cmd) => self.command(cmd),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => return,
                }
            }
            if let Err(e) = self.pump() {
                self.connection_lost(&e);
            }
        }
    }

    /// Connect (retrying while commands come in, failing them at once). False when the pool
    /// is gone.
    fn reconnect(&mut self) -> bool {
        loop {
            match Client::connect_with(&ConnectOptions {
                socket: self.socket.clone(),
                ..ConnectOptions::default()
            }) {
                Ok(c) => {
                    self.client = Some(c);
                    self.connected.store(true, Ordering::Relaxed);
                    return true;
                }
                Err(_) => {
                    let failed = self.waiting.len();
                    for s in self.waiting.drain(..) {
                        let _ = s
                            .events
                            .send((s.slot, GenEvent::Failed(Failure::DaemonGone)));
                    }
                    self.active.fetch_sub(failed, Ordering::Relaxed);
                    let deadline = Instant::now() + RECONNECT_EVERY;
                    loop {
                        let left = deadline.saturating_duration_since(Instant::now());
                        match self.commands.recv_timeout(left) {
                            Ok(Command::Submit(s)) => {
                                self.active.fetch_sub(1, Ordering::Relaxed);
                                let _ = s
                                    .events
                                    .send((s.slot, GenEvent::Failed(Failure::DaemonGone)));
                            }
                            Ok(Command::Cancel { .. }) => {}
                            Err(RecvTimeoutError::Timeout) => break,
                            Err(RecvTimeoutError::Disconnected) => return false,
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
                    && let Some(client) = self.client.as_mut()
                {
                    // UnknownTag: it finished meanwhile. QueueFull: the ring is full of
                    // this client's own work; the dropped receiver cancels it on its next
                    // event instead (see `route`).
                    let _ = client.cancel(nerva_client::Tag(tag));
                }
            }
        }
    }

    /// Submit what waits, deliver what arrived, and sleep briefly when nothing did.
    fn pump(&mut self) -> Result<(), Error> {
        let Some(client) = self.client.as_mut() else {
            return Ok(());
        };
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
        if n == 0 && !self.by_tag.is_empty() {
            client.wait(Some(BUSY_WAIT))?;
        } else if n == 0 && !self.waiting.is_empty() {
            // Ring full and nothing to reap yet: give the daemon a moment.
            client.wait(Some(BUSY_WAIT))?;
        }
        Ok(())
    }

    /// The connection died: fail everything it carried, reconnect on the next turn.
    fn connection_lost(&mut self, error: &Error) {
        let failure = match error {
            Error::DaemonGone | Error::ShuttingDown => Failure::DaemonGone,
            e => Failure::Other(e.to_string()),
        };
        self.client = None;
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
