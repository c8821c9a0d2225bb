"""A source read from artifacts (a Flux source object's revisions): seconds from a new
revision to its chunks searchable, and the passages sent to the model per chunk that
changed (goal 1.0: nothing unchanged embedded again).

A 2,000-file repository (Markdown of the docs corpus) is served as gzip tarballs by a
loopback HTTP server; `metis serve` follows its configuration file (as it follows its
ConfigMap: every `following.FOLLOW_SECONDS`, included in the seconds) and embeds at an
instant embedding server that counts what it is sent (`pipeline.vectors`). Three steps:
the whole repository as a first revision, a commit that changes 100 files, and a whole
new repository (every file changed) as the next revision.

    .venv/bin/python bench/artifact_revisions.py [--files 2000] [--changed 100]
        [--out bench/results/artifact-revisions.md]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime as dt
import hashlib
import io
import json
import os
import platform
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # for bench.pipeline and tests.support, when run as a script

from bench.pipeline import vectors  # noqa: E402
from tests.support.processes import Process, free_port, metis, running  # noqa: E402

CORPUS = ROOT.parent / "shared" / "data" / "perf"
DIM = 384


def repository(files: int) -> dict[str, bytes]:
    """The first `files` Markdown files of the docs corpus, by path."""
    found = sorted(CORPUS.glob("*/**/*.md"))[:files]
    if len(found) < files:
        raise SystemExit(f"the docs corpus at {CORPUS} has {len(found)} Markdown files")
    return {str(p.relative_to(CORPUS)): p.read_bytes() for p in found}


def tarball(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(content), 0  # Flux's artifacts carry no useful times
            tar.addfile(info, io.BytesIO(content))
    return out.getvalue()


class Servers:
    """The artifact server and the instant embedding server, on one loopback event loop in
    a thread; the passages embedded are counted."""

    def __init__(self) -> None:
        self.archives: dict[str, bytes] = {}
        self.passages = 0
        self.port = free_port()
        self._table = np.random.default_rng(13).standard_normal((4099, DIM)).astype(np.float32)

    async def artifact(self, request: web.Request) -> web.Response:
        return web.Response(body=self.archives[request.match_info["name"]])

    async def models(self, _: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "instant-hash", "object": "model"}]})

    async def embeddings(self, request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        texts = body["input"]
        self.passages += len(texts)
        rows = vectors(texts, self._table)
        data = [
            {"index": i, "embedding": base64.b64encode(r.tobytes()).decode()}
            for i, r in enumerate(rows)
        ]
        return web.json_response({"data": data})

    @contextmanager
    def running(self) -> Iterator[Servers]:
        app = web.Application(client_max_size=64 << 20)
        app.router.add_get("/artifacts/{name}", self.artifact)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/embeddings", self.embeddings)
        loop = asyncio.new_event_loop()
        runner = web.AppRunner(app, access_log=None)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            loop.run_until_complete(runner.cleanup())
            loop.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def configure(path: Path, index: Path, port: int, servers: Servers, name: str) -> None:
    data = servers.archives[name]
    artifact = {
        "url": f"{servers.url}/artifacts/{name}",
        "digest": f"sha256:{hashlib.sha256(data).hexdigest()}",
        "revision": f"main@sha1:{name}",
        "origin": "GitRepository docs",
    }
    config = {
        "sources": [
            {"drive": "docs", "root": str(index / "artifacts" / "docs"), "artifact": artifact}
        ],
        "embedding": {"url": servers.url, "name": "instant"},
        "index_dir": str(index),
        "rescan_seconds": 0,
        "port": port,
    }
    path.with_suffix(".tmp").write_text(json.dumps(config))
    path.with_suffix(".tmp").replace(path)


def chunks_of(p: Process, paths: set[str] | None) -> int:
    rows = p.get("/v1/documents", params={"page_size": 1000, "page": 1}).json()
    total, page, counted = rows["total"], 1, 0
    while True:
        counted += sum(
            r["chunks"] for r in rows["documents"] if paths is None or r["document"] in paths
        )
        if page * 1000 >= total:
            return counted
        page += 1
        rows = p.get("/v1/documents", params={"page_size": 1000, "page": page}).json()


def step(
    p: Process,
    config: Path,
    index: Path,
    port: int,
    servers: Servers,
    name: str,
    marker: str | None,
) -> float:
    """Seconds from the configuration naming revision `name` to it indexed, and a search
    by `marker` finding its new text."""
    before = time.monotonic()
    configure(config, index, port, servers, name)

    def searchable() -> bool:
        status = p.status()
        if status["indexed_revisions"].get("docs") != f"main@sha1:{name}":
            return False
        if marker is None:
            return True
        answer = p.post("/v1/search", {"query": marker, "mode": "keyword", "top_k": 1}).json()
        return bool(answer["results"]) and marker in answer["results"][0]["text"]

    p.wait_for(f"revision {name} searchable", searchable, timeout=3600)
    return time.monotonic() - before


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--changed", type=int, default=100)
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/artifact-revisions.md")
    args = ap.parse_args()
    first = repository(args.files)
    every = len(first) // args.changed
    changed_paths = set(sorted(first)[::every][: args.changed])
    second = {
        k: v + (b"\n\nZanzibar revision note %d.\n" % i if k in changed_paths else b"")
        for i, (k, v) in enumerate(first.items())
    }
    fresh = {k: b"# New\n\nQuokka repository.\n\n" + v for k, v in first.items()}
    rows: list[tuple[str, float, int, int, int]] = []
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp, Servers().running() as servers:
        folder = Path(tmp)
        index, config, port = folder / "index", folder / "config.json", free_port()
        servers.archives = {"aaa": tarball(first), "bbb": tarball(second), "ccc": tarball(fresh)}
        configure(config, index, port, servers, "aaa")
        p = Process(
            f"http://127.0.0.1:{port}",
            metis("serve", "--config", str(config)),
            folder / "indexer.log",
        )
        steps = [
            ("a first revision: the whole repository", "aaa", None, first, None),
            (
                f"a commit changing {len(changed_paths)} files",
                "bbb",
                "Zanzibar",
                changed_paths,
                changed_paths,
            ),
            ("a whole new repository as the next revision", "ccc", "Quokka", fresh, None),
        ]
        with running(p):
            for what, name, marker, changed, counted in steps:
                sent = servers.passages
                seconds = step(p, config, index, port, servers, name, marker)
                made = servers.passages - sent
                rows.append((what, seconds, len(changed), made, chunks_of(p, counted)))
    write(args.out, rows, load, args.files)


def write(out: Path, rows: list[tuple[str, float, int, int, int]], load: float, files: int) -> None:
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    machine = f"{platform.node()} ({os.cpu_count()} cores, Python {platform.python_version()})"
    lines = [
        f"# Artifact revisions — {now} on {machine}",
        "",
        f"A {files}-file repository (Markdown of `../shared/data/perf`) served as gzip "
        "tarballs on loopback; `metis serve` following its configuration file (looked at "
        "every 5 s, included); an instant embedding server counting the passages it is "
        f"sent. Load average before: {load:.2f}.",
        "",
        "| step | files changed | seconds to searchable | passages embedded "
        "| chunks of the changed files | embedded / changed chunks |",
        "|---|---|---|---|---|---|",
    ]
    for what, seconds, changed, passages, chunks in rows:
        ratio = passages / chunks if chunks else float("nan")
        lines.append(
            f"| {what} | {changed:,} | {seconds:.1f} | {passages:,} | {chunks:,} | {ratio:.2f} |"
        )
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
