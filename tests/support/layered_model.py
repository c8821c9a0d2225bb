"""A second, genuinely different embedding model for tests of a change of model: the first
three of all-MiniLM-L6-v2's six encoder layers (the same tokenizer and weights file, a
config that stops at layer 3, its own graph), served by the local model server's own
application as a real process on loopback. Its vectors are far from the full model's
(cosine 0.3-0.45 for the same text) and still rank by meaning, so an index that mixed the
two models' vectors, or asked one model's question of the other's vectors, would show.

    python -m tests.support.layered_model --port 7802 --cache DIR [--host H] [--allow N]

Besides the local server's routes: `GET /counts` says the passages embedded and the
requests that carried them (probes of one word left out), and the requests held. Requests
of several passages are held once `--allow` passages have gone through (none held without
it), until `POST /allow?passages=N` lets that many through in all (no `passages`: every
request from then on). A held request whose client has gone is dropped uncounted when let
through.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
from aiohttp import web

from metis_indexer.models.localmodel.encoder import Encoder, model_dir
from metis_indexer.models.localmodel.server import create_app
from tests.support.model_server import ModelServer, free_port

MODEL_ID = "metis-test/all-MiniLM-L6-v2-first-3-layers"
LAYERS = 3
PROBES = frozenset({"dimensions", "ping"})
"""The one-word inputs the indexer probes a model with (not passages)."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Gate:
    """Passages let through, and the requests of several held beyond what is allowed."""

    def __init__(self, allow: int | None) -> None:
        self.allow = allow
        self.passages = 0
        self.requests = 0
        self.held = 0
        self.changed = asyncio.Condition()

    async def through(self, inputs: list[str], gone: Callable[[], bool]) -> bool:
        """Whether the request goes on: held while it must be, and not once its client is
        gone meanwhile (a killed indexer's requests are neither counted nor run)."""
        counted = [t for t in inputs if t not in PROBES]
        async with self.changed:
            if len(inputs) > 1:
                self.held += 1
                await self.changed.wait_for(
                    lambda: self.allow is None or self.passages + len(counted) <= self.allow
                )
                self.held -= 1
            if gone():
                return False
            self.passages += len(counted)
            self.requests += bool(counted)
            return True


GATE = web.AppKey("gate", Gate)


@web.middleware
async def gated(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.method == "POST" and request.path == "/v1/embeddings":
        body = json.loads(await request.read())  # read once: the handler reads it again
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        transport = request.transport
        if not await request.app[GATE].through(
            inputs, lambda: transport is None or transport.is_closing()
        ):
            return web.Response(status=499, text="the client went away")
    return await handler(request)


async def counts(request: web.Request) -> web.Response:
    gate = request.app[GATE]
    return web.json_response(
        {"passages": gate.passages, "requests": gate.requests, "held": gate.held}
    )


async def allow(request: web.Request) -> web.Response:
    gate = request.app[GATE]
    raw = request.query.get("passages")
    async with gate.changed:
        gate.allow = None if raw is None else int(raw)
        gate.changed.notify_all()
    return web.json_response({"allow": gate.allow})


def model_folder(folder: Path) -> Path:
    """The installed model with a config that stops after `LAYERS` layers."""
    source = model_dir()
    folder.mkdir(parents=True, exist_ok=True)
    config = json.loads((source / "config.json").read_text())
    config["num_hidden_layers"] = LAYERS
    (folder / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "model.safetensors"):
        if not (folder / name).exists():
            os.symlink(source / name, folder / name)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cache", type=Path, required=True)
    parser.add_argument("--allow", type=int, default=None)
    args = parser.parse_args()
    # Its own graph cache: the graph's cache is keyed by the weights, which are the same.
    encoder = Encoder.load(model_folder(args.cache / "model"), cache_dir=args.cache, threads=1)
    quick = encoder.another(1)
    for e in (encoder, quick):
        e.model_id = MODEL_ID
    app = create_app(encoder, quick)
    app.middlewares.append(gated)
    app[GATE] = Gate(args.allow)
    app.router.add_get("/counts", counts)
    app.router.add_post("/allow", allow)
    web.run_app(app, host=args.host, port=args.port, print=None, access_log=None)


def start(
    cache: Path, allow: int | None = None, timeout_s: float = 120.0, host: str = "127.0.0.1"
) -> ModelServer:
    """The server as a child process on `host`, once its `/health` answers."""
    port = free_port()
    args = [sys.executable, "-m", "tests.support.layered_model", "--host", host]
    args += ["--port", str(port)]
    args += ["--cache", str(cache)] + ([] if allow is None else ["--allow", str(allow)])
    fd, log_name = tempfile.mkstemp(prefix="metis-layered-", suffix=".log")
    log = os.fdopen(fd, "wb")
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=root)
    server = ModelServer(f"http://{host}:{port}", proc, Path(log_name), log)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the layered model exited:\n{server.log()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{server.base_url}/health", timeout=2).status_code == 200:
                return server
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(0.2)  # paces the polls and notices an early exit
    server.stop()
    raise RuntimeError(f"the layered model did not answer in {timeout_s:g} s:\n{server.log()}")


if __name__ == "__main__":
    main()
