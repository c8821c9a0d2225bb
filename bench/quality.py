"""Retrieval quality on every evaluation set, in one table: the check a change of scoring,
tokenising, chunking, fusion or prefixes lands with (issue 28).

The sets: BEIR SciFact (train and test splits; abstracts of one or two chunks), the
project's own sets over long documents of other kinds (`bench/sets/*/`: each a corpus
list under `../shared/data/perf`, paraphrased questions with their expected documents and
a README saying how it was written) and the multilingual set (`bench/multilingual/`).
Each corpus is indexed through the indexer's own pass (all-MiniLM-L6-v2 on the local
server, `metis models`); each question is searched in every mode as the API answers it
(top_k 30, no reranker) and scored by document in rank order (a document ranks where its
best chunk does): nDCG@10, recall@10 and MRR@10.

Noise: each figure's spread over question subsets, as the half-width of the 95 %
interval of 1,000 bootstrap resamples of the questions. With `--against` a run is printed
beside an earlier one (its `--json`), and a fall larger than the earlier run's noise is
marked ✗: a change may land only with no ✗ in its table.

    .venv/bin/python bench/quality.py [--sets scifact-train,python-peps] [--workdir DIR]
        [--json FILE] [--against FILE] [--out bench/results/quality.md]

`--workdir` keeps the corpora and indexes, so a second run (another version of the code,
`PYTHONPATH=<its indexer_image>`) embeds nothing again. Tune on scifact-train only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime as dt
import json
import math
import os
import platform
import random
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pydantic
from multilingual import HERE as MULTILINGUAL
from multilingual import load_questions as multilingual_questions
from scifact import load_split, model_server, write_corpus

from metis_indexer.config import IndexerConfig
from metis_indexer.schema import SearchRequest
from metis_indexer.search import hybrid as search
from metis_indexer.search.evaluation import ranked_documents
from metis_indexer.service.service import Indexer

BENCH = Path(__file__).resolve().parent
SETS = BENCH / "sets"
PERF = BENCH.parents[1] / "shared" / "data" / "perf"
MODES = ("keyword", "dense", "hybrid")
METRICS = ("ndcg@10", "recall@10", "mrr@10")
TOP_K = 30
RESAMPLES = 1000


class SetQuestion(pydantic.BaseModel):
    """One line of a project set's `questions.jsonl`."""

    model_config = pydantic.ConfigDict(extra="forbid")

    id: str
    question: str = pydantic.Field(min_length=1)
    expected: list[str] = pydantic.Field(min_length=1)
    kind: str = pydantic.Field(pattern="^(term|meaning)$")


def read_corpus(folder: Path) -> list[str]:
    """A set's documents: paths under `../shared/data/perf`, one a line, `#` for comments."""
    lines = (folder / "corpus.txt").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def read_questions(folder: Path) -> list[SetQuestion]:
    lines = (folder / "questions.jsonl").read_text().splitlines()
    return [SetQuestion.model_validate_json(line) for line in lines if line.strip()]


@dataclasses.dataclass
class Judged:
    """A question and its relevant documents (with grades), as the index names them."""

    id: str
    text: str
    relevant: dict[str, int]


@dataclasses.dataclass
class Corpus:
    """What one index is built from, and the sets of questions asked of it."""

    name: str
    fill: Callable[[Path], int]
    """Writes the corpus into a drive folder (leaving files already there) and counts it."""
    sets: dict[str, list[Judged]]


def scifact_corpus() -> Corpus:
    def judged(split: str) -> list[Judged]:
        queries, qrels = load_split(split)
        return [
            Judged(q, text, {f"scifact/{d}.md": r for d, r in qrels[q].items()})
            for q, text in queries.items()
        ]

    return Corpus(
        "scifact", write_corpus, {"scifact-train": judged("train"), "scifact-test": judged("test")}
    )


def copy_files(paths: Sequence[Path], names: Sequence[str]) -> Callable[[Path], int]:
    """A fill that copies the corpus into the work folder: a drive must hold its files
    (a link out of it is not followed), and the shared data stay read-only."""

    def fill(drive: Path) -> int:
        for path, name in zip(paths, names, strict=True):
            target = drive / name
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target)
        return len(paths)

    return fill


