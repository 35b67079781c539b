//! Events as plain C structs, and the conversion from the Rust API's [`EventRef`].
//!
//! Text is copied into a per-client arena that lives until the next poll, so an event needs no
//! freeing; token ids travel inline. A Rust event that does not fit one C event (more ids than
//! `NERVA_EVENT_MAX_TOKENS`) becomes several consecutive C events of the same kind.

use core::ffi::c_char;
use core::mem::MaybeUninit;
use std::collections::VecDeque;

use crate::{Event, EventRef, FinishReason, Timings};

/// Most token ids (and log-probabilities) one `nerva_event` carries inline. Longer runs arrive
/// as several consecutive events of the same kind.
pub const NERVA_EVENT_MAX_TOKENS: usize = 16;

/// What a `nerva_event` reports.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum nerva_event_kind {
    /// New token ids of one sample: `tokens[0..n_tokens]`, with `logprobs[0..n_logprobs]`
    /// (`n_logprobs` is 0 unless the request asked for log-probabilities).
    NERVA_EVENT_TOKENS = 1,
    /// The most likely alternatives for generated token number `position` of one sample
    /// (only with `top_logprobs > 0`): `tokens[0..n_tokens]`, most likely first, with their
    /// `logprobs`.
    NERVA_EVENT_TOP_LOGPROBS = 2,
    /// A piece of output text of one sample: `text[0..text_len]`, whole UTF-8 code points
    /// only.
    NERVA_EVENT_TEXT = 3,
    /// One sample ended: `finish_reason` and `timings` are set. Exactly one per sample of
    /// every accepted request; the request is over when all its samples are done.
    NERVA_EVENT_DONE = 4,
    /// The whole request failed (no DONE follows for it): `status` holds the daemon's
    /// `nerva_request_status` code and `text` a short detail from the daemon (maybe empty).
    NERVA_EVENT_ERROR = 5,
    /// The daemon is shutting down: it accepts no new work, and in-flight samples end with
    /// DONE and `NERVA_FINISH_SHUTDOWN` unless they finish within its drain time. `tag` is 0.
    NERVA_EVENT_SHUTDOWN = 6,
}

/// Why a sample ended (in `NERVA_EVENT_DONE` events; `NERVA_FINISH_NONE` elsewhere).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum nerva_finish_reason {
    /// Not a DONE event.
    NERVA_FINISH_NONE = 0,
    /// An end-of-sequence id, a stop token id or a stop string.
    NERVA_FINISH_STOP = 1,
    /// `max_tokens` reached.
    NERVA_FINISH_LENGTH = 2,
    /// The model's context length reached.
    NERVA_FINISH_CONTEXT_LENGTH = 3,
    /// Cancelled by `nerva_client_cancel`.
    NERVA_FINISH_CANCELLED = 4,
    /// The daemon failed this sample (see its log).
    NERVA_FINISH_ERROR = 5,
    /// The daemon shut down before the sample finished.
    NERVA_FINISH_SHUTDOWN = 6,
}

impl From<FinishReason> for nerva_finish_reason {
    fn from(reason: FinishReason) -> Self {
        match reason {
            FinishReason::Stop => Self::NERVA_FINISH_STOP,
            FinishReason::Length => Self::NERVA_FINISH_LENGTH,
            FinishReason::ContextLength => Self::NERVA_FINISH_CONTEXT_LENGTH,
            FinishReason::Cancelled => Self::NERVA_FINISH_CANCELLED,
            FinishReason::Error => Self::NERVA_FINISH_ERROR,
            FinishReason::Shutdown => Self::NERVA_FINISH_SHUTDOWN,
        }
    }
}

/// Per-sample timings measured by the daemon (in `NERVA_EVENT_DONE` events; zero elsewhere).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct nerva_timings {
    /// Received by the daemon until first scheduled, in microseconds.
    pub queue_us: u64,
    /// Received by the daemon until the first token, in microseconds.
    pub first_token_us: u64,
    /// First token until last token, in microseconds.
    pub decode_us: u64,
    /// Mean time between consecutive tokens, in microseconds (0 with fewer than 2 tokens).
    pub inter_token_us: u64,
    /// Prompt tokens processed.
    pub prompt_tokens: u32,
    /// Tokens generated in this sample.
    pub generated_tokens: u32,
}

impl From<&Timings> for nerva_timings {
    fn from(t: &Timings) -> Self {
        let us = |d: core::time::Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        nerva_timings {
            queue_us: us(t.queue),
            first_token_us: us(t.time_to_first_token),
            decode_us: us(t.decode),
            inter_token_us: us(t.inter_token()),
            prompt_tokens: t.prompt_tokens,
            generated_tokens: t.generated_tokens,
        }
    }
}

