"""A base on a real node keeps answering through the ordinary changes of its life: a
steady five searches a second run through each change, and every one of them must
answer, by meaning as well as by words, with the known document in its top five.

What each change does to the pod: a new source mounts a drive (the pod is replaced), a
chunking change and a new embedding model reach the running indexer through its
ConfigMap (no pod replaced; the new chunking's index is built beside the one that
answers, in a folder of its own, and the new model's vectors beside the old ones, each
answering until the switch), a new indexer image replaces the pod, and `kubectl delete pod`
takes it away with nothing changed. A replacement starts beside the old pod on its
machine (the index drive is ReadWriteOnce), answers from the index in standby, and
takes over once the old pod has let go; the old pod keeps answering until then.

The tests run in order on one base (module-scoped): each builds on the last.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from metis_dev import images, node
from metis_indexer.changes.peers import NEW_CHECKS
from metis_operator import children
from tests.kube.conftest import ControlPlane, fresh_namespace
from tests.kube.operator_support import ROOT, get_kb, make_drive, wait_state
from tests.node.test_real_node import (
    HANDBOOK,
    Operator,
    model_service,
    models,
    operator,
    service_url,
)
from tests.support import layered_model
from tests.support.steady_load import NoteWriter, Question, Report, SteadyLoad

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

__all__ = ["models", "operator"]  # the host's model server and the operator: fixtures here too

BASE = "handbook"
SETTLE_SECONDS = 3.0
"""Searches go on this long after the base is Ready again: the change is over for the
people asking only once the new pod alone answers."""
EXTRA = "kitchen.md"


def _questions() -> list[Question]:
    lines = (ROOT / "examples/handbook/.metis/evals.jsonl").read_text().splitlines()
    cases = [json.loads(line) for line in lines if line.strip()]
    return [Question(c["question"], c["expected"][0]) for c in cases]


QUESTIONS = _questions()


@pytest.fixture(scope="module")
def ns(kube: ControlPlane) -> Iterator[str]:
    with fresh_namespace(kube, f"dark-{os.getpid()}") as name:
        yield name


@pytest.fixture(scope="module")
def base(kube: ControlPlane, ns: str, models: int, operator: Operator) -> str:
    make_drive(kube, ns, "docs", ROOT / "examples")
    model_service(kube, ns, models)
    kube.kubectl("apply", "-n", ns, "-f", "-", input=HANDBOOK)
    wait_state(kube, ns, BASE, "Ready", timeout=240, alive=operator.alive)
    return BASE


def indexer_pods(kube: ControlPlane, ns: str) -> list[dict[str, Any]]:
    path = f"/api/v1/namespaces/{ns}/pods?labelSelector=app.kubernetes.io/instance={BASE}"
    return list(kube.rest().get(path)["items"])


def replica_pods(kube: ControlPlane, ns: str) -> dict[str, dict[str, Any]]:
    """The base's pods by replica ("0" for replica 0's, which carry no label)."""
    return {
        (p["metadata"].get("labels") or {}).get(children.REPLICA_LABEL, "0"): p
        for p in indexer_pods(kube, ns)
    }


def current_pod(kube: ControlPlane, ns: str) -> dict[str, Any]:
    """The one pod of the base once a change is over (none going away, none beside it)."""
    pods = indexer_pods(kube, ns)
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    return pods[0]


def token(kube: ControlPlane, ns: str) -> str:
    """The base's API token, from the Secret the operator made for it."""
    secret = kube.rest().get(f"/api/v1/namespaces/{ns}/secrets/{children.child_name(BASE)}")
    return base64.b64decode(secret["data"][children.TOKEN_KEY]).decode()


def through(
    kube: ControlPlane, ns: str, operator: Operator, change: Any, done: Any, pods: int = 1
) -> Report:
    """The report of a steady load run from before `change()` until `done()` holds, the
    base is Ready with `pods` pods (one a replica), and SETTLE_SECONDS more. A base of one
    replica has notes written beside the searches too, each acknowledged one then given
    back and found by its word (a base of several refuses notes: NOTES_REPLICATED)."""
    url = service_url(kube, ns)
    writing = NoteWriter(url, token(kube, ns)) if pods == 1 else contextlib.nullcontext()
    with SteadyLoad(url, QUESTIONS) as load, writing:
        time.sleep(SETTLE_SECONDS)  # the load is steady before the change
        change()

        def over() -> bool:
            status = get_kb(kube, ns, BASE).get("status") or {}
            return bool(
                status.get("state") == "Ready"
                and len(indexer_pods(kube, ns)) == pods
                and done(status)
            )

        node.wait_for(
            over, timeout=600, what="the change over, the base Ready", alive=operator.alive
        )
        time.sleep(SETTLE_SECONDS)  # the searches after the change, by the new pod alone
    report = load.report()
    print(f"\n{report.summary()}")
    if isinstance(writing, NoteWriter):
        print(f"{len(writing.written)} notes written beside the searches")
        assert writing.failed == [], writing.failed[:5]
        assert len(writing.written) >= 5, "notes were written throughout"
        assert writing.lost() == []
        writing.forget()
    return report


