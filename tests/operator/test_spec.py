"""The operator's own check of a spec (it never trusts a CRD it did not install), and
the indexer configuration a spec turns into."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from metis_operator import spec as spec_mod
from metis_operator.spec import SpecError

GOOD: dict[str, Any] = {
    "sources": [{"drive": "docs", "path": "handbook"}, {"drive": "runbooks"}],
    "embedding": {"deployment": "bge-m3"},
}


def spec(**changes: Any) -> dict[str, Any]:
    out = copy.deepcopy(GOOD)
    out.update(changes)
    return out


def refused(body: dict[str, Any], name: str = "handbook") -> str:
    with pytest.raises(SpecError) as e:
        spec_mod.parse(name, body)
    return str(e.value)


def test_defaults_are_the_specs() -> None:
    s = spec_mod.parse("handbook", GOOD)
    assert (s.chunking.size, s.chunking.overlap, s.rescan_seconds) == (1200, 200, 60)
    assert (s.placement.cpu_cores, s.placement.memory_gb) == (1, 2)
    assert s.reranker is None and s.drives == ["docs", "runbooks"]


@pytest.mark.parametrize(
    ("name", "body", "words"),
    [
        pytest.param("-hb", GOOD, "metadata.name '-hb' must be lowercase", id="name-dash"),
        pytest.param("Handbook", GOOD, "metadata.name", id="name-upper"),
        pytest.param("h" * 41, GOOD, "at most 40 characters", id="name-41"),
        pytest.param(
            "hb", spec(sources=[]), "spec.sources: List should have at least 1", id="none"
        ),
        pytest.param(
            "hb",
            spec(sources=[{"drive": f"d{i}"} for i in range(17)]),
            "spec.sources: List should have at most 16",
            id="17",
        ),
        pytest.param(
            "hb",
            spec(sources=[{"drive": "docs", "path": "a/../b"}]),
            "spec.sources[0].path: must be a folder of the drive",
            id="dotdot",
        ),
        pytest.param(
            "hb",
            spec(sources=[{"drive": "docs", "path": "a//b"}]),
            "spec.sources[0].path",
            id="empty-part",
        ),
        pytest.param(
            "hb",
            spec(sources=[{"drive": "docs", "path": "/a"}]),
            "spec.sources[0].path",
            id="absolute",
        ),
        pytest.param(
            "hb",
            spec(sources=[{"drive": "docs", "path": "hb"}, {"drive": "docs", "path": "hb/hr"}]),
            "spec.sources[0] and spec.sources[1] overlap",
            id="nested",
        ),
        pytest.param(
            "hb",
            spec(sources=[{"drive": "docs"}, {"drive": "x"}, {"drive": "docs", "path": "a"}]),
            "spec.sources[0] and spec.sources[2] overlap",
            id="whole-drive",
        ),
        pytest.param("hb", spec(chunking={"size": 199}), "spec.chunking.size", id="size-199"),
        pytest.param("hb", spec(chunking={"size": 4001}), "spec.chunking.size", id="size-4001"),
        pytest.param(
            "hb",
            spec(chunking={"size": 400, "overlap": 200}),
            "spec.chunking.overlap (200) must be less than half of spec.chunking.size (400)",
            id="overlap",
        ),
        pytest.param(
            "hb",
            spec(chunking={"size": 300}),
            "spec.chunking.overlap (200, its default when not set) must be less than half of "
            "spec.chunking.size (300)",
            id="overlap-default",
        ),
        pytest.param(
            "hb",
            spec(chunking={"overlap": 600}),
            "spec.chunking.overlap (600) must be less than half of spec.chunking.size (1200)",
            id="overlap-default-size",
        ),
        pytest.param("hb", spec(placement={"cpu_cores": 65}), "spec.placement.cpu_cores", id="cpu"),
        pytest.param("hb", spec(placement={"memory_gb": 0}), "spec.placement.memory_gb", id="mem"),
        pytest.param(
            "hb", spec(placement={"labels": {"pool": "a b"}}), "spec.placement.labels", id="label"
        ),
        pytest.param(
            "hb", spec(placement={"machines": ["Node_1"]}), "spec.placement.machines", id="machine"
        ),
        pytest.param("hb", spec(rescan_seconds=9), "spec.rescan_seconds: is 9", id="rescan-9"),
        pytest.param("hb", spec(rescan_seconds=86_401), "spec.rescan_seconds", id="rescan-max"),
        pytest.param(
            "hb", spec(embedding={"deployment": "BGE"}), "spec.embedding.deployment", id="model"
        ),
        pytest.param("hb", spec(chunking={"sise": 1}), "spec.chunking.sise", id="unknown-field"),
    ],
)
def test_each_limit_is_refused_naming_the_field(
    name: str, body: dict[str, Any], words: str
) -> None:
    assert words in refused(body, name)


def test_every_problem_is_named_at_once() -> None:
    said = refused(spec(rescan_seconds=5, placement={"cpu_cores": 0}))
    assert "spec.rescan_seconds" in said and "spec.placement.cpu_cores" in said


def test_the_edges_are_accepted() -> None:
    body = spec(
        sources=[{"drive": "docs", "path": "hb"}, {"drive": "docs", "path": "hb2"}]
        + [{"drive": f"d{i}"} for i in range(14)],
        rescan_seconds=0,
        chunking={"size": 4000, "overlap": 1999},
        placement={"cpu_cores": 64, "memory_gb": 256, "labels": {"metis.io/pool": "cpu"}},
    )
    assert len(spec_mod.parse("h" * 40, body).sources) == 16


def test_the_configuration_mounts_drives_and_reaches_models_by_url() -> None:
    s = spec_mod.parse("handbook", spec(
        reranker={"deployment": "rr", "query_prefix": "q: "},
        embedding={"deployment": "bge-m3", "document_prefix": ""},
        placement={"cpu_cores": 8},
    ))  # fmt: skip
    config = spec_mod.to_indexer_config(
        "handbook", s, port=7700, embedding_url="http://bge-m3.ns.svc:80",
        reranker_url="http://rr.ns.svc:80", revisions={"docs": "r1", "elsewhere": "r9"},
    )  # fmt: skip
    assert [(x.drive, x.root, x.path) for x in config.sources] == [
        ("docs", Path("/drives/docs"), "handbook"),
        ("runbooks", Path("/drives/runbooks"), None),
    ]
    assert config.index_dir == Path("/index")
    assert (config.host, config.port, config.workers) == ("0.0.0.0", 7700, 8)
    assert config.embedding is not None and config.embedding.url == "http://bge-m3.ns.svc:80"
    # Unset: the indexer picks the model's own; set to "": none.
    assert (config.embedding.query_prefix, config.embedding.document_prefix) == (None, "")
    assert config.embedding.name == "bge-m3"
    assert config.reranker is not None and config.reranker.query_prefix == "q: "
    assert config.revisions == {"docs": "r1"}  # only the base's own drives


def test_one_core_still_gets_two_reader_workers() -> None:
    s = spec_mod.parse("handbook", GOOD)
    config = spec_mod.to_indexer_config(
        "handbook", s, port=1, embedding_url="http://e", reranker_url=None, revisions={}
    )
    assert config.workers == 2 and config.reranker is None
