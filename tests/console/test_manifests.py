"""The console's manifests as files: it only reads (bases and Events), runs the indexer
image's `metis-console` with the operator's security settings, and stays out of
manifests/kustomization.yaml (the demo's stand-in kubelet runs only indexer pods)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from metis_operator.console.main import build_parser

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"


def load(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind]
    return found


def test_the_console_may_only_read_bases_their_backups_and_events() -> None:
    role = one(load(MANIFESTS / "console" / "rbac.yaml"), "ClusterRole")
    granted = {
        (g, r, v)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    assert granted == {
        (g, r, v)
        for g, r in (
            ("metis.astraeus.io", "knowledgebases"),
            ("metis.astraeus.io", "knowledgebasebackups"),
            ("", "events"),
        )
        for v in ("get", "list", "watch")
    }


def test_the_console_runs_as_the_operator_does() -> None:
    pod = one(load(MANIFESTS / "console" / "console.yaml"), "Deployment")["spec"]["template"]
    operator = one(load(MANIFESTS / "operator" / "operator.yaml"), "Deployment")
    theirs = operator["spec"]["template"]["spec"]
    (container,) = pod["spec"]["containers"]
    assert pod["spec"]["securityContext"] == theirs["securityContext"]
    assert container["securityContext"] == theirs["containers"][0]["securityContext"]
    assert container["image"].startswith("ghcr.io/astraeus/metis-indexer:")
    command = container["command"]
    assert command[0] == "metis-console"
    args = build_parser().parse_args(command[1:])
    assert (args.host, args.port) == ("0.0.0.0", container["ports"][0]["containerPort"])
    assert pod["spec"]["serviceAccountName"] == "metis-console"


def test_the_console_is_installed_apart() -> None:
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    assert not any("console" in r for r in kustomization["resources"])
    assert yaml.safe_load((MANIFESTS / "console" / "kustomization.yaml").read_text())[
        "resources"
    ] == ["rbac.yaml", "console.yaml"]
