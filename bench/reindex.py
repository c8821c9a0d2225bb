"""Memory and search after many full reindexes, against a fresh start.

    .venv/bin/python bench/reindex.py [--rounds 100] [--out bench/results/reindex.md]

On a base of 1,149 chunks, 30 full reindexes once took the indexer from 151 to 257 MB and
its dense step from 0.33 to 13 ms, and a restart reset both. Three parts, each
with its fresh start measured in the same run:

1. **The index with the real model's vectors.** About 1,150 chunks of Python PEPs and 20
   questions are embedded once by the local model (`metis models`, all-MiniLM-L6-v2, over
   HTTP). A process of its own (the writer) builds the index and writes every document
   again `--rounds` times as a pass's writer does (groups of `writer.MOST` documents,
   then `settle`), with the same vectors: a full reindex with the model unchanged embeds
   the same texts to the same vectors, and embedding them 100 times (115,000 chunks at
   about 16 chunks/s here) would take two hours and measure the model, not the index.
   After 0, 30 and 100 reindexes: its VmRSS, and p50/p95 of the dense step, the keyword
   step and the whole hybrid search (model calls excluded). The fresh start: another
   process loads the index the writer left and measures the same.
2. **What a search waits while a large base is read again.** 100,000 chunks (perf text,
   random 384-dimensional unit vectors, float32): one full reindex while a thread
   searches back to back. Each search's time, the longest wait for the index's lock (a
   thread that takes it and lets go at once), and each compaction's build, which a
   search waited for whole before (the compaction held the lock throughout); 300 idle
   searches before it to compare with.
3. **`metis serve` itself**, keyword search alone (no model: a hundred passes in a minute
   or two): the same PEPs in a drive, `POST /v1/reindex {"full": true}` `--rounds`
   times; its VmRSS and keyword search over HTTP after the first full reindex, 30 and
   100, then after a restart on the same index.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # for tests.support, when run as a script

from bench.search import texts as perf_texts  # noqa: E402
from metis_indexer.documents import Chunk  # noqa: E402
from metis_indexer.index.memory import Index, IndexSettings, Replacement  # noqa: E402
from metis_indexer.index.store import FileRecord  # noqa: E402
from metis_indexer.ingest.writer import MOST  # noqa: E402
from metis_indexer.schema import SearchRequest  # noqa: E402
from metis_indexer.search.hybrid import Models, rank, search  # noqa: E402
from tests.support.model_server import running_model_server  # noqa: E402
from tests.support.processes import Process, indexer, wait_ready  # noqa: E402

SHARED = ROOT.parent / "shared"
PEPS = SHARED / "data" / "perf" / "python-peps" / "peps"
CHUNKS = 1150
SCALE_CHUNKS = 100_000
SCALE_DIM = 384
IDLE_SEARCHES = 300
QUESTIONS = [
    "how should a long line of Python code be wrapped",
    "generator expressions",
    "what does the walrus operator do",
    "unicode string literals",
    "relative imports",
    "exception chaining with raise from",
    "keyword-only arguments",
    "decorators for functions",
    "integer division and the // operator",
    "the with statement and context managers",
    "type hints for function annotations",
    "async and await coroutines",
    "f-strings formatted string literals",
    "dictionary ordering",
    "the global interpreter lock",
    "packaging and distributing modules",
    "pattern matching with match and case",
    "deprecating a module in the standard library",
    "iterators and the iteration protocol",
    "how a PEP is accepted or rejected",
]
MARKS = (0, 30, 100)


def rss_mb(pid: int | str = "self") -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def pct(values: list[float]) -> list[float]:
    return [float(np.percentile(values, 50)), float(np.percentile(values, 95))]


def passages(paths: list[Path], n: int, size: int = 1200) -> list[tuple[str, list[str]]]:
    """(file, its ~size-character passages, 200 overlapping) until n passages."""
    out: list[tuple[str, list[str]]] = []
    total = 0
    for path in paths:
        body = path.read_text(encoding="utf-8", errors="replace")
        parts = [
            p for p in (body[i : i + size] for i in range(0, len(body), size - 200)) if p.strip()
        ][: n - total]
        if parts:
            out.append((path.name, parts))
            total += len(parts)
        if total >= n:
            return out
    raise RuntimeError(f"only {total} passages")


def documents(files: list[tuple[str, list[str]]], vectors: np.ndarray) -> list[Replacement]:
    out: list[Replacement] = []
    at = 0
    for name, parts in files:
        chunks = [Chunk(name, (), p, None, 1, 0, 0) for p in parts]
        record = FileRecord(
            "peps", name, "txt", 1, 1, "h" + name, "indexed", "t", title=name, chunks=len(parts)
        )
        out.append(Replacement(record, chunks, vectors[at : at + len(parts)]))
        at += len(parts)
    return out


def full_reindex(index: Index, docs: list[Replacement]) -> None:
    for at in range(0, len(docs), MOST):
        index.put_documents(docs[at : at + MOST])
    index.settle()


def measure(
    index: Index, questions: list[str], qvecs: np.ndarray, rounds: int = 5
) -> dict[str, Any]:
    """VmRSS, and p50/p95 ms of the dense and keyword steps and of the whole search."""
    steps: dict[str, list[float]] = {"dense": [], "keyword": [], "whole": []}

    async def ask() -> None:
        for r in range(rounds + 1):  # the first round warms up
            for text, qv in zip(questions, qvecs, strict=True):
                ranked = rank(index, SearchRequest(query=text), qv)

                async def embed(_: str, qv: np.ndarray = qv) -> np.ndarray:
                    return qv

                answer = await search(index, SearchRequest(query=text), Models(embed=embed), "")
                if r:
                    steps["dense"].append(ranked.took.dense)
                    steps["keyword"].append(ranked.took.keyword)
                    steps["whole"].append(answer.took.total - answer.took.embed)

    asyncio.run(ask())
    return {
        "rss_mb": rss_mb(),
        "rows": index.n_rows,
        "chunks": index.chunk_count,
        "capacity": len(index.alive),
        **{k: pct(v) for k, v in steps.items()},
    }


# -- part 1: the index, in processes of its own ------------------------------------------


def embed_base(work: Path) -> None:
    """Chunks and questions embedded once by the real local model, kept in `work`."""
    files = passages(sorted(PEPS.glob("pep-*.rst")), CHUNKS)
    texts = [p for _, parts in files for p in parts]
    with (
        running_model_server() as server,
        httpx.Client(base_url=server.base_url, timeout=600) as client,
    ):

        def embed(batch: list[str]) -> list[list[float]]:
            answer = client.post("/v1/embeddings", json={"input": batch})
            answer.raise_for_status()
            return [d["embedding"] for d in answer.json()["data"]]

        vectors = [v for i in range(0, len(texts), 32) for v in embed(texts[i : i + 32])]
        qvecs = embed(QUESTIONS)
    np.save(work / "vectors.npy", np.array(vectors, dtype=np.float32))
    np.save(work / "questions.npy", np.array(qvecs, dtype=np.float32))
    (work / "files.json").write_text(json.dumps(files))


def writer_child(work: Path, rounds: int) -> None:
    """Build, then reindex fully `rounds` times, measuring at each of MARKS."""
    qvecs = np.load(work / "questions.npy")
    index = Index(work / "index")
    index.adopt(IndexSettings("all-MiniLM-L6-v2", qvecs.shape[1], 1200, 200))

    def again() -> None:  # the documents of one pass, gone after it
        files = json.loads((work / "files.json").read_text())
        full_reindex(index, documents(files, np.load(work / "vectors.npy")))

    again()
    for done in range(rounds + 1):
        if done:
            again()
        if done in MARKS or done == rounds:
            print(json.dumps({"reindexes": done, **measure(index, QUESTIONS, qvecs)}), flush=True)


def fresh_child(work: Path) -> None:
    index = Index(work / "index")
    index.load()
    index.settle()
    print(
        json.dumps(
            {"reindexes": "fresh", **measure(index, QUESTIONS, np.load(work / "questions.npy"))}
        )
    )


def child(kind: str, work: Path, *extra: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", kind, "--workdir", str(work), *extra],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    ).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


# -- part 2: a search's wait at 100,000 chunks ---------------------------------------------


class TimedIndex(Index):
    """An index that times each compaction that ran (it made new arrays)."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder)
        self.compactions: list[float] = []

    def compact(self, idle: bool = False) -> None:
        t, rows = time.perf_counter(), self.alive
        super().compact(idle)
        if self.alive is not rows:
            self.compactions.append((time.perf_counter() - t) * 1000)


