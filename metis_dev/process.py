"""Child processes and waiting: each component runs in its own process group with a log
file, dies with its parent, and every wait polls with a deadline."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TypeVar

T = TypeVar("T")


class ControlPlaneError(RuntimeError):
    """A component failed to build, start or become ready."""


def free_port() -> int:
    """A port the kernel says is free on loopback now (a tiny race remains;
    a component that loses it fails to start and is retried)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(
    check: Callable[[], T | None],
    *,
    timeout: float,
    what: str,
    interval: float = 0.2,
    alive: Callable[[], None] | None = None,
) -> T:
    """Poll `check` until it returns something truthy, or fail after `timeout`.

    Why: state in Kubernetes converges asynchronously; sleeping a fixed time is
    either flaky or slow. `check` may raise: the last exception is reported.
    `alive` is called every round to fail fast when a process died.
    """
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        if alive is not None:
            alive()
        try:
            result = check()
            if result:
                return result
            last = None
        except Exception as exc:  # reported if the deadline passes
            last = exc
        if time.monotonic() >= deadline:
            detail = f"; last error: {last!r}" if last is not None else ""
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}{detail}")
        time.sleep(interval)


def _tail_text(text: str, lines: int) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGKILL it when the parent dies, so that
    not even a SIGKILLed pytest or `metis-dev` leaves an apiserver behind (Linux
    only). The kernel sends it when the *thread* that started the child exits:
    start children from a thread that outlives them."""
    import ctypes

    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL)


@dataclass
class Process:
    """One child: its command line, log file and process group."""

    name: str
    args: list[str]
    log_path: Path
    env: dict[str, str] | None = None
    """Set for the child on top of this process's environment."""
    proc: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)
    _stopped: bool = field(default=False, repr=False)

    def start(self) -> Process:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._log.write(f"$ {' '.join(self.args)}\n".encode())
        self._log.flush()
        self.proc = subprocess.Popen(
            self.args,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **self.env} if self.env else None,
            start_new_session=True,  # own process group: killpg() reaches everything
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        return self

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self) -> None:
        """Raise with the log tail if the process has exited."""
        if self.proc is not None and self.proc.poll() is not None:
            raise ControlPlaneError(
                f"{self.name} exited with code {self.proc.returncode}; "
                f"last lines of {self.log_path}:\n{self.tail()}"
            )

    def tail(self, lines: int = 40) -> str:
        try:
            data = self.log_path.read_bytes()[-64 * 1024 :]
        except OSError:
            return "(no log)"
        return _tail_text(data.decode(errors="replace"), lines)

    def stop(self, grace: float = 10.0, sig: int = signal.SIGTERM) -> None:
        """`sig` to the process group, SIGKILL after `grace` seconds. Only once:
        a second call must not signal a group id the kernel reused."""
        proc = self.proc
        if proc is not None and not self._stopped:
            self._stopped = True
            for s, wait in ((sig, grace), (signal.SIGKILL, 10.0)):
                if proc.poll() is not None:
                    break
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, s)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(wait)
            # A child of the group could outlive the leader; make sure it does not.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        if self._log is not None:
            self._log.close()
            self._log = None
