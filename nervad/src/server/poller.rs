//! The poll loop: one thread serving every client's rings.
//!
//! Each pass: move engine outputs into completion rings, then visit clients round robin and
//! take at most `batch_per_client` descriptors from each, then ring the completion doorbells
//! of clients that got something. While work keeps coming the loop never blocks and makes no
//! system call per descriptor: hang-ups, signals and new clients are collected by a
//! zero-timeout `epoll_wait` at most once per millisecond. After `spin` of idleness it sleeps in
//! `epoll_wait` over every doorbell, socket, the engine's doorbell, the acceptor's inbox and the
//! signalfd, using the need-wakeup handshake so producers only pay a syscall while it sleeps.
//!
//! Backpressure, never loss: a full completion ring parks completions in that client's backlog
//! and pauses its streams in the engine; while a backlog exists, that client's submission ring
//! is not read, so its own NOP floods cannot grow the backlog either.

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use nerva_rings::handshake::{
    ABI_VERSION, HandshakeStatus, WELCOME_MAGIC, WELCOME_MESSAGE_LEN, Welcome,
};
use nerva_rings::{
    AdminOptions, AdminQuery, AdminReply, ByteRange, Completion, Consumer, Descriptor, EventFd,
    EventKind, Notifier, Producer, PushError, RegionReader, RegionWriter, Request, StatusCode,
    Waiter, WakeFlag,
};
use nix::sys::epoll::{Epoll, EpollEvent, EpollFlags, EpollTimeout};

use super::acceptor::{AcceptorShared, NewClient};
use super::admin::{
    ClientRow, ClientSizes, StatusContext, clients_json, model_info_json, status_json,
};
use super::alloc_count::thread_allocations;
use super::config::ServeConfig;
use super::engine_thread::{EngineCommand, EngineOutput};
use super::intake::{AdminInput, decode_admin_input, decode_generate};
use super::listener::send_welcome;
use super::policy::PeerCredentials;
use super::signals::ShutdownSignals;
use super::stats::{LatencyStats, TokenLedger};
use crate::engine::TextCodec;
use crate::engine::api::{ClientId, RequestKey};

const TOKEN_SIGNAL: u64 = u64::MAX;
const TOKEN_INBOX: u64 = u64::MAX - 1;
const TOKEN_ENGINE: u64 = u64::MAX - 2;
/// How often a busy loop collects hang-ups, signals and new clients.
const BUSY_CHECK: Duration = Duration::from_millis(1);
/// Longest sleep while some client has a backlog (its consumer does not ring us).
const BACKLOG_RECHECK_MS: u16 = 1;
/// Stop reading submission rings while this many engine commands wait for queue space.
const COMMAND_HIGH_WATER: usize = 4096;
/// How long the final SHUTDOWN completions wait for ring space.
const SHUTDOWN_FLUSH: Duration = Duration::from_secs(1);

/// Where a client stands with respect to the daemon's shutdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Serving,
    Draining,
    Drained,
}

/// Everything the loop writes for one client (disjoint from its submission consumer so a
/// descriptor can be handled while the consumer still holds its slot).
struct ClientTx {
    id: ClientId,
    peer: PeerCredentials,
    cq: Producer<Completion>,
    cq_bell: Notifier,
    input: RegionReader,
    output: RegionWriter,
    backlog: VecDeque<Completion>,
    paused: bool,
    /// tag → samples still running (requests the engine holds for this client).
    requests: HashMap<u64, u16>,
    pushed: bool,
    corrupt: bool,
    requests_total: u64,
    tokens_served: u64,
    descriptors: u64,
    connected_at: Instant,
    segment_bytes: u64,
    page_bytes: u64,
    shutdown_sent: bool,
}

impl ClientTx {
    /// Queue a completion: into the ring, or the backlog when the ring is full or a backlog
    /// already exists (order is preserved per client).
    fn emit(&mut self, c: Completion, ledger: &mut TokenLedger) {
        self.pushed = true;
        if !self.backlog.is_empty() {
            self.backlog.push_back(c);
            ledger.backlogged += 1;
            return;
        }
        match self.cq.push(c) {
            Ok(()) => ledger.completions += 1,
            Err(PushError::Full(c)) => {
                self.backlog.push_back(c);
                ledger.backlogged += 1;
            }
            Err(PushError::Corrupt(..)) => self.corrupt = true,
        }
    }

    /// Move backlog entries into the ring while it has room.
    fn flush_backlog(&mut self, ledger: &mut TokenLedger) {
        while let Some(&c) = self.backlog.front() {
            match self.cq.push(c) {
                Ok(()) => {
                    self.backlog.pop_front();
                    ledger.completions += 1;
                    self.pushed = true;
                }
                Err(PushError::Full(_)) => break,
                Err(PushError::Corrupt(..)) => {
                    self.corrupt = true;
                    break;
                }
            }
        }
    }

