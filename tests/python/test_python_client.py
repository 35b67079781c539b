"""The `nerva` Python package against a real daemon on the tiny model."""

from __future__ import annotations

import asyncio
import os

import pytest

import nerva
from conftest import Daemon


def test_generate_returns_text_and_token_ids(daemon: Daemon) -> None:
    with nerva.Client(daemon.socket) as c:
        g = c.generate("Once upon a time", max_tokens=6, ignore_eos=True, seed=7)
        assert g.finish_reason == "length"
        assert len(g.token_ids) == 6
        assert g.text != ""
        assert g.samples[0].timings is not None
        assert g.samples[0].timings.generated_tokens == 6
        assert g.samples[0].timings.prompt_tokens > 0
        # Same seed, same tokens; token-id prompts work too.
        again = c.generate("Once upon a time", max_tokens=6, ignore_eos=True, seed=7)
        assert again.token_ids == g.token_ids and again.text == g.text
        from_ids = c.generate(g.token_ids, max_tokens=3, ignore_eos=True)
        assert len(from_ids.token_ids) == 3


def test_stream_yields_events_in_order(daemon: Daemon) -> None:
    with nerva.Client(daemon.socket) as c:
        events = list(c.stream("The sky is", max_tokens=5, ignore_eos=True, seed=1))
    kinds = [type(e).__name__ for e in events]
    assert kinds[-1] == "DoneEvent" and kinds.count("DoneEvent") == 1
    tokens = [t for e in events if isinstance(e, nerva.TokensEvent) for t in e.token_ids]
    assert len(tokens) == 5
    assert all(e.tag == events[0].tag for e in events)


def test_chat_and_sampling_options(daemon: Daemon) -> None:
    params = nerva.GenerateParams(
        max_tokens=4, temperature=0.8, top_k=20, top_p=0.9, min_p=0.01,
        repetition_penalty=1.1, presence_penalty=0.5, frequency_penalty=0.5, seed=3,
        n_samples=3, top_logprobs=2, priority=1, ignore_eos=True, logprobs=True,
        stop=["zzzz-never"], stop_token_ids=[],
    )
    with nerva.Client(daemon.socket) as c:
        g = c.chat([{"role": "user", "content": "Hello"}], params)
        assert len(g.samples) == 3
        for s in g.samples:
            assert len(s.token_ids) == 4 and len(s.logprobs) == 4
            assert all(lp <= 0.0 for lp in s.logprobs)
        tops = [e for e in c.stream("abc", params) if isinstance(e, nerva.TopLogprobsEvent)]
        assert tops and all(len(t.token_ids) == 2 for t in tops)


def test_stop_string_ends_with_stop(daemon: Daemon) -> None:
    with nerva.Client(daemon.socket) as c:
        base = c.generate("Stop test", max_tokens=12, ignore_eos=True, seed=5, temperature=0)
        assert len(base.text) > 2
        stop = base.text[2:4] if base.text[2:4] else base.text[-1]
        cut = c.generate("Stop test", max_tokens=12, ignore_eos=True, seed=5, temperature=0,
                         stop=[stop])
        assert cut.finish_reason == "stop"
        assert stop not in cut.text
        assert base.text.startswith(cut.text)


def test_cancel_ends_with_cancelled(daemon: Daemon) -> None:
    with nerva.Client(daemon.socket) as c:
        tag = c.submit("Cancel me", max_tokens=4000, ignore_eos=True)
        seen = []
        for e in c.events(tag):
            seen.append(e)
            if len(seen) == 2:
                assert c.cancel(tag)
        assert isinstance(seen[-1], nerva.DoneEvent)
        assert seen[-1].finish_reason == "cancelled"
        assert c.in_flight == 0
        assert c.cancel(tag) is False  # no longer in flight


