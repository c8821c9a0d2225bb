"""The operator's own check of a spec (it never trusts a CRD it did not install), and
the indexer configuration a spec turns into."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from metis_operator.api.spec import SpecError, parse, to_indexer_config, unknown_fields
from tests.support import refused_specs
from tests.support.refused_specs import GOOD, spec


def refused(body: dict[str, Any], name: str = "handbook") -> str:
    with pytest.raises(SpecError) as e:
        parse(name, body)
    return str(e.value)


def test_defaults_are_the_specs() -> None:
    s = parse("handbook", GOOD)
    assert (s.chunking.size, s.chunking.overlap, s.rescan_seconds) == (1200, 200, 60)
    assert (s.placement.cpu_cores, s.placement.memory_gb) == (1, 2)
    assert s.vectors == "float32"
    assert s.reranker is None and s.drives == ["docs", "runbooks"]


@pytest.mark.parametrize(("name", "body", "words"), refused_specs.params("operator"))
def test_each_limit_is_refused_naming_the_field(
    name: str, body: dict[str, Any], words: str
) -> None:
    assert words in refused(body, name)


def test_a_field_of_a_newer_crd_is_ignored_and_named() -> None:
    """An operator rolled back under a newer CRD: the base runs as the fields it knows say
    (a new field's default is the older behaviour), never refused and never read as a
    removal; `unknown_fields` names what it leaves aside, for the base's warnings."""
    body = spec(
        sources=[{"drive": "docs", "exclude": ["drafts/"]}, {"drive": "wiki"}],
        chunking={"size": 800, "strategy": "headings"},
        placement={"labels": {"pool": "cpu"}},
        retention="keep",
    )
    parsed = parse("handbook", body)
    assert parse("handbook", spec(sources=[{"drive": "docs"}, {"drive": "wiki"}])).sources == (
        parsed.sources
    )
    assert parsed.chunking.size == 800 and parsed.placement.labels == {"pool": "cpu"}
    assert unknown_fields(body) == [
        "spec.sources[0].exclude",
        "spec.chunking.strategy",
        "spec.retention",
    ]
    assert unknown_fields(GOOD) == []


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
    assert len(parse("h" * 40, body).sources) == 16


def test_the_configuration_mounts_drives_and_reaches_models_by_url() -> None:
    s = parse(
        "handbook",
        spec(
            reranker={"deployment": "rr", "query_prefix": "q: "},
            embedding={"deployment": "bge-m3", "document_prefix": ""},
            placement={"cpu_cores": 8},
            vectors="int8",
        ),
    )
    config = to_indexer_config(
        "handbook",
        s,
        port=7700,
        embedding_url="http://bge-m3.ns.svc:80",
        reranker_url="http://rr.ns.svc:80",
        revisions={"docs": "r1", "elsewhere": "r9"},
    )
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
    assert config.vectors == "int8"


def test_one_core_still_gets_two_reader_workers() -> None:
    s = parse("handbook", GOOD)
    config = to_indexer_config(
        "handbook", s, port=1, embedding_url="http://e", reranker_url=None, revisions={}
    )
    assert config.workers == 2 and config.reranker is None


def test_the_bases_own_drive_is_not_a_source() -> None:
    body = {**GOOD, "sources": [{"drive": "docs"}, {"drive": "metis-handbook"}]}
    said = refused(body)
    assert said.startswith("spec.sources[1].drive: metis-handbook is the base's own drive")
    assert parse("other", body).drives == ["docs", "metis-handbook"]  # another base's name


def test_a_flux_source_is_fetched_by_the_indexer_at_its_artifacts_revision() -> None:
    s = parse(
        "handbook",
        spec(
            sources=[
                {"drive": "docs"},
                {"flux": {"kind": "GitRepository", "name": "wiki"}, "path": "handbook"},
            ]
        ),
    )
    assert s.drives == ["docs"] and [f.said for f in s.fluxes] == ["GitRepository wiki"]
    artifact = {
        "url": "http://source-controller.flux-system.svc.cluster.local./gitrepository/t/wiki/a.tar.gz",
        "digest": "sha256:" + "a" * 64,
        "revision": "main@sha1:" + "b" * 40,
    }
    config = to_indexer_config(
        "handbook",
        s,
        port=7700,
        embedding_url="http://e",
        reranker_url=None,
        revisions={"docs": "r1", "wiki": "not a claim's"},
        artifacts={"wiki": artifact},
    )
    wiki = config.sources[1]
    assert (wiki.drive, wiki.root, wiki.path) == ("wiki", Path("/index/artifacts/wiki"), "handbook")
    assert wiki.artifact is not None
    assert wiki.artifact.model_dump() == {**artifact, "origin": "GitRepository wiki"}
    assert config.revisions == {"docs": "r1"}
    assert config.all_revisions() == {"docs": "r1", "wiki": artifact["revision"]}


def test_one_name_is_one_flux_object() -> None:
    body = {
        **GOOD,
        "sources": [
            {"flux": {"kind": "GitRepository", "name": "wiki"}, "path": "a"},
            {"flux": {"kind": "Bucket", "name": "wiki"}, "path": "b"},
        ],
    }
    assert refused(body) == (
        "spec.sources[0] and spec.sources[1] are both named wiki: its documents are cited "
        "under the name, so one name is one drive or one flux source object"
    )
    body = {**GOOD, "sources": [{"flux": {"kind": "GitRepository", "name": "metis-handbook"}}]}
    assert refused(body).startswith("spec.sources[0].flux.name: metis-handbook is the base's own")