    fn reject(&mut self, tag: u64, status: StatusCode, detail: &str, ledger: &mut TokenLedger) {
        ledger.rejected += 1;
        self.emit(Completion::error(tag, 0, status, detail), ledger);
    }
}

struct ClientConn {
    sq: Consumer<Descriptor>,
    sq_bell: EventFd,
    daemon_sleeping: WakeFlag,
    conn: OwnedFd,
    tx: ClientTx,
}

/// An admin query waiting for the end of the service pass.
#[derive(Debug, Clone, Copy)]
struct PendingAdmin {
    slot: usize,
    tag: u64,
    query: AdminQuery,
    reply: ByteRange,
    input: Option<ByteRange>,
    options: AdminOptions,
}

/// The poll thread's state.
pub struct PollLoop {
    config: ServeConfig,
    clients: Vec<Option<ClientConn>>,
    /// Occupied slots, so a pass touches only live clients (not every `--max-clients` slot).
    active: Vec<usize>,
    generations: Vec<u32>,
    rr_start: usize,
    epoll: Epoll,
    events: Vec<EpollEvent>,
    signals: ShutdownSignals,
    inbox: Receiver<NewClient>,
    inbox_bell: Arc<EventFd>,
    acceptor: Arc<AcceptorShared>,
    commands: rtrb::Producer<EngineCommand>,
    pending_commands: VecDeque<EngineCommand>,
    outputs: rtrb::Consumer<EngineOutput>,
    engine_thread: std::thread::Thread,
    engine_bell: Waiter,
    stats: Arc<LatencyStats>,
    ledger: TokenLedger,
    started: Instant,
    status: StatusContext,
    staging: Vec<u8>,
    ext_staging: Vec<u8>,
    pending_admin: Vec<PendingAdmin>,
    phase: Phase,
    daemon_uid: u32,
    alloc_baseline: u64,
    cold_allocations: u64,
    engine_failed: bool,
    codec: Option<Arc<dyn TextCodec>>,
}

/// The pieces [`PollLoop::new`] needs.
pub struct PollLoopParts {
    /// Settings.
    pub config: ServeConfig,
    /// Shutdown signals.
    pub signals: ShutdownSignals,
    /// New clients from the acceptor.
    pub inbox: Receiver<NewClient>,
    /// Rung by the acceptor after each new client.
    pub inbox_bell: Arc<EventFd>,
    /// Shared with the acceptor.
    pub acceptor: Arc<AcceptorShared>,
    /// Commands to the engine thread.
    pub commands: rtrb::Producer<EngineCommand>,
    /// Outputs from the engine thread.
    pub outputs: rtrb::Consumer<EngineOutput>,
    /// The engine thread (to unpark it).
    pub engine_thread: std::thread::Thread,
    /// The engine's doorbell to us.
    pub engine_bell: Waiter,
    /// Latency statistics (written by the engine thread).
    pub stats: Arc<LatencyStats>,
    /// Facts for `status`.
    pub status: StatusContext,
    /// Pre-allocated prompt staging buffer.
    pub staging: Vec<u8>,
    /// The tokenizer for clients' tokenize / detokenize queries (`None`: refused).
    pub codec: Option<Arc<dyn TextCodec>>,
}

impl PollLoop {
    /// Set up epoll over the fixed descriptors.
    pub fn new(parts: PollLoopParts) -> std::io::Result<PollLoop> {
        let epoll = Epoll::new(nix::sys::epoll::EpollCreateFlags::EPOLL_CLOEXEC)?;
        epoll.add(
            parts.signals.fd(),
            EpollEvent::new(EpollFlags::EPOLLIN, TOKEN_SIGNAL),
        )?;
        epoll.add(
            parts.inbox_bell.as_fd(),
            EpollEvent::new(EpollFlags::EPOLLIN, TOKEN_INBOX),
        )?;
        epoll.add(
            parts.engine_bell.eventfd().as_fd(),
            EpollEvent::new(EpollFlags::EPOLLIN, TOKEN_ENGINE),
        )?;
        let max = parts.config.max_clients as usize;
        let mut clients = Vec::with_capacity(max);
        clients.resize_with(max, || None);
        Ok(PollLoop {
            generations: vec![0; max],
            active: Vec::with_capacity(max),
            clients,
            rr_start: 0,
            epoll,
            events: vec![EpollEvent::empty(); 64],
            signals: parts.signals,
            inbox: parts.inbox,
            inbox_bell: parts.inbox_bell,
            acceptor: parts.acceptor,
            commands: parts.commands,
            pending_commands: VecDeque::with_capacity(2 * COMMAND_HIGH_WATER),
            outputs: parts.outputs,
            engine_thread: parts.engine_thread,
            engine_bell: parts.engine_bell,
            stats: parts.stats,
            ledger: TokenLedger::default(),
            started: Instant::now(),
            status: parts.status,
            ext_staging: Vec::with_capacity(nerva_rings::extension::MAX_EXTENSION_BYTES),
            staging: parts.staging,
            pending_admin: Vec::with_capacity(max.max(16)),
            phase: Phase::Serving,
            daemon_uid: nix::unistd::geteuid().as_raw(),
            config: parts.config,
            alloc_baseline: 0,
            cold_allocations: 0,
            engine_failed: false,
            codec: parts.codec,
        })
    }

