"""The HTTP face of the local model: the public protocols production model servers speak.

- `GET /v1/models`: OpenAI list; each entry's `metis` field says what it is, and
  the reranker has its own id, so a client probing for a reranker can tell that
  this one is the embedding model's cosine, not a cross-encoder.
- `POST /v1/embeddings`: OpenAI (vLLM, Infinity, TEI's OpenAI route).
- `POST /v1/rerank`: Cohere/Jina (vLLM, Infinity). `POST /rerank`: TEI's own shape,
  with TEI's error shape.
- `GET /health`, with the work of each kind waiting, started and answered.

The `model` field of a request is accepted whatever it says (as TEI does) and the
answer names the model that really ran. A question never waits for an indexer's
batch (what a production server's dynamic batching achieves):
- quick work (a question: a few tokens) runs at once on a one-thread session of its
  own, beside whatever else runs; it takes milliseconds, so it takes little from it;
- everything else runs on the main session, whose threads use every core given:
  one thread feeds it a slice (the encoder's batch of 8) at a time, reranks ahead of
  batches, so a rerank waits at most one slice of a batch. Two batches at once would
  only fight for the cores.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import concurrent.futures
import dataclasses
import itertools
import logging
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from http import HTTPStatus
from typing import Any, Literal, TypeVar

import numpy as np
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from metis_indexer.models.localmodel.encoder import (
    MAX_TOKENS,
    Encoded,
    Encoder,
    ModelNotInstalled,
    slices,
)

RERANKER_ID = "all-MiniLM-L6-v2-cosine-reranker"
RERANK_NOTE = "cosine of the embedding model (not a cross-encoder)"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 7800
DEFAULT_MAX_INPUTS = 2048
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024

log = logging.getLogger(__name__)


class _Body(BaseModel):
    # Clients send fields this server has no use for (`user`, `truncate`, ...).
    model_config = ConfigDict(extra="ignore")


class EmbeddingsRequest(_Body):
    input: str | list[str]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None


class RerankDocument(_Body):
    text: str


class RerankRequest(_Body):
    query: str
    documents: list[str | RerankDocument]
    top_n: int | None = Field(default=None, ge=1)
    return_documents: bool = False
    model: str | None = None


class TeiRerankRequest(_Body):
    query: str
    texts: list[str]
    return_text: bool = False


class _BadRequest(Exception):
    """A request that parsed but asks for something this server will not do."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


Kind = Literal["quick", "rerank", "bulk"]
"""What a request's work is, which decides where and when it runs."""
KINDS: tuple[Kind, ...] = ("quick", "rerank", "bulk")
QUICK_TOKENS = 128
"""Work of at most this many tokens (a question, or a few) is quick: it runs on a session
of its own at once, beside any batch, in milliseconds."""
QUICK_THREADS = 1
"""The quick session's threads: a question is too small to share out."""
_RANKS: dict[Kind, int] = {"quick": 0, "rerank": 0, "bulk": 1}
"""Lower runs first on a session: a rerank (a question's) goes ahead of a batch's slices."""


def kind_of(route: Literal["embeddings", "rerank"], tokens: int) -> Kind:
    """Quick when small; else a rerank, which a question waits for, or bulk (an indexer's
    passages, which can wait a slice or two)."""
    if tokens <= QUICK_TOKENS:
        return "quick"
    return "rerank" if route == "rerank" else "bulk"


@dataclasses.dataclass(eq=False)
class _Job:
    """One request's texts, run a slice (the encoder's batch) at a time."""

    kind: Kind
    order: int
    ids: list[list[int]]
    left: collections.deque[list[int]]
    """Slices not run yet: indices into `ids`."""
    vectors: np.ndarray
    future: concurrent.futures.Future[Encoded]
    started: bool = False

    def precedence(self) -> tuple[int, int]:
        return _RANKS[self.kind], self.order


