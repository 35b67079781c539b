"""The synchronous client: one connection to nervad (one shared-memory segment)."""

from __future__ import annotations

import ctypes
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Deque, Dict, Iterator, List, Mapping, Optional, Sequence, Union

from . import _ffi
from ._ffi import load

__all__ = [
    "Client",
    "GenerateParams",
    "Timings",
    "TokensEvent",
    "TopLogprobsEvent",
    "TextEvent",
    "DoneEvent",
    "ShutdownEvent",
    "Event",
    "Sample",
    "Generation",
    "ModelInfo",
    "NervaError",
    "RequestError",
    "DaemonGoneError",
    "NoDaemonError",
    "QueueFullError",
    "InvalidArgumentError",
    "ShuttingDownError",
    "Prompt",
    "Message",
]


class NervaError(Exception):
    """A failed call into libnerva-client.

    ``code`` is the C ``nerva_status`` (negative; e.g. -7 ``NERVA_E_DAEMON_GONE``) and
    ``message`` the library's description of it (``nerva_strerror``), plus context.
    """

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{message} (nerva status {code})")
        self.code = code
        self.message = message


class InvalidArgumentError(NervaError, ValueError):
    """``NERVA_E_INVALID_ARGUMENT``: a parameter out of range or malformed."""


class NoDaemonError(NervaError, ConnectionError):
    """``NERVA_E_NO_DAEMON``: nothing listens on the socket path."""


class DaemonGoneError(NervaError, ConnectionError):
    """``NERVA_E_DAEMON_GONE``: the daemon exited or dropped this client."""


class QueueFullError(NervaError):
    """``NERVA_E_RING_FULL``: the submission ring is full now; poll, then retry."""


class ShuttingDownError(NervaError):
    """``NERVA_E_SHUTTING_DOWN``: the daemon is draining and takes no new work."""


class RequestError(NervaError):
    """The daemon failed a request (an ERROR event). ``code`` is ``NERVA_E_REJECTED`` (-11),
    ``status`` the daemon's ``nerva_request_status`` and ``detail`` its explanation."""

    def __init__(self, status: int, detail: str) -> None:
        lib = load()
        described = lib.nerva_request_status_string(status).decode()
        text = f"request failed: {described}" + (f": {detail}" if detail else "")
        super().__init__(_ffi.E_REJECTED, text)
        self.status = status
        self.detail = detail


_BY_CODE = {
    _ffi.E_INVALID_ARGUMENT: InvalidArgumentError,
    _ffi.E_NO_DAEMON: NoDaemonError,
    _ffi.E_DAEMON_GONE: DaemonGoneError,
    _ffi.E_RING_FULL: QueueFullError,
    _ffi.E_SHUTTING_DOWN: ShuttingDownError,
}


def _check(code: int, what: str) -> None:
    if code != _ffi.OK:
        desc = load().nerva_strerror(code).decode()
        raise _BY_CODE.get(code, NervaError)(code, f"{what}: {desc}")