    /// Run until drained after SIGTERM/SIGINT or an admin shutdown. Returns false when it
    /// stopped because the engine thread died.
    pub fn run(mut self) -> bool {
        self.alloc_baseline = thread_allocations();
        let mut last_check = Instant::now();
        let mut idle_since: Option<Instant> = None;
        loop {
            let mut work = self.pump_engine_outputs();
            if self.phase == Phase::Drained {
                break;
            }
            work |= self.service_clients();
            work |= self.flush_commands();
            self.ring_completion_doorbells();
            let now = Instant::now();
            if now.duration_since(last_check) >= BUSY_CHECK {
                self.ledger.busy_checks += 1;
                self.collect_events(EpollTimeout::ZERO);
                self.check_engine_alive();
                last_check = now;
            }
            if work {
                idle_since = None;
                continue;
            }
            let idle = *idle_since.get_or_insert(now);
            if now.duration_since(idle) >= self.config.spin {
                self.sleep();
                self.check_engine_alive();
                idle_since = None;
                last_check = Instant::now();
            } else {
                std::hint::spin_loop();
            }
        }
        self.finish_shutdown();
        !self.engine_failed
    }

    /// Run `f` without counting its allocations as hot-path allocations.
    fn cold<T>(&mut self, f: impl FnOnce(&mut Self) -> T) -> T {
        let before = thread_allocations();
        let out = f(self);
        self.cold_allocations += thread_allocations() - before;
        out
    }

    fn update_hot_allocations(&mut self) {
        self.ledger.hot_allocations = thread_allocations()
            .saturating_sub(self.alloc_baseline)
            .saturating_sub(self.cold_allocations);
    }

    // ---- engine side -------------------------------------------------------------------

    /// Move engine outputs into client rings. Returns whether anything moved.
    fn pump_engine_outputs(&mut self) -> bool {
        let mut any = false;
        while let Ok(out) = self.outputs.pop() {
            any = true;
            match out {
                EngineOutput::Drained => {
                    self.phase = Phase::Drained;
                    return true;
                }
                EngineOutput::Completion(id, c) => {
                    let Some(Some(conn)) = self.clients.get_mut(id.slot as usize) else {
                        continue;
                    };
                    if conn.tx.id != id {
                        continue; // for a previous occupant of the slot
                    }
                    let tx = &mut conn.tx;
                    match c.kind() {
                        Some(EventKind::Done) => {
                            if let Ok(nerva_rings::Event::Done(info)) = c.event() {
                                tx.tokens_served += u64::from(info.generated_tokens);
                            }
                            if let Some(left) = tx.requests.get_mut(&c.tag()) {
                                *left = left.saturating_sub(1);
                                if *left == 0 {
                                    tx.requests.remove(&c.tag());
                                }
                            }
                        }
                        Some(EventKind::Error) => {
                            tx.requests.remove(&c.tag());
                        }
                        _ => {}
                    }
                    tx.emit(c, &mut self.ledger);
                    if !tx.backlog.is_empty() && !tx.paused {
                        tx.paused = true;
                        self.ledger.pauses += 1;
                        self.pending_commands
                            .push_back(EngineCommand::SetPaused(id, true));
                    }
                }
            }
        }
        any
    }

    /// An engine thread that died (panicked) can never drain: shut down instead of hanging.
    fn check_engine_alive(&mut self) {
        if self.phase != Phase::Drained && self.outputs.is_empty() && self.outputs.is_abandoned() {
            tracing::error!("engine thread is gone; shutting down");
            self.engine_failed = true;
            self.acceptor.shutting_down.store(true, Ordering::Release);
            let _ = self.acceptor.stop.signal();
            self.phase = Phase::Drained;
        }
    }