def scale_child(work: Path) -> None:
    rng = np.random.default_rng(7)
    files = perf_texts(SCALE_CHUNKS)
    vectors = rng.standard_normal((SCALE_CHUNKS, SCALE_DIM), dtype=np.float32)
    docs = documents(files, vectors)
    index = TimedIndex(work / "scale")
    index.adopt(IndexSettings("random-unit-vectors", SCALE_DIM, 1200, 200))
    start = time.perf_counter()
    full_reindex(index, docs)
    build_s = time.perf_counter() - start
    qvecs = rng.standard_normal((len(QUESTIONS), SCALE_DIM), dtype=np.float32)
    qvecs /= np.linalg.norm(qvecs, axis=1, keepdims=True)
    index.compactions.clear()  # the build's
    stop = threading.Event()
    searches: list[float] = []
    waits: list[float] = []

    def searcher(most: int) -> None:
        i = 0
        while not stop.is_set() and i < most:
            text, qv = QUESTIONS[i % len(QUESTIONS)], qvecs[i % len(QUESTIONS)]
            t = time.perf_counter()
            with index.lock:
                waits.append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            rank(index, SearchRequest(query=text), qv)
            searches.append((time.perf_counter() - t) * 1000)
            i += 1

    searcher(IDLE_SEARCHES)
    idle_searches, idle_waits = list(searches), list(waits)
    searches.clear()
    waits.clear()
    during = threading.Thread(target=searcher, args=(sys.maxsize,))
    during.start()
    start = time.perf_counter()
    full_reindex(index, docs)
    reindex_s = time.perf_counter() - start
    stop.set()
    during.join()
    print(
        json.dumps(
            {
                "chunks": index.chunk_count,
                "build_s": build_s,
                "reindex_s": reindex_s,
                "compactions_ms": index.compactions,
                "idle": {
                    "searches": len(idle_searches),
                    "search": pct(idle_searches),
                    "max_search": max(idle_searches),
                    "max_wait": max(idle_waits),
                },
                "during": {
                    "searches": len(searches),
                    "search": pct(searches),
                    "max_search": max(searches),
                    "max_wait": max(waits),
                },
            }
        )
    )


