"""Real processes for the Python-level tests: nervad on the tiny model and nerva-gateway over
it, both from the workspace's debug build (`cargo build -p nervad -p nerva-client -p
nerva-gateway`). `NERVA_BIN_DIR` overrides where the binaries are."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator, List, Optional

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "libnerva-client" / "python"))

import nerva  # noqa: E402

BIN = Path(os.environ.get("NERVA_BIN_DIR", REPO / "target" / "debug"))


def _exe(name: str) -> str:
    p = BIN / name
    if not p.exists():
        raise RuntimeError(f"{p} is missing: run `cargo build -p nervad -p nerva-gateway` first")
    return str(p)


class Daemon:
    """nervad serving the tiny model on a private socket."""

    def __init__(self, socket_path: str, log_path: str, extra: Optional[List[str]] = None) -> None:
        self.socket = socket_path
        self.log_path = log_path
        self.extra = extra or []
        self.proc: Optional[subprocess.Popen] = None
        self.start()

    def start(self) -> None:
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [_exe("nervad"), "serve", "--socket", self.socket, *self.extra],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nervad exited: {self.log()}")
            try:
                with nerva.Client(self.socket) as c:
                    c.nop()
                return
            except nerva.NervaError:
                time.sleep(0.05)
        raise RuntimeError(f"nervad did not come up: {self.log()}")

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def log(self) -> str:
        return Path(self.log_path).read_text(errors="replace")[-4000:]


class Gateway:
    """nerva-gateway on an ephemeral port."""

    def __init__(self, daemon_socket: str, extra: Optional[List[str]] = None, env=None) -> None:
        self.proc = subprocess.Popen(
            [_exe("nerva-gateway"), "--socket", daemon_socket, "--listen", "127.0.0.1:0",
             *(extra or [])],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env={**os.environ, **(env or {})},
        )
        assert self.proc.stderr is not None
        line = self.proc.stderr.readline().decode()
        m = re.search(r"listening on (http://\S+)", line)
        if not m:
            self.proc.kill()
            raise RuntimeError(f"gateway did not start: {line}")
        self.url = m.group(1)
        self.base = self.url + "/v1"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="session")
def workdir() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="nerva-py-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def daemon(workdir: str) -> Iterator[Daemon]:
    d = Daemon(os.path.join(workdir, "nervad.sock"), os.path.join(workdir, "nervad.log"))
    yield d
    d.kill()


@pytest.fixture(scope="session")
def gateway(daemon: Daemon) -> Iterator[Gateway]:
    g = Gateway(daemon.socket)
    yield g
    g.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