    /// Hand queued commands to the engine thread. Returns whether any moved.
    fn flush_commands(&mut self) -> bool {
        let mut moved = false;
        while let Some(cmd) = self.pending_commands.pop_front() {
            match self.commands.push(cmd) {
                Ok(()) => moved = true,
                Err(rtrb::PushError::Full(cmd)) => {
                    self.pending_commands.push_front(cmd);
                    break;
                }
            }
        }
        if moved {
            // An atomic swap unless the engine thread is parked (then one futex wake).
            self.engine_thread.unpark();
        }
        moved
    }

    // ---- clients -----------------------------------------------------------------------

    fn service_clients(&mut self) -> bool {
        let mut work = false;
        let n = self.active.len();
        if n > 0 {
            let start = self.rr_start % n;
            self.rr_start = self.rr_start.wrapping_add(1);
            for i in 0..n {
                // A client removed during the pass shifts the list; at worst one client is
                // visited twice or skipped in this pass.
                let Some(&slot) = self.active.get((start + i) % n) else {
                    break;
                };
                work |= self.service_one(slot);
            }
        }
        if !self.pending_admin.is_empty() {
            self.cold(|s| s.answer_admin());
            work = true;
        }
        work
    }

    /// Flush one client's backlog, then read up to a batch of its descriptors.
    fn service_one(&mut self, slot: usize) -> bool {
        let Some(mut conn) = self.clients[slot].take() else {
            return false;
        };
        let mut work = false;
        if !conn.tx.backlog.is_empty() {
            let before = conn.tx.backlog.len();
            conn.tx.flush_backlog(&mut self.ledger);
            work |= conn.tx.backlog.len() != before;
            if conn.tx.backlog.is_empty() && conn.tx.paused {
                conn.tx.paused = false;
                self.pending_commands
                    .push_back(EngineCommand::SetPaused(conn.tx.id, false));
            }
        }
        let can_read = conn.tx.backlog.is_empty()
            && self.pending_commands.len() < COMMAND_HIGH_WATER
            && !conn.tx.corrupt;
        if can_read {
            let batch = self.config.batch_per_client as usize;
            let ClientConn { sq, tx, .. } = &mut conn;
            // The closure copies each descriptor's input bytes before `consume` releases the
            // slot, so the client cannot reuse them underneath us.
            match sq.consume(batch, |d| self.handle_descriptor(slot, tx, d)) {
                Ok(n) => work |= n > 0,
                Err(e) => {
                    self.cold(|_| {
                        tracing::warn!(slot, error = %e, "corrupt submission ring; disconnecting");
                    });
                    conn.tx.corrupt = true;
                }
            }
        }
        let corrupt = conn.tx.corrupt;
        self.clients[slot] = Some(conn);
        if corrupt {
            self.ledger.corrupt_disconnects += 1;
            self.cold(|s| s.remove_client(slot, "corrupt ring indices"));
        }
        work
    }

    fn handle_descriptor(&mut self, slot: usize, tx: &mut ClientTx, d: Descriptor) {
        self.ledger.descriptors += 1;
        tx.descriptors += 1;
        let request = match d.validate() {
            Ok(r) => r,
            Err(e) => {
                tx.reject(d.tag(), e.status(), "invalid descriptor", &mut self.ledger);
                return;
            }
        };
        if let Err(e) = request.check_regions(tx.input.len(), tx.output.len()) {
            tx.reject(
                d.tag(),
                e.status(),
                "range outside its region",
                &mut self.ledger,
            );
            return;
        }
        match request {
            Request::Nop { tag, payload } => {
                self.ledger.nops += 1;
                tx.emit(Completion::nop_reply(tag, payload), &mut self.ledger);
            }
            Request::Cancel { target } => {
                self.ledger.cancels += 1;
                // Cancelling a finished request is a benign race: nothing to do.
                if tx.requests.contains_key(&target) {
                    self.pending_commands
                        .push_back(EngineCommand::Cancel(RequestKey {
                            client: tx.id,
                            tag: target,
                        }));
                }
            }
            Request::Admin {
                tag,
                query,
                reply,
                input,
                options,
            } => {
                self.ledger.admin += 1;
                if self.pending_admin.len() == self.pending_admin.capacity() {
                    tx.reject(
                        tag,
                        StatusCode::Overloaded,
                        "admin queue full",
                        &mut self.ledger,
                    );
                } else {
                    self.pending_admin.push(PendingAdmin {
                        slot,
                        tag,
                        query,
                        reply,
                        input,
                        options,
                    });
                }
            }
            Request::Generate(g) => {
                if self.phase != Phase::Serving {
                    tx.reject(
                        g.tag,
                        StatusCode::ShuttingDown,
                        "draining",
                        &mut self.ledger,
                    );
                    return;
                }
                if tx.requests.contains_key(&g.tag) {
                    tx.reject(
                        g.tag,
                        StatusCode::DuplicateTag,
                        "tag in flight",
                        &mut self.ledger,
                    );
                    return;
                }
                // Read once, copy, validate: the bytes are copied out of shared memory into
                // private staging before anything looks at them.
                let plen = g.prompt.len as usize;
                let elen = g.extension.map_or(0, |e| e.len as usize);
                self.staging.resize(plen, 0);
                self.ext_staging.resize(elen, 0);
                let copied = tx
                    .input
                    .read(g.prompt.offset, &mut self.staging[..plen])
                    .and_then(|()| match g.extension {
                        Some(e) => tx.input.read(e.offset, &mut self.ext_staging[..elen]),
                        None => Ok(()),
                    });
                if copied.is_err() {
                    tx.reject(
                        g.tag,
                        StatusCode::PromptOutOfRange,
                        "range",
                        &mut self.ledger,
                    );
                    return;
                }
                let before = thread_allocations();
                let decoded = decode_generate(
                    tx.id,
                    &g,
                    &self.staging[..plen],
                    &self.ext_staging[..elen],
                    Instant::now(),
                );
                match decoded {
                    Ok((request, flags)) => {
                        self.ledger.generates += 1;
                        tx.requests_total += 1;
                        tx.requests.insert(g.tag, g.n_samples);
                        self.pending_commands.push_back(EngineCommand::Submit {
                            request: Box::new(request),
                            flags,
                        });
                    }
                    Err(rejection) => {
                        tx.reject(g.tag, rejection.status, &rejection.detail, &mut self.ledger);
                    }
                }
                // Generate intake allocates (the engine's request owns its prompt); it is
                // accounted apart from the per-descriptor hot path.
                self.cold_allocations += thread_allocations() - before;
            }
        }
    }