def answered_throughout(report: Report) -> None:
    assert report.failed == [], report.failed[:5]
    assert report.degraded == [], report.degraded[:5]
    assert report.missed == [], report.missed[:5]


def test_before_any_change_every_search_finds_its_document(
    kube: ControlPlane, ns: str, base: str
) -> None:
    with SteadyLoad(service_url(kube, ns), QUESTIONS) as load:
        node.wait_for(
            lambda: load.count >= 2 * len(QUESTIONS), timeout=120, what="each question twice"
        )
    report = load.report()
    print(f"\n{report.summary()}")
    answered_throughout(report)


def test_a_new_source_replaces_the_pod_with_no_failed_search(
    kube: ControlPlane, ns: str, base: str, operator: Operator, tmp_path: Path
) -> None:
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / EXTRA).write_text("# Kitchen\n\nThe office kitchen is cleaned every Friday.\n")
    extra.chmod(0o755)
    make_drive(kube, ns, "extra", extra)
    before = current_pod(kube, ns)["metadata"]["uid"]
    kb = get_kb(kube, ns, BASE)
    generation = kb["metadata"]["generation"] + 1
    sources = [*kb["spec"]["sources"], {"drive": "extra"}]

    def change() -> None:
        patch = json.dumps({"spec": {"sources": sources}})
        kube.kubectl("patch", "kb", BASE, "-n", ns, "--type=merge", "-p", patch)

    report = through(
        kube, ns, operator, change, lambda s: s.get("observedGeneration") == generation
    )
    assert current_pod(kube, ns)["metadata"]["uid"] != before  # the pod was replaced
    answered_throughout(report)


def test_a_chunking_change_built_beside_with_no_failed_search_and_no_dip(
    kube: ControlPlane, ns: str, base: str, operator: Operator
) -> None:
    generation = get_kb(kube, ns, BASE)["metadata"]["generation"] + 1
    before = current_pod(kube, ns)["metadata"]["uid"]

    def change() -> None:
        patch = json.dumps({"spec": {"chunking": {"size": 1600, "overlap": 200}}})
        kube.kubectl("patch", "kb", BASE, "-n", ns, "--type=merge", "-p", patch)

    report = through(
        kube, ns, operator, change, lambda s: s.get("observedGeneration") == generation
    )
    assert current_pod(kube, ns)["metadata"]["uid"] == before  # no pod was replaced
    chunking = httpx.get(f"{service_url(kube, ns)}/v1/status", timeout=5).json()["chunking"]
    assert chunking["answering"] == {"size": 1600, "overlap": 200} and chunking["next"] is None
    answered_throughout(report)