@dataclass
class GenerateParams:
    """Sampling and stopping parameters (the C ``nerva_generate_params``; defaults equal
    ``nerva_generate_default_params()``)."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int = 0
    n_samples: int = 1
    top_logprobs: int = 0
    priority: int = 0
    ignore_eos: bool = False
    stream_tokens: bool = True
    stream_text: bool = True
    logprobs: bool = False
    stop: Sequence[str] = ()
    stop_token_ids: Sequence[int] = ()
    user_data: int = 0
    """Echoed on every event of the request (``nerva_event.user_data``)."""

    def validate(self) -> None:
        """Check every range (the library checks again); raises :class:`InvalidArgumentError`
        naming the parameter."""
        checks = [
            ("max_tokens", self.max_tokens >= 1, "must be at least 1"),
            ("temperature", self.temperature >= 0 and self.temperature != float("inf"),
             "must be finite and >= 0"),
            ("top_k", self.top_k >= 0, "must be >= 0"),
            ("top_p", 0 < self.top_p <= 1, "must be in (0, 1]"),
            ("min_p", 0 <= self.min_p <= 1, "must be in [0, 1]"),
            ("repetition_penalty", 0 < self.repetition_penalty < float("inf"),
             "must be finite and > 0"),
            ("presence_penalty", -2 <= self.presence_penalty <= 2, "must be in [-2, 2]"),
            ("frequency_penalty", -2 <= self.frequency_penalty <= 2, "must be in [-2, 2]"),
            ("seed", 0 <= self.seed < 2**64, "must be in 0..2**64"),
            ("n_samples", 1 <= self.n_samples <= 64, "must be in 1..=64"),
            ("top_logprobs", 0 <= self.top_logprobs <= 20, "must be in 0..=20"),
            ("priority", -128 <= self.priority <= 127, "must be in -128..=127"),
            ("stop", all(isinstance(s, str) and s for s in self.stop),
             "must be non-empty strings"),
            ("user_data", 0 <= self.user_data < 2**64, "must be in 0..2**64"),
        ]
        for name, ok, why in checks:
            if not ok:
                raise InvalidArgumentError(
                    _ffi.E_INVALID_ARGUMENT, f"{name} {why}, got {getattr(self, name)!r}"
                )

    def _to_c(self) -> "tuple[_ffi.nerva_generate_params, list]":
        try:
            self.validate()
        except TypeError as e:
            raise InvalidArgumentError(_ffi.E_INVALID_ARGUMENT, f"parameter type: {e}") from e
        lib = load()
        p = lib.nerva_generate_default_params()
        keep: list = []
        try:
            for name in (
                "max_tokens", "temperature", "top_k", "top_p", "min_p", "repetition_penalty",
                "presence_penalty", "frequency_penalty", "seed", "n_samples", "top_logprobs",
                "priority", "ignore_eos", "stream_tokens", "stream_text", "logprobs", "user_data",
            ):
                setattr(p, name, getattr(self, name))
        except TypeError as e:
            raise InvalidArgumentError(_ffi.E_INVALID_ARGUMENT, f"parameter type: {e}") from e
        if self.stop:
            encoded = [s.encode() for s in self.stop]
            arr = (ctypes.c_char_p * len(encoded))(*encoded)
            keep.append(arr)
            p.stop_strings = arr
            p.n_stop_strings = len(encoded)
        if self.stop_token_ids:
            ids = (ctypes.c_uint32 * len(self.stop_token_ids))(*self.stop_token_ids)
            keep.append(ids)
            p.stop_token_ids = ids
            p.n_stop_token_ids = len(self.stop_token_ids)
        return p, keep


@dataclass(frozen=True)
class Timings:
    """Per-sample timings measured by the daemon (microseconds)."""

    queue_us: int
    first_token_us: int
    decode_us: int
    inter_token_us: int
    prompt_tokens: int
    generated_tokens: int


@dataclass(frozen=True)
class TokensEvent:
    """New token ids of one sample (with log-probabilities when asked)."""

    tag: int
    sample: int
    token_ids: List[int]
    logprobs: List[float]
    user_data: int = 0


@dataclass(frozen=True)
class TopLogprobsEvent:
    """Most likely alternatives for generated token ``position`` of one sample."""

    tag: int
    sample: int
    position: int
    token_ids: List[int]
    logprobs: List[float]
    user_data: int = 0


@dataclass(frozen=True)
class TextEvent:
    """A piece of output text (whole code points)."""

    tag: int
    sample: int
    text: str
    user_data: int = 0


@dataclass(frozen=True)
class DoneEvent:
    """One sample ended; ``finish_reason`` is "stop", "length", "context_length",
    "cancelled", "error" or "shutdown"."""

    tag: int
    sample: int
    finish_reason: str
    timings: Timings
    user_data: int = 0


@dataclass(frozen=True)
class ShutdownEvent:
    """The daemon is shutting down: no new work is accepted."""


Event = Union[TokensEvent, TopLogprobsEvent, TextEvent, DoneEvent, ShutdownEvent]

Message = Mapping[str, str]
"""A chat message: ``{"role": ..., "content": ...}``."""

Prompt = Union[str, Sequence[int]]
"""Text (tokenized by the daemon) or token ids."""


@dataclass(frozen=True)
class ModelInfo:
    """What the daemon serves (``nerva_model_info``, the fields most callers need)."""

    name: str
    architecture: str
    dtype: str
    vocab_size: int
    max_context: int
    max_batch: int
    max_samples: int
    max_top_logprobs: int
    has_tokenizer: bool


@dataclass
class Sample:
    """One sample's output."""

    text: str = ""
    token_ids: List[int] = field(default_factory=list)
    logprobs: List[float] = field(default_factory=list)
    finish_reason: Optional[str] = None
    timings: Optional[Timings] = None


