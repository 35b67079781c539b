//! Nerva's wire: everything the daemon and its clients share.
//!
//! - [`Descriptor`] (64 B, client → daemon) and [`Completion`] (64 B, daemon → client), with
//!   safe constructors, validation and the shared [`StatusCode`] table;
//! - [`SpscRing`]: a lock-free single-producer single-consumer ring of [`Pod`] entries in
//!   caller-provided (shared) memory or on the heap, with batch commit/consume and hostile-peer
//!   checks;
//! - [`SegmentLayout`] / [`Segment`]: one client's shared-memory segment (header, submission
//!   ring, completion ring, input and output data regions) and its two ends;
//! - the doorbell ([`NeedWakeup`], [`Notifier`], [`Waiter`], [`EventFd`]): wake a sleeping peer
//!   with an eventfd write only when it announced sleep;
//! - [`extension`]: the versioned block of options that do not fit in a descriptor;
//! - [`handshake`]: the socket messages that hand a client its segment.
//!
//! No allocation, lock or system call on the ring's hot path. Under `--cfg loom` the ring and
//! the doorbell flag run on loom's model-checked atomics (see `tests/loom_*.rs`); the
//! shared-memory parts (segments, eventfds) are compiled out there.
//!
//! ```
//! use nerva_rings::{Completion, Descriptor, SpscRing};
//! # if nerva_rings::BUILT_FOR_LOOM { return; } // loom atomics only work inside a loom model
//! let (mut tx, mut rx) = SpscRing::<Descriptor>::with_capacity(64).unwrap();
//! tx.push(Descriptor::nop(1, 12345)).unwrap();
//! let d = rx.pop().unwrap().unwrap();
//! assert_eq!(d.validate().unwrap(), nerva_rings::Request::Nop { tag: 1, payload: 12345 });
//! let reply = Completion::nop_reply(d.tag(), 12345);
//! assert_eq!(reply.tag(), 1);
//! ```
#![deny(missing_docs)]

mod sync;

pub mod completion;
pub mod descriptor;
pub mod doorbell;
pub mod extension;
pub mod handshake;
#[cfg(not(loom))]
pub mod layout;
pub mod pod;
pub mod ring;
#[cfg(not(loom))]
pub mod segment;
pub mod status;
mod wire_bytes;

pub use completion::{
    AdminReply, Completion, CompletionError, DoneInfo, Event, EventKind, FinishReason,
    INLINE_ERROR_BYTES, INLINE_TEXT_BYTES, INLINE_TOKENS, INLINE_TOP_LOGPROBS, InlineText,
    TextTooLong, TokenChunk, TopLogprobs, split_text,
};
pub use descriptor::{
    AdminOptions, AdminQuery, ByteRange, DEFAULT_MAX_TOKENS, DESCRIPTOR_VERSION, Descriptor,
    DescriptorError, GenerateFlags, GenerateRequest, MAX_SAMPLES, Opcode, PromptKind, RangeError,
    Request, SamplingParams, check_range,
};
pub use doorbell::NeedWakeup;
#[cfg(not(loom))]
pub use doorbell::{EventFd, Notifier, WaitError, Waiter, WakeFlag, doorbell_pair};
pub use extension::{Extension, ExtensionError, ExtensionView};
#[cfg(not(loom))]
pub use layout::{SegmentError, SegmentGeometry, SegmentHeader, SegmentLayout};
pub use pod::Pod;
pub use ring::{
    AttachError, CapacityError, Consumer, MAX_RING_CAPACITY, Producer, PushError, RingError,
    RingHeader, SpscRing,
};
#[cfg(not(loom))]
pub use segment::{ClientEnd, DaemonEnd, RegionReader, RegionWriter, Segment, SegmentMapping};
pub use status::StatusCode;

/// Whether this build uses loom's model-checked atomics (`--cfg loom`). Such a build can only
/// run ring code inside `loom::model`; its doc examples check this and return early.
#[doc(hidden)]
pub const BUILT_FOR_LOOM: bool = cfg!(loom);
