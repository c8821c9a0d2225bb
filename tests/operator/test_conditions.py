"""The condition types, said once (`metis_operator.api.conditions`): what the operator sets
and what `kubectl explain` tells are the same list."""

from __future__ import annotations

from pathlib import Path

import yaml

from metis_operator.api.conditions import MEANING, ConditionType
from metis_operator.status import compose, quality

CRD = Path(__file__).resolve().parents[2] / "crds" / "knowledgebase.yaml"


def test_the_crd_names_and_explains_every_condition_type() -> None:
    doc = yaml.safe_load(CRD.read_text())
    status = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    conditions = status["properties"]["conditions"]
    named = conditions["items"]["properties"]["type"]["description"]
    for t in ConditionType:
        assert t.value in named, t
        assert f"{t.value}: {MEANING[t]}" in " ".join(conditions["description"].split()), t


def test_the_operator_sets_the_types_of_the_vocabulary() -> None:
    set_by_the_operator = {
        compose.READY,
        compose.RECONCILING,
        compose.STALLED,
        compose.PAUSED,
        compose.EMBEDDING_CONDITION,
        compose.RERANKER_CONDITION,
        compose.DRIVE_CONDITION,
        compose.RESTORED_CONDITION,
        quality.CONDITION,
    }
    assert set_by_the_operator == set(ConditionType)
    assert set(MEANING) == set(ConditionType), "each type has one meaning"
