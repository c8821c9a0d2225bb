"""Search speed and memory at 100,000 chunks of 1,024 dimensions.

Builds an index of real chunk text from ../shared/data/perf with random unit
vectors, then reports in one run: p50/p95 of each step and of a whole hybrid
search (model calls excluded), memory per chunk and load time (measured in a
fresh process), against baselines measured here too: a bare numpy
matrix-vector product over the same matrix, and bm25s over the same texts.

The same index is then loaded with int8 vectors and measured the same way:
the int8 scan against the bare product, recall@50 of its dense step against exact
float32 on these random vectors, and, given `--real PATH` (the index folder of a
`bench/scifact.py --workdir`), on SciFact's all-MiniLM-L6-v2 vectors with SciFact's
questions.

    .venv/bin/python bench/search.py [--chunks 100000] [--dim 1024] [--real PATH]
        [--out bench/results/search.md]

A million chunks are measured with `vectors: int8` alone, from an index kept in
a folder of its own so that it is built once (several minutes) and measured again in
short runs: its load in a fresh process, memory per chunk, the int8 scan, dense step and
whole hybrid search, and recall@50 against exact float32 scores read from the index's
own float32 file. The float32, bm25s and during-a-pass figures are not taken there (the
float32 matrix alone would be 4 GB more, and bm25s another copy of every posting).

    .venv/bin/python bench/search.py --million --chunks 1000000 --workdir DIR
        [--out bench/results/search-million.md]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from metis_indexer.documents import Chunk
from metis_indexer.index import tokens
from metis_indexer.index.memory import Index, IndexSettings, Replacement, count_words
from metis_indexer.index.store import FileRecord
from metis_indexer.index.vectors import FloatVectors, Int8Vectors, top
from metis_indexer.ingest.writer import MOST
from metis_indexer.limits import VectorKind
from metis_indexer.schema import SearchRequest
from metis_indexer.search.hybrid import Models, leg_size, rank, search

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
PERF = SHARED / "data" / "perf"
QUERIES = SHARED / "data" / "scifact" / "queries.jsonl"
GROUP = 16
"""Documents written per transaction while searches run: a pass's writer takes those that
finished embedding, a few at a time."""
BUILD_GROUP = MOST
"""Documents written per transaction by a build: every document waits, and a pass's writer
takes up to `writer.MOST` of those waiting at once."""
INT8_BLOCK = 20
"""Questions asked of one form (float32 or int8) before the other takes its turn."""


def texts(n: int, size: int = 1200) -> list[tuple[str, list[str]]]:
    """(file, its ~size-character passages) until n passages, from the perf corpus's text."""
    out: list[tuple[str, list[str]]] = []
    total = 0
    for path in sorted(PERF.rglob("*")):
        if path.suffix not in (".md", ".rst", ".txt") or not path.is_file():
            continue
        body = path.read_text(encoding="utf-8", errors="replace")
        parts = [body[i : i + size] for i in range(0, len(body), size - 200)]
        parts = [p for p in parts if p.strip()]
        if not parts:
            continue
        parts = parts[: n - total]
        out.append((str(path.relative_to(PERF)), parts))
        total += len(parts)
        if total >= n:
            return out
    while total < n:  # the corpus is smaller than asked: reuse it under other names
        for name, parts in list(out):
            take = parts[: n - total]
            out.append((f"again/{len(out)}/{name}", take))
            total += len(take)
            if total >= n:
                break
    return out