    fn ring_completion_doorbells(&mut self) {
        for i in 0..self.active.len() {
            let Some(conn) = self.clients[self.active[i]].as_mut() else {
                continue;
            };
            if !conn.tx.pushed {
                continue;
            }
            conn.tx.pushed = false;
            match conn.tx.cq_bell.notify() {
                Ok(true) => {
                    self.ledger.cq_doorbells += 1;
                    self.ledger.syscalls += 1;
                }
                Ok(false) => {}
                Err(e) => tracing::debug!(error = %e, "completion doorbell failed"),
            }
        }
    }

    // ---- admin ------------------------------------------------------------------------

    fn answer_admin(&mut self) {
        let pending = std::mem::take(&mut self.pending_admin);
        for a in &pending {
            let body = match self.admin_body(a) {
                Ok(body) => body,
                Err((status, detail)) => {
                    if let Some(conn) = self.clients[a.slot].as_mut() {
                        conn.tx.reject(a.tag, status, &detail, &mut self.ledger);
                    }
                    continue;
                }
            };
            let Some(conn) = self.clients[a.slot].as_mut() else {
                continue;
            };
            let cap = a.reply.len as usize;
            let (status, written) = if body.len() <= cap {
                (StatusCode::Ok, body.len())
            } else {
                (StatusCode::ReplyTruncated, 0)
            };
            if written > 0
                && conn
                    .tx
                    .output
                    .write(a.reply.offset, &body[..written])
                    .is_err()
            {
                conn.tx.reject(
                    a.tag,
                    StatusCode::ReplyOutOfRange,
                    "reply range",
                    &mut self.ledger,
                );
                continue;
            }
            let reply = AdminReply {
                status: status.as_u16(),
                query: a.query as u8,
                offset: a.reply.offset,
                len: written as u32,
                required: u32::try_from(body.len()).unwrap_or(u32::MAX),
            };
            conn.tx
                .emit(Completion::admin_reply(a.tag, &reply), &mut self.ledger);
        }
        self.pending_admin = pending;
        self.pending_admin.clear();
    }

