"""`metis`: run the indexer on local folders, ask it questions, serve a local model.

Usage:

    metis serve --source docs=./handbook --index ./.metis-index --embedding http://127.0.0.1:7800
    METIS_API_TOKEN=… metis serve …   (reindex and evaluate then need Authorization: Bearer …)
    metis search "how many vacation days" --top-k 3
    metis status | documents | reindex [--full] | eval [--k 10]
    metis models --port 7800
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

import httpx
from aiohttp import web
from pydantic import ValidationError

from metis_indexer import limits
from metis_indexer.answer_text import answer_text, notes_text
from metis_indexer.config import ConfigError, IndexerConfig, explain, load
from metis_indexer.schema import FILTERS, Mode, SearchAnswer

if TYPE_CHECKING:
    from metis_indexer.service.service import Indexer

DEFAULT_URL = "http://127.0.0.1:7700"
TOKEN_ENV = "METIS_API_TOKEN"
"""The operator's token: when set, `POST /v1/reindex` and `/v1/evaluate` require it."""
log = logging.getLogger("metis")
_SOURCE = re.compile(r"^(?P<name>[a-z0-9]([-a-z0-9]*[a-z0-9])?)=(?P<path>[^:]+)(:(?P<sub>.+))?$")


def parse_source(text: str) -> dict[str, str]:
    """`NAME=PATH[:SUBPATH]` → a source of the configuration."""
    m = _SOURCE.match(text)
    if m is None:
        raise argparse.ArgumentTypeError(
            f"source {text!r} must be NAME=PATH or NAME=PATH:SUBPATH "
            "(NAME: lowercase letters, digits and -)"
        )
    source = {"drive": m["name"], "root": str(Path(m["path"]).resolve())}
    if m["sub"]:
        source["path"] = m["sub"]
    return source


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="metis", description="Metis knowledge bases")
    sub = p.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="index local folders and serve the search API")
    serve.add_argument("--config", type=Path, help="a JSON configuration (as the operator writes)")
    serve.add_argument(
        "--source", action="append", type=parse_source, default=[], metavar="NAME=PATH[:SUBPATH]"
    )
    serve.add_argument("--index", type=Path, help="the folder that keeps the index")
    serve.add_argument(
        "--name", default="local", help="the base's name: its notes are source metis-NAME"
    )
    serve.add_argument("--embedding", metavar="URL", help="an OpenAI-compatible embeddings server")
    serve.add_argument("--reranker", metavar="URL", help="a reranker server")
    serve.add_argument("--chunk-size", type=int, default=1200)
    serve.add_argument("--chunk-overlap", type=int, default=200)
    serve.add_argument("--rescan-seconds", type=int, default=60)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=7700)
    serve.add_argument("--workers", type=int, default=2)
    serve.add_argument(
        "--embedding-batch",
        type=int,
        default=64,
        help="passages per embeddings request, across documents (1-2048)",
    )
    serve.add_argument(
        "--vectors",
        choices=limits.VECTOR_KINDS,
        default=limits.VECTORS_DEFAULT,
        help="vectors in memory: float32, or int8 rescored exactly from disk",
    )
    serve.add_argument(
        "--check-seconds",
        type=float,
        default=60.0,
        help="seconds between looks of the integrity check, which reads a few "
        "pages more of the index file each look",
    )
    serve.add_argument(
        "--drain-seconds",
        type=float,
        default=0.0,
        help="seconds a stopping indexer (SIGTERM) goes on answering reads, its writing "
        "handed over, before it exits (0-120; %(default)g: at once; a pod's configuration "
        "says 15)",
    )

    serve.add_argument(
        "--peer",
        action="append",
        default=[],
        metavar="URL",
        help="another indexer of the same sources and model, asked for the vectors it holds "
        "before passages go to the model (repeatable)",
    )

    def client(name: str, help_: str) -> argparse.ArgumentParser:
        c = sub.add_parser(name, help=help_)
        c.add_argument("--url", default=DEFAULT_URL, help=f"the indexer (default {DEFAULT_URL})")
        c.add_argument("--json", action="store_true", help="print the answer as JSON")
        return c

    s = client("search", "ask a question")
    s.add_argument("question")
    s.add_argument("--top-k", type=int, default=5)
    s.add_argument("--mode", choices=get_args(Mode), default="hybrid")
    s.add_argument("--no-rerank", action="store_true")
    for f in FILTERS:  # --prefix, --kind, --source: a list's flag is repeated
        many: dict[str, Any] = {"action": "append"} if f.many else {}
        s.add_argument(f"--{f.asked.name}", **many, choices=f.choices, help=f.asked.help)
    client("status", "the index's phase and totals")
    d = client("documents", "documents with their state")
    d.add_argument("--page", type=int, default=1)
    d.add_argument("--page-size", type=int, default=100)
    d.add_argument("--state", choices=["indexed", "failed"])
    r = client("reindex", "start a pass now")
    r.add_argument("--full", action="store_true", help="read every document again")
    n = client("note", "the base's own notes: add, list, rm")
    notes = n.add_subparsers(dest="note", required=True)
    add = notes.add_parser("add", help="keep a note, searchable at once")
    add.add_argument("text")
    add.add_argument("--title")
    add.add_argument(
        "--replaces", action="append", default=[], metavar="ID", help="a note it replaces"
    )
    add.add_argument("--id", help="the note's id (a note of that id is written over)")
    listed = notes.add_parser("list", help="the notes, newest first")
    listed.add_argument("--page", type=int, default=1)
    listed.add_argument("--page-size", type=int, default=100)
    rm = notes.add_parser("rm", help="forget a note")
    rm.add_argument("id")
    for sub_parser in (add, listed, rm):
        sub_parser.add_argument("--url", default=DEFAULT_URL, help=argparse.SUPPRESS)
        sub_parser.add_argument(
            "--json", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS
        )
    e = client("eval", "evaluate .metis/evals.jsonl of the sources")
    e.add_argument("--k", type=int, default=10)

    m = sub.add_parser("models", help="serve the local embedding model (tests, quick start)")
    m.add_argument("--host", default="127.0.0.1")
    m.add_argument("--port", type=int, default=7800)
    return p