/// One event from the daemon. Fields that do not apply to `kind` are zero (pointers NULL).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct nerva_event {
    /// The request's tag, as returned by the submit call (0 for SHUTDOWN).
    pub tag: u64,
    /// The request's `user_data` from its `nerva_generate_params`, echoed on every event of
    /// the request (0 for SHUTDOWN).
    pub user_data: u64,
    /// What this event reports.
    pub kind: nerva_event_kind,
    /// Sample index within the request, 0..n_samples.
    pub sample: u32,
    /// ERROR: the daemon's `nerva_request_status` code; 0 otherwise.
    pub status: u32,
    /// DONE: why the sample ended; `NERVA_FINISH_NONE` otherwise.
    pub finish_reason: nerva_finish_reason,
    /// TOP_LOGPROBS: index of the generated token the alternatives are for; 0 otherwise.
    pub position: u32,
    /// TOKENS / TOP_LOGPROBS: valid entries in `tokens`.
    pub n_tokens: u32,
    /// TOKENS / TOP_LOGPROBS: valid entries in `logprobs`: `n_tokens`, or 0 for TOKENS events
    /// of a request that did not set `logprobs`.
    pub n_logprobs: u32,
    /// TOKENS / TOP_LOGPROBS: token ids.
    pub tokens: [u32; NERVA_EVENT_MAX_TOKENS],
    /// TOKENS / TOP_LOGPROBS: natural-log probabilities of `tokens`.
    pub logprobs: [f32; NERVA_EVENT_MAX_TOKENS],
    /// TEXT: the piece; ERROR: the daemon's detail. `text_len` bytes of UTF-8 followed by a
    /// NUL (not counted). Owned by the client: valid until the next `nerva_client_poll` or
    /// `nerva_client_close` on this client. NULL for other kinds.
    pub text: *const c_char,
    /// TEXT / ERROR: bytes at `text`, excluding the terminating NUL.
    pub text_len: usize,
    /// DONE: the sample's timings.
    pub timings: nerva_timings,
}

impl nerva_event {
    fn empty(tag: u64, user_data: u64, kind: nerva_event_kind, sample: u16) -> Self {
        nerva_event {
            tag,
            user_data,
            kind,
            sample: u32::from(sample),
            status: 0,
            finish_reason: nerva_finish_reason::NERVA_FINISH_NONE,
            position: 0,
            n_tokens: 0,
            n_logprobs: 0,
            tokens: [0; NERVA_EVENT_MAX_TOKENS],
            logprobs: [0.0; NERVA_EVENT_MAX_TOKENS],
            text: core::ptr::null(),
            text_len: 0,
            timings: nerva_timings::default(),
        }
    }
}

/// Fills a caller's `nerva_event` array during one poll.
///
/// Text bytes go to `arena` (cleared at the start of each poll, so pointers from the previous
/// poll die exactly when the header says); their pointers are fixed up in [`EventSink::finish`]
/// because the arena may move while it grows. Events that do not fit the caller's array are
/// kept, owned, in `overflow` and delivered first by the next poll: nothing is ever dropped.
pub(crate) struct EventSink<'a> {
    /// The caller's array, possibly uninitialized: entries are only written, never read, until
    /// `filled` says they hold an event.
    out: &'a mut [MaybeUninit<nerva_event>],
    filled: usize,
    arena: &'a mut Vec<u8>,
    /// (event index, arena offset) of every TEXT event written this poll.
    text_spans: &'a mut Vec<(usize, usize)>,
    overflow: &'a mut VecDeque<Event>,
}

impl<'a> EventSink<'a> {
    /// Start a poll: clears the arena (ending the previous poll's text pointers).
    pub(crate) fn new(
        out: &'a mut [MaybeUninit<nerva_event>],
        arena: &'a mut Vec<u8>,
        text_spans: &'a mut Vec<(usize, usize)>,
        overflow: &'a mut VecDeque<Event>,
    ) -> Self {
        arena.clear();
        text_spans.clear();
        EventSink {
            out,
            filled: 0,
            arena,
            text_spans,
            overflow,
        }
    }

    /// Whether the caller's array is full.
    pub(crate) fn is_full(&self) -> bool {
        self.filled == self.out.len()
    }

    /// Deliver events left over from earlier polls, oldest first, while there is room.
    pub(crate) fn drain_overflow(&mut self) {
        while !self.is_full() {
            let Some(event) = self.overflow.pop_front() else {
                return;
            };
            // A token run only partly delivered goes back to the front: it is the oldest.
            self.deliver(event.to_ref(), Spill::Front);
        }
    }