def project_corpus(folder: Path) -> Corpus:
    name, docs = folder.name, read_corpus(folder)
    questions = [
        Judged(q.id, q.question, {f"{name}/{d}": 1 for d in q.expected})
        for q in read_questions(folder)
    ]
    return Corpus(name, copy_files([PERF / d for d in docs], docs), {name: questions})


def multilingual_corpus() -> Corpus:
    docs = sorted(
        p.relative_to(MULTILINGUAL / "docs")
        for p in (MULTILINGUAL / "docs").rglob("*")
        if p.is_file()
    )
    questions = [
        Judged(f"{q.language}-{i}", q.question, {f"multilingual/{q.document}": 1})
        for i, q in enumerate(multilingual_questions(), start=1)
    ]
    return Corpus(
        "multilingual",
        copy_files([MULTILINGUAL / "docs" / d for d in docs], [str(d) for d in docs]),
        {"multilingual": questions},
    )


def corpora() -> list[Corpus]:
    project = [project_corpus(f) for f in sorted(SETS.iterdir()) if (f / "corpus.txt").exists()]
    return [scifact_corpus(), *project, multilingual_corpus()]


def ndcg(ranked: Sequence[str], relevant: dict[str, int], k: int = 10) -> float:
    dcg = sum(relevant.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranked[:k]))
    ideal = sorted(relevant.values(), reverse=True)[:k]
    return dcg / sum(r / math.log2(i + 2) for i, r in enumerate(ideal))


def recall(ranked: Sequence[str], relevant: dict[str, int], k: int = 10) -> float:
    wanted = {d for d, r in relevant.items() if r > 0}
    return len(wanted & set(ranked[:k])) / len(wanted)


def mrr(ranked: Sequence[str], relevant: dict[str, int], k: int = 10) -> float:
    return next((1 / i for i, d in enumerate(ranked[:k], 1) if relevant.get(d, 0) > 0), 0.0)


def scores(ranked: Sequence[str], relevant: dict[str, int]) -> dict[str, float]:
    return {
        "ndcg@10": ndcg(ranked, relevant),
        "recall@10": recall(ranked, relevant),
        "mrr@10": mrr(ranked, relevant),
    }


def noise(values: Sequence[float], resamples: int = RESAMPLES, seed: int = 28) -> float:
    """Half-width of the 95 % bootstrap interval of the mean over question resamples."""
    if len(values) < 2:
        return 0.0
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(rng.choices(values, k=n)) / n for _ in range(resamples))
    return (means[int(0.975 * resamples)] - means[int(0.025 * resamples)]) / 2


def summary(per_question: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, float]]:
    """Per mode: each metric's mean and noise (`<metric>±`)."""
    out: dict[str, dict[str, float]] = {}
    for mode, metrics in per_question.items():
        out[mode] = {}
        for metric, values in metrics.items():
            out[mode][metric] = sum(values) / len(values)
            out[mode][metric + "±"] = noise(values)
    return out


