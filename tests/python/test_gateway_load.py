"""Many simultaneous HTTP streams multiplexed over the gateway's few daemon connections."""

from __future__ import annotations

import http.client
import json
import re
import threading
import urllib.parse
import urllib.request

from conftest import Gateway

STREAMS = 64
TOKENS = 12


def _finished(gw: Gateway, reason: str) -> float:
    with urllib.request.urlopen(gw.url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    m = re.search(rf'nerva_daemon_samples_finished_total\{{reason="{reason}"\}} (\S+)', text)
    assert m, text
    return float(m.group(1))


def test_64_simultaneous_streams_each_complete_exactly_once(gateway: Gateway) -> None:
    with urllib.request.urlopen(gateway.base + "/models", timeout=30) as r:
        model = json.loads(r.read())["data"][0]["id"]
    before = _finished(gateway, "length")
    url = urllib.parse.urlparse(gateway.url)
    barrier = threading.Barrier(STREAMS)
    results: list = [None] * STREAMS

    def one(i: int) -> None:
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=120)
        body = json.dumps({
            "model": model, "stream": True, "max_tokens": TOKENS, "seed": i,
            "stream_options": {"include_usage": True}, "ignore_eos": True,
            "messages": [{"role": "user", "content": f"stream {i}"}],
        })
        barrier.wait()
        try:
            conn.request("POST", "/v1/chat/completions", body,
                         {"content-type": "application/json"})
            resp = conn.getresponse()
            raw = resp.read().decode()
            results[i] = (resp.status, raw)
        except Exception as e:  # recorded, asserted below
            results[i] = (0, repr(e))
        finally:
            conn.close()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(STREAMS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    ids = set()
    for i, r in enumerate(results):
        assert r is not None, f"stream {i} never returned"
        status, raw = r
        assert status == 200, f"stream {i}: {status} {raw[:300]}"
        frames = [f[len("data: "):] for f in raw.split("\n\n") if f.startswith("data: ")]
        assert frames.count("[DONE]") == 1 and frames[-1] == "[DONE]", f"stream {i}"
        chunks = [json.loads(f) for f in frames[:-1]]
        assert all("error" not in c for c in chunks), f"stream {i}: {raw[:300]}"
        finishes = [c["choices"][0]["finish_reason"] for c in chunks
                    if c["choices"] and c["choices"][0]["finish_reason"]]
        assert finishes == ["length"], f"stream {i}: {finishes}"
        assert chunks[-1]["usage"]["completion_tokens"] == TOKENS
        assert len({c["id"] for c in chunks}) == 1
        ids.add(chunks[0]["id"])
    assert len(ids) == STREAMS  # 64 distinct responses, none delivered twice
    assert _finished(gateway, "length") - before == STREAMS
