"""Retrieval quality as a cluster signal: pure decisions, no I/O.

A base's evaluation set (`.metis/evals.jsonl`) measures how well it finds what it should.
What changes that is how the base is built: its embedding model and its chunking. So each
evaluation records the retrieval settings it was made under, and when a base that was
evaluated becomes Ready under other settings — after the pass a change of model or
chunking asked for — the operator evaluates it again and compares the figures. A drop
beyond the tolerance (`METIS_QUALITY_TOLERANCE`) in recall@k or MRR sets the condition
`QualityRegressed` and posts a Warning Event naming both figures; figures that hold set
it False with a Normal Event. A base never evaluated has nothing to compare with and is
not evaluated by itself (`kubectl metis evaluate` gives it its first figures).

    judge(previous, current, tolerance) -> Judgement     (tested as a table)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from metis_operator.api.conditions import ConditionType
from metis_operator.api.status_types import Evaluation

CONDITION = ConditionType.QUALITY_REGRESSED

RETRIEVAL = "retrieval"
"""The key of `status.evaluation` naming the retrieval settings it was measured under."""


def retrieval(spec: Mapping[str, Any]) -> str:
    """What an evaluation depends on, as a sentence: `embedding minilm, chunks 1200/200`.
    Sources and the reranker are left out: new documents are not a regression, and the
    reranker is asked at search time (it changes no index)."""
    embedding = (spec.get("embedding") or {}).get("deployment", "?")
    chunking = spec.get("chunking") or {}
    return (
        f"embedding {embedding}, chunks {chunking.get('size', 1200)}/{chunking.get('overlap', 200)}"
    )


def due(current: str, evaluation: Evaluation | None, tried: str | None) -> bool:
    """Whether a Ready base running `current` settings is evaluated again: it has an
    evaluation, made under other settings (or before they were recorded), and `current`
    was not already tried and refused (its evaluation set gone)."""
    if evaluation is None or tried == current:
        return False
    return evaluation.retrieval != current


@dataclasses.dataclass(frozen=True)
class Judgement:
    """What an evaluation after a change means: the condition to set and the Event."""

    condition: dict[str, Any]
    """QualityRegressed (without lastTransitionTime: compose.merge_conditions adds it)."""
    event_type: str
    event_reason: str
    message: str

    @property
    def regressed(self) -> bool:
        return self.condition["status"] == "True"


def _figures(e: Mapping[str, Any]) -> str:
    return f"recall@{e['k']} {e['recall_at_k']:.3f}, MRR {e['mrr']:.3f}"


def judge(
    previous: Mapping[str, Any], current: Mapping[str, Any], tolerance: float, generation: int
) -> Judgement:
    """Compare `current` (an evaluation, with its `retrieval`) with `previous`, the last
    evaluation before it. A drop of more than `tolerance` in recall@k or in MRR
    regresses; a figure that rose or fell within it holds."""
    now = f"{_figures(current)} over {current['cases']} questions ({current[RETRIEVAL]})"
    was = f"{_figures(previous)} ({previous.get(RETRIEVAL, 'settings not recorded')})"
    recall_drop = previous["recall_at_k"] - current["recall_at_k"]
    mrr_drop = previous["mrr"] - current["mrr"]
    if round(max(recall_drop, mrr_drop), 9) > tolerance:  # 0.9 - 0.85 is 0.0500...04
        return _judgement(
            True,
            "Regressed",
            f"evaluation fell from {was} to {now}; tolerance {tolerance:g}",
            generation,
        )
    return _judgement(False, "Held", f"evaluation held: {now}, was {was}", generation)


def _judgement(regressed: bool, reason: str, message: str, generation: int) -> Judgement:
    condition = {
        "type": CONDITION,
        "status": "True" if regressed else "False",
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
    }
    if regressed:
        return Judgement(condition, "Warning", CONDITION, message)
    return Judgement(condition, "Normal", "Evaluated", message)