async def measure(corpus: Corpus, workdir: Path, embedding: str, wanted: set[str]) -> dict:
    """Index the corpus (once per work folder) and score each of its wanted sets."""
    drive = workdir / corpus.name / "drive"
    drive.mkdir(parents=True, exist_ok=True)
    documents = corpus.fill(drive)
    config = IndexerConfig(
        name=corpus.name,
        sources=[{"drive": corpus.name, "root": drive}],  # type: ignore[list-item]
        embedding={"url": embedding, "name": "all-MiniLM-L6-v2"},  # type: ignore[arg-type]
        index_dir=workdir / corpus.name / "index",
        rescan_seconds=0,
    )
    indexer = Indexer(config)
    started = time.monotonic()
    await indexer.start()
    while indexer.progress.state.phase != "ready":
        await asyncio.sleep(0.5)
    index_s = time.monotonic() - started
    embedder = indexer.configured.embedder
    assert embedder is not None
    results = {}
    for name, questions in corpus.sets.items():
        if name not in wanted:
            continue
        per_question: dict[str, dict[str, list[float]]] = {
            mode: {m: [] for m in METRICS} for mode in MODES
        }
        for q in questions:
            vector = await embedder.embed_query(q.text)

            async def embed(_: str, vector: list[float] = vector) -> list[float]:
                return vector

            for mode in MODES:
                answer = await search.search(
                    indexer.passes.index,
                    SearchRequest(query=q.text, top_k=TOP_K, mode=mode),
                    search.Models(embed=embed),
                    "",
                )
                for metric, value in scores(ranked_documents(answer), q.relevant).items():
                    per_question[mode][metric].append(value)
        results[name] = {
            "questions": len(questions),
            "documents": documents,
            "chunks": indexer.passes.index.chunk_count,
            "index_s": round(index_s, 1),
            "modes": summary(per_question),
        }
    await indexer.stop()
    return results


def table(results: dict, before: dict | None = None) -> list[str]:
    """Markdown rows: a figure per set and mode, `before → after` with `--against`."""
    head = "| set | questions | mode | nDCG@10 | recall@10 | MRR@10 | noise (nDCG) |"
    lines = [head, "|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        for mode in MODES:
            f = r["modes"][mode]
            was = (before or {}).get(name, {}).get("modes", {}).get(mode)
            cells = []
            for metric in METRICS:
                if was is None:
                    cells.append(f"{f[metric]:.3f}")
                    continue
                fall = was[metric] - f[metric]
                mark = " ✗" if fall > was[metric + "±"] else ""
                cells.append(f"{was[metric]:.3f} → {f[metric]:.3f}{mark}")
            lines.append(
                f"| {name} | {r['questions']} | {mode} | {' | '.join(cells)} | "
                f"±{f['ndcg@10±']:.3f} |"
            )
    return lines


def report(results: dict, before: dict | None, label: str) -> str:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=BENCH
    ).stdout.strip()
    lines = [
        f"# Retrieval quality on every set — {dt.date.today()} on {platform.node()} "
        f"({os.cpu_count()} cores), {label or commit}",
        "",
        "Each corpus indexed through the indexer's own pass (all-MiniLM-L6-v2, local server); "
        f"each question searched as the API answers (top_k {TOP_K}, no reranker) and scored "
        "by document in rank order. Noise: half-width of the 95 % bootstrap interval over "
        f"the questions ({RESAMPLES} resamples). ✗: a fall larger than the earlier run's noise.",
        "",
        *table(results, before),
        "",
        "| set | documents | chunks | index pass (s) |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {n} | {r['documents']:,} | {r['chunks']:,} | {r['index_s']:.0f} |"
        for n, r in results.items()
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", help="comma-separated set names (default: all)")
    parser.add_argument("--embedding", help="an embeddings server (default: start metis models)")
    parser.add_argument("--workdir", type=Path, help="keep the corpora and indexes here")
    parser.add_argument("--json", type=Path, help="write the figures here, for --against")
    parser.add_argument("--against", type=Path, help="an earlier run's --json: before → after")
    parser.add_argument("--label", default="", help="what this run measured (default: commit)")
    parser.add_argument("--out", type=Path, help="write the Markdown table here too")
    args = parser.parse_args()
    every = corpora()
    names = [n for c in every for n in c.sets]
    wanted = set(args.sets.split(",")) if args.sets else set(names)
    if unknown := wanted - set(names):
        parser.error(f"no set named {', '.join(sorted(unknown))}; sets: {', '.join(names)}")
    results: dict = {}
    with contextlib.ExitStack() as stack:
        workdir = args.workdir or Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="metis-quality-"))
        )
        url = args.embedding or stack.enter_context(model_server())
        for corpus in every:
            if wanted & set(corpus.sets):
                results.update(asyncio.run(measure(corpus, workdir, url, wanted)))
    before = json.loads(args.against.read_text()) if args.against else None
    text = report(results, before, args.label)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