class _Lane:
    """One session and its thread. A job runs a slice at a time, and after each slice the
    job of lowest rank (then the earliest) runs next: what arrives while a batch runs
    waits one slice, not the batch. A job cancelled while it waits is never run; those
    left at shutdown are cancelled, or fail if started."""

    def __init__(self, encoder: Encoder, name: str) -> None:
        self._encoder = encoder
        self._jobs: list[_Job] = []
        self._order = itertools.count()
        self._ready = threading.Condition()
        self._closed = False
        self._counts = {
            kind: dict.fromkeys(("waiting", "started", "answered"), 0) for kind in KINDS
        }
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, kind: Kind, ids: list[list[int]]) -> concurrent.futures.Future[Encoded]:
        future: concurrent.futures.Future[Encoded] = concurrent.futures.Future()
        parts = slices([len(i) for i in ids], self._encoder.batch_size)
        vectors = np.zeros((len(ids), self._encoder.dimensions), dtype=np.float32)
        with self._ready:
            if self._closed:
                raise RuntimeError("the model server is stopping")
            job = _Job(kind, next(self._order), ids, collections.deque(parts), vectors, future)
            self._jobs.append(job)
            self._counts[kind]["waiting"] += 1
            self._ready.notify()
        return future

    def counts(self) -> dict[Kind, dict[str, int]]:
        with self._ready:
            return {kind: dict(counts) for kind, counts in self._counts.items()}

    def shutdown(self) -> None:
        with self._ready:
            self._closed = True
            self._ready.notify()
        self._thread.join()

    def _next(self) -> tuple[_Job, list[int]] | None:
        """The job to run a slice of, and the slice; None once closed."""
        with self._ready:
            while True:
                while not self._jobs and not self._closed:
                    self._ready.wait()
                if self._closed:
                    for left in self._jobs:
                        if not left.future.cancel():
                            left.future.set_exception(RuntimeError("the model server stopped"))
                    self._jobs.clear()
                    return None
                job = min(self._jobs, key=_Job.precedence)
                if not job.started:
                    self._counts[job.kind]["waiting"] -= 1
                    if not job.future.set_running_or_notify_cancel():
                        self._jobs.remove(job)
                        continue
                    job.started = True
                    self._counts[job.kind]["started"] += 1
                return job, job.left.popleft()

    def _finish(self, job: _Job) -> None:
        with self._ready:
            self._jobs.remove(job)
            self._counts[job.kind]["started"] -= 1
            self._counts[job.kind]["answered"] += 1

    def _run(self) -> None:
        while (picked := self._next()) is not None:
            job, part = picked
            try:
                job.vectors[part] = self._encoder.run([job.ids[i] for i in part])
            except BaseException as e:
                self._finish(job)
                job.future.set_exception(e)
                continue
            if not job.left:
                self._finish(job)
                job.future.set_result(Encoded(job.vectors, sum(len(i) for i in job.ids)))


class Scheduler:
    """Quick work on a session of its own; reranks and batches share the main session's
    thread, a slice at a time, reranks first."""

    def __init__(self, encoder: Encoder, quick: Encoder) -> None:
        self._main = _Lane(encoder, "metis-model")
        self._quick = _Lane(quick, "metis-model-quick")

    def submit(self, kind: Kind, ids: list[list[int]]) -> concurrent.futures.Future[Encoded]:
        return (self._quick if kind == "quick" else self._main).submit(kind, ids)

    def work(self) -> dict[Kind, dict[str, int]]:
        """Requests of each kind waiting, started (a slice run, not all) and answered."""
        main, quick = self._main.counts(), self._quick.counts()
        return {kind: {k: main[kind][k] + quick[kind][k] for k in main[kind]} for kind in KINDS}

    def shutdown(self) -> None:
        self._quick.shutdown()
        self._main.shutdown()


_ENCODER = web.AppKey("encoder", Encoder)
_QUICK = web.AppKey("quick", Encoder)
_SCHEDULER = web.AppKey("scheduler", Scheduler)
_MAX_INPUTS = web.AppKey("max_inputs", int)
_CREATED = web.AppKey("created", int)
_EMBEDDED = web.AppKey("embedded", collections.Counter[str])
"""Texts embedded (`/v1/embeddings`' inputs answered): what a client cost the model."""


def _is_tei(request: web.Request) -> bool:
    return request.path == "/rerank"


def _error(
    request: web.Request, status: int, message: str, param: str | None = None
) -> web.Response:
    """OpenAI's error shape; TEI's on TEI's route, so each client reads what it expects."""
    if _is_tei(request):
        kind = "Validation" if status in (400, 413, 422) else "Backend"
        return web.json_response({"error": message, "error_type": kind}, status=status)
    kind = "invalid_request_error" if status < 500 else "server_error"
    code = HTTPStatus(status).phrase.lower().replace(" ", "_")  # e.g. "bad_request"
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return web.json_response(body, status=status)


