"""The specs both enforcement layers refuse, in one table: the API server's CRD
(tests/kube/test_operator_crd.py) and the operator's own check, which never trusts a
CRD it did not install (tests/operator/test_spec.py). Each says the field in its words."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]

GOOD: dict[str, Any] = {
    "sources": [{"drive": "docs", "path": "handbook"}, {"drive": "runbooks"}],
    "embedding": {"deployment": "bge-m3"},
}


def spec(**changes: Any) -> dict[str, Any]:
    """GOOD with some fields replaced."""
    out = copy.deepcopy(GOOD)
    out.update(changes)
    return out


def _examples() -> list[tuple[str, dict[str, Any]]]:
    """The KnowledgeBases of manifests/examples, by file."""
    found = []
    for path in sorted((ROOT / "manifests/examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "KnowledgeBase":
                found.append((str(path.relative_to(ROOT)), doc["spec"]))
    return found


ACCEPTED: list[tuple[str, dict[str, Any]]] = [
    ("GOOD", GOOD),
    *_examples(),
    (
        "edges",
        spec(
            sources=[{"drive": "docs", "path": "hb"}, {"drive": "docs", "path": "hb2"}]
            + [{"drive": f"d{i}"} for i in range(14)],
            rescan_seconds=0,
            chunking={"size": 4000, "overlap": 1999},
            placement={"cpu_cores": 64, "memory_gb": 256, "labels": {"metis.io/pool": "cpu"}},
        ),
    ),
    (
        "every-field",
        spec(
            embedding={"deployment": "bge-m3", "query_prefix": "query: ", "document_prefix": ""},
            reranker={"deployment": "bge-reranker", "query_prefix": "q: "},
            placement={"cpu_cores": 4, "memory_gb": 16, "machines": ["node-1", "node-2"]},
            replicas=3,
            vectors="int8",
            rescan_seconds=3600,
        ),
    ),
    (
        "flux-sources",
        spec(
            sources=[
                {"drive": "docs"},
                {"flux": {"kind": "GitRepository", "name": "handbook"}, "path": "docs"},
                {"flux": {"kind": "GitRepository", "name": "handbook"}, "path": "runbooks"},
                {"flux": {"kind": "Bucket", "name": "policies"}},
                {"flux": {"kind": "OCIRepository", "name": "manuals.v2"}},
            ]
        ),
    ),
]
"""Specs the project shows or its tests run, each taken by both layers: the CRD keeps each
as written (tests/kube/test_operator_crd.py) and the operator's models give each back
unchanged (tests/operator/test_crd_changes.py)."""


@dataclasses.dataclass(frozen=True)
class Refused:
    id: str
    name: str
    body: dict[str, Any]
    crd: str
    """Words of the API server's answer."""
    operator: str | None = None
    """Words of the operator's SpecError; None: the same as the API server's."""
    by_operator: bool = True
    """False: the API server refuses it, the operator takes it (an unknown field, which
    reaches the operator only from a newer CRD: ignored, and said in the warnings)."""


