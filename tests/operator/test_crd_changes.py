"""The rules for changing the resource (docs/reference/changing-the-resource.md), held:
the CRD `make crd` writes now reads every object release 0.1.0's took, the same way
(only additive, defaulted changes within `v1`), and every spec the project shows or tests
comes back from the operator's models as it went in."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from metis_operator.api.spec import parse, unknown_fields
from tests.support.crd_changes import breaking, schema
from tests.support.refused_specs import ACCEPTED

ROOT = Path(__file__).resolve().parents[2]
RELEASED = sorted((Path(__file__).parent / "released").glob("knowledgebase-*.yaml"))
NOW = yaml.safe_load((ROOT / "crds/knowledgebase.yaml").read_text())


@pytest.mark.parametrize("released", RELEASED, ids=lambda p: p.stem)
def test_the_crd_reads_what_every_release_took(released: Path) -> None:
    old = yaml.safe_load(released.read_text())
    assert breaking(schema(old), schema(NOW)) == []
    [v1] = NOW["spec"]["versions"]
    assert (v1["name"], v1["served"], v1["storage"]) == ("v1", True, True)


def changed(edit: Any) -> list[str]:
    new = copy.deepcopy(NOW)
    edit(schema(new)["properties"]["spec"]["properties"])
    return breaking(schema(NOW), schema(new))


def test_a_change_that_breaks_is_named() -> None:
    def remove(spec: dict[str, Any]) -> None:
        del spec["rescan_seconds"]

    def retype(spec: dict[str, Any]) -> None:
        spec["replicas"]["type"] = "string"

    def tighten(spec: dict[str, Any]) -> None:
        spec["chunking"]["properties"]["size"]["maximum"] = 2000

    def new_rule(spec: dict[str, Any]) -> None:
        spec["placement"]["x-kubernetes-validations"] = [{"rule": "self.cpu_cores < 8"}]

    def new_default(spec: dict[str, Any]) -> None:
        spec["rescan_seconds"]["default"] = 300

    def narrow(spec: dict[str, Any]) -> None:
        spec["vectors"]["enum"] = ["float32"]

    def undefaulted(spec: dict[str, Any]) -> None:
        spec["mode"] = {"type": "string"}

    assert changed(remove) == [".spec.rescan_seconds: removed"]
    assert changed(retype) == [".spec.replicas: type 'integer' became 'string'"]
    assert changed(tighten) == [".spec.chunking.size: maximum lowered to 2000"]
    assert changed(new_rule) == [".spec.placement: a new rule 'self.cpu_cores < 8'"]
    assert changed(new_default) == [".spec.rescan_seconds: default 60 became 300"]
    assert changed(narrow) == [".spec.vectors: enum narrowed to ['float32']"]
    assert changed(undefaulted) == [".spec.mode: a new field without a default"]


def test_an_additive_defaulted_change_is_allowed() -> None:
    new = copy.deepcopy(NOW)
    spec = schema(new)["properties"]["spec"]
    spec["properties"]["mode"] = {"type": "string", "default": "hybrid", "enum": ["hybrid"]}
    spec["properties"]["sources"]["items"]["properties"]["exclude"] = {
        "type": "array",
        "items": {"type": "string"},
    }
    spec["properties"]["chunking"]["properties"]["size"]["maximum"] += 1000
    spec["required"] = [*spec.get("required", []), "mode"]
    assert breaking(schema(NOW), schema(new)) == []
    spec["required"].append("sources_v2")
    spec["properties"]["sources_v2"] = {"type": "array", "items": {"type": "string"}}
    assert breaking(schema(NOW), schema(new)) == [
        ".spec.sources_v2: required now, without a default"
    ]


@pytest.mark.parametrize(("where", "body"), ACCEPTED, ids=[w for w, _ in ACCEPTED])
def test_every_spec_shown_or_tested_comes_back_as_it_went_in(
    where: str, body: dict[str, Any]
) -> None:
    assert unknown_fields(body) == []
    parsed = parse("handbook", body)
    assert parsed.model_dump(mode="json", exclude_unset=True) == body, where
