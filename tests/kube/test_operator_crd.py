"""The KnowledgeBase CRD as the API server enforces it: each limit of a base's spec is
refused at `kubectl apply` with a message that names the field, defaults are
filled in, and the printer columns are those `kubectl get kb` shows
(docs/reference/knowledgebase.md)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from metis_dev.plane import ControlPlane
from metis_dev.process import wait_for
from tests.kube.operator_support import ROOT, install, kb
from tests.support import refused_specs
from tests.support.refused_specs import ACCEPTED, GOOD, spec


@pytest.fixture(scope="module")
def crd(kube: ControlPlane) -> Iterator[None]:
    install(kube)
    yield


def apply(kube: ControlPlane, namespace: str, body: dict[str, Any]) -> tuple[int, str]:
    done = kube.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(body), check=False)
    return done.returncode, done.stderr + done.stdout


@pytest.mark.parametrize(("name", "body", "words"), refused_specs.params("crd"))
def test_each_limit_is_refused_naming_the_field(
    kube: ControlPlane, crd: None, namespace: str, name: str, body: dict[str, Any], words: str
) -> None:
    code, said = apply(kube, namespace, kb(name, body))
    assert code != 0, f"accepted: {said}"
    assert words in said
    assert "is invalid" in said or "unknown field" in said


def kept(written: Any, stored: Any) -> bool:
    """Whether `stored` holds all of `written` as written (the API server may add defaults)."""
    if isinstance(written, dict):
        return isinstance(stored, dict) and all(
            k in stored and kept(v, stored[k]) for k, v in written.items()
        )
    return written == stored


def test_every_spec_shown_or_tested_is_kept_as_written(
    kube: ControlPlane, crd: None, namespace: str
) -> None:
    """Nothing pruned, nothing rewritten: a spec the CRD would cut would be read by the
    operator as a field removed (docs/reference/changing-the-resource.md)."""
    for where, body in ACCEPTED:
        done = kube.kubectl(
            *("create", "--dry-run=server", "-o", "json", "-n", namespace, "-f", "-"),
            input=json.dumps(kb("round-trip", body)),
        )
        stored = json.loads(done.stdout)["spec"]
        assert kept(body, stored), f"{where}: {body} came back as {stored}"


def test_a_valid_base_is_accepted_with_the_spec_defaults(
    kube: ControlPlane, crd: None, namespace: str
) -> None:
    edge = spec(
        sources=[{"drive": "docs", "path": "handbook"}, {"drive": "docs", "path": "handbook2"}]
        + [{"drive": f"d{i}"} for i in range(14)],
        rescan_seconds=0,
        chunking={"size": 4000, "overlap": 1999},
        placement={"cpu_cores": 64, "memory_gb": 256, "labels": {"metis.io/pool": "cpu"}},
    )
    for name, body in (("h" * 40, edge), ("handbook", GOOD)):
        code, said = apply(kube, namespace, kb(name, body))
        assert code == 0, said
    stored = kube.rest().get(
        f"/apis/metis.astraeus.io/v1/namespaces/{namespace}/knowledgebases/handbook"
    )["spec"]
    assert stored["chunking"] == {"size": 1200, "overlap": 200}
    assert stored["placement"] == {"cpu_cores": 1, "memory_gb": 2}
    assert stored["rescan_seconds"] == 60
    headers = kube.kubectl("get", "kb", "-n", namespace).stdout.splitlines()[0].split()
    assert headers == [
        *("NAME", "STATE", "DOCUMENTS", "CHUNKS", "PROGRESS", "LAST", "INDEXED"),
        *("REPLICAS", "AGE"),
    ]
    wide = kube.kubectl("get", "knowledgebases", "-n", namespace, "-o", "wide").stdout
    assert "REASON" in wide.splitlines()[0]


def test_the_manifests_install_an_admitted_least_privilege_operator(
    kube: ControlPlane, crd: None
) -> None:
    # The restricted Pod Security Standard of metis-system admits the operator's pod.
    wait_for(
        lambda: kube.rest().get(
            "/api/v1/namespaces/metis-system/pods?labelSelector=app.kubernetes.io/name=metis-operator"
        )["items"],
        timeout=60,
        what="the operator's pod to be admitted",
    )
    operator = "--as=system:serviceaccount:metis-system:metis-operator"

    def can(*args: str) -> bool:
        said = kube.kubectl("auth", "can-i", *args, operator, check=False).stdout.strip()
        return said == "yes"

    assert can("patch", "knowledgebases.metis.astraeus.io/status", "-n", "team-a")
    assert can("create", "deployments.apps", "-n", "team-a")
    assert can("list", "pods", "-n", "team-a")
    assert can("watch", "deployments.apps", "-n", "team-a")
    # Each base's edge: its NetworkPolicy and its token Secret.
    assert can("create", "networkpolicies.networking.k8s.io", "-n", "team-a")
    assert can("patch", "networkpolicies.networking.k8s.io", "-n", "team-a")
    assert can("create", "secrets", "-n", "team-a")
    assert can("get", "secrets", "-n", "team-a")
    # Events through either API.
    assert can("create", "events", "-n", "team-a")
    assert can("patch", "events.events.k8s.io", "-n", "team-a")
    # Leader election: Leases in its own namespace only.
    for verb in ("get", "list", "watch", "create", "update", "patch"):
        assert can(verb, "leases.coordination.k8s.io", "-n", "metis-system")
    assert not can("create", "leases.coordination.k8s.io", "-n", "team-a")
    assert not can("delete", "leases.coordination.k8s.io", "-n", "metis-system")
    assert not can("create", "knowledgebases.metis.astraeus.io", "-n", "team-a")
    # It deletes only what a replica scaled away leaves: its Deployment and index drive,
    # and the disruption budget once one replica is left.
    assert can("delete", "deployments.apps", "-n", "team-a")
    assert can("delete", "persistentvolumeclaims", "-n", "team-a")
    assert can("patch", "persistentvolumeclaims", "-n", "team-a"), "a drive grows with memory"
    assert can("delete", "poddisruptionbudgets.policy", "-n", "team-a")
    assert not can("delete", "services", "-n", "team-a")
    assert not can("delete", "configmaps", "-n", "team-a")
    assert not can("delete", "secrets", "-n", "team-a")
    assert not can("list", "secrets", "-n", "team-a"), "a base's token is read by name"
    assert not can("delete", "networkpolicies.networking.k8s.io", "-n", "team-a")
    assert not can("update", "pods", "-n", "team-a")

    # Flux's source objects: read, never written (asked of the API server directly: kubectl
    # guesses another group for a kind it does not serve).
    def may(verb: str, plural: str) -> bool:
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": "system:serviceaccount:metis-system:metis-operator",
                "groups": ["system:serviceaccounts", "system:serviceaccounts:metis-system"],
                "resourceAttributes": {
                    "namespace": "team-a",
                    "verb": verb,
                    "group": "source.toolkit.fluxcd.io",
                    "resource": plural,
                },
            },
        }
        path = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
        return bool(kube.rest().post(path, review)["status"].get("allowed"))

    for plural in ("gitrepositories", "buckets", "ocirepositories"):
        assert may("watch", plural) and may("get", plural)
        assert not may("patch", plural)
    # People: namespace editors manage bases (the aggregated edit role), viewers read them.
    wait_for(
        lambda: any(
            "knowledgebases" in r.get("resources", [])
            for r in kube.rest().get("/apis/rbac.authorization.k8s.io/v1/clusterroles/edit")[
                "rules"
            ]
        ),
        timeout=60,
        what="the edit role to aggregate knowledgebases",
    )


def test_the_examples_are_accepted(kube: ControlPlane, crd: None, namespace: str) -> None:
    for example in ("handbook.yaml", "embedding-tei.yaml"):
        path = ROOT / "manifests" / "examples" / example
        kube.kubectl("apply", "-n", namespace, "--dry-run=server", "-f", str(path))