OVERLAP = "spec.sources: two sources of one name may not overlap"
ONE_PLACE = "name either a drive or a flux source object"
GIT = {"kind": "GitRepository", "name": "handbook"}
TABLE = [
    Refused(
        "name-starts-with-dash",
        "-handbook",
        GOOD,
        "metadata.name",
        "metadata.name '-handbook' must be lowercase",
    ),
    Refused("name-ends-with-dash", "handbook-", GOOD, "metadata.name", "metadata.name"),
    Refused("name-upper", "Handbook", GOOD, "metadata.name", "metadata.name"),
    Refused(
        "name-41",
        "h" * 41,
        GOOD,
        "metadata.name must be at most 40 characters",
        "at most 40 characters",
    ),
    Refused(
        "no-source",
        "hb",
        spec(sources=[]),
        "spec.sources",
        "spec.sources: List should have at least 1",
    ),
    Refused(
        "17-sources",
        "hb",
        spec(sources=[{"drive": f"d{i}"} for i in range(17)]),
        "spec.sources",
        "spec.sources: List should have at most 16",
    ),
    Refused(
        "dotdot-part",
        "hb",
        spec(sources=[{"drive": "docs", "path": "a/../b"}]),
        "spec.sources[0].path",
        "spec.sources[0].path: must be a folder of the drive",
    ),
    Refused(
        "dot-part",
        "hb",
        spec(sources=[{"drive": "docs", "path": "./a"}]),
        "spec.sources[0].path",
        "spec.sources[0].path: must be a folder of the drive",
    ),
    Refused(
        "empty-part",
        "hb",
        spec(sources=[{"drive": "docs", "path": "a//b"}]),
        "spec.sources[0].path",
        "spec.sources[0].path: must be a folder of the drive",
    ),
    Refused(
        "absolute-path",
        "hb",
        spec(sources=[{"drive": "docs", "path": "/etc"}]),
        "spec.sources[0].path",
        "spec.sources[0].path: must be a folder of the drive",
    ),
    Refused(
        "nested-sources",
        "hb",
        spec(sources=[{"drive": "docs", "path": "hb"}, {"drive": "docs", "path": "hb/hr"}]),
        OVERLAP,
        "spec.sources[0] and spec.sources[1] overlap",
    ),
    Refused(
        "whole-drive-and-folder",
        "hb",
        spec(sources=[{"drive": "docs"}, {"drive": "x"}, {"drive": "docs", "path": "a"}]),
        OVERLAP,
        "spec.sources[0] and spec.sources[2] overlap",
    ),
    Refused(
        "same-source-twice",
        "hb",
        spec(sources=[{"drive": "docs"}, {"drive": "docs"}]),
        OVERLAP,
        "spec.sources[0] and spec.sources[1] overlap",
    ),
    Refused(
        "drive-and-flux",
        "hb",
        spec(sources=[{"drive": "docs", "flux": GIT}]),
        ONE_PLACE,
        f"spec.sources[0]: {ONE_PLACE}",
    ),
    Refused(
        "neither-drive-nor-flux",
        "hb",
        spec(sources=[{"drive": "docs"}, {"path": "handbook"}]),
        ONE_PLACE,
        f"spec.sources[1]: {ONE_PLACE}",
    ),
    Refused(
        "flux-kind-unknown",
        "hb",
        spec(sources=[{"flux": {"kind": "HelmRepository", "name": "charts"}}]),
        "spec.sources[0].flux.kind",
    ),
    Refused(
        "flux-named-as-a-drive",
        "hb",
        spec(sources=[{"drive": "handbook"}, {"flux": GIT}]),
        OVERLAP,
        "spec.sources[0] and spec.sources[1] are both named handbook",
    ),
    Refused("chunk-199", "hb", spec(chunking={"size": 199}), "spec.chunking.size"),
    Refused("chunk-4001", "hb", spec(chunking={"size": 4001}), "spec.chunking.size"),
    Refused(
        "overlap-half",
        "hb",
        spec(chunking={"size": 400, "overlap": 300}),
        "spec.chunking.overlap (300) must be less than half of spec.chunking.size (400)",
    ),
    # The CRD cannot tell an overlap set to 200 from its default: only the operator can.
    Refused(
        "overlap-200-of-400",
        "hb",
        spec(chunking={"size": 400, "overlap": 200}),
        "spec.chunking.overlap (200, its default when not set) must be less than half of "
        "spec.chunking.size (400)",
        "spec.chunking.overlap (200) must be less than half of spec.chunking.size (400)",
    ),
    Refused(
        "overlap-default-size",
        "hb",
        spec(chunking={"overlap": 600}),
        "spec.chunking.overlap (600) must be less than half of spec.chunking.size (1200)",
    ),
    Refused(
        "overlap-not-set",
        "hb",
        spec(chunking={"size": 300}),
        "spec.chunking.overlap (200, its default when not set) must be less than half of "
        "spec.chunking.size (300)",
    ),
    Refused("cpu-0", "hb", spec(placement={"cpu_cores": 0}), "spec.placement.cpu_cores"),
    Refused("cpu-65", "hb", spec(placement={"cpu_cores": 65}), "spec.placement.cpu_cores"),
    Refused("mem-0", "hb", spec(placement={"memory_gb": 0}), "spec.placement.memory_gb"),
    Refused("mem-257", "hb", spec(placement={"memory_gb": 257}), "spec.placement.memory_gb"),
    Refused(
        "rescan-9", "hb", spec(rescan_seconds=9), "spec.rescan_seconds", "spec.rescan_seconds: is 9"
    ),
    Refused("rescan-86401", "hb", spec(rescan_seconds=86_401), "spec.rescan_seconds"),
    Refused("rescan-negative", "hb", spec(rescan_seconds=-1), "spec.rescan_seconds"),
    Refused("no-embedding-model", "hb", spec(embedding={}), "spec.embedding.deployment"),
    Refused(
        "model-not-a-service-name",
        "hb",
        spec(embedding={"deployment": "BGE_M3"}),
        "spec.embedding.deployment",
    ),
    Refused(
        "label-value",
        "hb",
        spec(placement={"labels": {"pool": "has space"}}),
        "spec.placement.labels.pool",
        "spec.placement.labels",
    ),
    Refused(
        "label-key", "hb", spec(placement={"labels": {"bad key": "x"}}), "spec.placement.labels"
    ),
    Refused("machine", "hb", spec(placement={"machines": ["Node_1"]}), "spec.placement.machines"),
    Refused(
        "vectors-int4",
        "hb",
        spec(vectors="int4"),
        "spec.vectors",
        "spec.vectors: Input should be 'float32' or 'int8'",
    ),
    Refused("unknown-field", "hb", spec(chunking={"sise": 800}), "sise", by_operator=False),
]


def params(layer: str) -> list[Any]:
    """(name, body, words) for `layer` ("crd" or "operator"), one param a refused spec."""
    words = {"crd": lambda r: r.crd, "operator": lambda r: r.operator or r.crd}[layer]
    return [
        pytest.param(r.name, r.body, words(r), id=r.id)
        for r in TABLE
        if layer == "crd" or r.by_operator
    ]
