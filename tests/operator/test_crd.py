"""The CRD is generated from the api models (`make crd`): the committed file is what they
make, byte for byte, a structural schema, and it carries the limits of their one home
(`metis_indexer.limits`, which the spec model, the indexer's configuration, the chunker
and the sources read) with the same defaults. The API server's behaviour itself is
tested in tests/kube/test_operator_crd.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from metis_indexer import limits
from metis_operator.api import crd as crd_gen
from metis_operator.api import spec

CRD = Path(__file__).resolve().parents[2] / "crds" / "knowledgebase.yaml"


def test_the_committed_crd_is_what_the_models_make() -> None:
    assert CRD.read_text() == crd_gen.render(), "crds/knowledgebase.yaml is stale: run make crd"


def test_the_yaml_reads_back_as_the_document() -> None:
    """Folded sentences and quoted patterns read back as the strings the models hold."""
    assert yaml.safe_load(crd_gen.render()) == crd_gen.document()


def _nodes(node: dict[str, Any], where: str) -> list[tuple[str, dict[str, Any]]]:
    out = [(where, node)]
    for name, child in node.get("properties", {}).items():
        out += _nodes(child, f"{where}.{name}")
    for key in ("items", "additionalProperties"):
        if key in node:
            out += _nodes(node[key], f"{where}[{key}]")
    return out


def test_the_schema_is_structural() -> None:
    """Every node has its type and none of what a structural schema refuses."""
    for where, node in _nodes(crd_gen.schema(), "kb"):
        assert node.get("type") in ("object", "array", "string", "integer", "number"), where
        assert not {"$ref", "anyOf", "allOf", "oneOf", "nullable", "title"} & set(node), where


def test_a_key_no_schema_has_is_refused() -> None:
    with pytest.raises(ValueError, match="maxLenght"):
        crd_gen._ordered({"type": "string", "maxLenght": 3})


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    (version,) = crd["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]


def test_numeric_limits_and_defaults_match(schema: dict[str, Any]) -> None:
    chunking = schema["chunking"]["properties"]
    placement = schema["placement"]["properties"]
    assert (chunking["size"]["minimum"], chunking["size"]["maximum"]) == (
        limits.CHUNK_SIZE_MIN,
        limits.CHUNK_SIZE_MAX,
    )
    assert chunking["size"]["default"] == limits.CHUNK_SIZE_DEFAULT
    assert chunking["overlap"]["default"] == limits.CHUNK_OVERLAP_DEFAULT
    assert schema["chunking"]["default"] == {
        "size": limits.CHUNK_SIZE_DEFAULT,
        "overlap": limits.CHUNK_OVERLAP_DEFAULT,
    }
    assert (placement["cpu_cores"]["minimum"], placement["cpu_cores"]["maximum"]) == (
        spec.CPU_MIN,
        spec.CPU_MAX,
    )
    assert (placement["memory_gb"]["minimum"], placement["memory_gb"]["maximum"]) == (
        spec.MEMORY_MIN,
        spec.MEMORY_MAX,
    )
    assert schema["placement"]["default"] == {
        "cpu_cores": spec.CPU_DEFAULT,
        "memory_gb": spec.MEMORY_DEFAULT,
    }
    assert placement["machines"]["maxItems"] == spec.MACHINES_MAX
    rescan = schema["rescan_seconds"]
    assert (rescan["default"], rescan["maximum"]) == (limits.RESCAN_DEFAULT, limits.RESCAN_MAX)
    assert f"self >= {limits.RESCAN_MIN}" in rescan["x-kubernetes-validations"][0]["rule"]
    sources = schema["sources"]
    assert (sources["minItems"], sources["maxItems"]) == (limits.SOURCES_MIN, limits.SOURCES_MAX)
    vectors = schema["vectors"]
    assert (tuple(vectors["enum"]), vectors["default"]) == (
        limits.VECTOR_KINDS,
        limits.VECTORS_DEFAULT,
    )


def test_names_and_lengths_match(schema: dict[str, Any]) -> None:
    source = schema["sources"]["items"]["properties"]
    assert source["drive"]["pattern"] == spec.DRIVE_RE
    assert source["drive"]["maxLength"] == spec.DRIVE_MAX
    assert source["path"]["maxLength"] == limits.PATH_MAX
    for model in ("embedding", "reranker"):
        deployment = schema[model]["properties"]["deployment"]
        assert deployment["pattern"] == spec.SERVICE_RE
        assert deployment["maxLength"] == spec.SERVICE_MAX
    crd = yaml.safe_load(CRD.read_text())
    (version,) = crd["spec"]["versions"]
    rules = [r["rule"] for r in version["schema"]["openAPIV3Schema"]["x-kubernetes-validations"]]
    assert f"<= {spec.NAME_MAX}" in rules[1]
    assert re.search(re.escape(spec.NAME_RE.pattern), rules[0])


def test_the_printer_columns_are_designs() -> None:
    crd = yaml.safe_load(CRD.read_text())
    (version,) = crd["spec"]["versions"]
    columns = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    # The design's columns, and Replicas (answering/wanted) before Age.
    design = ["State", "Documents", "Chunks", "Progress", "Last Indexed", "Replicas", "Age"]
    assert columns == design
    assert crd["spec"]["names"]["shortNames"] == ["kb"]


def _undocumented(node: dict[str, Any], where: str) -> list[str]:
    """The fields under `node` (a schema) without a description, by path."""
    out = []
    for name, child in node.get("properties", {}).items():
        path = f"{where}.{name}"
        if path == "kb.metadata":  # the API server's own ObjectMeta, described by it
            continue
        if not str(child.get("description", "")).strip():
            out.append(path)
        out += _undocumented(child, path)
        out += _undocumented(child.get("items", {}), f"{path}[]")
    return out


def test_every_field_is_documented_for_kubectl_explain() -> None:
    crd = yaml.safe_load(CRD.read_text())
    (version,) = crd["spec"]["versions"]
    root = version["schema"]["openAPIV3Schema"]
    assert root["description"].strip()
    assert _undocumented(root, "kb") == []
    conditions = root["properties"]["status"]["properties"]["conditions"]["description"]
    for kind in ("Ready", "Reconciling", "Stalled", "Paused"):
        assert kind in conditions


def test_the_overlap_rule_names_the_default(schema: dict[str, Any]) -> None:
    (rule,) = schema["chunking"]["x-kubernetes-validations"]
    assert f"self.overlap == {limits.CHUNK_OVERLAP_DEFAULT}" in rule["messageExpression"]
    assert "its default when not set" in rule["messageExpression"]