@pytest.fixture(scope="module")
def second_model(real_node: node.Node, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """Another embedding model on the host, listening on the pods' bridge: its port."""
    cache = tmp_path_factory.mktemp("layered")
    server = layered_model.start(cache, host=node.GATEWAY)
    try:
        yield int(server.base_url.rsplit(":", 1)[1])
    finally:
        server.stop()


def test_a_new_embedding_model_with_no_failed_search_and_no_dip(
    kube: ControlPlane, ns: str, base: str, operator: Operator, second_model: int
) -> None:
    objects = {
        "apiVersion": "v1",
        "kind": "List",
        "items": node.model_service(ns, "minilm-l3", second_model),
    }
    kube.kubectl("apply", "-f", "-", input=json.dumps(objects))
    generation = get_kb(kube, ns, BASE)["metadata"]["generation"] + 1
    before = current_pod(kube, ns)["metadata"]["uid"]

    def change() -> None:
        patch = json.dumps({"spec": {"embedding": {"deployment": "minilm-l3"}}})
        kube.kubectl("patch", "kb", BASE, "-n", ns, "--type=merge", "-p", patch)

    report = through(
        kube, ns, operator, change, lambda s: s.get("observedGeneration") == generation
    )
    assert current_pod(kube, ns)["metadata"]["uid"] == before  # no pod was replaced
    answering = httpx.get(f"{service_url(kube, ns)}/v1/status", timeout=5).json()["embedding"]
    assert answering["answering"] == layered_model.MODEL_ID and answering["next"] is None
    answered_throughout(report)


def test_a_new_indexer_image_with_no_failed_search(
    kube: ControlPlane,
    real_node: node.Node,
    built: images.Built,
    ns: str,
    base: str,
    operator: Operator,
) -> None:
    old = built.refs[images.INDEXER.name]
    new = f"{old}-next"  # the same content under a new name: a new image to Kubernetes
    real_node.ctr("images", "tag", "--force", old, new)

    def runs_new(status: dict[str, Any]) -> bool:
        (container,) = current_pod(kube, ns)["spec"]["containers"]
        return bool(container["image"] == new)

    report = through(kube, ns, operator, lambda: operator.restart(new), runs_new)
    answered_throughout(report)


def test_a_deleted_pod_with_no_failed_search(
    kube: ControlPlane, ns: str, base: str, operator: Operator
) -> None:
    pod = current_pod(kube, ns)["metadata"]

    def change() -> None:
        kube.kubectl("delete", "pod", pod["name"], "-n", ns, "--wait=false")

    report = through(
        kube,
        ns,
        operator,
        change,
        lambda s: current_pod(kube, ns)["metadata"]["uid"] != pod["uid"],
    )
    answered_throughout(report)


def test_a_second_replica_with_no_failed_search_and_its_vectors_from_its_peer(
    kube: ControlPlane, ns: str, base: str, operator: Operator
) -> None:

    def change() -> None:
        patch = json.dumps({"spec": {"replicas": 2}})
        kube.kubectl("patch", "kb", BASE, "-n", ns, "--type=merge", "-p", patch)

    report = through(kube, ns, operator, change, lambda s: s.get("replicas") == "2/2", pods=2)
    answered_throughout(report)
    # Each replica asked itself: the base's status is the first's as last polled, a minute
    # ago at most (the notes of the tests before forgotten since, say).
    first, second = (
        httpx.get(f"http://{pod['status']['podIP']}:7700/v1/status", timeout=10).json()
        for pod in (replica_pods(kube, ns)["0"], replica_pods(kube, ns)["1"])
    )
    chunks, status = first["chunks"], second
    print(
        f"replica 1: {status['vectors_from_peers']} vectors from its peer, "
        f"{status['vectors_from_model']} from the model, of {chunks} chunks"
    )
    assert status["chunks"] == chunks
    # The model embeds only what the replica checks of its peer's vectors: every one of
    # the first NEW_CHECKS, then one in 16 drawn (the base's 18 chunks: nearly all).
    checked = status["vectors_from_model"]
    assert min(chunks, NEW_CHECKS) <= checked <= NEW_CHECKS + 0.25 * chunks
    assert status["vectors_from_peers"] + checked == chunks


def test_a_drain_with_two_replicas_with_no_failed_search(
    kube: ControlPlane, ns: str, base: str, operator: Operator
) -> None:
    """The one machine drained: the budget lets one replica be evicted, and holds the
    other, which answers every search until the machine is back and the evicted one's
    replacement is ready."""
    before = {r: p["metadata"]["uid"] for r, p in replica_pods(kube, ns).items()}
    assert len(before) == 2
    drained: list[str] = []

    def change() -> None:
        out = kube.kubectl(
            "drain",
            node.NODE_NAME,
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--pod-selector=app.kubernetes.io/name=metis-indexer",
            "--timeout=30s",
            check=False,
        )
        drained.append(out.stdout + out.stderr)
        kube.kubectl("uncordon", node.NODE_NAME)

    def back(status: dict[str, Any]) -> bool:
        pods = replica_pods(kube, ns)
        now = {r: p["metadata"]["uid"] for r, p in pods.items()}
        ready = all(
            c["type"] != "Ready" or c["status"] == "True"
            for p in pods.values()
            for c in p["status"].get("conditions", [{"type": "Ready", "status": "False"}])
        )
        return status.get("replicas") == "2/2" and len(now) == 2 and now != before and ready

    report = through(kube, ns, operator, change, back, pods=2)
    answered_throughout(report)
    (said,) = drained
    assert "disruption budget" in said, said
    after = {r: p["metadata"]["uid"] for r, p in replica_pods(kube, ns).items()}
    assert sum(after[r] == before[r] for r in before) == 1, (before, after)
