"""What a long step of a cold machine is doing, said as it goes: a build of many minutes
that printed one line and then nothing reads as a hang. `step` says what starts, every
`EVERY` seconds that it still runs (and for how long), and what it made where, on stderr."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator

EVERY = float(os.environ.get("METIS_PROGRESS_SECONDS", "30"))


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@contextlib.contextmanager
def step(what: str, done: str = "", every: float = EVERY) -> Iterator[None]:
    """`what` (a gerund: "building the base image") as it starts, as it goes on, and with
    its seconds once it ends, then `done` (where the result went)."""
    t0, stop = time.monotonic(), threading.Event()

    def beat() -> None:
        while not stop.wait(every):
            say(f"  still {what} ({time.monotonic() - t0:.0f} s so far)")

    say(f"{what} ...")
    ticker = threading.Thread(target=beat, daemon=True)
    ticker.start()
    try:
        yield
    finally:
        stop.set()
        ticker.join()
    say(f"  {what}: done in {time.monotonic() - t0:.0f} s" + (f"; {done}" if done else ""))
