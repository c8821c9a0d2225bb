"""The indexer (`metis serve`) and the local model server (`metis models`) as real
child processes on loopback, for tests that exercise what users run.

Every wait polls with a deadline; every process is killed at the latest when the
interpreter exits.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

_LIVE: list[subprocess.Popen[bytes]] = []


@atexit.register
def _kill_all() -> None:
    for proc in _LIVE:
        if proc.poll() is None:
            proc.kill()


def stop(proc: subprocess.Popen[bytes] | None, sig: int = signal.SIGTERM) -> None:
    """Signal a child and reap it; SIGKILL if it is still there after 20 s."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclasses.dataclass
class Process:
    """A child process with a base URL and a log file."""

    base_url: str
    args: list[str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    """Set for the child on top of this process's environment."""

    def start(self) -> Process:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            self.args,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **self.env},
        )
        log.close()
        _LIVE.append(self.proc)
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self, sig: int = signal.SIGTERM) -> None:
        stop(self.proc, sig)

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return httpx.get(f"{self.base_url}{path}", timeout=30, **kw)

    def post(self, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
        return httpx.post(f"{self.base_url}{path}", json=body or {}, timeout=120)

    def wait_for(self, what: str, check: Callable[[], Any], timeout: float = 180.0) -> Any:
        """Poll `check` until it returns something truthy; fail with the log after `timeout`."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(
                    f"{self.args[2:4]} exited while waiting for {what}:\n{self.log()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                last = check()
                if last:
                    return last
            time.sleep(0.1)  # pacing between polls, not waiting for a state
        raise AssertionError(f"timed out waiting for {what} (last: {last!r}):\n{self.log()}")

    def status(self) -> dict[str, Any]:
        return self.get("/v1/status").json()

    def wait_status(
        self, what: str, check: Callable[[dict[str, Any]], bool], timeout: float = 180.0
    ) -> dict[str, Any]:
        def poll() -> dict[str, Any] | None:
            s = self.status()
            return s if check(s) else None

        return self.wait_for(what, poll, timeout)


def metis(*args: str) -> list[str]:
    return [sys.executable, "-m", "metis_indexer.cli", *args]


def indexer(
    sources: dict[str, Path],
    index_dir: Path,
    embedding: str | None,
    reranker: str | None = None,
    extra: tuple[str, ...] = (),
) -> Process:
    port = free_port()
    args = ["serve", "--index", str(index_dir), "--port", str(port), "--rescan-seconds", "0"]
    for name, path in sources.items():
        args += ["--source", f"{name}={path}"]
    if embedding:
        args += ["--embedding", embedding]
    if reranker:
        args += ["--reranker", reranker]
    log_path = index_dir.parent / f"indexer-{port}.log"
    return Process(f"http://127.0.0.1:{port}", metis(*args, *extra), log_path)


def served(config: Path, port: int, log: Path | None = None) -> Process:
    """`metis serve --config` as the operator's pod runs it, on `port` (the configuration's
    own); its log beside the configuration unless `log` says where."""
    log = log or config.parent / f"indexer-{port}.log"
    return Process(f"http://127.0.0.1:{port}", metis("serve", "--config", str(config)), log)


@contextlib.contextmanager
def running(p: Process) -> Iterator[Process]:
    p.start()
    try:
        yield p
    finally:
        p.stop()


def wait_ready(p: Process, timeout: float = 300.0) -> dict[str, Any]:
    return p.wait_status("phase ready", lambda s: s["phase"] == "ready", timeout)