def serve_config(args: argparse.Namespace) -> IndexerConfig:
    if args.config is not None:
        return load(args.config)
    if not args.source or args.index is None:
        raise ConfigError("serve needs --config, or --source and --index")
    raw: dict[str, Any] = {
        "name": args.name,
        "sources": args.source,
        "index_dir": str(args.index.resolve()),
        "chunking": {"size": args.chunk_size, "overlap": args.chunk_overlap},
        "rescan_seconds": args.rescan_seconds,
        "host": args.host,
        "port": args.port,
        "workers": args.workers,
        "embedding_batch": args.embedding_batch,
        "vectors": args.vectors,
        "check_seconds": args.check_seconds,
        "drain_seconds": args.drain_seconds,
        "peers": args.peer,
    }
    if args.embedding:
        raw["embedding"] = {"url": args.embedding, "name": args.embedding}
    if args.reranker:
        raw["reranker"] = {"url": args.reranker, "name": args.reranker}
    try:
        return IndexerConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(explain(e)) from None


async def _serve(cfg: IndexerConfig, config_path: Path | None) -> None:
    from metis_indexer.api import create_app, runner
    from metis_indexer.service.service import Indexer

    signals = _signals()
    token = os.environ.get(TOKEN_ENV) or None
    indexer = Indexer(cfg, on_progress=_progress_bar if sys.stderr.isatty() else None, token=token)
    running = runner(create_app(indexer, token=token, config_path=config_path))
    await running.setup()
    site = web.TCPSite(running, cfg.host, cfg.port)
    await site.start()
    print(f"metis: serving {cfg.name} on http://{cfg.host}:{cfg.port}", flush=True)
    first = await signals.get()
    drain = indexer.configured.config.drain_seconds  # as the configuration followed says now
    if drain:
        await _drain(indexer, signals, first, drain)
    await running.cleanup()
    log.info("stopped: no longer listening")


def _signals() -> asyncio.Queue[signal.Signals]:
    """SIGINT and SIGTERM as they come: the first stops the indexer, a second one ends
    its drain."""
    came: asyncio.Queue[signal.Signals] = asyncio.Queue()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, came.put_nowait, sig)
    return came


