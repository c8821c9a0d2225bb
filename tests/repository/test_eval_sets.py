"""The evaluation sets `bench/quality.py` scores (issue 28) and its scoring: each set well
formed and answerable from its corpus, the figures and the noise as defined."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from metis_indexer.ingest.readers import kind_of

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import quality  # noqa: E402

SETS = sorted(p for p in quality.SETS.iterdir() if (p / "corpus.txt").exists())


def test_there_are_sets_of_long_documents_of_other_kinds_than_scifact() -> None:
    assert {p.name for p in SETS} >= {"cloud-native-docs", "python-peps", "office-files"}
    assert quality.PERF.is_dir(), quality.PERF


@pytest.mark.parametrize("folder", SETS, ids=lambda p: p.name)
def test_a_set_is_well_formed_and_answerable_from_its_corpus(folder: Path) -> None:
    corpus = quality.read_corpus(folder)
    questions = quality.read_questions(folder)
    assert len(corpus) == len(set(corpus)) and corpus == sorted(corpus)
    missing = [d for d in corpus if not (quality.PERF / d).is_file()]
    assert not missing, missing
    unread = [d for d in corpus if kind_of(d) is None]
    assert not unread, f"the indexer reads no such kind: {unread}"
    assert len(questions) >= 30
    assert len({q.id for q in questions}) == len(questions)
    kinds = [q.kind for q in questions]
    assert kinds.count("term") >= 10 and kinds.count("meaning") >= 10
    outside = {d for q in questions for d in q.expected} - set(corpus)
    assert not outside, outside
    header = (folder / "README.md").read_text()
    assert "written" in header and "tuned" in header, "the header says how it was written"


def test_the_multilingual_set_is_scored_too() -> None:
    names = [name for c in quality.corpora() for name in c.sets]
    assert names[:2] == ["scifact-train", "scifact-test"]
    assert "multilingual" in names and {p.name for p in SETS} <= set(names)


def test_ndcg_recall_and_mrr_score_documents_in_rank_order() -> None:
    relevant = {"a": 2, "b": 1}
    assert quality.ndcg(["a", "b", "x"], relevant) == pytest.approx(1.0)
    swapped = (1 + 2 / math.log2(3)) / (2 + 1 / math.log2(3))
    assert quality.ndcg(["b", "a"], relevant) == pytest.approx(swapped)
    assert quality.recall(["x", "b"], relevant) == 0.5
    assert quality.mrr(["x", "y", "b"], relevant) == pytest.approx(1 / 3)
    assert quality.mrr([f"x{i}" for i in range(10)] + ["a"], relevant) == 0.0


def test_the_noise_is_the_spread_over_question_subsets() -> None:
    assert quality.noise([0.5] * 40) == 0.0
    spread = quality.noise([0.0, 1.0] * 20)
    assert 0.1 < spread < 0.2  # 1.96 · 0.5 / √40 ≈ 0.155
    assert quality.noise([0.0, 1.0] * 20) == spread, "seeded: the same every run"


def test_a_fall_beyond_the_earlier_noise_is_marked() -> None:
    def run(hybrid: float, noise: float) -> dict:
        figures = {
            m: v for metric in quality.METRICS for m, v in ((metric, hybrid), (metric + "±", noise))
        }
        return {"s": {"questions": 30, "modes": dict.fromkeys(quality.MODES, figures)}}

    [_, _, *rows] = quality.table(run(0.80, 0.01), before=run(0.85, 0.06))
    assert all("✗" not in row for row in rows), "a fall within the noise"
    [_, _, *rows] = quality.table(run(0.80, 0.01), before=run(0.85, 0.02))
    assert all("0.850 → 0.800 ✗" in row for row in rows)