    /// The reply bytes of one admin query, or the status and detail of its refusal.
    fn admin_body(&mut self, a: &PendingAdmin) -> Result<Vec<u8>, (StatusCode, String)> {
        let json = match a.query {
            AdminQuery::Status => status_json(
                &self.status,
                &self.stats.engine,
                self.started.elapsed().as_secs_f64(),
                self.clients.iter().flatten().count(),
                self.phase != Phase::Serving,
            ),
            AdminQuery::Clients => clients_json(&self.client_rows()),
            AdminQuery::Stats => {
                self.update_hot_allocations();
                serde_json::json!({
                    "ledger": self.ledger.to_json(),
                    "engine": self.stats.to_json(),
                })
            }
            AdminQuery::Shutdown => {
                let peer = self.clients[a.slot].as_ref().map(|c| c.tx.peer.uid);
                if peer == Some(0) || peer == Some(self.daemon_uid) {
                    self.begin_drain("admin shutdown request");
                    serde_json::json!({"draining": true})
                } else {
                    return Err((
                        StatusCode::PermissionDenied,
                        "shutdown needs the daemon's uid".into(),
                    ));
                }
            }
            AdminQuery::ModelInfo => {
                let Some(conn) = self.clients[a.slot].as_ref() else {
                    return Err((StatusCode::Internal, "client gone".into()));
                };
                let sizes = ClientSizes {
                    sq_entries: conn.sq.capacity(),
                    cq_entries: conn.tx.cq.capacity(),
                    data_bytes: conn.tx.input.len(),
                    reply_bytes: conn.tx.output.len(),
                };
                model_info_json(&self.status, sizes, self.codec.is_some())
            }
            AdminQuery::Tokenize | AdminQuery::Detokenize => return self.convert_text(a),
            AdminQuery::Ledger => return Ok(self.stats.ledger_dump(a.reply.len as usize)),
        };
        Ok(json.to_string().into_bytes())
    }

    /// TOKENIZE / DETOKENIZE: copy the input out of shared memory once, then convert the
    /// private copy (read once, copy, validate).
    fn convert_text(&mut self, a: &PendingAdmin) -> Result<Vec<u8>, (StatusCode, String)> {
        let Some(codec) = self.codec.clone() else {
            return Err((
                StatusCode::BadAdminQuery,
                "this engine has no tokenizer".into(),
            ));
        };
        let (Some(input), Some(conn)) = (a.input, self.clients[a.slot].as_ref()) else {
            return Err((StatusCode::Internal, "no input".into()));
        };
        let mut bytes = vec![0u8; input.len as usize];
        conn.tx
            .input
            .read(input.offset, &mut bytes)
            .map_err(|_| (StatusCode::PromptOutOfRange, "input range".to_string()))?;
        match decode_admin_input(a.query, a.options, &bytes) {
            Err(rejection) => Err((rejection.status, rejection.detail)),
            Ok(AdminInput::Text(text, add_special)) => {
                let ids = codec
                    .tokenize(text, add_special)
                    .map_err(|e| (StatusCode::Internal, e))?;
                Ok(ids.iter().flat_map(|id| id.to_le_bytes()).collect())
            }
            Ok(AdminInput::Ids(ids, skip_special)) => codec
                .detokenize(&ids, skip_special)
                .map(String::into_bytes)
                .map_err(|e| (StatusCode::TokenOutOfVocab, e)),
        }
    }

    fn client_rows(&mut self) -> Vec<ClientRow> {
        let mut rows = Vec::new();
        for conn in self.clients.iter_mut().flatten() {
            let sq_cap = conn.sq.capacity();
            let cq_cap = conn.tx.cq.capacity();
            let sq_used = conn.sq.available().unwrap_or(sq_cap);
            let cq_used = cq_cap - conn.tx.cq.free_slots().unwrap_or(0);
            rows.push(ClientRow {
                slot: conn.tx.id.slot,
                generation: conn.tx.id.generation,
                pid: conn.tx.peer.pid,
                uid: conn.tx.peer.uid,
                gid: conn.tx.peer.gid,
                sq: (sq_used, sq_cap),
                cq: (cq_used, cq_cap),
                backlog: conn.tx.backlog.len(),
                paused: conn.tx.paused,
                in_flight: conn.tx.requests.len(),
                requests: conn.tx.requests_total,
                tokens_served: conn.tx.tokens_served,
                descriptors: conn.tx.descriptors,
                connected_s: conn.tx.connected_at.elapsed().as_secs_f64(),
                segment: (conn.tx.segment_bytes, conn.tx.page_bytes),
            });
        }
        rows
    }

    // ---- events, sleep, connects, hang-ups ---------------------------------------------

