"""Searches while a big document is embedded: do questions wait behind
the pass's batches at the model? Writes bench/results/preemption.md.

    .venv/bin/python bench/preemption.py [--chunks 4000] [--searches 40] [--out PATH]

For each model server, in one run: a real `metis serve` indexes the example handbook;
searches are timed idle (the baseline); then a document of `--chunks` chunks is added,
and searches are timed again while its passages are embedded. Two servers, both the
real all-MiniLM-L6-v2 on onnxruntime:
- `metis models`, the local server;
- a server that serializes requests: one at a time, first come first served, the same
  encoder behind one lock (as a plain model server without dynamic batching does; the
  stand-in is here, in `--serve-fifo`, since `metis models` does not serialize).
Then the pass's throughput at the local server: the same passages embedded by the
client's defaults and by fixed requests of 64 passages, two out (the sizing before).

Run with `PYTHONPATH=<a copy of the old indexer_image>` to measure older code the same
way: the processes it starts inherit it.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import datetime as dt
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # for tests.support and bench, when run as a script

from bench.local_model import chunks  # noqa: E402
from metis_indexer.models.clients import EmbeddingClient  # noqa: E402
from tests.support.model_server import free_port, start_model_server  # noqa: E402
from tests.support.processes import Process, indexer, running, wait_ready  # noqa: E402

HANDBOOK = ROOT / "examples" / "handbook"
QUERY = {"query": "How many vacation days do I get?", "top_k": 3, "rerank": False}
TARGET = 3.0
"""p50 during the embedding, over idle, at the local server."""


def serve_fifo(port: int) -> None:
    """The serializing stand-in: OpenAI embeddings, one request at a time in arrival
    order (asyncio's lock wakes its waiters first in, first out)."""
    from aiohttp import web

    from metis_indexer.models.localmodel.encoder import Encoder

    encoder = Encoder.load()
    one_at_a_time = asyncio.Lock()

    async def models(_: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": encoder.model_id, "object": "model"}]}
        )

    async def embeddings(request: web.Request) -> web.Response:
        body = await request.json()
        texts = [body["input"]] if isinstance(body["input"], str) else body["input"]
        async with one_at_a_time:
            vectors = await asyncio.to_thread(encoder.embed, texts)
        if body.get("encoding_format") == "base64":
            rows: list[object] = [
                base64.b64encode(v.astype("<f4").tobytes()).decode() for v in vectors
            ]
        else:
            rows = vectors.tolist()
        data = [{"object": "embedding", "index": i, "embedding": r} for i, r in enumerate(rows)]
        return web.json_response({"object": "list", "data": data, "model": encoder.model_id})

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/embeddings", embeddings)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


@dataclass
class Server:
    name: str
    base_url: str
    pid: int


@contextlib.contextmanager
def local_server() -> Iterator[Server]:
    server = start_model_server()
    try:
        yield Server("`metis models` (local)", server.base_url, server.proc.pid)
    finally:
        server.stop()


@contextlib.contextmanager
def fifo_server() -> Iterator[Server]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--serve-fifo", str(port)])
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/v1/models").status_code == 200:
                    break
            time.sleep(0.1)  # pacing the polls of its start
        else:
            raise RuntimeError("the serializing stand-in did not start")
        yield Server("serializing stand-in (one request at a time, FIFO)", url, proc.pid)
    finally:
        proc.terminate()
        proc.wait()


def cpu_seconds(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def big_document(path: Path, chunks_wanted: int) -> None:
    """Markdown of about `chunks_wanted` chunks of 1,200 characters (distinct lines, so
    no two chunks are the same)."""
    lines = []
    for i in range(chunks_wanted * 8):
        lines.append(
            f"Item {i} of the ledger: shelf {i % 97}, row {i % 13}, counted on day "
            f"{i % 365} by team {i % 7}, {i * 7 % 1000} units."
        )
    path.write_text("# Inventory\n\n" + "\n\n".join(lines) + "\n", encoding="utf-8")


@dataclass
class Searches:
    seconds: list[float]
    embed_ms: list[float]
    """The question's embedding, as the indexer timed it (`took.embed`)."""
    fallbacks: int

    def p50_ms(self) -> float:
        return statistics.median(self.seconds) * 1000

    def embed_p50_ms(self) -> float:
        return statistics.median(self.embed_ms)

    def p90_ms(self) -> float:
        return statistics.quantiles(self.seconds, n=10)[-1] * 1000


def search(p: Process, n: int, until: float | None = None) -> Searches:
    seconds, embed_ms, fallbacks = [], [], 0
    with httpx.Client(base_url=p.base_url, timeout=60) as client:
        for _ in range(n):
            if until is not None and time.monotonic() > until:
                break
            started = time.perf_counter()
            answer = client.post("/v1/search", json=QUERY).json()
            seconds.append(time.perf_counter() - started)
            embed_ms.append(answer["took"]["embed"])
            fallbacks += any("keywords only" in w for w in answer["warnings"])
    return Searches(seconds, embed_ms, fallbacks)


@dataclass
class Row:
    server: str
    idle: Searches
    busy: Searches
    still_embedding: bool


def measure(server: Server, folder: Path, chunks_wanted: int, n: int) -> Row:
    drive = folder / "drive"
    shutil.copytree(HANDBOOK, drive)
    p = indexer({"docs": drive}, folder / "index", server.base_url)
    with running(p):
        wait_ready(p, timeout=600)
        search(p, 5)  # warm-up
        idle = search(p, n)
        big_document(drive / "zz-inventory.md", chunks_wanted)
        assert p.post("/v1/reindex", {}).status_code == 202
        # The big document is read and cut in a second or two; its embedding takes
        # minutes: the model's CPU time climbing says it is under way.
        p.wait_status("the pass", lambda s: s["phase"] == "indexing", timeout=120)
        start_cpu = cpu_seconds(server.pid)
        p.wait_for(
            "the model busy", lambda: cpu_seconds(server.pid) - start_cpu >= 2.0, timeout=120
        )
        busy = search(p, n, until=time.monotonic() + 120)
        still = p.status()["phase"] == "indexing"
    return Row(server.name, idle, busy, still)


SIZINGS: dict[str, dict[str, int]] = {
    "the client's defaults (sized to the pace)": {},
    "64 passages a request, 2 out (the sizing before)": {"batch": 64, "in_flight": 2},
}


async def throughput(
    server: Server, texts: list[str], sizing: dict[str, int]
) -> tuple[float, float]:
    """Passages a second for one document of `texts` through the embedding client, and the
    server's CPU milliseconds a passage (which other work on the cores moves less)."""
    client = EmbeddingClient(server.base_url, **sizing)  # type: ignore[arg-type]
    await client.connect()
    cpu, started = cpu_seconds(server.pid), time.perf_counter()
    await client.embed_documents(texts)
    seconds, cpu = time.perf_counter() - started, cpu_seconds(server.pid) - cpu
    await client.close()
    return len(texts) / seconds, cpu / len(texts) * 1000


def searches_report(rows: list[Row], args: argparse.Namespace) -> list[str]:
    if not rows:
        return []
    lines = [
        f"The example handbook, then a document of about {args.chunks:,} chunks added; "
        f"{args.searches} searches idle and as many (or 120 s of them) while it is embedded, "
        "one at a time, hybrid, no reranker.",
        "",
        "| model server | idle p50 | during p50 | ratio | during p90 | of which the "
        "question's embedding, p50 idle → during | fell back to keywords | still embedding "
        "at the end |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row.server} | {row.idle.p50_ms():.1f} ms | {row.busy.p50_ms():.1f} ms | "
            f"{row.busy.p50_ms() / row.idle.p50_ms():.1f} × | {row.busy.p90_ms():.1f} ms | "
            f"{row.idle.embed_p50_ms():.1f} → {row.busy.embed_p50_ms():.1f} ms | "
            f"{row.busy.fallbacks} of {len(row.busy.seconds)} | "
            f"{'yes' if row.still_embedding else 'NO'} |"
        )
    ratio = rows[0].busy.p50_ms() / rows[0].idle.p50_ms()
    met = ratio <= TARGET and not rows[0].busy.fallbacks
    return [
        *lines,
        "",
        f"Target at the local server: ≤ {TARGET:g} × idle and no fallback: "
        f"{'met' if met else 'MISSED'} ({ratio:.1f} ×, {rows[0].busy.fallbacks} fallbacks).",
        "",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=4000)
    parser.add_argument("--searches", type=int, default=40)
    parser.add_argument("--passages", type=int, default=256, help="for the throughput")
    parser.add_argument("--rounds", type=int, default=3, help="of the throughput")
    parser.add_argument("--skip-searches", action="store_true", help="the throughput only")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/preemption.md")
    parser.add_argument("--serve-fifo", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_fifo:
        serve_fifo(args.serve_fifo)
        return
    load = os.getloadavg()[0]
    code = os.environ.get("PYTHONPATH") or "this tree"
    rows = []
    for server_of in () if args.skip_searches else (local_server, fifo_server):
        with server_of() as server, tempfile.TemporaryDirectory(prefix="metis-pre-") as tmp:
            rows.append(measure(server, Path(tmp), args.chunks, args.searches))
            print(rows[-1].server, rows[-1].idle.p50_ms(), rows[-1].busy.p50_ms(), flush=True)
    texts = chunks(args.passages)
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in SIZINGS}
    with local_server() as server:
        asyncio.run(throughput(server, texts[:16], {}))  # warm-up
        for _ in range(args.rounds):  # alternating, so the load moves both alike
            for name, sizing in SIZINGS.items():
                runs[name].append(asyncio.run(throughput(server, texts, sizing)))
    now = dt.datetime.now(dt.UTC)
    lines = [
        f"# Searches during a big document's embedding — {now:%Y-%m-%d %H:%M} UTC on "
        f"{platform.node()} ({os.cpu_count()} cores, Python {platform.python_version()})",
        "",
        f"Code: {code}. Written by `bench/preemption.py`. Load average before: {load:.2f}, "
        f"after: {os.getloadavg()[0]:.2f}.",
        "",
        *searches_report(rows, args),
        f"Pass throughput at the local server, {len(texts)} passages of 1,200 characters "
        f"in one document, {args.rounds} rounds alternating:",
        "",
        "| requests | passages/s, median (each run) | server CPU ms a passage, median |",
        "|---|---|---|",
        *(
            f"| {name} | {statistics.median(r for r, _ in rs):.1f} "
            f"({', '.join(f'{r:.1f}' for r, _ in rs)}) | "
            f"{statistics.median(c for _, c in rs):.0f} |"
            for name, rs in runs.items()
        ),
        "",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