def build(folder: Path, n: int, dim: int) -> tuple[float, float]:
    """Seconds counting the chunks' words (a pass does that in its reader workers), then
    seconds writing the counted documents, a group a transaction, as a pass's writer."""
    rng = np.random.default_rng(7)
    index = Index(folder)
    index.adopt(IndexSettings("random-unit-vectors", dim, 1200, 200))
    documents = []
    for name, parts in texts(n):
        chunks = [Chunk(name, ("Section",), p, None, 1, 0, 0) for p in parts]
        vectors = rng.standard_normal((len(parts), dim), dtype=np.float32)
        record = FileRecord(
            "perf", name, "md", 1, 1, "h", "indexed", "t", title=name, chunks=len(parts)
        )
        documents.append(Replacement(record, chunks, vectors))
    start = time.perf_counter()
    counted = [dataclasses.replace(d, terms=count_words(d.chunks)) for d in documents]
    count_s = time.perf_counter() - start
    start = time.perf_counter()
    for i in range(0, len(counted), BUILD_GROUP):
        index.put_documents(counted[i : i + BUILD_GROUP])
    index.settle()
    index.store.close()
    return count_s, time.perf_counter() - start


def build_large(folder: Path, n: int, dim: int) -> float:
    """Seconds writing n chunks into an int8 index, words counted and vectors drawn a group
    at a time (a million chunks' words and vectors at once would not fit beside it)."""
    rng = np.random.default_rng(7)
    index = Index(folder, "int8")
    index.adopt(IndexSettings("random-unit-vectors", dim, 1200, 200))
    documents = texts(n)
    start = time.perf_counter()
    for i in range(0, len(documents), BUILD_GROUP):
        group = []
        for name, parts in documents[i : i + BUILD_GROUP]:
            chunks = [Chunk(name, ("Section",), p, None, 1, 0, 0) for p in parts]
            vectors = rng.standard_normal((len(parts), dim), dtype=np.float32)
            record = FileRecord(
                "perf", name, "md", 1, 1, "h", "indexed", "t", title=name, chunks=len(parts)
            )
            group.append(Replacement(record, chunks, vectors, count_words(chunks)))
        index.put_documents(group)
    index.store.close()
    return time.perf_counter() - start


def exact_top(held: Int8Vectors, n: int, qvecs: list[np.ndarray], k: int) -> list[set[int]]:
    """Each question's k best rows by exact float32 score, read from the float32 file a
    block at a time (every vector at once would be 4 GB in memory)."""
    questions = np.stack(qvecs)
    scores = np.empty((len(qvecs), n), dtype=np.float32)
    for at in range(0, n, 65_536):
        rows = np.arange(at, min(at + 65_536, n))
        scores[:, rows] = questions @ held.exact(rows).T
    everyone = np.ones(n, dtype=bool)
    return [set(top(row, everyone, k)) for row in scores]


def million(folder: Path, n: int, dim: int, repeats: int, rounds: int) -> dict[str, object]:
    """The int8 figures of a large index kept in `folder` (built there first if absent)."""
    build_s = None
    if not (folder / "index.sqlite3").exists():
        build_s = build_large(folder, n, dim)
    from_store = None if (folder / "snapshot.json").exists() else measure_load(folder, "int8")
    load = measure_load(folder, "int8")
    index = Index(folder, "int8")
    index.load()
    index.settle()
    held = index.vectors
    assert isinstance(held, Int8Vectors)
    qs = queries(repeats)
    rng = np.random.default_rng(11)
    qvecs = [
        v / np.linalg.norm(v) for v in rng.standard_normal((len(qs), index.dimensions), np.float32)
    ]
    steps: dict[str, list[float]] = {name: [] for name in ("scan", "dense", "keyword", "hybrid")}

    async def ask_all() -> None:
        for _ in range(rounds):
            for text, qv in zip(qs, qvecs, strict=True):
                t = time.perf_counter()
                held.scan(qv, index.n_rows)
                steps["scan"].append((time.perf_counter() - t) * 1000)
                ranked = rank(index, SearchRequest(query=text), qv)
                steps["dense"].append(ranked.took.dense)
                steps["keyword"].append(ranked.took.keyword)
                steps["hybrid"].append(await hybrid_ms(index, text, qv))

    asyncio.run(ask_all())
    allowed = index.allowed(None)
    asked = qvecs[:20]
    hits = sum(
        len(want & {r for r, _ in index.dense(qv, allowed, 50)})
        for want, qv in zip(exact_top(held, index.n_rows, asked, 50), asked, strict=True)
    )
    return {
        "chunks": index.chunk_count,
        "dim": index.dimensions,
        "build_s": build_s,
        "load": load,
        "from_store": from_store,
        "asked": len(qs) * rounds,
        "recall": hits / (50 * len(asked)),
        "recall_asked": len(asked),
        "resident": held.resident_bytes(),
        "steps": {name: pct(values) for name, values in steps.items()},
    }


