"""The unmodified `openai` SDK against nerva-gateway over a real daemon on the tiny model."""

from __future__ import annotations

import json
import os
import re
import threading
import time
import urllib.error
import urllib.request

import openai
import pytest

from conftest import Daemon, Gateway


def sdk(gw: Gateway, key: str = "none", **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base, api_key=key, max_retries=0, timeout=60, **kw)


@pytest.fixture(scope="module")
def client(gateway: Gateway) -> openai.OpenAI:
    return sdk(gateway)


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def http(url: str, body: bytes | None = None, headers=None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def metric(gw: Gateway, name: str) -> float:
    _, text = http(gw.url + "/metrics")
    for line in text.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics:\n{text.decode()}")


def test_models_and_health(client: openai.OpenAI, gateway: Gateway, model: str) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == [model]
    assert client.models.retrieve(model).id == model
    status, body = http(gateway.url + "/health")
    health = json.loads(body)
    assert status == 200 and health["status"] == "ok" and health["model"]


def test_chat_non_streaming(client: openai.OpenAI, model: str) -> None:
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hello"}], max_tokens=5,
        extra_body={"ignore_eos": True}, seed=1,
    )
    assert r.object == "chat.completion"
    c = r.choices[0]
    assert c.message.role == "assistant" and isinstance(c.message.content, str)
    assert c.finish_reason == "length"
    assert r.usage.completion_tokens == 5 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + 5


def test_chat_streaming_with_usage(client: openai.OpenAI, model: str) -> None:
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hello"}], max_completion_tokens=6,
        stream=True, stream_options={"include_usage": True}, seed=2,
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    whole = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hello"}], max_tokens=6, seed=2,
        extra_body={"ignore_eos": True},
    )
    assert whole.choices[0].message.content == text  # same seed: streaming equals whole


def test_completions_streaming_and_not(client: openai.OpenAI, model: str) -> None:
    r = client.completions.create(model=model, prompt="Once upon a time", max_tokens=7, seed=9,
                                  extra_body={"ignore_eos": True})
    assert r.object == "text_completion" and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 7
    chunks = list(client.completions.create(model=model, prompt="Once upon a time",
                                            max_tokens=7, seed=9, stream=True,
                                            extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in chunks) == r.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["length"]
    # Token-id prompts and batched prompts.
    ids = client.completions.create(model=model, prompt=[1, 2, 3], max_tokens=2,
                                    extra_body={"ignore_eos": True})
    assert ids.usage.prompt_tokens == 3
    batch = client.completions.create(model=model, prompt=["a", "b"], max_tokens=2, n=2,
                                      extra_body={"ignore_eos": True})
    assert sorted(c.index for c in batch.choices) == [0, 1, 2, 3]
    assert batch.usage.completion_tokens == 8


def test_n_samples_stream_and_not(client: openai.OpenAI, model: str) -> None:
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}],
                                       n=3, max_tokens=4, extra_body={"ignore_eos": True})
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert r.usage.completion_tokens == 12
    chunks = list(client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "x"}], n=3, max_tokens=4,
        stream=True, extra_body={"ignore_eos": True}))
    finished = sorted(c.choices[0].index for c in chunks if c.choices[0].finish_reason)
    assert finished == [0, 1, 2]


def test_stop_strings(client: openai.OpenAI, model: str) -> None:
    kw = dict(model=model, prompt="Stop here", max_tokens=12, temperature=0,
              extra_body={"ignore_eos": True})
    base = client.completions.create(**kw).choices[0].text
    assert len(base) > 3
    stop = base[2:4]
    cut = client.completions.create(stop=[stop], **kw).choices[0]
    assert cut.finish_reason == "stop" and stop not in cut.text and base.startswith(cut.text)
    streamed = list(client.completions.create(stop=stop, stream=True, **kw))
    assert "".join(c.choices[0].text for c in streamed) == cut.text


