//! The server: socket, handshake, per-client segments, the poll loop and the engine thread.
//!
//! Threads: the **acceptor** (accept, credentials, hello, segment creation), the **poll
//! thread** (this function's caller: all rings of all clients, doorbells, signals, admin
//! replies) and the **engine thread** (owns the engine; steps it; turns events into
//! completions). They talk through SPSC queues allocated at start and eventfd doorbells.

pub mod acceptor;
pub mod admin;
pub mod alloc_count;
pub mod cli;
pub mod client_segment;
pub mod config;
pub mod engine_thread;
pub mod intake;
pub mod ledger_history;
pub mod listener;
pub mod policy;
pub mod poller;
pub mod segment;
pub mod signals;
pub mod stats;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32};

pub use config::ServeConfig;
use nerva_rings::EventFd;

use crate::engine::TextCodec;
use crate::engine::api::InferenceEngine;
use acceptor::{Acceptor, AcceptorShared};
use admin::StatusContext;
use engine_thread::EngineWorker;
use listener::DaemonSocket;
use policy::AccessPolicy;
use poller::{PollLoop, PollLoopParts};
use signals::ShutdownSignals;
use stats::LatencyStats;

/// Capacity of the poll → engine command queue.
const COMMAND_QUEUE: usize = 8192;
/// Capacity of the engine → poll output queue (completions).
const OUTPUT_QUEUE: usize = 1 << 16;

/// Why the daemon could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The socket could not be set up.
    #[error(transparent)]
    Listen(#[from] listener::ListenError),
    /// The engine thread died (panicked); clients were sent SHUTDOWN.
    #[error("the engine thread died")]
    EngineDied,
    /// A resource could not be created at start.
    #[error("{what}: {source}")]
    Setup {
        /// What.
        what: &'static str,
        /// The error.
        source: std::io::Error,
    },
}

fn setup(what: &'static str) -> impl FnOnce(std::io::Error) -> ServerError {
    move |source| ServerError::Setup { what, source }
}

/// Serve until SIGTERM/SIGINT (or an admin shutdown) and a completed drain. `signals` must
/// have been created before any thread was spawned. `codec` answers clients' tokenize and
/// detokenize queries (`None`: those queries are refused).
pub fn serve(
    config: ServeConfig,
    engine: Box<dyn InferenceEngine>,
    codec: Option<Arc<dyn TextCodec>>,
    signals: ShutdownSignals,
) -> Result<(), ServerError> {
    let uid = nix::unistd::geteuid().as_raw();
    let socket = DaemonSocket::bind(&config.socket, config.socket_mode, config.create_socket_dir)?;
    let policy = AccessPolicy::new(&config.allow_uids, &config.allow_gids, uid, socket.group());
    let info = engine.info();
    let socket_path = socket.path().display().to_string();

    let shared = Arc::new(AcceptorShared {
        shutting_down: AtomicBool::new(false),
        clients: AtomicU32::new(0),
        stop: EventFd::new().map_err(setup("acceptor stop eventfd"))?,
    });
    let inbox_bell = Arc::new(EventFd::new().map_err(setup("inbox eventfd"))?);
    let (inbox_tx, inbox_rx) = std::sync::mpsc::sync_channel(config.max_clients as usize);
    let acceptor = Acceptor::new(
        socket,
        policy.clone(),
        config.clone(),
        shared.clone(),
        inbox_tx,
        inbox_bell.clone(),
    )
    .map_err(setup("segment pool"))?;
    let segment_pages = acceptor.pool_report();

    // Staging arena for prompt copies: sized for the default input region, locked if allowed.
    let staging: Vec<u8> = Vec::with_capacity(config.data_bytes as usize);
    let staging_locked = config.mlock && lock_vec(&staging);

    let (cmd_tx, cmd_rx) = rtrb::RingBuffer::new(COMMAND_QUEUE);
    let (out_tx, out_rx) = rtrb::RingBuffer::new(OUTPUT_QUEUE);
    let (engine_notifier, engine_waiter) =
        nerva_rings::doorbell_pair().map_err(setup("engine doorbell"))?;
    let stats = Arc::new(LatencyStats::new());

    let (backing, page_bytes, locked) = segment_pages.unwrap_or(("none", 0, false));
    tracing::info!(
        socket = %socket_path,
        %policy,
        model = %info.model,
        backend = %info.backend,
        device = %info.device,
        segment_backing = backing,
        segment_page_bytes = page_bytes,
        segments_mlocked = locked,
        staging_mlocked = staging_locked,
        host = %segment::host_page_report(),
        "nervad serving"
    );
    let status = StatusContext {
        engine: info,
        socket: socket_path,
        policy: policy.to_string(),
        segment_pages,
        host_pages: segment::host_page_report(),
        segment_pool: config.segment_pool,
        staging: (staging.capacity(), staging_locked),
        queues: (COMMAND_QUEUE, OUTPUT_QUEUE),
        defaults: (
            config.sq_entries,
            config.cq_entries,
            config.data_bytes,
            config.reply_bytes,
        ),
        spin_us: config.spin.as_micros() as u64,
        max_clients: config.max_clients,
        max_ring_entries: config.max_ring_entries,
        max_data_bytes: config.max_data_bytes,
    };

    let worker = EngineWorker::new(engine, cmd_rx, out_tx, engine_notifier, stats.clone());
    let engine_handle = std::thread::Builder::new()
        .name("nerva-engine".into())
        .spawn(move || worker.run())
        .map_err(setup("engine thread"))?;
    let acceptor_handle = std::thread::Builder::new()
        .name("nerva-accept".into())
        .spawn(move || acceptor.run())
        .map_err(setup("acceptor thread"))?;

    let poll = PollLoop::new(PollLoopParts {
        config,
        signals,
        inbox: inbox_rx,
        inbox_bell,
        acceptor: shared.clone(),
        commands: cmd_tx,
        outputs: out_rx,
        engine_thread: engine_handle.thread().clone(),
        engine_bell: engine_waiter,
        stats,
        status,
        staging,
        codec,
    })
    .map_err(setup("epoll"))?;
    let clean = poll.run();

    let _ = shared.stop.signal();
    if acceptor_handle.join().is_err() {
        tracing::error!("acceptor thread panicked");
    }
    if engine_handle.join().is_err() {
        tracing::error!("engine thread panicked");
    }
    if !clean {
        return Err(ServerError::EngineDied);
    }
    tracing::info!("nervad stopped");
    Ok(())
}

/// mlock a vector's allocation (capacity), reporting success.
fn lock_vec(v: &Vec<u8>) -> bool {
    let Some(ptr) = std::ptr::NonNull::new(v.as_ptr().cast_mut().cast::<std::ffi::c_void>()) else {
        return false;
    };
    if v.capacity() == 0 {
        return false;
    }
    // SAFETY: locks exactly the vector's live allocation; contents are unaffected. The lock
    // goes away with the pages when the vector is freed at exit.
    unsafe { nix::sys::mman::mlock(ptr, v.capacity()) }.is_ok()
}
