"""The asyncio flavour: :class:`AsyncClient`, the same calls as :class:`nerva.Client` as
coroutines and async iterators.

The client's readiness descriptor (``nerva_client_fd``) sits in the event loop
(``loop.add_reader``): when it turns readable the loop polls the client until it is empty and
hands each event to its request's queue. No thread, no timer.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Dict, List, Optional, Sequence

from .client import (
    Client,
    DoneEvent,
    Event,
    GenerateParams,
    Generation,
    Message,
    Prompt,
    QueueFullError,
    RequestError,
    Sample,
    ShutdownEvent,
    TextEvent,
    TokensEvent,
    _ErrorEvent,
)

__all__ = ["AsyncClient"]

# Back-off while the submission ring is full (completions free it; they arrive by the reader).
_RING_FULL_RETRY_S = 0.001


class AsyncClient:
    """A connection to nervad for asyncio code.

    ``async with nerva.AsyncClient() as c: text = (await c.generate("Hi")).text``
    """

    def __init__(self, socket_path: Optional[str] = None) -> None:
        """Connect (blocking, a few hundred microseconds). See :class:`nerva.Client`."""
        self._client = Client(socket_path)
        self._fd = self._client.fileno()
        self._queues: Dict[int, "asyncio.Queue[object]"] = {}
        self._left: Dict[int, int] = {}
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._failure: Optional[BaseException] = None

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Leave the event loop and disconnect (the daemon cancels what is in flight)."""
        if self._loop is not None:
            self._loop.remove_reader(self._fd)
            self._loop = None
        self._client.close()

    def _submit(self, submit, n: int) -> int:  # type: ignore[no-untyped-def]
        if self._failure is not None:
            raise self._failure
        tag = submit()
        self._queues[tag] = asyncio.Queue()
        self._left[tag] = n
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._loop.add_reader(self._fd, self._on_ready)
        return tag

    async def submit(
        self, prompt: Prompt, params: Optional[GenerateParams] = None, **overrides: object
    ) -> int:
        """Queue a generation (text or token ids); returns its tag."""
        n = int(overrides.get("n_samples", params.n_samples if params else 1))  # type: ignore[arg-type]
        while True:
            try:
                return self._submit(lambda: self._client.submit(prompt, params, **overrides), n)
            except QueueFullError:
                await asyncio.sleep(_RING_FULL_RETRY_S)

    async def submit_chat(
        self,
        messages: Sequence[Message],
        params: Optional[GenerateParams] = None,
        **overrides: object,
    ) -> int:
        """Queue a chat generation; returns its tag."""
        n = int(overrides.get("n_samples", params.n_samples if params else 1))  # type: ignore[arg-type]
        while True:
            try:
                return self._submit(
                    lambda: self._client.submit_chat(messages, params, **overrides), n
                )
            except QueueFullError:
                await asyncio.sleep(_RING_FULL_RETRY_S)

    async def cancel(self, tag: int) -> bool:
        """Ask the daemon to stop ``tag`` (its samples end "cancelled")."""
        return self._client.cancel(tag)

    def _on_ready(self) -> None:
        """The descriptor is readable: poll until empty (its contract), route the events."""
        try:
            while True:
                events: List[object] = self._client._poll_raw()
                if not events:
                    return
                for e in events:
                    q = self._queues.get(getattr(e, "tag", -1))
                    if q is not None:
                        q.put_nowait(e)
        except Exception as e:  # the daemon went away: every waiting request learns it
            self._failure = e
            if self._loop is not None:
                self._loop.remove_reader(self._fd)
            for q in self._queues.values():
                q.put_nowait(e)

    async def events(self, tag: int) -> AsyncIterator[Event]:
        """Yield ``tag``'s events until its last sample is done; leaving early cancels it."""
        q = self._queues.get(tag)
        if q is None:
            raise KeyError(f"request {tag} is not in flight on this client")
        finished = False
        try:
            while True:
                e = await q.get()
                if isinstance(e, BaseException):
                    finished = True
                    raise e
                if isinstance(e, _ErrorEvent):
                    finished = True
                    raise RequestError(e.status, e.detail)
                yield e  # type: ignore[misc]
                if isinstance(e, DoneEvent):
                    self._left[tag] -= 1
                    if self._left[tag] == 0:
                        finished = True
                        return
        finally:
            self._queues.pop(tag, None)
            self._left.pop(tag, None)
            if not finished:
                try:
                    self._client.cancel(tag)
                except Exception:
                    pass

    async def stream(
        self, prompt: Prompt, params: Optional[GenerateParams] = None, **overrides: object
    ) -> AsyncIterator[Event]:
        """Submit and yield events as they arrive."""
        tag = await self.submit(prompt, params, **overrides)
        async for e in self.events(tag):
            yield e

    async def stream_chat(
        self,
        messages: Sequence[Message],
        params: Optional[GenerateParams] = None,
        **overrides: object,
    ) -> AsyncIterator[Event]:
        """Submit chat messages and yield events as they arrive."""
        tag = await self.submit_chat(messages, params, **overrides)
        async for e in self.events(tag):
            yield e

    async def generate(
        self, prompt: Prompt, params: Optional[GenerateParams] = None, **overrides: object
    ) -> Generation:
        """Run ``prompt`` to the end."""
        tag = await self.submit(prompt, params, **overrides)
        return await self._collect(tag)

    async def chat(
        self,
        messages: Sequence[Message],
        params: Optional[GenerateParams] = None,
        **overrides: object,
    ) -> Generation:
        """Run a chat to the end."""
        tag = await self.submit_chat(messages, params, **overrides)
        return await self._collect(tag)

    async def _collect(self, tag: int) -> Generation:
        samples: Dict[int, Sample] = {}
        async for e in self.events(tag):
            if isinstance(e, ShutdownEvent):
                continue
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