    /// Deliver one event: into the caller's array while there is room, the rest into the
    /// overflow queue (in order).
    pub(crate) fn push(&mut self, event: EventRef<'_>) {
        if !self.overflow.is_empty() || self.is_full() {
            // Older events wait in the queue: keep the order.
            self.overflow.push_back(event.to_owned());
            return;
        }
        self.deliver(event, Spill::Back);
    }

    /// Write `event` into the caller's array, which has room for at least one event; a token
    /// run longer than the remaining room spills its tail into the overflow queue at `spill`.
    fn deliver(&mut self, event: EventRef<'_>, spill: Spill) {
        match event {
            EventRef::Tokens {
                tag,
                user_data,
                sample,
                ids,
                logprobs,
            } => self.push_ids(
                nerva_event_kind::NERVA_EVENT_TOKENS,
                (tag.0, user_data, sample, 0),
                (ids, logprobs),
                spill,
            ),
            EventRef::TopLogprobs {
                tag,
                user_data,
                sample,
                position,
                ids,
                logprobs,
            } => self.push_ids(
                nerva_event_kind::NERVA_EVENT_TOP_LOGPROBS,
                (tag.0, user_data, sample, position),
                (ids, logprobs),
                spill,
            ),
            EventRef::Text {
                tag,
                user_data,
                sample,
                text,
            } => {
                let ev = nerva_event::empty(
                    tag.0,
                    user_data,
                    nerva_event_kind::NERVA_EVENT_TEXT,
                    sample,
                );
                self.put_with_text(ev, text);
            }
            EventRef::Done {
                tag,
                user_data,
                sample,
                reason,
                timings,
            } => {
                let mut ev = nerva_event::empty(
                    tag.0,
                    user_data,
                    nerva_event_kind::NERVA_EVENT_DONE,
                    sample,
                );
                ev.finish_reason = reason.into();
                ev.timings = (&timings).into();
                self.put(ev);
            }
            EventRef::Error {
                tag,
                user_data,
                status,
                detail,
            } => {
                let mut ev =
                    nerva_event::empty(tag.0, user_data, nerva_event_kind::NERVA_EVENT_ERROR, 0);
                ev.status = u32::from(status);
                self.put_with_text(ev, detail);
            }
            EventRef::Shutdown => {
                self.put(nerva_event::empty(
                    0,
                    0,
                    nerva_event_kind::NERVA_EVENT_SHUTDOWN,
                    0,
                ));
            }
        }
    }

    /// Split a run of ids into events of at most `NERVA_EVENT_MAX_TOKENS`; what does not fit
    /// the caller's array is queued as one owned event.
    fn push_ids(
        &mut self,
        kind: nerva_event_kind,
        (tag, user_data, sample, position): (u64, u64, u16, u32),
        (ids, logprobs): (&[u32], &[f32]),
        spill: Spill,
    ) {
        // The Rust API pairs logprobs with ids or leaves them empty; anything else is treated
        // as "no logprobs" rather than read out of step.
        let logprobs = if logprobs.len() == ids.len() {
            logprobs
        } else {
            &[]
        };
        let mut start = 0;
        while start < ids.len() || (start == 0 && ids.is_empty()) {
            if self.is_full() {
                let rest_ids = ids[start..].to_vec();
                let rest_logprobs = logprobs.get(start..).unwrap_or_default().to_vec();
                let tag = crate::Tag(tag);
                let rest = match kind {
                    nerva_event_kind::NERVA_EVENT_TOP_LOGPROBS => Event::TopLogprobs {
                        tag,
                        user_data,
                        sample,
                        position,
                        ids: rest_ids,
                        logprobs: rest_logprobs,
                    },
                    _ => Event::Tokens {
                        tag,
                        user_data,
                        sample,
                        ids: rest_ids,
                        logprobs: rest_logprobs,
                    },
                };
                match spill {
                    Spill::Front => self.overflow.push_front(rest),
                    Spill::Back => self.overflow.push_back(rest),
                }
                return;
            }
            let end = (start + NERVA_EVENT_MAX_TOKENS).min(ids.len());
            let mut ev = nerva_event::empty(tag, user_data, kind, sample);
            ev.position = position;
            let n = end - start;
            ev.tokens[..n].copy_from_slice(&ids[start..end]);
            ev.n_tokens = n as u32;
            if !logprobs.is_empty() {
                ev.logprobs[..n].copy_from_slice(&logprobs[start..end]);
                ev.n_logprobs = n as u32;
            }
            self.put(ev);
            if ids.is_empty() {
                return;
            }
            start = end;
        }
    }