def test_logprobs(client: openai.OpenAI, model: str) -> None:
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=5, temperature=0,
        logprobs=True, top_logprobs=3, extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert len(content) == 5
    # Entries name tokens by their text (the daemon's tokenizer), which spell the output.
    assert "".join(e.token for e in content) == r.choices[0].message.content
    assert all(bytes(e.bytes) == e.token.encode() for e in content)
    for entry in content:
        assert entry.logprob <= 0.0 and len(entry.top_logprobs) == 3
        # Greedy: the sampled token is the most likely alternative.
        assert entry.token == entry.top_logprobs[0].token
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
    c = client.completions.create(model=model, prompt="Hi", max_tokens=4, logprobs=2,
                                  extra_body={"ignore_eos": True})
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == 4 and len(lp.token_logprobs) == 4 and len(lp.top_logprobs) == 4
    assert all(len(t) <= 2 for t in lp.top_logprobs)
    streamed = list(client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=5, temperature=0,
        logprobs=True, top_logprobs=3, stream=True, extra_body={"ignore_eos": True}))
    entries = [e for ch in streamed if ch.choices and ch.choices[0].logprobs
               for e in ch.choices[0].logprobs.content]
    assert [e.token for e in entries] == [e.token for e in content]


def test_seed_reproducibility(client: openai.OpenAI, model: str) -> None:
    def run(seed: int) -> str:
        return client.completions.create(model=model, prompt="Seeded", max_tokens=12,
                                         temperature=1.0, seed=seed,
                                         extra_body={"ignore_eos": True}).choices[0].text
    assert run(42) == run(42)


def test_extensions_are_accepted(client: openai.OpenAI, model: str) -> None:
    r = client.completions.create(
        model=model, prompt="ext", max_tokens=3, presence_penalty=0.5, frequency_penalty=0.5,
        top_p=0.9, extra_body={"top_k": 5, "min_p": 0.05, "repetition_penalty": 1.2,
                               "ignore_eos": True, "priority": 2})
    assert r.usage.completion_tokens == 3


def test_error_shapes(client: openai.OpenAI, model: str, gateway: Gateway) -> None:
    msgs = [{"role": "user", "content": "x"}]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=msgs, temperature=7)
    assert e.value.status_code == 400 and e.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=msgs, n=0)
    assert e.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError) as e:  # above the daemon's --max-batch (16)
        client.chat.completions.create(model=model, messages=msgs, n=17, max_tokens=1)
    assert e.value.body["param"] == "n" and "max batch" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=[])
    assert e.value.body["param"] == "messages"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model, prompt=[10**9], max_tokens=1)
    assert e.value.body["param"] == "prompt" and "vocab" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:  # refused before streaming starts
        list(client.completions.create(model=model, prompt=[10**9], max_tokens=1, stream=True))
    assert e.value.body["param"] == "prompt"
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="no-such-model", messages=msgs)
    assert e.value.body["code"] == "model_not_found" and e.value.body["param"] == "model"
    status, body = http(gateway.base + "/chat/completions", b"{not json",
                        {"content-type": "application/json"})
    assert status == 400 and "error" in json.loads(body)
    big = json.dumps({"model": model, "prompt": "x" * (5 << 20)}).encode()
    status, body = http(gateway.base + "/completions", big, {"content-type": "application/json"})
    assert status == 413 and json.loads(body)["error"]["type"] == "invalid_request_error"
    status, body = http(gateway.url + "/v2/nothing")
    assert status == 404 and json.loads(body)["error"]["message"]


def test_api_key(daemon: Daemon) -> None:
    gw = Gateway(daemon.socket, env={"NERVA_API_KEY": "s3cret"})
    try:
        with pytest.raises(openai.AuthenticationError) as e:
            sdk(gw, key="wrong").models.list()
        assert e.value.status_code == 401
        good = sdk(gw, key="s3cret")
        model = good.models.list().data[0].id
        r = good.completions.create(model=model, prompt="k", max_tokens=1)
        assert r.usage.completion_tokens == 1
        assert http(gw.url + "/health")[0] == 200  # health stays open for probes
    finally:
        gw.stop()


def test_client_disconnect_mid_stream_frees_the_daemon_request(
        gateway: Gateway, model: str) -> None:
    cancelled_before = _cancelled(gateway)
    client = sdk(gateway)
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "long"}], max_tokens=4000,
        stream=True, extra_body={"ignore_eos": True})
    got = 0
    for chunk in stream:
        got += 1
        if got == 3:
            break
    assert metric(gateway, "nerva_daemon_requests_in_flight") >= 1
    stream.close()  # drops the HTTP connection mid-stream
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if (metric(gateway, "nerva_daemon_requests_in_flight") == 0
                and metric(gateway, "nerva_gateway_requests_in_flight") == 0):
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the daemon still runs the abandoned request")
    assert _cancelled(gateway) == cancelled_before + 1
    assert metric(gateway, "nerva_gateway_client_disconnects_total") >= 1