async def _drain(
    indexer: Indexer, signals: asyncio.Queue[signal.Signals], first: signal.Signals, seconds: float
) -> None:
    """Stop writing at once (a replacement standing by on the index takes over), then
    answer every read for `seconds` more, or until a second signal.

    A terminating pod is taken out of its Service's ready endpoints by the endpoints
    controller by itself, but kube-proxy and the clients learn of it a moment later:
    requests keep coming meanwhile. Readiness stays OK so the pod stays `serving`:
    kube-proxy still routes to a terminating endpoint that serves when no other endpoint
    is ready yet (a single replica whose replacement is still loading). Work that writes
    or costs model time is refused meanwhile (409 STANDBY); answers close their
    connection, so a client's next request opens one to an endpoint that stays."""
    await indexer.stop_writing()
    log.info(
        "%s: stopping: writing stopped, the index handed over; answering reads for %g s "
        "more (a second signal stops at once)",
        first.name,
        seconds,
    )
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await signals.get()


def _progress_bar(state: Any) -> None:
    width = shutil.get_terminal_size((80, 20)).columns
    if state.phase == "indexing" and state.total:
        filled = int(30 * state.done / state.total)
        line = (
            f"indexing [{'#' * filled}{'.' * (30 - filled)}] {state.done}/{state.total} documents"
        )
    else:
        line = f"{state.phase}{': ' + state.reason if state.reason else ''}"
    sys.stderr.write("\r" + line[: width - 1].ljust(width - 1))
    if state.phase == "ready":
        sys.stderr.write("\n")
    sys.stderr.flush()


def _call(
    method: str, url: str, body: dict[str, Any] | None = None, params: dict[str, Any] | None = None
) -> Any:
    token = os.environ.get(TOKEN_ENV)
    headers = {"Authorization": f"Bearer {token}"} if token else None
    try:
        response = httpx.request(
            method, url, json=body, params=params, headers=headers, timeout=120.0
        )
    except httpx.HTTPError as e:
        raise SystemExit(f"metis: cannot reach the indexer at {url}: {e}") from None
    data = response.json()
    if response.status_code >= 400:
        err = data.get("error", {})
        raise SystemExit(f"metis: {err.get('code', response.status_code)}: {err.get('message')}")
    return data


def _note(args: argparse.Namespace, url: str) -> Any:
    if args.note == "add":
        body: dict[str, Any] = {"text": args.text, "replaces": args.replaces}
        body |= {"title": args.title} if args.title else {}
        body |= {"id": args.id} if args.id else {}
        return _call("POST", f"{url}/v1/notes", body)
    if args.note == "list":
        params = {"page": args.page, "page_size": args.page_size}
        return _call("GET", f"{url}/v1/notes", params=params)
    return _call("DELETE", f"{url}/v1/notes/{args.id}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if args.command == "models":
        from metis_indexer.models.localmodel.server import main as models_main

        return models_main(["--host", args.host, "--port", str(args.port)])
    if args.command == "serve":
        try:
            cfg = serve_config(args)
        except ConfigError as e:
            print(f"metis: {e}", file=sys.stderr)
            return 2
        asyncio.run(_serve(cfg, args.config))
        return 0
    url = args.url.rstrip("/")
    if args.command == "search":
        filters = {f.field: v for f in FILTERS if (v := getattr(args, f.asked.name))}
        body: dict[str, Any] = {"query": args.question, "top_k": args.top_k, "mode": args.mode}
        if args.no_rerank:
            body["rerank"] = False
        if filters:
            body["filters"] = filters
        answer = _call("POST", f"{url}/v1/search", body)
        if not args.json:
            print(answer_text(SearchAnswer.model_validate(answer)))
            return 0
    elif args.command == "status":
        answer = _call("GET", f"{url}/v1/status")
    elif args.command == "documents":
        params = {"page": args.page, "page_size": args.page_size}
        if args.state:
            params["state"] = args.state
        answer = _call("GET", f"{url}/v1/documents", params=params)
    elif args.command == "note":
        answer = _note(args, url)
        if not args.json:
            print(notes_text(answer))
            return 0
    elif args.command == "reindex":
        answer = _call("POST", f"{url}/v1/reindex", {"full": args.full})
    else:
        answer = _call("POST", f"{url}/v1/evaluate", {"k": args.k})
    print(json.dumps(answer, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