# -- part 3: metis serve -----------------------------------------------------------------


def serve_part(work: Path, rounds: int) -> dict[str, Any]:
    drive = work / "drive"
    drive.mkdir()
    for name, _ in passages(sorted(PEPS.glob("pep-*.rst")), CHUNKS):
        shutil.copy(PEPS / name, drive / name)
    p = indexer({"peps": drive}, work / "serve-index", None)
    marks: list[dict[str, Any]] = []

    def keyword_ms() -> list[float]:
        took = []
        for r in range(6):
            for q in QUESTIONS:
                answer = p.post("/v1/search", {"query": q, "mode": "keyword"}).json()
                if r:
                    took.append(answer["took"]["total"])
        return pct(took)

    def mark(label: object) -> None:
        assert p.proc is not None
        marks.append(
            {
                "reindexes": label,
                "rss_mb": rss_mb(p.proc.pid),
                "chunks": p.status()["chunks"],
                "keyword": keyword_ms(),
            }
        )

    p.start()
    try:
        wait_ready(p)
        for done in range(1, rounds + 1):
            assert p.post("/v1/reindex", {"full": True}).status_code == 202
            p.wait_status(
                f"pass {done + 1}",
                lambda s, n=done + 1: s["passes"] == n and s["phase"] == "ready",
                600,
            )
            if done in (1, *MARKS[1:]) or done == rounds:
                mark(done)
        p.stop()
        p = Process(p.base_url, p.args, p.log_path)
        p.start()
        wait_ready(p)
        mark("restart")
    finally:
        p.stop()
    return {"marks": marks}


# -- the report ----------------------------------------------------------------------------


def reindexes(mark: dict[str, Any]) -> str:
    n = mark["reindexes"]
    return f"{n} full reindex" + ("" if n == 1 else "es")


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f} ×" if b else "—"