def million_report(r: dict[str, object]) -> str:
    steps: dict[str, tuple[float, float]] = r["steps"]  # type: ignore[assignment]
    load: dict[str, float] = r["load"]  # type: ignore[assignment]
    chunks = int(r["chunks"])  # type: ignore[arg-type]
    per_chunk = load["rss_bytes"] / chunks
    hybrid, load_s = steps["hybrid"][0], load["load_s"]
    recall = float(r["recall"])  # type: ignore[arg-type]
    built = (
        "kept from an earlier run"
        if r["build_s"] is None
        else f"built in this run in {float(r['build_s']):.0f} s"  # type: ignore[arg-type]
    )
    lines = [
        f"# Search at a million chunks, int8 — {dt.date.today()} on {platform.node()} "
        f"({os.cpu_count()} cores, Python {platform.python_version()}, numpy {np.__version__})",
        "",
        f"{chunks:,} chunks of real text from shared/data/perf (reused under other names past "
        f"its end), {r['dim']}-dimensional random unit vectors, `vectors: int8`; the index "
        f"{built}. {r['asked']} questions (SciFact claims); model calls excluded.",
        "",
        "| step | p50 ms | p95 ms |",
        "|---|---|---|",
    ]
    lines += _step_rows(
        steps,
        {
            "scan": "int8 scan (every row's approximate score)",
            "dense": "int8 dense step (scan, top 400, exact rescoring, top 50; the keyword step "
            "runs beside it)",
            "keyword": "keyword step (beside the dense step, on the same 2 cores)",
            "hybrid": "whole hybrid search (no model calls; texts, snippets, citations)",
        },
    )
    lines += [
        "",
        "| target | measured | verdict |",
        "|---|---|---|",
        f"| whole hybrid search p50 ≤ 60 ms | {hybrid:.2f} ms | "
        f"{'met' if hybrid <= 60 else 'MISSED'} |",
        f"| load ≤ 20 s | {load_s:.2f} s (fresh process, from the snapshot a load saved) | "
        f"{'met' if load_s <= 20 else 'MISSED'} |",
        f"| ≤ 2 KB per chunk resident at {r['dim']:,} dims | {per_chunk / 1024:.2f} KiB per "
        f"chunk ({load['rss_bytes'] / 2**20:.0f} MiB resident after load; the codes "
        f"{float(r['resident']) / chunks:.0f} B a chunk) | "  # type: ignore[arg-type]
        f"{'met' if per_chunk <= 2 * 1024 else 'MISSED'} |",
        f"| recall@50 vs exact float32 ≥ 0.99 ({r['recall_asked']} questions) | {recall:.4f} | "
        f"{'met' if recall >= 0.99 else 'MISSED'} |",
    ]
    first: dict[str, float] | None = r["from_store"]  # type: ignore[assignment]
    if first is not None:
        lines += [
            "",
            f"The load before it read the store (no snapshot yet, as after any change to a "
            f"chunk) and saved the snapshot: {first['load_s']:.1f} s, "
            f"{first['peak_bytes'] / 2**30:.1f} GiB peak.",
        ]
    return "\n".join(lines) + "\n"


