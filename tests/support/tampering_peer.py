"""A peer that lies: `POST /v1/vectors` asked of a real indexer and its answer tampered with.

A stand-in, because no real indexer can be made to give wrong vectors, to answer a byte at a
time, or to answer 150 MB: each way a broken or hostile replica answers (`MODES`) is made
here from a real replica's real answer, on loopback, in a thread of the test's process.
"""

from __future__ import annotations

import base64
import contextlib
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import numpy as np

MODES = ("random", "zeros", "shifted", "tarpit", "huge")
"""random: noise of the right shape; zeros: vectors of zeros; shifted: each vector given for
the passage after it (a bug that moves rows by one); tarpit: a byte every 2 s; huge: 150 MB."""
TARPIT_SECONDS = 60.0
"""How long a tarpit answer goes on at most (the replica gives up long before)."""
HUGE_BYTES = 150 * 1024 * 1024


def tampered(answer: dict[str, object], mode: str, rng: np.random.Generator) -> dict[str, object]:
    """A real answer with its vectors made wrong in `mode`'s way (the same shape)."""
    found = answer["found"]
    assert isinstance(found, list)
    if not found:
        return answer
    dims = int(answer["dimensions"])  # type: ignore[call-overload]
    rows = np.frombuffer(base64.b64decode(str(answer["vectors"])), dtype="<f4").reshape(-1, dims)
    if mode == "random":
        rows = rng.standard_normal(rows.shape).astype("<f4")
    elif mode == "zeros":
        rows = np.zeros_like(rows)
    elif mode == "shifted":
        rows = np.roll(rows, 1, axis=0)
    return {**answer, "vectors": base64.b64encode(rows.astype("<f4").tobytes()).decode()}


class TamperingPeer:
    """Listens on loopback; forwards to `honest` and answers in `mode`'s way."""

    def __init__(self, honest: str, mode: str, token: str) -> None:
        assert mode in MODES
        self.honest, self.mode, self.token = honest, mode, token
        self.asked = 0
        """Requests for vectors it was sent."""
        peer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                peer.asked += 1
                if peer.mode == "tarpit":
                    return self._tarpit()
                if peer.mode == "huge":
                    return self._huge()
                real = httpx.post(
                    f"{peer.honest}{self.path}",
                    content=body,
                    headers={
                        "Content-Type": "application/json",
                        "Authorization": f"Bearer {peer.token}",
                    },
                    timeout=30,
                )
                answer = tampered(real.json(), peer.mode, np.random.default_rng(peer.asked))
                out = json.dumps(answer).encode()
                self.send_response(real.status_code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def _tarpit(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "1000")  # within any limit: slow, not large
                self.end_headers()
                deadline = time.monotonic() + TARPIT_SECONDS
                with contextlib.suppress(OSError):
                    while time.monotonic() < deadline:
                        self.wfile.write(b" ")
                        self.wfile.flush()
                        time.sleep(2)

            def _huge(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Connection", "close")  # the body runs to the close
                self.end_headers()
                block = b" " * (1024 * 1024)
                with contextlib.suppress(OSError):
                    for _ in range(HUGE_BYTES // len(block)):
                        self.wfile.write(block)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}"

    @contextlib.contextmanager
    def serving(self) -> Iterator[TamperingPeer]:
        thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._server.shutdown()
            self._server.server_close()