@web.middleware
async def _errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Every failure answers JSON: clients parse error bodies, not HTML."""
    try:
        return await handler(request)
    except _BadRequest as e:
        return _error(request, 422 if _is_tei(request) else 400, str(e), e.param)
    except ValidationError as e:
        errors = e.errors(include_url=False)
        places = [".".join(str(p) for p in err["loc"]) for err in errors]
        message = "; ".join(
            f"{place}: {err['msg']}" if place else err["msg"]
            for place, err in zip(places[:3], errors, strict=False)
        )
        return _error(request, 422 if _is_tei(request) else 400, message, places[0] or None)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        message = (
            e.text if e.status == 413 and e.text else f"{e.reason}: {request.method} {request.path}"
        )
        return _error(request, e.status, message)
    except Exception:
        log.exception("%s %s failed", request.method, request.path)
        return _error(request, 500, "internal error in the local model server")


_Req = TypeVar("_Req", bound=BaseModel)


async def _parse(request: web.Request, model: type[_Req]) -> _Req:
    return model.model_validate_json(await request.read())


def _check_count(request: web.Request, n: int, param: str) -> None:
    if n == 0:
        raise _BadRequest(f"{param} must not be empty", param)
    limit = request.app[_MAX_INPUTS]
    if n > limit:
        raise _BadRequest(f"{param} has {n} items; this server takes at most {limit}", param)


async def _encode(
    request: web.Request, texts: list[str], route: Literal["embeddings", "rerank"]
) -> Encoded:
    """Tokenize and run the model off the event loop, keeping it free for /health."""
    app = request.app
    ids = await asyncio.to_thread(app[_ENCODER].tokenize, texts)
    kind = kind_of(route, sum(len(i) for i in ids))
    return await asyncio.wrap_future(app[_SCHEDULER].submit(kind, ids))


async def health(request: web.Request) -> web.Response:
    """`work`: the requests of each kind waiting, started and answered (the order the
    model took them in, for whoever watches it); `embedded`: the texts embedded."""
    app = request.app
    return web.json_response(
        {
            "status": "ok",
            "model": app[_ENCODER].model_id,
            "work": app[_SCHEDULER].work(),
            "embedded": app[_EMBEDDED]["texts"],
        }
    )


async def models(request: web.Request) -> web.Response:
    encoder = request.app[_ENCODER]
    created = request.app[_CREATED]
    entries = [
        {
            "id": encoder.model_id,
            "object": "model",
            "created": created,
            "owned_by": "metis-local",
            "max_model_len": MAX_TOKENS,
            "metis": {
                "embedding": True,
                "dimensions": encoder.dimensions,
                "rerank": RERANK_NOTE,
                "cross_encoder": False,
            },
        },
        {
            "id": RERANKER_ID,
            "object": "model",
            "created": created,
            "owned_by": "metis-local",
            "max_model_len": MAX_TOKENS,
            "metis": {
                "embedding": False,
                "rerank": RERANK_NOTE,
                "cross_encoder": False,
                "base_model": encoder.model_id,
                "scores": "cosine similarity, in [-1, 1]",
            },
        },
    ]
    return web.json_response({"object": "list", "data": entries})


async def embeddings(request: web.Request) -> web.Response:
    body = await _parse(request, EmbeddingsRequest)
    texts = [body.input] if isinstance(body.input, str) else body.input
    _check_count(request, len(texts), "input")
    encoder = request.app[_ENCODER]
    if body.dimensions is not None and body.dimensions != encoder.dimensions:
        raise _BadRequest(
            f"dimensions: this model gives {encoder.dimensions}, not {body.dimensions}",
            "dimensions",
        )
    encoded = await _encode(request, texts, "embeddings")
    request.app[_EMBEDDED]["texts"] += len(texts)
    if body.encoding_format == "base64":
        rows: list[Any] = [
            base64.b64encode(v.astype("<f4").tobytes()).decode("ascii") for v in encoded.vectors
        ]
    else:
        rows = encoded.vectors.tolist()
    data = [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(rows)]
    usage = {"prompt_tokens": encoded.tokens, "total_tokens": encoded.tokens}
    return web.json_response(
        {"object": "list", "data": data, "model": encoder.model_id, "usage": usage}
    )


async def _scores(request: web.Request, query: str, texts: list[str]) -> tuple[np.ndarray, int]:
    """Cosine of each text with the query; vectors are unit length, so a dot product."""
    encoded = await _encode(request, [query, *texts], "rerank")
    return encoded.vectors[1:] @ encoded.vectors[0], encoded.tokens


def _ranked(scores: np.ndarray) -> list[int]:
    """Indices by descending score; ties keep the documents' order."""
    return sorted(range(len(scores)), key=lambda i: (-scores[i], i))