LOADER = """
import resource, sys, time, json
from collections.abc import Callable
from pathlib import Path
from metis_indexer.index.memory import Index
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
def rss():
    for line in open('/proc/self/status'):
        if line.startswith('VmRSS'):
            return int(line.split()[1]) * 1024
r0 = rss()
t = time.perf_counter()
index = Index(Path(sys.argv[1]), sys.argv[2])
index.load()
took = time.perf_counter() - t
print(json.dumps({"load_s": took, "rss_bytes": rss() - r0, "chunks": index.chunk_count,
  "peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def measure_load(folder: Path, vectors: VectorKind = "float32") -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", LOADER, str(folder), vectors],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out)


def pct(values: list[float]) -> tuple[float, float]:
    return float(np.percentile(values, 50)), float(np.percentile(values, 95))


def queries(limit: int) -> list[str]:
    with QUERIES.open() as f:
        return [json.loads(line)["text"] for line in f][:limit]


def recall_at_50(exact: Index, int8: Index, qvecs: list[np.ndarray]) -> tuple[float, float]:
    """Of exact float32's 50 nearest rows, the share int8's dense step returns too, and
    the share the int8 scan's own top 50 holds (no rescoring: the codes' margin)."""
    allowed = exact.allowed(None)
    held = int8.vectors
    assert isinstance(held, Int8Vectors)
    hits = scan_hits = 0
    for qv in qvecs:
        want = {r for r, _ in exact.dense(qv, allowed, 50)}
        hits += len(want & {r for r, _ in int8.dense(qv, allowed, 50)})
        scan_hits += len(want & set(top(held.scan(qv, int8.n_rows), allowed, 50)))
    return hits / (50 * len(qvecs)), scan_hits / (50 * len(qvecs))


def real_recall(folder: Path, limit: int) -> dict[str, float]:
    """Recall@50 of int8 on a SciFact index (all-MiniLM-L6-v2 vectors), SciFact's questions
    embedded by the same model in this process."""
    from metis_indexer.models.localmodel.encoder import Encoder

    exact, int8 = Index(folder), Index(folder, "int8")
    exact.load()
    int8.load()
    qvecs = list(Encoder.load().embed(queries(limit)))
    recall, scan_only = recall_at_50(exact, int8, qvecs)
    return {
        "recall": recall,
        "scan_only": scan_only,
        "chunks": exact.chunk_count,
        "dim": exact.dimensions,
        "asked": len(qvecs),
    }


def run(n: int, dim: int, repeats: int, rounds: int) -> dict[str, object]:
    """Each question is asked of every contender back to back, `rounds` times over, so a
    step and its baseline always run under the same load."""
    with tempfile.TemporaryDirectory(prefix="metis-bench-") as tmp:
        folder = Path(tmp)
        count_s, build_s = build(folder, n, dim)
        load = measure_load(folder)
        index = Index(folder)
        index.load()
        index.settle()  # as the service does once it has loaded
        bm25s_search, bm25s_build, tokenise_s = bm25s_baseline(n)
        qs = queries(repeats)
        rng = np.random.default_rng(11)
        qvecs = [v / np.linalg.norm(v) for v in rng.standard_normal((len(qs), dim), np.float32)]
        assert isinstance(index.vectors, FloatVectors)
        matrix = index.vectors.matrix[: index.n_rows]
        mask = index.alive[: index.n_rows]
        k = leg_size(5)
        names = ("bare_matvec", "dense", "bm25s", "keyword", "fuse", "hybrid")
        steps: dict[str, list[float]] = {name: [] for name in names}

        async def ask_all() -> None:
            for _ in range(rounds):
                for text, qv in zip(qs, qvecs, strict=True):
                    t = time.perf_counter()
                    top(matrix @ qv, mask, k)
                    steps["bare_matvec"].append((time.perf_counter() - t) * 1000)
                    t = time.perf_counter()
                    bm25s_search(text)
                    steps["bm25s"].append((time.perf_counter() - t) * 1000)
                    ranked = rank(index, SearchRequest(query=text), qv)
                    steps["dense"].append(ranked.took.dense)
                    steps["keyword"].append(ranked.took.keyword)
                    steps["fuse"].append(ranked.took.fuse)
                    steps["hybrid"].append(await hybrid_ms(index, text, qv))

        asyncio.run(ask_all())
        int8_load = measure_load(folder, "int8")  # from the store: the snapshot lacks codes
        int8_reload = measure_load(folder, "int8")  # from the snapshot that load saved
        int8 = Index(folder, "int8")
        int8.load()
        int8.settle()
        int8_steps = int8_figures(int8, qs, qvecs, matrix, mask, rounds)
        recall, scan_only = recall_at_50(index, int8, qvecs)
        del int8
        pass_steps, written = during_pass(index, qs, qvecs, n, rounds)
        return {
            "int8": {name: pct(values) for name, values in int8_steps.items()},
            "int8_load": int8_load,
            "int8_reload": int8_reload,
            "int8_recall": recall,
            "int8_scan_only": scan_only,
            "pass": {name: pct(values) for name, values in pass_steps.items()},
            "written_during": written,
            "chunks": index.chunk_count,
            "dim": dim,
            "build_s": build_s,
            "count_s": count_s,
            "bm25s_index_s": bm25s_build,
            "tokenise_s": tokenise_s,
            "load": load,
            "asked": len(qs) * rounds,
            "steps": {name: pct(values) for name, values in steps.items()},
        }


def int8_figures(
    int8: Index,
    qs: list[str],
    qvecs: list[np.ndarray],
    matrix: np.ndarray,
    mask: np.ndarray,
    rounds: int,
) -> dict[str, list[float]]:
    """The int8 index's scan, dense step and whole hybrid search against the bare float32
    product, in alternating blocks of INT8_BLOCK questions: a service holds one form or the
    other, so each is measured as it runs, under the same load. Asked back to back, the
    400 MB float32 product before each scan pushes the codes out of cache; that figure is
    kept too (`scan_after_float32`)."""
    held = int8.vectors
    assert isinstance(held, Int8Vectors)
    k = leg_size(5)
    names = ("bare_matvec", "scan", "dense", "hybrid", "scan_after_float32")
    steps: dict[str, list[float]] = {n: [] for n in names}
    asked = list(zip(qs, qvecs, strict=True))

    async def ask_all() -> None:
        for _ in range(rounds):
            for at in range(0, len(asked), INT8_BLOCK):
                block = asked[at : at + INT8_BLOCK]
                for _, qv in block:
                    t = time.perf_counter()
                    top(matrix @ qv, mask, k)
                    steps["bare_matvec"].append((time.perf_counter() - t) * 1000)
                for _, qv in block:
                    t = time.perf_counter()
                    held.scan(qv, int8.n_rows)
                    steps["scan"].append((time.perf_counter() - t) * 1000)
                for text, qv in block:
                    steps["dense"].append(rank(int8, SearchRequest(query=text), qv).took.dense)
                    steps["hybrid"].append(await hybrid_ms(int8, text, qv))
                for _, qv in block:
                    top(matrix @ qv, mask, k)
                    t = time.perf_counter()
                    held.scan(qv, int8.n_rows)
                    steps["scan_after_float32"].append((time.perf_counter() - t) * 1000)

    asyncio.run(ask_all())
    return steps


def during_pass(
    index: Index, qs: list[str], qvecs: list[np.ndarray], n: int, rounds: int
) -> tuple[dict[str, list[float]], int]:
    """Searches while a writer thread replaces documents, as a pass does (groups of GROUP
    per transaction, new vectors), against the same searches with the writer paused:
    the two alternate in blocks of questions, so both run under the same load."""
    rng = np.random.default_rng(13)
    files = texts(min(n, 20_000))
    writing, stop = threading.Event(), threading.Event()
    written = 0

    def writer() -> None:
        nonlocal written
        while not stop.is_set():
            for start in range(0, len(files), GROUP):
                writing.wait()
                if stop.is_set():
                    return
                group = []
                for name, parts in files[start : start + GROUP]:
                    chunks = [Chunk(name, ("Section",), p, None, 1, 0, 0) for p in parts]
                    record = FileRecord(
                        "perf", name, "md", 1, 1, "h", "indexed", "t", title=name, chunks=len(parts)
                    )
                    vectors = rng.standard_normal((len(parts), index.dimensions), np.float32)
                    group.append(Replacement(record, chunks, vectors))
                index.put_documents(group)
                written += len(group)

    names = ("idle_keyword", "pass_keyword", "idle_hybrid", "pass_hybrid")
    steps: dict[str, list[float]] = {name: [] for name in names}

    async def ask(label: str, block: list[tuple[str, np.ndarray]]) -> None:
        for text, qv in block:
            ranked = rank(index, SearchRequest(query=text), qv)
            steps[f"{label}_keyword"].append(ranked.took.keyword)

            async def embed(_: str, qv: np.ndarray = qv) -> np.ndarray:
                return qv

            answer = await search(index, SearchRequest(query=text), Models(embed=embed), "")
            steps[f"{label}_hybrid"].append(answer.took.total - answer.took.embed)

    async def alternate() -> None:
        pairs = list(zip(qs, qvecs, strict=True))
        for _ in range(rounds):
            for i in range(0, len(pairs), 25):
                block = pairs[i : i + 25]
                writing.clear()
                await asyncio.to_thread(index.settle)  # what the pass's end does
                await ask("idle", block)
                writing.set()
                await ask("pass", block)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        asyncio.run(alternate())
    finally:
        stop.set()
        writing.set()
        thread.join()
    return steps, written


def bm25s_baseline(n: int) -> tuple[Callable[[str], object], float, float]:
    """bm25s over the same texts, tokenised the same way, retrieving 50; timed from the
    question's text (tokenising, word ids, scores, top 50), as the keyword step is. Also
    how long its indexing took, and tokenising the texts before it (which it is given)."""
    import bm25s

    passages = [p for _, parts in texts(n) for p in parts]
    t = time.perf_counter()
    corpus = [tokens.words(p) for p in passages]
    tokenise_s = time.perf_counter() - t
    t = time.perf_counter()
    retriever = bm25s.BM25(k1=1.2, b=0.75)
    vocab: dict[str, int] = {}
    ids = [[vocab.setdefault(w, len(vocab)) for w in doc] for doc in corpus]
    retriever.index(bm25s.tokenization.Tokenized(ids=ids, vocab=vocab), show_progress=False)
    build_s = time.perf_counter() - t
    everyone = np.ones(len(corpus), dtype=bool)

    def ask(question: str) -> object:
        q_ids = [vocab[w] for w in tokens.words(question) if w in vocab]
        return top(retriever.get_scores(q_ids), everyone, 50) if q_ids else []

    return ask, build_s, tokenise_s


async def hybrid_ms(index: Index, text: str, qv: np.ndarray) -> float:
    """A whole hybrid search's milliseconds, the question's vector given (no model call)."""

    async def embed_as(_: str) -> np.ndarray:
        return qv

    answer = await search(index, SearchRequest(query=text), Models(embed=embed_as), "")
    return answer.took.total - answer.took.embed


def _step_rows(steps: dict[str, tuple[float, float]], names: dict[str, str]) -> list[str]:
    """A row a step: its label, p50 and p95 in milliseconds."""
    return [
        f"| {label} | {steps[key][0]:.2f} | {steps[key][1]:.2f} |" for key, label in names.items()
    ]


def report(r: dict[str, object]) -> str:
    steps: dict[str, tuple[float, float]] = r["steps"]  # type: ignore[assignment]
    load: dict[str, float] = r["load"]  # type: ignore[assignment]
    chunks = int(r["chunks"])  # type: ignore[arg-type]
    bare, dense = steps["bare_matvec"][0], steps["dense"][0]
    kw, bm = steps["keyword"][0], steps["bm25s"][0]
    per_chunk = load["rss_bytes"] / chunks
    passing: dict[str, tuple[float, float]] = r["pass"]  # type: ignore[assignment]
    build_s, bm25s_s = float(r["build_s"]), float(r["bm25s_index_s"])  # type: ignore[arg-type]
    build_ratio = build_s / bm25s_s
    count_s = float(r["count_s"])  # type: ignore[arg-type]
    fair = (count_s + build_s) / (bm25s_s + float(r["tokenise_s"]))  # type: ignore[arg-type]
    during = passing["pass_hybrid"][0] / passing["idle_hybrid"][0]
    lines = [
        f"# Search benchmark — {dt.date.today()} on {platform.node()} "
        f"({os.cpu_count()} cores, Python {platform.python_version()}, numpy {np.__version__})",
        "",
        f"{chunks:,} chunks of real text from shared/data/perf, {r['dim']}-dimensional random "
        f"unit vectors; {r['asked']} questions (SciFact claims), each asked of a step and its "
        "baseline back to back; model calls excluded.",
        "",
        "| step | p50 ms | p95 ms |",
        "|---|---|---|",
    ]
    names = {
        "bare_matvec": "baseline: bare numpy matrix @ vector (+ top 50)",
        "dense": "dense step",
        "bm25s": "baseline: bm25s get_scores (+ top 50)",
        "keyword": "keyword step",
        "fuse": "fusion",
        "hybrid": "whole hybrid search (no model calls; texts, snippets, citations)",
    }
    lines += _step_rows(steps, names)
    lines += [
        "",
        "| target | measured | verdict |",
        "|---|---|---|",
        f"| dense step ≤ 1.2 × bare product | {dense / bare:.2f} × | "
        f"{'met' if dense <= 1.2 * bare else 'MISSED'} |",
        f"| keyword step ≤ bm25s | {kw / bm:.2f} × bm25s | {'met' if kw <= bm else 'MISSED'} |",
        f"| memory ≤ 5 KB per chunk at {r['dim']:,} dims | {per_chunk / 1024:.2f} KiB per chunk "
        f"({load['rss_bytes'] / 2**20:.0f} MiB resident after load) | "
        f"{'met' if per_chunk <= 5 * 1024 else 'MISSED'} |",
        f"| load of {chunks:,} chunks ≤ 10 s | {load['load_s']:.2f} s | "
        f"{'met' if load['load_s'] <= 10 else 'MISSED'} |",
        f"| index build ≤ 2 × bm25s indexing | {build_ratio:.2f} × ({r['build_s']:.1f} s from "
        f"counted words, {BUILD_GROUP} documents a transaction: SQLite, memory; bm25s "
        f"{r['bm25s_index_s']:.1f} s from tokens) | "
        f"{'met' if build_ratio <= 2 else 'MISSED'} |",
        f"| searches during a pass ≤ 2 × idle (p50, whole hybrid search) | {during:.2f} × "
        f"({passing['pass_hybrid'][0]:.2f} ms vs {passing['idle_hybrid'][0]:.2f} ms) | "
        f"{'met' if during <= 2 else 'MISSED'} |",
        "",
        f"Counting the chunks' words took {count_s:.1f} s before the build (a pass counts them "
        f"in its reader workers); tokenising the same texts for bm25s {r['tokenise_s']:.1f} s. "
        f"Both included: (counting + build) / (tokenising + bm25s) = {fair:.2f} ×.",
        "",
        f"During a pass ({r['written_during']:,} documents replaced by a writer thread, "
        f"{GROUP} per transaction, while searches ran), against idle blocks of the same "
        "questions alternating with them:",
        "",
        "| step | idle p50 ms | during a pass p50 ms | p95 idle / pass |",
        "|---|---|---|---|",
        f"| keyword step | {passing['idle_keyword'][0]:.2f} | {passing['pass_keyword'][0]:.2f} | "
        f"{passing['idle_keyword'][1]:.2f} / {passing['pass_keyword'][1]:.2f} |",
        f"| whole hybrid search | {passing['idle_hybrid'][0]:.2f} | "
        f"{passing['pass_hybrid'][0]:.2f} | "
        f"{passing['idle_hybrid'][1]:.2f} / {passing['pass_hybrid'][1]:.2f} |",
    ]
    return "\n".join(lines + int8_report(r)) + "\n"


def int8_report(r: dict[str, object]) -> list[str]:
    steps: dict[str, tuple[float, float]] = r["int8"]  # type: ignore[assignment]
    load: dict[str, float] = r["int8_load"]  # type: ignore[assignment]
    reload: dict[str, float] = r["int8_reload"]  # type: ignore[assignment]
    chunks = int(r["chunks"])  # type: ignore[arg-type]
    per_chunk = load["rss_bytes"] / chunks
    scan = steps["scan"][0] / steps["bare_matvec"][0]
    recall = float(r["int8_recall"])  # type: ignore[arg-type]
    lines = [
        "",
        "## int8 vectors",
        "",
        "The same index loaded with `vectors: int8`: int8 codes in memory scanned with "
        "numkong, the best 400 rescored exactly from the float32 file (memory-mapped); the "
        f"questions asked of it and of the bare float32 product in alternating blocks of "
        f"{INT8_BLOCK} (a service holds one form or the other).",
        "",
        "| step | p50 ms | p95 ms |",
        "|---|---|---|",
    ]
    names = {
        "bare_matvec": "baseline: bare numpy float32 matrix @ vector (+ top 50)",
        "scan": "int8 scan (every row's approximate score)",
        "dense": "int8 dense step (scan, top 400, exact rescoring, top 50)",
        "hybrid": "int8 whole hybrid search (no model calls)",
        "scan_after_float32": "int8 scan, each right after a float32 product (codes out of cache)",
    }
    lines += _step_rows(steps, names)
    lines += [
        "",
        "| target | measured | verdict |",
        "|---|---|---|",
        f"| scan ≤ 0.4 × the float32 bare product | {scan:.2f} × | "
        f"{'met' if scan <= 0.4 else 'MISSED'} (right after a float32 product: "
        f"{steps['scan_after_float32'][0] / steps['bare_matvec'][0]:.2f} ×) |",
        f"| recall@50 vs exact float32 ≥ 0.99, random vectors | {recall:.4f} (scan alone, "
        f"no rescoring: {float(r['int8_scan_only']):.4f}) | "  # type: ignore[arg-type]
        f"{'met' if recall >= 0.99 else 'MISSED'} |",
    ]
    real: dict[str, float] | None = r.get("real")  # type: ignore[assignment]
    if real is not None:
        lines.append(
            f"| recall@50 vs exact float32 ≥ 0.99, SciFact all-MiniLM-L6-v2 vectors "
            f"({int(real['chunks']):,} chunks × {int(real['dim'])}, {int(real['asked'])} "
            f"questions) | {real['recall']:.4f} (scan alone: {real['scan_only']:.4f}) | "
            f"{'met' if real['recall'] >= 0.99 else 'MISSED'} |"
        )
    lines += [
        f"| ≤ 2 KB per chunk resident at {r['dim']:,} dims | {per_chunk / 1024:.2f} KiB per chunk "
        f"({load['rss_bytes'] / 2**20:.0f} MiB resident after load) | "
        f"{'met' if per_chunk <= 2 * 1024 else 'MISSED'} |",
        f"| load of {chunks:,} chunks (int8), from the store (saving a snapshot) | "
        f"{load['load_s']:.2f} s | — |",
        f"| load of {chunks:,} chunks (int8), from that snapshot | "
        f"{reload['load_s']:.2f} s ({reload['rss_bytes'] / chunks / 1024:.2f} KiB per chunk "
        "resident) | — |",
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--real", type=Path, help="a SciFact index folder (bench/scifact.py --workdir W: W/index)"
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--million", action="store_true", help="int8 figures only, of an index kept in --workdir"
    )
    parser.add_argument("--workdir", type=Path, help="where --million keeps its index")
    args = parser.parse_args()
    if args.million:
        if args.workdir is None:
            parser.error("--million needs --workdir")
        figures = million(args.workdir, args.chunks, args.dim, args.queries, args.rounds)
        text = million_report(figures)
        args.out = args.out or Path("bench/results/search-million.md")
    else:
        figures = run(args.chunks, args.dim, args.queries, args.rounds)
        if args.real is not None:
            figures["real"] = real_recall(args.real, args.queries)
        text = report(figures)
        args.out = args.out or Path("bench/results/search.md")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
