//! Admin replies (`nervactl status / clients / stats`), as JSON built on the poll thread.
//! Admin queries are not on the hot path: they allocate, and the poll loop accounts for that
//! separately from its per-descriptor ledger.

use serde_json::{Value, json};

use crate::engine::api::EngineInfo;

/// Static facts for `status`.
#[derive(Debug, Clone)]
pub struct StatusContext {
    /// Engine facts.
    pub engine: EngineInfo,
    /// Socket path.
    pub socket: String,
    /// Access policy, as text.
    pub policy: String,
    /// Segment backing of the pooled segments: (name, page bytes, mlocked).
    pub segment_pages: Option<(&'static str, u64, bool)>,
    /// Host page facts (nr_hugepages, shmem THP policy).
    pub host_pages: String,
    /// Pre-allocated segments.
    pub segment_pool: u32,
    /// Staging bytes for prompt copies, and whether they are mlocked.
    pub staging: (usize, bool),
    /// Engine command / output queue capacities.
    pub queues: (usize, usize),
    /// Default ring and region sizes.
    pub defaults: (u32, u32, u64, u64),
    /// Spin window in microseconds.
    pub spin_us: u64,
    /// Most clients.
    pub max_clients: u32,
    /// Largest ring a client may ask for at connect.
    pub max_ring_entries: u32,
    /// Largest input region a client may ask for at connect.
    pub max_data_bytes: u64,
}

/// The asking client's own sizes, for `model_info`.
#[derive(Debug, Clone, Copy)]
pub struct ClientSizes {
    /// Submission ring entries.
    pub sq_entries: u32,
    /// Completion ring entries.
    pub cq_entries: u32,
    /// Input region bytes.
    pub data_bytes: u64,
    /// Output region bytes.
    pub reply_bytes: u64,
}

/// `model_info` reply: what a client needs to size and validate its requests (the model, the
/// daemon's limits, and this client's own ring and region sizes).
pub fn model_info_json(ctx: &StatusContext, client: ClientSizes, tokenizer: bool) -> Value {
    use nerva_rings::extension::{
        MAX_STOP_STRING_BYTES, MAX_STOP_STRINGS, MAX_STOP_TOKENS, MAX_TOP_LOGPROBS,
    };
    json!({
        "name": ctx.engine.model,
        "architecture": ctx.engine.architecture,
        "dtype": ctx.engine.dtype,
        "vocab_size": ctx.engine.vocab_size,
        "max_context": ctx.engine.max_context,
        "backend": ctx.engine.backend,
        "tokenizer": tokenizer,
        "limits": {
            "max_batch": ctx.engine.max_batch,
            "max_samples": nerva_rings::MAX_SAMPLES,
            "max_stop_strings": MAX_STOP_STRINGS,
            "max_stop_string_bytes": MAX_STOP_STRING_BYTES,
            "max_stop_token_ids": MAX_STOP_TOKENS,
            "max_top_logprobs": MAX_TOP_LOGPROBS,
            "max_ring_entries": ctx.max_ring_entries,
            "max_data_bytes": ctx.max_data_bytes,
        },
        "client": {
            "sq_entries": client.sq_entries,
            "cq_entries": client.cq_entries,
            "data_bytes": client.data_bytes,
            "reply_bytes": client.reply_bytes,
        },
    })
}

/// One client's row in `clients`.
#[derive(Debug, Clone, Copy)]
pub struct ClientRow {
    /// Slot.
    pub slot: u32,
    /// Generation of the slot.
    pub generation: u32,
    /// Peer pid/uid/gid.
    pub pid: i32,
    /// uid.
    pub uid: u32,
    /// gid.
    pub gid: u32,
    /// Submission ring entries waiting / capacity.
    pub sq: (u32, u32),
    /// Completion ring entries unread by the client / capacity.
    pub cq: (u32, u32),
    /// Completions waiting in the daemon for ring space.
    pub backlog: usize,
    /// Streams paused for a full completion ring.
    pub paused: bool,
    /// Requests in flight.
    pub in_flight: usize,
    /// Requests submitted.
    pub requests: u64,
    /// Tokens generated for this client.
    pub tokens_served: u64,
    /// Descriptors consumed.
    pub descriptors: u64,
    /// Seconds connected.
    pub connected_s: f64,
    /// Segment bytes and page size.
    pub segment: (u64, u64),
}

/// `status` reply.
pub fn status_json(
    ctx: &StatusContext,
    live: &crate::engine::api::EngineGauges,
    uptime_s: f64,
    clients: usize,
    draining: bool,
) -> Value {
    use std::sync::atomic::Ordering::{Acquire, Relaxed};
    // SYNC POINT with the Release store of kv_pages_used in the engine's `publish`: the peak
    // read after it is at least that step's.
    let used = live.kv_pages_used.load(Acquire);
    let peak = live.kv_pages_peak.load(Relaxed);
    let (backing, page_bytes, locked) = ctx.segment_pages.unwrap_or(("none", 0, false));
    json!({
        "daemon": {
            "pid": std::process::id(),
            "version": env!("CARGO_PKG_VERSION"),
            "abi_version": nerva_rings::handshake::ABI_VERSION,
            "uptime_s": uptime_s,
            "socket": ctx.socket,
            "policy": ctx.policy,
            "draining": draining,
            "clients": clients,
            "max_clients": ctx.max_clients,
            "spin_us": ctx.spin_us,
        },
        "model": {
            "name": ctx.engine.model,
            "architecture": ctx.engine.architecture,
            "dtype": ctx.engine.dtype,
            "vocab_size": ctx.engine.vocab_size,
            "max_context": ctx.engine.max_context,
            "max_batch": ctx.engine.max_batch,
            "weight_bytes": ctx.engine.weight_bytes,
            "step_weight_bytes": ctx.engine.step_weight_bytes,
        },
        "backend": ctx.engine.backend,
        "device": ctx.engine.device,
        "read_bandwidth_bytes_per_s": ctx.engine.read_bandwidth_bytes_per_s,
        "kv": {
            "pages_total": ctx.engine.kv_pages_total,
            "pages_used": used,
            "pages_free": u64::from(ctx.engine.kv_pages_total).saturating_sub(used),
            "pages_peak": peak,
            "pages_shared": live.kv_pages_shared.load(Relaxed),
            "pages_cached": live.kv_pages_cached.load(Relaxed),
            "page_tokens": ctx.engine.kv_page_tokens,
            "bytes_per_token": ctx.engine.kv_bytes_per_token,
        },
        "scheduler": {
            "running": live.running.load(Relaxed),
            "queued": live.queued.load(Relaxed),
            "parked": live.parked.load(Relaxed),
            "preempted": live.preempted.load(Relaxed),
            "preemptions": live.preemptions.load(Relaxed),
            "swapped": live.swapped.load(Relaxed),
            "swap_outs": live.swap_outs.load(Relaxed),
            "swap_ins": live.swap_ins.load(Relaxed),
        },
        "swap": {
            "pages_total": live.swap_pages_total.load(Relaxed),
            "pages_used": live.swap_pages_used.load(Relaxed),
            "pages_free": live
                .swap_pages_total
                .load(Relaxed)
                .saturating_sub(live.swap_pages_used.load(Relaxed)),
        },
        "arenas": {
            "segment_backing": backing,
            "segment_page_bytes": page_bytes,
            "segments_mlocked": locked,
            "segment_pool": ctx.segment_pool,
            "staging_bytes": ctx.staging.0,
            "staging_mlocked": ctx.staging.1,
            "engine_command_queue": ctx.queues.0,
            "engine_output_queue": ctx.queues.1,
            "host_pages": ctx.host_pages,
        },
        "defaults": {
            "sq_entries": ctx.defaults.0,
            "cq_entries": ctx.defaults.1,
            "data_bytes": ctx.defaults.2,
            "reply_bytes": ctx.defaults.3,
        },
    })
}

/// `clients` reply.
pub fn clients_json(rows: &[ClientRow]) -> Value {
    Value::Array(
        rows.iter()
            .map(|r| {
                json!({
                    "slot": r.slot,
                    "generation": r.generation,
                    "pid": r.pid,
                    "uid": r.uid,
                    "gid": r.gid,
                    "sq_used": r.sq.0,
                    "sq_entries": r.sq.1,
                    "cq_used": r.cq.0,
                    "cq_entries": r.cq.1,
                    "backlog": r.backlog,
                    "paused": r.paused,
                    "in_flight": r.in_flight,
                    "requests": r.requests,
                    "tokens_served": r.tokens_served,
                    "descriptors": r.descriptors,
                    "connected_s": r.connected_s,
                    "segment_bytes": r.segment.0,
                    "page_bytes": r.segment.1,
                })
            })
            .collect(),
    )
}
