"""Indexing throughput: a whole pass against reading and cutting alone.

An OpenAI-compatible embedding server that answers at once (each passage's vector
is a unit vector seeded by its text's hash) runs in its own process, so what is
measured is the indexer's own cost: hashing, reading and cutting in the worker
pool, batching and decoding embeddings, tokenising, writing SQLite and memory.
The same files are then read and cut alone through the same pool, in the same
run, for the baseline (after the pass, so that the pass starts its workers cold, as an
indexer does).

    .venv/bin/python bench/pipeline.py [--corpus ../shared/data/perf/python-peps]
        [--dim 384] [--encoding base64|float] [--out bench/results/pipeline.md]

`--encoding float` makes the server refuse base64 (as some servers do), so the
indexer falls back to JSON floats: the cost of floats, measured.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import datetime as dt
import hashlib
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np

from metis_indexer.config import IndexerConfig
from metis_indexer.documents import ReadFailed
from metis_indexer.ingest import sources
from metis_indexer.ingest.readers.pool import ReaderPool
from metis_indexer.service.service import Indexer

PEPS = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "perf" / "python-peps"
TARGET = 3000.0
"""Chunks a second a whole pass should reach on 2 cores."""


def vectors(texts: list[str], table: np.ndarray) -> np.ndarray:
    """Unit vectors seeded by the texts' hashes: the same text, the same vector. Each is
    the sum of three rows of a fixed random table picked by its hash, so a request's
    vectors cost a few array operations: the server's work must not take the cores the
    indexer is measured on (a random generator seeded per text took 2 s of a pass)."""
    seeds = np.array(
        [
            int.from_bytes(
                hashlib.blake2b(t.encode("utf-8", "surrogatepass"), digest_size=8).digest(),
                "little",
            )
            for t in texts
        ],
        dtype=np.uint64,
    )
    size = np.uint64(len(table))
    v = (
        table[seeds % size]
        + table[(seeds >> np.uint64(20)) % size]
        + table[(seeds >> np.uint64(40)) % size]
    )
    return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype("<f4")


def serve(port: int, dim: int, base64_ok: bool) -> None:
    """The instant embedding server (run in its own process)."""
    from aiohttp import web

    table = np.random.default_rng(13).standard_normal((4099, dim)).astype(np.float32)

    async def models(_: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": "instant-hash", "object": "model"}]}
        )

    async def embeddings(request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        texts = [body["input"]] if isinstance(body["input"], str) else body["input"]
        fmt = body.get("encoding_format", "float")
        if fmt == "base64" and not base64_ok:
            return web.json_response({"error": "encoding_format must be float"}, status=422)
        rows = vectors(texts, table)
        if fmt == "base64":
            data = ",".join(
                f'{{"object":"embedding","index":{i},"embedding":"{base64.b64encode(r).decode()}"}}'
                for i, r in enumerate(
                    rows.tobytes()[k : k + 4 * dim] for k in range(0, 4 * dim * len(rows), 4 * dim)
                )
            )
        else:
            data = ",".join(
                json.dumps({"object": "embedding", "index": i, "embedding": r.tolist()})
                for i, r in enumerate(rows)
            )
        text = f'{{"object":"list","model":"instant-hash","data":[{data}]}}'
        return web.Response(text=text, content_type="application/json")

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/embeddings", embeddings)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


@contextlib.contextmanager
def instant_server(dim: int, base64_ok: bool) -> Iterator[tuple[str, int]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--serve",
            str(port),
            "--dim",
            str(dim),
            "--encoding",
            "base64" if base64_ok else "float",
        ],
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/v1/models").status_code == 200:
                    break
            time.sleep(0.1)
        yield url, proc.pid
    finally:
        proc.terminate()
        proc.wait()


def read_and_cut(corpus: Path, workers: int) -> tuple[float, int, int]:
    """Seconds to read and cut every file through the pool, the files, and the chunks."""
    started = time.perf_counter()
    listing = sources.walk(corpus)
    chunks = 0
    with ReaderPool(workers) as pool:
        futures = [pool.submit_chunks(f.absolute, f.kind, 1200, 200) for f in listing.files]
        for future in futures:
            done = future.result()
            if not isinstance(done.result, ReadFailed):
                chunks += len(done.result)
    return time.perf_counter() - started, len(listing.files), chunks


def cpu_seconds(pid: int) -> float:
    """A process's CPU time so far (user and system), from /proc."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def descendants_cpu(leave_out: int) -> float:
    """CPU seconds of this process's descendants but `leave_out` (the instant server): the
    reader workers, and the server they are forked from."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError):
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat[stat.rindex(")") + 2 :].split()[1])
    total = 0.0
    for pid in parents:
        up = pid
        while up in parents and up not in (os.getpid(), leave_out):
            up = parents[up]
        if up == os.getpid() and pid != os.getpid():
            with contextlib.suppress(OSError, ValueError):
                total += cpu_seconds(pid)
    return total


@dataclasses.dataclass(frozen=True)
class Passed:
    """A pass: its seconds and chunks, and the CPU seconds each part of it took (the
    machine's load moves them less than the seconds, though it moves them)."""

    seconds: float
    chunks: int
    indexer_cpu: float
    """The indexer's own process, all its threads."""
    workers_cpu: float
    """Its reader workers, from their start (imports included), with the process they
    are started from."""
    server_cpu: float
    """The instant embedding server."""


async def whole_pass(corpus: Path, url: str, server: int, workers: int, folder: Path) -> Passed:
    """A first pass over the corpus, from start to `ready`."""
    config = IndexerConfig(
        name="bench",
        sources=[{"drive": "corpus", "root": corpus}],  # type: ignore[list-item]
        embedding={"url": url, "name": "instant"},  # type: ignore[arg-type]
        index_dir=folder,
        rescan_seconds=0,
        workers=workers,
    )
    done = asyncio.Event()
    indexer = Indexer(config, on_progress=lambda state: done.set() if state.completed else None)
    started = time.perf_counter()
    own, served, before = time.process_time(), cpu_seconds(server), descendants_cpu(server)
    await indexer.start()
    try:
        await done.wait()
        seconds = time.perf_counter() - started
        cpu = (
            time.process_time() - own,
            descendants_cpu(server) - before,
            cpu_seconds(server) - served,
        )
    finally:
        await indexer.stop()
    return Passed(seconds, indexer.passes.index.chunk_count, *cpu)


def report(
    args: argparse.Namespace, read: tuple[float, int, int], passed: Passed, load: float
) -> str:
    read_s, files, read_chunks = read
    pass_s, chunks = passed.seconds, passed.chunks
    rate = chunks / pass_s
    cpu = passed.indexer_cpu + passed.workers_cpu
    return "\n".join(
        [
            f"# Pipeline benchmark — {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC on "
            f"{platform.node()} ({os.cpu_count()} cores, Python {platform.python_version()})",
            "",
            f"Corpus `{args.corpus}`: {files:,} files, {read_chunks:,} chunks; {args.workers} "
            f"reader workers; an instant embedding server ({args.dim} dimensions, "
            f"{args.encoding} offered) in its own process. Load average before: {load:.2f}.",
            "",
            "| step | seconds | chunks/s |",
            "|---|---|---|",
            f"| baseline: read and cut alone (the reader pool) | {read_s:.2f} | "
            f"{read_chunks / read_s:,.0f} |",
            f"| whole pass (hash, read, cut, embed, tokenise, write) | {pass_s:.2f} | "
            f"{rate:,.0f} |",
            "",
            f"Whole pass / read and cut: {pass_s / read_s:.2f} ×. Target ≥ {TARGET:,.0f} chunks/s: "
            f"{'met' if rate >= TARGET else 'MISSED'} ({rate:,.0f}). Load average after: "
            f"{os.getloadavg()[0]:.2f}.",
            "",
            "CPU seconds of the pass (other work on the cores moves them less than the seconds "
            "above, but moves them):",
            "",
            "| process | CPU s | µs a chunk |",
            "|---|---|---|",
            f"| the indexer's own (all its threads) | {passed.indexer_cpu:.2f} | "
            f"{passed.indexer_cpu / chunks * 1e6:,.0f} |",
            f"| its {args.workers} reader workers (their start included) and their fork server | "
            f"{passed.workers_cpu:.2f} | {passed.workers_cpu / chunks * 1e6:,.0f} |",
            f"| indexer and workers | {cpu:.2f} | {cpu / chunks * 1e6:,.0f} |",
            f"| the instant embedding server (the fake; not the indexer's) | "
            f"{passed.server_cpu:.2f} | {passed.server_cpu / chunks * 1e6:,.0f} |",
            "",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=PEPS)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--encoding", choices=("base64", "float"), default="base64")
    parser.add_argument("--out", type=Path, default=Path("bench/results/pipeline.md"))
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.dim, args.encoding == "base64")
        return
    load = os.getloadavg()[0]
    with (
        instant_server(args.dim, args.encoding == "base64") as (url, server),
        tempfile.TemporaryDirectory(prefix="metis-pipeline-") as tmp,
    ):
        passed = asyncio.run(whole_pass(args.corpus, url, server, args.workers, Path(tmp)))
    read = read_and_cut(args.corpus, args.workers)  # after: the pass starts its workers cold
    text = report(args, read, passed, load)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