def _cancelled(gw: Gateway) -> float:
    _, text = http(gw.url + "/metrics")
    m = re.search(r'nerva_daemon_samples_finished_total\{reason="cancelled"\} (\S+)',
                  text.decode())
    assert m, text.decode()
    return float(m.group(1))


def test_metrics_exposition(gateway: Gateway) -> None:
    status, body = http(gateway.url + "/metrics")
    text = body.decode()
    assert status == 200
    for name in ["nerva_gateway_requests_total", "nerva_gateway_time_to_first_token_seconds_bucket",
                 "nerva_gateway_inter_token_seconds_bucket", "nerva_daemon_up 1",
                 "nerva_daemon_kv_pages_total", "nerva_daemon_requests_in_flight",
                 "nerva_daemon_latency_seconds"]:
        assert name in text, name
    assert metric(gateway, "nerva_gateway_completion_tokens_total") > 0


def test_daemon_restart_is_survived(workdir: str) -> None:
    sock = os.path.join(workdir, "restart.sock")
    d = Daemon(sock, os.path.join(workdir, "restart.log"))
    gw = Gateway(sock)
    try:
        client = sdk(gw)
        model = client.models.list().data[0].id
        assert client.completions.create(model=model, prompt="a", max_tokens=2).choices
        # A stream in flight when the daemon dies ends with an error event, not a hang.
        stream = client.completions.create(model=model, prompt="a", max_tokens=4000,
                                           stream=True, extra_body={"ignore_eos": True})
        t0 = time.monotonic()
        with pytest.raises(openai.APIError) as died:
            for i, _ in enumerate(stream):
                if i == 2:
                    d.kill()
        assert "not reachable" in str(died.value) and time.monotonic() - t0 < 10
        t0 = time.monotonic()
        with pytest.raises(openai.APIStatusError) as e:
            client.completions.create(model=model, prompt="a", max_tokens=2)
        assert e.value.status_code == 503 and time.monotonic() - t0 < 5  # never a hang
        assert http(gw.url + "/health")[0] == 503
        d.start()
        deadline = time.monotonic() + 10
        while True:
            try:
                r = client.completions.create(model=model, prompt="a", max_tokens=2,
                                              extra_body={"ignore_eos": True})
                break
            except openai.APIStatusError as err:
                assert err.status_code == 503
                assert time.monotonic() < deadline, "gateway did not reconnect"
                time.sleep(0.1)
        assert r.usage.completion_tokens == 2
        assert http(gw.url + "/health")[0] == 200
    finally:
        gw.stop()
        d.kill()


def test_daemon_busy_is_429_and_the_admitted_requests_finish(workdir: str) -> None:
    # One sequence slot and one queue place: of four concurrent long requests at most two are
    # taken (one running, one queued); the daemon answers the others Busy, the gateway 429.
    sock = os.path.join(workdir, "busy.sock")
    d = Daemon(sock, os.path.join(workdir, "busy.log"), ["--max-batch", "1", "--max-queued", "1"])
    gw = Gateway(sock)
    try:
        client = sdk(gw)
        model = client.models.list().data[0].id
        results: list = [None] * 4

        def one(i: int) -> None:
            try:
                r = client.completions.create(model=model, prompt=f"busy {i}", max_tokens=1500,
                                              extra_body={"ignore_eos": True})
                results[i] = r.usage.completion_tokens
            except openai.RateLimitError as e:
                results[i] = e

        threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        busy = [r for r in results if isinstance(r, openai.RateLimitError)]
        done = [r for r in results if isinstance(r, int)]
        assert len(busy) >= 2 and len(busy) + len(done) == 4, results
        assert all(n == 1500 for n in done), results
        assert busy[0].status_code == 429 and busy[0].body["type"] == "rate_limit_error"
    finally:
        gw.stop()
        d.kill()