def report(
    index_marks: list[dict[str, Any]],
    scale: dict[str, Any],
    serve: dict[str, Any],
    started: str,
    loads: tuple[tuple[float, ...], tuple[float, ...]],
    rounds: int,
) -> str:
    fresh = index_marks[-1]
    lines = [
        f"# Memory and search after full reindexes — {started} on {platform.node()} "
        f"({os.cpu_count()} cores, Python {platform.python_version()}, numpy {np.__version__})",
        "",
        "Written by `bench/reindex.py` (its docstring says how each part is measured). "
        f"Load average {loads[0][0]:.1f} before, {loads[1][0]:.1f} after: the machine is "
        "shared, so latencies are noisy; each ratio is against a baseline of the same run.",
        "",
        f"## 1. The index, real model vectors ({fresh['chunks']:,} chunks, all-MiniLM-L6-v2)",
        "",
        "| after | rows | VmRSS MB | dense step p50 / p95 ms | keyword step p50 / p95 ms "
        "| whole search p50 / p95 ms |",
        "|---|---|---|---|---|---|",
    ]
    for m in index_marks:
        label = "a fresh start (load)" if m["reindexes"] == "fresh" else reindexes(m)
        lines.append(
            f"| {label} | {m['rows']:,} | {m['rss_mb']:.1f} | {m['dense'][0]:.3f} / "
            f"{m['dense'][1]:.3f} | {m['keyword'][0]:.3f} / {m['keyword'][1]:.3f} | "
            f"{m['whole'][0]:.3f} / {m['whole'][1]:.3f} |"
        )
    last = next(m for m in index_marks if m["reindexes"] == rounds)
    first = index_marks[0]
    lines += [
        "",
        f"After {rounds}: VmRSS {ratio(last['rss_mb'], fresh['rss_mb'])} the fresh start's, "
        "dense step p50 "
        f"{ratio(last['dense'][0], fresh['dense'][0])}, whole search p50 "
        f"{ratio(last['whole'][0], fresh['whole'][0])}. The rows are the same at every mark "
        "(the dense step reads exactly these): latencies differ by what else the machine "
        "ran. The writer's VmRSS also holds what writing brought in and a process that only "
        "loads never has (the store's writing connection with its page cache, the heap the "
        "documents of each pass went through): against its own figure after the build, "
        f"{ratio(last['rss_mb'], first['rss_mb'])}.",
        "",
        f"## 2. What a search waits at {scale['chunks']:,} chunks (float32, {SCALE_DIM} dims)",
        "",
        f"Built in {scale['build_s']:.1f} s; one full reindex in {scale['reindex_s']:.1f} s "
        "while a thread searched back to back (rank: both legs and fusion).",
        "",
        "| | searches | search p50 / p95 ms | longest search ms | longest wait for the lock ms |",
        "|---|---|---|---|---|",
    ]
    for label, key in (("idle", "idle"), ("during the full reindex", "during")):
        s = scale[key]
        lines.append(
            f"| {label} | {s['searches']} | {s['search'][0]:.2f} / {s['search'][1]:.2f}"
            f" | {s['max_search']:.1f} | {s['max_wait']:.1f} |"
        )
    builds = ", ".join(f"{b:.0f}" for b in scale["compactions_ms"])
    lines += [
        "",
        f"Compactions during the reindex, each built while searches went on (ms): {builds}. "
        "Before, a compaction held the index's lock while it built (and ran only when files "
        "were dropped): a search waited about that long. The longest wait now is for a "
        "pass's own writes under the lock: a group's rows, and the arrays grown when they "
        "are full (once a full reindex, as it begins: `memory.grown`).",
        "",
        "## 3. `metis serve`, keyword search alone (no model)",
        "",
        "| after | chunks | VmRSS MB | keyword search over HTTP p50 / p95 ms (`took.total`) |",
        "|---|---|---|---|",
    ]
    marks = serve["marks"]
    for m in marks:
        label = "a restart" if m["reindexes"] == "restart" else reindexes(m)
        lines.append(
            f"| {label} | {m['chunks']:,} | {m['rss_mb']:.1f} | "
            f"{m['keyword'][0]:.2f} / {m['keyword'][1]:.2f} |"
        )
    restart = marks[-1]
    end = next(m for m in marks if m["reindexes"] == rounds)
    lines += [
        "",
        f"After {rounds}: VmRSS {ratio(end['rss_mb'], restart['rss_mb'])} a restart's, "
        f"{ratio(end['rss_mb'], marks[0]['rss_mb'])} its own after the first full reindex.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "reindex.md")
    parser.add_argument("--child", choices=["writer", "fresh", "scale"], help=argparse.SUPPRESS)
    parser.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "writer":
        return writer_child(args.workdir, args.rounds)
    if args.child == "fresh":
        return fresh_child(args.workdir)
    if args.child == "scale":
        return scale_child(args.workdir)
    started = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        embed_base(work)
        index_marks = child("writer", work, "--rounds", str(args.rounds))
        index_marks += child("fresh", work)
        [scale] = child("scale", work)
        serve = serve_part(work, args.rounds)
    text = report(index_marks, scale, serve, started, (before, os.getloadavg()), args.rounds)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
