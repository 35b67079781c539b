//! Client library for `nervad`, the Nerva inference daemon.
//!
//! ```no_run
//! use nerva_client::{Client, EventRef, GenerateParams, Prompt};
//! let mut client = Client::connect(None)?;
//! let params = GenerateParams { max_tokens: 32, ..GenerateParams::default() };
//! let tag = client.submit_generate(Prompt::Text("Once upon a time"), &params)?;
//! let mut done = false;
//! while !done {
//!     client.wait(None)?;
//!     client.poll_with(|event| match event {
//!         EventRef::Text { text, .. } => print!("{text}"),
//!         EventRef::Done { tag: t, .. } | EventRef::Error { tag: t, .. } if t == tag => done = true,
//!         _ => {}
//!     })?;
//! }
//! # Ok::<(), nerva_client::Error>(())
//! ```
//!
//! # Model
//! A [`Client`] is one connection: the daemon creates a shared-memory segment for it alone
//! (submission ring, completion ring, input region, output region) and passes it over the Unix
//! socket. Requests go in as 64-byte descriptors, results come back as 64-byte completions;
//! while both sides are busy no system call is made.
//!
//! # Thread safety
//! `Client` is `Send` and not `Sync`: one thread at a time uses a client, and it may move
//! between threads. A process may open any number of clients (each has its own segment), e.g.
//! one per thread.
//!
//! # Protocol conventions (what the daemon and this library agree on)
//! - **Input region (client-owned).** The client writes prompt bytes (UTF-8 text, `u32`
//!   little-endian token ids, or chat JSON) and the optional extension block (stop strings,
//!   stop ids, penalties, top-logprobs, ignore-eos) there, then pushes the descriptor
//!   referencing them. The daemon copies the bytes out when it consumes the descriptor (read
//!   once, copy, validate), so the client reuses the bytes as soon as the submission ring's
//!   consumer index has passed that descriptor: a byte ring released in submission order.
//! - **Output region.** Admin replies (status/clients/stats JSON) are written by the daemon
//!   into the `(offset, capacity)` the ADMIN descriptor names; this library names the whole
//!   region because its admin calls are blocking (`&mut self`), so one reply is outstanding at
//!   a time.
//! - **Text** streams as `TEXT` completions of at most 48 inline bytes, split by the daemon at
//!   code-point boundaries; this library still reassembles split code points (and replaces
//!   invalid bytes with U+FFFD), so applications only see whole code points.
//! - **Ordering.** Every completion of a request carries a per-request sequence number; the
//!   library checks it and reports a gap as [`Error::Protocol`].
//! - **Doorbells.** Submission side: the daemon sets "sleeping" before it blocks; the client
//!   pushes, fences, and writes the submission eventfd only if the flag is set. Completion
//!   side, symmetric: [`Client::wait`] sets "waiting", re-checks the ring, then sleeps in
//!   `poll(2)` on the completion eventfd *and the socket*.
//! - **Liveness.** The socket stays open for the life of the client. The daemon treats hang-up
//!   as death: it cancels the client's requests and reclaims the segment. The client sees the
//!   daemon's hang-up in `wait` (the socket is in the poll set) and in non-blocking calls (the
//!   socket is checked at most every 2 ms while nothing arrives): calls fail with
//!   [`Error::DaemonGone`] within milliseconds.
//! - **Shutdown.** On SIGTERM the daemon stops accepting, lets in-flight requests finish
//!   (or ends them with `Done { reason: Shutdown }` after its drain timeout), sends
//!   [`EventRef::Shutdown`] as the last event, and closes.
//! - **Tags.** [`Client::submit_generate`] assigns tags counting up from 1; tags with the top
//!   bit set are reserved for the library's own NOP and admin round trips.
#![deny(missing_docs)]

mod client;
mod connection;
mod error;
mod event;
pub mod ffi;
mod input_arena;
mod params;
mod text_assembly;

pub use client::{Client, ConnectOptions, ModelInfo, abi_version};
pub use connection::{RingSizes, default_socket_path};
pub use error::{Error, ErrorCode, Result};
pub use event::{Event, EventRef, FinishReason, Tag, Timings, status_code};
pub use nerva_rings::StatusCode;
pub use params::{GenerateParams, MAX_SAMPLES, MAX_TOP_LOGPROBS, Prompt};