    /// One `epoll_wait` and the handling of what it reports.
    fn collect_events(&mut self, timeout: EpollTimeout) {
        self.ledger.syscalls += 1;
        let n = match self.epoll.wait(&mut self.events, timeout) {
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR) => 0,
            Err(e) => {
                tracing::error!(error = %e, "epoll_wait failed");
                0
            }
        };
        for i in 0..n {
            let ev = self.events[i];
            match ev.data() {
                TOKEN_SIGNAL => {
                    self.ledger.syscalls += 1;
                    if let Some(sig) = self.signals.take() {
                        if self.phase != Phase::Serving {
                            // A second SIGINT/SIGTERM during the drain: the operator wants
                            // out now. Clients see the hang-up; the kernel reclaims the rest.
                            tracing::warn!(
                                signal = sig.as_str(),
                                "second signal while draining: exiting now"
                            );
                            std::process::exit(130);
                        }
                        self.cold(|s| s.begin_drain(sig.as_str()));
                    }
                }
                TOKEN_INBOX => {
                    self.ledger.syscalls += 1;
                    let _ = self.inbox_bell.drain();
                    self.cold(|s| s.accept_new_clients());
                }
                TOKEN_ENGINE => {
                    self.ledger.syscalls += 1;
                    let _ = self.engine_bell.eventfd().drain();
                }
                token => {
                    let slot = (token >> 1) as usize;
                    let Some(Some(conn)) = self.clients.get(slot) else {
                        continue;
                    };
                    if token & 1 == 0 {
                        self.ledger.syscalls += 1;
                        let _ = conn.sq_bell.drain();
                    } else {
                        // The client never writes to its socket after the hello: readable
                        // means hang-up (or a misbehaving client, which we drop as well).
                        self.cold(|s| s.remove_client(slot, "hang-up"));
                    }
                }
            }
        }
    }

    /// Announce sleep on every doorbell, re-check, then block in epoll.
    fn sleep(&mut self) {
        for &slot in &self.active {
            if let Some(conn) = &self.clients[slot] {
                conn.daemon_sleeping.prepare_sleep();
            }
        }
        self.engine_bell.flag().prepare_sleep();
        // Re-check after the announcements (their SeqCst fences pair with the producers').
        let mut ready = !self.outputs.is_empty() || !self.pending_commands.is_empty();
        let mut backlog = false;
        for i in 0..self.active.len() {
            if let Some(conn) = self.clients[self.active[i]].as_mut() {
                backlog |= !conn.tx.backlog.is_empty();
                ready |= conn.sq.has_pending().unwrap_or(true);
            }
        }
        if !ready {
            self.ledger.sleeps += 1;
            let timeout = if backlog {
                EpollTimeout::from(BACKLOG_RECHECK_MS)
            } else {
                EpollTimeout::NONE
            };
            self.collect_events(timeout);
        }
        for &slot in &self.active {
            if let Some(conn) = &self.clients[slot] {
                conn.daemon_sleeping.finish_sleep();
            }
        }
        self.engine_bell.flag().finish_sleep();
    }

    fn accept_new_clients(&mut self) {
        while let Ok(new) = self.inbox.try_recv() {
            self.register(new);
        }
    }

    fn register(&mut self, new: NewClient) {
        let pid = std::process::id();
        let refuse = |conn: &OwnedFd, status, why: &str| {
            let _ = send_welcome(conn.as_fd(), &Welcome::refused(status, pid, why), None);
        };
        if self.phase != Phase::Serving {
            refuse(
                &new.conn,
                HandshakeStatus::ShuttingDown,
                "daemon is shutting down",
            );
            return;
        }
        let Some(slot) = self.clients.iter().position(Option::is_none) else {
            refuse(
                &new.conn,
                HandshakeStatus::TooManyClients,
                "daemon serves --max-clients clients",
            );
            return;
        };
        let generation = self.generations[slot].wrapping_add(1);
        let end = match new.segment.segment.daemon_end() {
            Ok(e) => e,
            Err(e) => {
                tracing::error!(error = %e, "segment end unavailable");
                refuse(
                    &new.conn,
                    HandshakeStatus::ResourceExhausted,
                    "segment setup failed",
                );
                return;
            }
        };
        let welcome = Welcome {
            magic: WELCOME_MAGIC,
            abi_version: ABI_VERSION,
            status: HandshakeStatus::Accepted,
            client_slot: slot as u32,
            client_generation: generation,
            segment_bytes: new.segment.bytes,
            page_bytes: new.segment.page_bytes,
            daemon_pid: pid,
            message: [0; WELCOME_MESSAGE_LEN],
        };
        let fds = [
            new.segment.fd.as_raw_fd(),
            new.sq_doorbell.as_raw_fd(),
            new.cq_doorbell.as_raw_fd(),
        ];
        if let Err(e) = send_welcome(new.conn.as_fd(), &welcome, Some(fds)) {
            tracing::info!(pid = new.peer.pid, error = %e, "welcome not delivered");
            return;
        }
        let sq_token = (slot as u64) << 1;
        let added = self
            .epoll
            .add(
                new.sq_doorbell.as_fd(),
                EpollEvent::new(EpollFlags::EPOLLIN, sq_token),
            )
            .and_then(|()| {
                self.epoll.add(
                    new.conn.as_fd(),
                    EpollEvent::new(
                        EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP | EpollFlags::EPOLLHUP,
                        sq_token | 1,
                    ),
                )
            });
        if let Err(e) = added {
            tracing::error!(error = %e, "cannot watch the new client");
            let _ = self.epoll.delete(new.sq_doorbell.as_fd());
            return;
        }
        self.generations[slot] = generation;
        let id = ClientId {
            slot: slot as u32,
            generation,
        };
        let cq_entries = end.completions.capacity() as usize;
        tracing::info!(
            slot,
            generation,
            pid = new.peer.pid,
            uid = new.peer.uid,
            segment_bytes = new.segment.bytes,
            page_bytes = new.segment.page_bytes,
            backing = new.segment.backing.name(),
            "client connected"
        );
        // Our copy of the memfd is no longer needed: the mapping keeps the memory.
        drop(new.segment.fd);
        self.clients[slot] = Some(ClientConn {
            sq: end.submissions,
            sq_bell: new.sq_doorbell,
            daemon_sleeping: end.daemon_sleeping,
            conn: new.conn,
            tx: ClientTx {
                id,
                peer: new.peer,
                cq: end.completions,
                cq_bell: Notifier::new(end.client_waiting, new.cq_doorbell),
                input: end.input,
                output: end.output,
                backlog: VecDeque::with_capacity(cq_entries),
                paused: false,
                requests: HashMap::with_capacity(64),
                pushed: false,
                corrupt: false,
                requests_total: 0,
                tokens_served: 0,
                descriptors: 0,
                connected_at: Instant::now(),
                segment_bytes: new.segment.bytes,
                page_bytes: new.segment.page_bytes,
                shutdown_sent: false,
            },
        });
        self.active.push(slot);
        self.ledger.clients_connected += 1;
        self.acceptor.clients.fetch_add(1, Ordering::Relaxed);
    }

    /// Drop a client: stop watching it, cancel its work in the engine, unmap its segment and
    /// close its descriptors (dropping the connection does all of it).
    fn remove_client(&mut self, slot: usize, why: &str) {
        let Some(conn) = self.clients[slot].take() else {
            return;
        };
        if let Some(i) = self.active.iter().position(|&s| s == slot) {
            self.active.swap_remove(i);
        }
        // The client holds duplicates of these descriptors, so closing ours would not remove
        // them from the epoll set: delete explicitly.
        let _ = self.epoll.delete(conn.sq_bell.as_fd());
        let _ = self.epoll.delete(conn.conn.as_fd());
        if !conn.tx.requests.is_empty() || conn.tx.paused {
            self.pending_commands
                .push_back(EngineCommand::DropClient(conn.tx.id));
        }
        // A client that died mid-stream: its samples end without a Done, but they were
        // cancelled all the same, and `stats` says so.
        let abandoned: u64 = conn.tx.requests.values().map(|&n| u64::from(n)).sum();
        if abandoned > 0 {
            self.stats.record_abandoned(abandoned);
        }
        self.pending_admin.retain(|a| a.slot != slot);
        tracing::info!(
            slot,
            pid = conn.tx.peer.pid,
            in_flight = conn.tx.requests.len(),
            why,
            "client disconnected"
        );
        self.ledger.clients_disconnected += 1;
        self.acceptor.clients.fetch_sub(1, Ordering::Relaxed);
        drop(conn);
    }

    fn begin_drain(&mut self, why: &str) {
        if self.phase != Phase::Serving {
            return;
        }
        tracing::info!(why, drain_timeout = ?self.config.drain_timeout, "draining");
        self.phase = Phase::Draining;
        self.acceptor.shutting_down.store(true, Ordering::Release);
        if let Err(e) = self.acceptor.stop.signal() {
            tracing::error!(error = %e, "cannot stop the acceptor");
        }
        self.pending_commands.push_back(EngineCommand::Drain {
            deadline: Instant::now() + self.config.drain_timeout,
        });
    }

    /// After the engine drained: deliver backlogs and one SHUTDOWN completion per client
    /// (waiting up to a second for ring space), then close every connection.
    fn finish_shutdown(&mut self) {
        let deadline = Instant::now() + SHUTDOWN_FLUSH;
        loop {
            let mut all_done = true;
            for conn in self.clients.iter_mut().flatten() {
                let tx = &mut conn.tx;
                tx.flush_backlog(&mut self.ledger);
                if tx.backlog.is_empty() && !tx.shutdown_sent {
                    tx.emit(
                        Completion::shutdown(StatusCode::ShuttingDown),
                        &mut self.ledger,
                    );
                    tx.shutdown_sent = true;
                }
                all_done &= tx.shutdown_sent && tx.backlog.is_empty() || tx.corrupt;
            }
            self.ring_completion_doorbells();
            if all_done || Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let n = self.clients.iter().flatten().count();
        for slot in 0..self.clients.len() {
            if self.clients[slot].is_some() {
                self.remove_client(slot, "daemon shutdown");
            }
        }
        tracing::info!(clients = n, "drained; all clients closed");
    }
}
