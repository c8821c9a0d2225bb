"""A multilingual check: questions in Portuguese, German and Japanese (and English questions
over those documents) against short handbook pages written for it, in every mode.

The pages (`bench/multilingual/docs/<language>/`) are indexed with the indexer's own pass and
each question of `bench/multilingual/questions.jsonl` is searched in each mode (top_k 10, as
the API answers). Reports, per language and mode, recall@10 (its one relevant page among the
first ten results' documents) and MRR@10: with 24 pages, recall@10 alone says little.

    .venv/bin/python bench/multilingual.py [--embedding URL --model NAME] [--out FILE]

Without `--embedding`, the local all-MiniLM-L6-v2 server (`metis models`) is started. A word
is a run of letters and digits (`metis_indexer.index.tokens`), so a word of Japanese, written
without spaces, is a whole run of characters: by words, a Japanese question finds a page only
where it repeats one of those runs exactly.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import tempfile
import time
from pathlib import Path

import pydantic
from scifact import model_server

from metis_indexer.config import IndexerConfig
from metis_indexer.schema import SearchRequest
from metis_indexer.search import hybrid as search
from metis_indexer.search.evaluation import ranked_documents
from metis_indexer.service.service import Indexer

HERE = Path(__file__).resolve().parent / "multilingual"
MODES = ("keyword", "dense", "hybrid")


class Question(pydantic.BaseModel):
    language: str
    question: str
    document: str


def load_questions(path: Path = HERE / "questions.jsonl") -> list[Question]:
    return [Question.model_validate_json(line) for line in path.read_text().splitlines() if line]


def figures(found: dict[str, list[tuple[str, list[str]]]]) -> dict[str, dict[str, float]]:
    """recall@10 and MRR@10 of each mode, from (relevant page, ranked pages) per question."""
    out = {}
    for mode, answers in found.items():
        hits = [ranked.index(want) + 1 if want in ranked[:10] else 0 for want, ranked in answers]
        out[mode] = {
            "recall@10": sum(h > 0 for h in hits) / len(hits),
            "mrr@10": sum(1 / h for h in hits if h) / len(hits),
        }
    return out


async def run(workdir: Path, embedding: str, model: str) -> dict[str, dict[str, dict[str, float]]]:
    config = IndexerConfig(
        name="multilingual",
        sources=[{"drive": "docs", "root": HERE / "docs"}],  # type: ignore[list-item]
        embedding={"url": embedding, "name": model},  # type: ignore[arg-type]
        index_dir=workdir / "index",
        rescan_seconds=0,
    )
    indexer = Indexer(config)
    await indexer.start()
    deadline = time.monotonic() + 600
    while indexer.progress.state.phase != "ready" and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
    questions = load_questions()
    by_language: dict[str, dict[str, list[tuple[str, list[str]]]]] = {}
    assert indexer.configured.embedder is not None
    for q in questions:
        vec = await indexer.configured.embedder.embed_query(q.question)

        async def embed(_: str, vec=vec):
            return vec

        for mode in MODES:
            answer = await search.search(
                indexer.passes.index,
                SearchRequest(query=q.question, top_k=10, mode=mode),
                search.Models(embed=embed),
                "",
            )
            ranked = [d.removeprefix("docs/") for d in ranked_documents(answer)]
            for lang in (q.language, "all"):
                by_language.setdefault(lang, {m: [] for m in MODES})[mode].append(
                    (q.document, ranked)
                )
    await indexer.stop()
    by_language["all"] = by_language.pop("all")  # last, after the languages
    return {lang: figures(found) for lang, found in by_language.items()}


def report(model: str, results: dict[str, dict[str, dict[str, float]]]) -> str:
    counts: dict[str, int] = {}
    for q in load_questions():
        counts[q.language] = counts.get(q.language, 0) + 1
    counts["all"] = sum(counts.values())
    lines = [
        f"# Multilingual check — {dt.date.today()}, embedding model {model}",
        "",
        "recall@10 / MRR@10 per question language (`en→pt`: English questions over "
        "Portuguese pages).",
        "",
        "| language | questions | " + " | ".join(MODES) + " |",
        "|---|---|" + "---|" * len(MODES),
    ]
    for lang, by_mode in results.items():
        cells = [f"{by_mode[m]['recall@10']:.2f} / {by_mode[m]['mrr@10']:.2f}" for m in MODES]
        lines.append(f"| {lang} | {counts[lang]} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--embedding", help="an embeddings server (default: start metis models)")
    parser.add_argument("--model", default="all-MiniLM-L6-v2", help="its model's name")
    parser.add_argument("--out", type=Path, default=Path("bench/results/multilingual.md"))
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="metis-ml-")))
        url = args.embedding or stack.enter_context(model_server())
        results = asyncio.run(run(workdir, url, args.model))
    text = report(args.model, results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
