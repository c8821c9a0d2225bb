"""The drift check's decision: the cache against one LIST per kind, without I/O (its
LISTs: test_watching.py)."""

from __future__ import annotations

from typing import Any

import pytest

from metis_operator import drift

OURS = {"app.kubernetes.io/managed-by": "metis-operator"}


def child(name: str, base: str, version: str, ns: str = "team", **labels: str) -> dict[str, Any]:
    meta_labels = {**OURS, "app.kubernetes.io/instance": base, **labels}
    return {
        "metadata": {
            "name": name,
            "namespace": ns,
            "resourceVersion": version,
            "labels": meta_labels,
        }
    }


def test_only_the_operators_children_of_a_base_count() -> None:
    drive = {"metadata": {"name": "docs", "namespace": "team", "resourceVersion": "3"}}
    other = child("x", "handbook", "4", **{"app.kubernetes.io/managed-by": "helm"})
    mine = child("metis-handbook", "handbook", "5")
    assert drift.seen("ConfigMap", [drive, other, mine]) == {
        ("ConfigMap", "team", "metis-handbook"): ("5", ("team", "handbook"))
    }


@pytest.mark.parametrize(
    ("listed", "cached", "bases"),
    [
        ([child("metis-a", "a", "1")], [child("metis-a", "a", "1")], set()),
        ([child("metis-a", "a", "2")], [child("metis-a", "a", "1")], {("team", "a")}),
        ([child("metis-a", "a", "1")], [], {("team", "a")}),
        ([], [child("metis-a", "a", "1")], {("team", "a")}),
        (
            [child("metis-a", "a", "1"), child("metis-b", "b", "7", ns="wiki")],
            [child("metis-a", "a", "1"), child("metis-b", "b", "6", ns="wiki")],
            {("wiki", "b")},
        ),
    ],
    ids=["same", "newer-version", "missed-creation", "missed-deletion", "one-of-two"],
)
def test_drifted_bases(
    listed: list[dict[str, Any]], cached: list[dict[str, Any]], bases: set[tuple[str, str]]
) -> None:
    assert drift.drifted(drift.seen("Service", listed), drift.seen("Service", cached)) == bases


def test_the_same_name_in_two_kinds_is_two_children() -> None:
    listed = drift.seen("Service", [child("metis-a", "a", "1")])
    listed |= drift.seen("ConfigMap", [child("metis-a", "a", "2")])
    cached = drift.seen("Service", [child("metis-a", "a", "1")])
    cached |= drift.seen("ConfigMap", [child("metis-a", "a", "2")])
    assert drift.drifted(listed, cached) == set()
