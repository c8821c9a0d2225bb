"""quality.py's decisions as tables: when a base is evaluated again, and what the new
figures mean against the previous ones."""

from __future__ import annotations

from typing import Any

import pytest

from metis_operator.api.status_types import Evaluation
from metis_operator.status import quality

BEFORE = {
    "k": 10,
    "cases": 20,
    "recall_at_k": 0.9,
    "mrr": 0.8,
    "at": "2026-11-30T10:00:00Z",
    "retrieval": "embedding minilm, chunks 1200/200",
}
NOW = "embedding minilm, chunks 200/50"


def test_retrieval_names_the_model_and_the_chunking_with_their_defaults() -> None:
    spec = {"embedding": {"deployment": "bge-m3"}, "sources": [{"drive": "docs"}]}
    assert quality.retrieval(spec) == "embedding bge-m3, chunks 1200/200"
    spec["chunking"] = {"size": 400, "overlap": 50}
    spec["reranker"] = {"deployment": "bge-reranker"}
    assert quality.retrieval(spec) == "embedding bge-m3, chunks 400/50"


@pytest.mark.parametrize(
    ("evaluation", "tried", "due"),
    [
        (None, None, False),
        (BEFORE, None, True),
        ({**BEFORE, "retrieval": NOW}, None, False),
        ({k: v for k, v in BEFORE.items() if k != "retrieval"}, None, True),
        (BEFORE, NOW, False),
        (BEFORE, "embedding minilm, chunks 300/50", True),
    ],
    ids=[
        "never-evaluated",
        "other-settings",
        "same-settings",
        "settings-not-recorded",
        "refused-under-these-settings",
        "refused-under-others",
    ],
)
def test_due(evaluation: dict[str, Any] | None, tried: str | None, due: bool) -> None:
    typed = None if evaluation is None else Evaluation.model_validate(evaluation)
    assert quality.due(NOW, typed, tried) is due


def after(recall: float, mrr: float) -> dict[str, Any]:
    return {**BEFORE, "recall_at_k": recall, "mrr": mrr, "retrieval": NOW}


@pytest.mark.parametrize(
    ("current", "regressed"),
    [
        (after(0.9, 0.8), False),
        (after(0.95, 0.9), False),
        (after(0.85, 0.8), False),
        (after(0.84, 0.8), True),
        (after(0.9, 0.74), True),
        (after(0.5, 0.4), True),
    ],
    ids=[
        "same",
        "better",
        "recall-down-by-the-tolerance",
        "recall-down-beyond",
        "mrr-down-beyond",
        "both-down",
    ],
)
def test_judge(current: dict[str, Any], regressed: bool) -> None:
    j = quality.judge(BEFORE, current, tolerance=0.05, generation=3)
    assert j.regressed is regressed
    assert j.condition["type"] == "QualityRegressed"
    assert j.condition["observedGeneration"] == 3
    assert (j.condition["status"], j.condition["reason"], j.event_type, j.event_reason) == (
        ("True", "Regressed", "Warning", "QualityRegressed")
        if regressed
        else ("False", "Held", "Normal", "Evaluated")
    )
    assert j.condition["message"] == j.message


def test_a_regression_names_both_figures_and_both_settings() -> None:
    j = quality.judge(BEFORE, after(0.6, 0.55), tolerance=0.05, generation=2)
    assert j.message == (
        "evaluation fell from recall@10 0.900, MRR 0.800 (embedding minilm, chunks 1200/200) "
        "to recall@10 0.600, MRR 0.550 over 20 questions (embedding minilm, chunks 200/50); "
        "tolerance 0.05"
    )


def test_an_evaluation_without_recorded_settings_says_so() -> None:
    legacy = {k: v for k, v in BEFORE.items() if k != "retrieval"}
    j = quality.judge(legacy, after(0.9, 0.8), tolerance=0.05, generation=2)
    assert j.message.endswith("was recall@10 0.900, MRR 0.800 (settings not recorded)")