@dataclass
class Generation:
    """A finished request: one :class:`Sample` per ``n_samples``. ``text``, ``token_ids``
    and ``finish_reason`` are sample 0's."""

    tag: int
    samples: List[Sample]

    @property
    def text(self) -> str:
        return self.samples[0].text

    @property
    def token_ids(self) -> List[int]:
        return self.samples[0].token_ids

    @property
    def finish_reason(self) -> Optional[str]:
        return self.samples[0].finish_reason


class _ErrorEvent:
    __slots__ = ("tag", "status", "detail")

    def __init__(self, tag: int, status: int, detail: str) -> None:
        self.tag, self.status, self.detail = tag, status, detail


def _params(params: Optional[GenerateParams], overrides: Mapping[str, object]) -> GenerateParams:
    base = params if params is not None else GenerateParams()
    if not overrides:
        return base
    known = GenerateParams.__dataclass_fields__
    for k in overrides:
        if k not in known:
            raise TypeError(f"unknown generation parameter {k!r}")
    return GenerateParams(**{**base.__dict__, **overrides})


_POLL_BATCH = 64


class Client:
    """A connection to nervad: its own shared-memory segment, rings and doorbells.

    Use as a context manager (``with nerva.Client() as c: ...``) or call :meth:`close`.
    Requests run concurrently on one client; events of other requests that arrive while one
    is being streamed are kept for theirs. A client may be used from several threads; calls
    are serialized by an internal lock.
    """

    def __init__(self, socket_path: Optional[str] = None) -> None:
        """Connect to the daemon at ``socket_path`` (default: ``$NERVA_SOCKET``, else the
        daemon's default path). Raises :class:`NoDaemonError` and friends."""
        self._lib = load()
        self._handle = ctypes.POINTER(_ffi.NervaClientHandle)()
        path = socket_path.encode() if socket_path is not None else None
        _check(self._lib.nerva_client_connect(path, ctypes.byref(self._handle)), "connect")
        self._lock = threading.RLock()
        self._events = (_ffi.nerva_event * _POLL_BATCH)()
        self._queues: Dict[int, Deque[object]] = {}
        self._samples_left: Dict[int, int] = {}
        self._shutdown = False

    # -- lifetime ---------------------------------------------------------------------------

    def close(self) -> None:
        """Disconnect; the daemon cancels this client's requests. Idempotent."""
        with self._lock:
            if self._handle:
                self._lib.nerva_client_close(self._handle)
                self._handle = ctypes.POINTER(_ffi.NervaClientHandle)()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    def _live(self) -> "ctypes._Pointer":
        if not self._handle:
            raise NervaError(_ffi.E_INVALID_ARGUMENT, "client is closed")
        return self._handle

    # -- submitting -------------------------------------------------------------------------

    def submit(
        self,
        prompt: Prompt,
        params: Optional[GenerateParams] = None,
        **overrides: object,
    ) -> int:
        """Queue a generation from text or token ids; returns its tag. Never blocks: raises
        :class:`QueueFullError` when the ring is full (poll, then retry)."""
        p = _params(params, overrides)
        c_params, keep = p._to_c()
        tag = ctypes.c_uint64(0)
        with self._lock:
            h = self._live()
            if isinstance(prompt, str):
                data = prompt.encode()
                code = self._lib.nerva_client_submit_text(
                    h, data, len(data), ctypes.byref(c_params), ctypes.byref(tag)
                )
            else:
                ids = list(prompt)
                try:
                    arr = (ctypes.c_uint32 * len(ids))(*ids)
                except (TypeError, OverflowError) as e:
                    raise InvalidArgumentError(
                        _ffi.E_INVALID_ARGUMENT, f"token ids must be u32: {e}"
                    ) from e
                code = self._lib.nerva_client_submit_tokens(
                    h, arr, len(ids), ctypes.byref(c_params), ctypes.byref(tag)
                )
            _check(code, "submit")
            self._register(tag.value, p.n_samples)
        del keep
        return tag.value

    def submit_chat(
        self,
        messages: Sequence[Message],
        params: Optional[GenerateParams] = None,
        **overrides: object,
    ) -> int:
        """Queue a generation from chat messages, rendered by the daemon's chat template."""
        p = _params(params, overrides)
        c_params, keep = p._to_c()
        try:
            pairs = [(m["role"].encode(), m["content"].encode()) for m in messages]
        except (KeyError, AttributeError, TypeError) as e:
            raise InvalidArgumentError(
                _ffi.E_INVALID_ARGUMENT, "messages must be {'role': str, 'content': str} mappings"
            ) from e
        arr = (_ffi.nerva_chat_message * len(pairs))(
            *[_ffi.nerva_chat_message(r, c) for r, c in pairs]
        )
        tag = ctypes.c_uint64(0)
        with self._lock:
            code = self._lib.nerva_client_submit_chat(
                self._live(), arr, len(pairs), ctypes.byref(c_params), ctypes.byref(tag)
            )
            _check(code, "submit_chat")
            self._register(tag.value, p.n_samples)
        del keep
        return tag.value

    def _register(self, tag: int, n: int) -> None:
        self._queues[tag] = deque()
        self._samples_left[tag] = n

    def cancel(self, tag: int) -> bool:
        """Ask the daemon to stop request ``tag``; its samples end with finish reason
        "cancelled". False when it is no longer in flight."""
        with self._lock:
            code = self._lib.nerva_client_cancel(self._live(), tag)
        if code == _ffi.E_UNKNOWN_TAG:
            return False
        _check(code, "cancel")
        return True

    # -- receiving --------------------------------------------------------------------------

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block until events are ready (True) or ``timeout`` seconds pass (False). Sleeps
        on the completion doorbell, no busy loop."""
        ms = -1 if timeout is None else max(0, int(timeout * 1000 + 0.999))
        # Not under the lock: the C client sleeps without holding its own, so other threads
        # keep submitting while one waits.
        code = self._lib.nerva_client_wait(self._live(), ms)
        if code == _ffi.E_TIMEOUT:
            return False
        _check(code, "wait")
        return True

    def poll(self) -> List[Event]:
        """Events ready now, without blocking (all requests). Prefer :meth:`stream` or
        :meth:`events` for one request; raises :class:`RequestError` for a failed request's
        ERROR event."""
        out = self._poll_raw()
        events: List[Event] = []
        for e in out:
            if isinstance(e, _ErrorEvent):
                self._forget(e.tag)
                raise RequestError(e.status, e.detail)
            events.append(e)  # type: ignore[arg-type]
            self._account(e)  # type: ignore[arg-type]
        return events

    def _account(self, e: Event) -> None:
        if isinstance(e, DoneEvent):
            left = self._samples_left.get(e.tag, 1) - 1
            if left <= 0:
                self._forget(e.tag)
            else:
                self._samples_left[e.tag] = left

    def _forget(self, tag: int) -> None:
        self._samples_left.pop(tag, None)
        self._queues.pop(tag, None)

    def _poll_raw(self) -> List[object]:
        n = ctypes.c_size_t(0)
        with self._lock:
            code = self._lib.nerva_client_poll(
                self._live(), self._events, _POLL_BATCH, ctypes.byref(n)
            )
            _check(code, "poll")
            # Text pointers are valid until the next poll: convert while holding the lock.
            return [self._convert(self._events[i]) for i in range(n.value)]

    def _convert(self, ev: _ffi.nerva_event) -> object:
        k = ev.kind
        if k == _ffi.EVENT_TOKENS:
            return TokensEvent(
                ev.tag, ev.sample, list(ev.tokens[: ev.n_tokens]),
                list(ev.logprobs[: ev.n_logprobs]), ev.user_data,
            )
        if k == _ffi.EVENT_TOP_LOGPROBS:
            return TopLogprobsEvent(
                ev.tag,
                ev.sample,
                ev.position,
                list(ev.tokens[: ev.n_tokens]),
                list(ev.logprobs[: ev.n_logprobs]),
                ev.user_data,
            )
        if k == _ffi.EVENT_TEXT:
            text = ctypes.string_at(ev.text, ev.text_len).decode()
            return TextEvent(ev.tag, ev.sample, text, ev.user_data)
        if k == _ffi.EVENT_DONE:
            t = ev.timings
            return DoneEvent(
                ev.tag,
                ev.sample,
                _ffi.FINISH_REASONS.get(ev.finish_reason, "error"),
                Timings(
                    t.queue_us, t.first_token_us, t.decode_us, t.inter_token_us,
                    t.prompt_tokens, t.generated_tokens,
                ),
                ev.user_data,
            )
        if k == _ffi.EVENT_ERROR:
            detail = ctypes.string_at(ev.text, ev.text_len).decode() if ev.text else ""
            return _ErrorEvent(ev.tag, ev.status, detail)
        if k == _ffi.EVENT_SHUTDOWN:
            self._shutdown = True
            return ShutdownEvent()
        raise NervaError(-12, f"unknown event kind {k}")

    def _pump(self, timeout: Optional[float]) -> bool:
        """Wait once and route what arrived into the per-tag queues."""
        if not self.wait(timeout):
            return False
        for e in self._poll_raw():
            q = self._queues.get(getattr(e, "tag", -1))
            if q is not None:
                q.append(e)
        return True

    def events(self, tag: int, timeout: Optional[float] = None) -> Iterator[Event]:
        """Yield request ``tag``'s events as they arrive, until its last sample is done.
        Raises :class:`RequestError` if the daemon fails it, ``TimeoutError`` if nothing
        arrives for ``timeout`` seconds. Closing the generator early cancels the request."""
        q = self._queues.get(tag)
        if q is None:
            raise NervaError(_ffi.E_UNKNOWN_TAG, f"request {tag} is not in flight on this client")
        finished = False
        try:
            while True:
                while q:
                    e = q.popleft()
                    if isinstance(e, _ErrorEvent):
                        self._forget(tag)
                        finished = True
                        raise RequestError(e.status, e.detail)
                    self._account(e)  # type: ignore[arg-type]
                    yield e  # type: ignore[misc]
                    if tag not in self._samples_left:
                        finished = True
                        return
                if not self._pump(timeout):
                    raise TimeoutError(f"no event for request {tag} within {timeout} s")
        finally:
            if not finished and self._handle:
                self._forget(tag)
                try:
                    self.cancel(tag)
                except NervaError:
                    pass

    def stream(
        self,
        prompt: Prompt,
        params: Optional[GenerateParams] = None,
        **overrides: object,
    ) -> Iterator[Event]:
        """Submit ``prompt`` and yield its events as they arrive (see :meth:`events`)."""
        tag = self._submit_retrying(lambda: self.submit(prompt, params, **overrides))
        return self.events(tag)

    def stream_chat(
        self,
        messages: Sequence[Message],
        params: Optional[GenerateParams] = None,
        **overrides: object,
    ) -> Iterator[Event]:
        """Submit chat ``messages`` and yield the events as they arrive."""
        tag = self._submit_retrying(lambda: self.submit_chat(messages, params, **overrides))
        return self.events(tag)

    def _submit_retrying(self, submit) -> int:  # type: ignore[no-untyped-def]
        while True:
            try:
                return submit()
            except QueueFullError:
                self._pump(0.01)

    def generate(
        self,
        prompt: Prompt,
        params: Optional[GenerateParams] = None,
        **overrides: object,
    ) -> Generation:
        """Run ``prompt`` to the end; returns text and token ids of every sample."""
        return self._collect(self.stream(prompt, params, **overrides))

    def chat(
        self,
        messages: Sequence[Message],
        params: Optional[GenerateParams] = None,
        **overrides: object,
    ) -> Generation:
        """Run a chat to the end through the model's chat template."""
        return self._collect(self.stream_chat(messages, params, **overrides))

    @staticmethod
    def _collect(events: Iterator[Event]) -> Generation:
        samples: Dict[int, Sample] = {}
        tag = 0
        for e in events:
            if isinstance(e, ShutdownEvent):
                continue
            tag = e.tag
            s = samples.setdefault(e.sample, Sample())
            if isinstance(e, TextEvent):
                s.text += e.text
            elif isinstance(e, TokensEvent):
                s.token_ids.extend(e.token_ids)
                s.logprobs.extend(e.logprobs)
            elif isinstance(e, DoneEvent):
                s.finish_reason = e.finish_reason
                s.timings = e.timings
        return Generation(tag, [samples[i] for i in sorted(samples)])

    def nop(self) -> float:
        """One round trip to the daemon, in seconds."""
        rtt = ctypes.c_uint64(0)
        with self._lock:
            _check(self._lib.nerva_client_nop(self._live(), ctypes.byref(rtt)), "nop")
        return rtt.value / 1e9

    def fileno(self) -> int:
        """The readiness descriptor (``nerva_client_fd``) for an event loop: readable when
        events are ready or the daemon went away; after taking it, poll until a poll returns
        nothing, then wait for readability again. Owned by the client: do not close it."""
        fd = ctypes.c_int(-1)
        with self._lock:
            _check(self._lib.nerva_client_fd(self._live(), ctypes.byref(fd)), "fd")
        return fd.value

    def model_info(self) -> "ModelInfo":
        """What the daemon serves and the limits it enforces (one round trip)."""
        out = _ffi.nerva_model_info()
        with self._lock:
            _check(self._lib.nerva_client_model_info(self._live(), ctypes.byref(out)), "model_info")
        return ModelInfo(
            name=out.name.decode(errors="replace"),
            architecture=out.architecture.decode(errors="replace"),
            dtype=out.dtype.decode(errors="replace"),
            vocab_size=out.vocab_size,
            max_context=out.max_context,
            max_batch=out.max_batch,
            max_samples=out.max_samples,
            max_top_logprobs=out.max_top_logprobs,
            has_tokenizer=bool(out.has_tokenizer),
        )

    def tokenize(self, text: str, add_special: bool = True) -> List[int]:
        """Token ids of ``text`` through the daemon's tokenizer (``add_special``: what a text
        prompt gets, e.g. BOS)."""
        data = text.encode()
        n = ctypes.c_size_t(0)
        cap = max(16, len(data) + 8)
        while True:
            ids = (ctypes.c_uint32 * cap)()
            with self._lock:
                code = self._lib.nerva_client_tokenize(
                    self._live(), data, len(data), add_special, ids, cap, ctypes.byref(n)
                )
            if code == _ffi.E_TOO_LARGE and n.value > cap:
                cap = n.value
                continue
            _check(code, "tokenize")
            return list(ids[: n.value])

    def detokenize(self, ids: Sequence[int], skip_special: bool = False) -> str:
        """Text of ``ids`` through the daemon's tokenizer."""
        arr = (ctypes.c_uint32 * len(ids))(*ids)
        n = ctypes.c_size_t(0)
        cap = 64 + 16 * len(ids)
        while True:
            buf = ctypes.create_string_buffer(cap)
            with self._lock:
                code = self._lib.nerva_client_detokenize(
                    self._live(), arr, len(ids), skip_special, buf, cap, ctypes.byref(n)
                )
            if code == _ffi.E_TOO_LARGE and n.value + 1 > cap:
                cap = n.value + 1
                continue
            _check(code, "detokenize")
            return buf.raw[: n.value].decode(errors="replace")

    @property
    def in_flight(self) -> int:
        """Requests submitted through this object and not finished."""
        return len(self._samples_left)