async def rerank(request: web.Request) -> web.Response:
    body = await _parse(request, RerankRequest)
    texts = [d if isinstance(d, str) else d.text for d in body.documents]
    _check_count(request, len(texts), "documents")
    scores, tokens = await _scores(request, body.query, texts)
    results: list[dict[str, Any]] = []
    for i in _ranked(scores)[: body.top_n]:
        result: dict[str, Any] = {"index": i, "relevance_score": float(scores[i])}
        if body.return_documents:
            result["document"] = {"text": texts[i]}
        results.append(result)
    return web.json_response(
        {"model": RERANKER_ID, "results": results, "usage": {"total_tokens": tokens}}
    )


async def tei_rerank(request: web.Request) -> web.Response:
    body = await _parse(request, TeiRerankRequest)
    _check_count(request, len(body.texts), "texts")
    scores, _ = await _scores(request, body.query, body.texts)
    results: list[dict[str, Any]] = []
    for i in _ranked(scores):
        result: dict[str, Any] = {"index": i, "score": float(scores[i])}
        if body.return_text:
            result["text"] = body.texts[i]
        results.append(result)
    return web.json_response(results)


def create_app(
    encoder: Encoder,
    quick: Encoder,
    *,
    max_inputs: int = DEFAULT_MAX_INPUTS,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> web.Application:
    """The aiohttp application serving `encoder`, with `quick` (another session of it) for
    quick work; caps inputs per request and body size."""
    app = web.Application(middlewares=[_errors], client_max_size=max_body_bytes)
    app[_ENCODER] = encoder
    app[_QUICK] = quick
    app[_MAX_INPUTS] = max_inputs
    app[_CREATED] = int(time.time())
    app[_EMBEDDED] = collections.Counter()

    async def scheduler(app: web.Application) -> AsyncIterator[None]:
        work = Scheduler(app[_ENCODER], app[_QUICK])
        app[_SCHEDULER] = work
        yield
        await asyncio.to_thread(work.shutdown)

    app.cleanup_ctx.append(scheduler)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/embeddings", embeddings)
    app.router.add_post("/v1/rerank", rerank)
    app.router.add_post("/rerank", tei_rerank)
    return app


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


async def _run(app: web.Application, host: str, port: int) -> None:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0][1]  # the real port when asked for port 0
        print(f"metis models: serving all-MiniLM-L6-v2 on {_url(host, bound)}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()


def serve(
    host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, *, threads: int | None = None
) -> None:
    """Load the model and serve it until SIGINT or SIGTERM.

    Raises `ModelNotInstalled` when the wheel or the `models` extra is missing,
    and `OSError` when the address cannot be bound.
    """
    encoder = Encoder.load(threads=threads)
    asyncio.run(_run(create_app(encoder, encoder.another(QUICK_THREADS)), host, port))


def main(argv: list[str] | None = None) -> int:
    """`metis models` / `python -m metis_indexer.models.localmodel`; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="metis models",
        description="Serve all-MiniLM-L6-v2 locally: OpenAI embeddings, Cohere/Jina and TEI "
        "rerank (the embedding model's cosine, not a cross-encoder).",
    )
    parser.add_argument("--host", default=DEFAULT_HOST, help="address to bind (%(default)s)")
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help="port; 0 picks a free one (%(default)s)"
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="onnxruntime threads (default: CPUs, at most 4)"
    )
    args = parser.parse_args(argv)
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be at least 1")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    try:
        serve(args.host, args.port, threads=args.threads)
    except ModelNotInstalled as e:
        print(f"metis models: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"metis models: cannot serve on {_url(args.host, args.port)}: {e}", file=sys.stderr)
        return 1
    return 0