    /// Write `ev` with `text` copied into the arena (pointer fixed up in `finish`).
    fn put_with_text(&mut self, mut ev: nerva_event, text: &str) {
        ev.text_len = text.len();
        self.text_spans.push((self.filled, self.arena.len()));
        self.arena.extend_from_slice(text.as_bytes());
        self.arena.push(0);
        self.put(ev);
    }

    fn put(&mut self, ev: nerva_event) {
        debug_assert!(!self.is_full(), "callers check for room first");
        self.out[self.filled].write(ev);
        self.filled += 1;
    }

    /// Point every TEXT event at its bytes (the arena no longer grows) and return how many
    /// events were written.
    pub(crate) fn finish(self) -> usize {
        let base = self.arena.as_ptr();
        for &(index, offset) in self.text_spans.iter() {
            debug_assert!(index < self.filled);
            // Offsets were taken from `arena.len()` before the bytes were appended, so
            // `offset..offset + text_len + 1` lies inside the arena; wrapping_add keeps the
            // pointer arithmetic free of unsafe.
            let text = base.wrapping_add(offset).cast::<c_char>();
            // SAFETY: `index` < `filled` (spans are recorded by `put_with_text` for the entry it
            // is about to write), and every entry below `filled` was written by `put`.
            unsafe { self.out[index].assume_init_mut() }.text = text;
        }
        self.filled
    }
}

/// Where the undelivered tail of a token run joins the overflow queue.
#[derive(Clone, Copy)]
enum Spill {
    /// It came from the queue's front (older than everything queued).
    Front,
    /// It is the newest event.
    Back,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Tag;

    fn slots<const N: usize>() -> [MaybeUninit<nerva_event>; N] {
        [const { MaybeUninit::uninit() }; N]
    }

    fn read(slots: &[MaybeUninit<nerva_event>], n: usize) -> Vec<nerva_event> {
        // SAFETY: the sink reported `n` entries written.
        slots[..n]
            .iter()
            .map(|s| unsafe { s.assume_init() })
            .collect()
    }

    #[test]
    fn long_token_runs_split_and_overflow_keeps_order() {
        let ids: Vec<u32> = (0..40).collect();
        let logprobs: Vec<f32> = (0..40).map(|i| -(i as f32)).collect();
        let (mut arena, mut spans, mut overflow) = (Vec::new(), Vec::new(), VecDeque::new());
        let mut slots2 = slots::<2>();
        let mut sink = EventSink::new(&mut slots2, &mut arena, &mut spans, &mut overflow);
        sink.push(EventRef::Tokens {
            tag: Tag(7),
            user_data: 99,
            sample: 1,
            ids: &ids,
            logprobs: &logprobs,
        });
        sink.push(EventRef::Text {
            tag: Tag(7),
            user_data: 99,
            sample: 1,
            text: "héllo",
        });
        assert_eq!(sink.finish(), 2);
        let out = read(&slots2, 2);
        assert_eq!(out[0].n_tokens, 16);
        assert_eq!(out[1].tokens[0], 16);
        assert_eq!(out[1].logprobs[0], -16.0);
        assert_eq!(
            overflow.len(),
            2,
            "the last 8 ids and the text wait, in order"
        );

        let mut slots4 = slots::<4>();
        let mut sink = EventSink::new(&mut slots4, &mut arena, &mut spans, &mut overflow);
        sink.drain_overflow();
        sink.push(EventRef::Done {
            tag: Tag(7),
            user_data: 99,
            sample: 1,
            reason: FinishReason::Length,
            timings: Timings::default(),
        });
        assert_eq!(sink.finish(), 3);
        let out = read(&slots4, 3);
        assert!(overflow.is_empty());
        assert_eq!(out[0].n_tokens, 8);
        assert_eq!(out[0].tokens[7], 39);
        assert_eq!(out[1].kind, nerva_event_kind::NERVA_EVENT_TEXT);
        // SAFETY: the arena holds text_len bytes plus a NUL at `text` until the next poll.
        let text = unsafe { core::ffi::CStr::from_ptr(out[1].text) };
        assert_eq!(text.to_bytes(), "héllo".as_bytes());
        assert_eq!(out[1].text_len, "héllo".len());
        assert_eq!(
            out[2].finish_reason,
            nerva_finish_reason::NERVA_FINISH_LENGTH
        );
        assert!(
            out.iter().all(|e| e.user_data == 99),
            "user_data survives the split and the overflow queue"
        );
    }
}