def test_closing_a_stream_early_cancels_it(daemon: Daemon) -> None:
    with nerva.Client(daemon.socket) as c:
        it = c.stream("Leave early", max_tokens=4000, ignore_eos=True)
        next(it)
        it.close()
        assert c.in_flight == 0
        # The client stays usable.
        assert c.generate("after", max_tokens=2, ignore_eos=True).finish_reason == "length"


def test_error_paths_carry_status_codes(daemon: Daemon, workdir: str) -> None:
    with nerva.Client(daemon.socket) as c:
        with pytest.raises(nerva.RequestError) as e:
            c.generate([10**9], max_tokens=2)
        assert e.value.code == -11 and e.value.status == 33  # TokenOutOfVocab
        with pytest.raises(nerva.InvalidArgumentError) as e2:
            c.generate("x", temperature=-1.0)
        assert e2.value.code == -1 and "temperature" in str(e2.value)
        with pytest.raises(nerva.InvalidArgumentError):
            c.generate("x", n_samples=65)
        with pytest.raises(TypeError):
            c.generate("x", not_a_param=1)
        with pytest.raises(nerva.InvalidArgumentError) as e3:
            c.generate("")  # empty prompt: refused by the library
        assert e3.value.code == -1
    with pytest.raises(nerva.NoDaemonError) as e4:
        nerva.Client(os.path.join(workdir, "nobody-here.sock"))
    assert e4.value.code == -2


def test_daemon_death_raises_daemon_gone(workdir: str) -> None:
    d = Daemon(os.path.join(workdir, "dying.sock"), os.path.join(workdir, "dying.log"))
    try:
        c = nerva.Client(d.socket)
        tag = c.submit("doomed", max_tokens=4000, ignore_eos=True)
        d.kill()
        with pytest.raises(nerva.DaemonGoneError) as e:
            for _ in c.events(tag, timeout=10):
                pass
        assert e.value.code == -7
        c.close()
    finally:
        d.kill()


def test_asyncio_generate_stream_and_cancel(daemon: Daemon) -> None:
    async def main() -> None:
        async with nerva.AsyncClient(daemon.socket) as c:
            outs = await asyncio.gather(
                *[c.generate(f"prompt {i}", max_tokens=4, ignore_eos=True, seed=i)
                  for i in range(8)]
            )
            assert all(len(o.token_ids) == 4 for o in outs)
            chat = await c.chat([{"role": "user", "content": "hi"}], max_tokens=3,
                                ignore_eos=True)
            assert len(chat.token_ids) == 3
            texts = []
            async for e in c.stream("stream me", max_tokens=3, ignore_eos=True):
                texts.append(e)
            assert isinstance(texts[-1], nerva.DoneEvent)
            tag = await c.submit("cancel me", max_tokens=4000, ignore_eos=True)
            last = None
            n = 0
            async for e in c.events(tag):
                n += 1
                if n == 2:
                    await c.cancel(tag)
                last = e
            assert isinstance(last, nerva.DoneEvent) and last.finish_reason == "cancelled"
            with pytest.raises(nerva.RequestError):
                await c.generate([10**9], max_tokens=1)

    asyncio.run(main())


def test_model_info_tokenize_and_user_data(daemon: Daemon) -> None:
    with nerva.Client(daemon.socket) as c:
        info = c.model_info()
        assert info.name and info.vocab_size > 0 and info.max_context > 0
        ids = c.tokenize("Hello world", add_special=False)
        assert ids and all(0 <= i < info.vocab_size for i in ids)
        assert c.detokenize(ids) == "Hello world"
        # The same ids as a generation's prompt: usage counts agree with tokenize.
        g = c.generate("Hello world", max_tokens=1, ignore_eos=True)
        assert g.samples[0].timings.prompt_tokens == len(c.tokenize("Hello world"))
        events = list(c.stream("tagged", max_tokens=2, ignore_eos=True, user_data=0xFEED))
        assert events and all(e.user_data == 0xFEED for e in events)
        assert c.fileno() >= 0
