"""The operator as a citizen of a shared cluster, on the real control plane: two
replicas act once (leader election) and a standby takes over; a paused base is left
alone; the operator's own changes roll out a few bases at a time; uninstalling with
bases present completes.

Each wait polls with a deadline; "nothing happened" is asserted only after the
operator has provably looked again (its reconciliation counter moved on).
"""

from __future__ import annotations

import json
import secrets
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from metis_dev.plane import ControlPlane, gone
from metis_dev.process import free_port, wait_for
from metis_operator.api.identity import DEFERRED_REINDEX
from tests.kube.operator_support import (
    CRD,
    Operator,
    StallingProxy,
    get_kb,
    install,
    kb,
    kb_path,
    looks,
    make_drive,
    model_service,
    state_events,
    wait_state,
)
from tests.kube.pods import Pods, port_of
from tests.kube.test_operator_lifecycle import write_documents
from tests.support.model_server import ModelServer

LEASE = "/apis/coordination.k8s.io/v1/namespaces/metis-system/leases/metis-operator"


@pytest.fixture
def node(kube: ControlPlane) -> Iterator[str]:
    """A node object with a pool label of this test's own; the pool's name."""
    pool = f"cpu-{secrets.token_hex(3)}"
    kube.add_node(pool, {"pool": pool})
    yield pool
    kube.kubectl("delete", "node", pool, "--ignore-not-found", "--wait=false", check=False)


@pytest.fixture
def machine(pods: Pods) -> Iterator[str]:
    """A machine of `pods` with a pool label of this test's own; the pool's name."""
    pool = f"cpu-{secrets.token_hex(3)}"
    with pods.machine({"pool": pool}):
        yield pool


def apply_kb(kube: ControlPlane, namespace: str, body: dict[str, Any]) -> None:
    kube.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(body))


def looked_again(op: Operator, times: int = 3) -> None:
    """Wait until the operator has looked at its bases `times` more times (`looks`)."""
    start = looks(op)
    wait_for(
        lambda: looks(op) >= start + times,
        timeout=60,
        what=f"{times} more looks",
        alive=op.check_alive,
    )


def spec_for(pool: str) -> dict[str, Any]:
    return {
        "sources": [{"drive": "docs"}],
        "embedding": {"deployment": "minilm"},
        "placement": {"labels": {"pool": pool}},
        "rescan_seconds": 0,
    }


def setup(kube: ControlPlane, ns: str, models: ModelServer, tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    write_documents(docs, 6)
    make_drive(kube, ns, "docs", docs)
    model_service(kube, ns, "minilm", port_of(models))


def acting(op: Operator) -> bool:
    """Whether `op` runs the operator (its metrics are served once it does)."""
    try:
        op.metrics()
        return True
    except httpx.HTTPError:
        return False


def test_two_replicas_act_once_and_the_standby_takes_over(
    kube: ControlPlane, pods: Pods, machine: str, pod_models: ModelServer, tmp_path: Path
) -> None:
    pods.install()
    ns, node = pods.namespace, machine
    docs = tmp_path / "docs"
    docs.mkdir()
    write_documents(docs, 6)
    pods.drive("docs", docs)
    pods.model_service("minilm", port_of(pod_models))
    election = {"METIS_LEADER_ELECTION": "true"}
    ops = [
        pods.operator(tmp_path / name, env=election, identity=name)
        for name in ("replica-a", "replica-b")
    ]
    for op in ops:
        op.workdir.mkdir()
    first, second = ops
    try:
        first.start().wait_healthy()
        second.start()
        wait_for(
            lambda: kube.rest().get(LEASE)["spec"]["holderIdentity"] == "replica-a",
            timeout=30,
            what="replica-a to lead",
        )
        apply_kb(kube, ns, kb("handbook", spec_for(node)))
        wait_state(kube, ns, "handbook", "Ready", timeout=120, alive=first.check_alive)
        assert second._healthy() and not acting(second)  # alive, standing by

        indexer = pods.indexer("handbook")
        passes = indexer.status()["passes"]
        kube.kubectl("annotate", "kb", "handbook", "-n", ns, "metis.astraeus.io/reindex=1")
        wait_for(
            lambda: indexer.status()["passes"] == passes + 1,
            timeout=30,
            what="the pass the annotation asked for",
        )
        wait_state(kube, ns, "handbook", "Ready", alive=first.check_alive)
        looked_again(first)
        assert indexer.status()["passes"] == passes + 1
        reindexed = [e for e in state_events(kube, ns, "handbook") if e[0] == "Reindex"]
        assert len(reindexed) == 1, reindexed

        # The leader dies: the standby takes the Lease once it has not been renewed
        # for its duration (15 s) and acts on the next request.
        first.stop(signal.SIGKILL)
        wait_for(
            lambda: kube.rest().get(LEASE)["spec"]["holderIdentity"] == "replica-b",
            timeout=15 + 2 + 5,
            interval=0.5,
            what="replica-b to take over",
        )
        wait_for(
            lambda: acting(second), timeout=30, what="replica-b to act", alive=second.check_alive
        )
        kube.kubectl(
            "annotate", "kb", "handbook", "-n", ns, "--overwrite", "metis.astraeus.io/reindex=2"
        )
        wait_for(
            lambda: indexer.status()["passes"] == passes + 2,
            timeout=60,
            what="a pass asked of the new leader",
            alive=second.check_alive,
        )
        wait_for(
            lambda: len([e for e in state_events(kube, ns, "handbook") if e[0] == "Reindex"]) == 2,
            timeout=30,
            what="the new leader's Event",
        )
        events = kube.rest().get(
            f"/api/v1/namespaces/{ns}/events?fieldSelector=involvedObject.name=handbook"
        )["items"]
        assert {e["source"].get("component") for e in events} == {"metis-operator"}
        assert {e.get("reportingInstance") for e in events if e["reason"] == "Reindex"} == {
            "replica-a",
            "replica-b",
        }
    finally:
        for op in ops:
            op.stop()


def test_a_slow_probe_does_not_flip_the_state(
    kube: ControlPlane, pods: Pods, machine: str, pod_models: ModelServer, tmp_path: Path
) -> None:
    pods.install()
    ns, node = pods.namespace, machine
    # the operator gives up after 2 s
    proxy = StallingProxy(pod_models.base_url, seconds=5, host=pods.host)
    docs = tmp_path / "docs"
    docs.mkdir()
    write_documents(docs, 6)
    pods.drive("docs", docs)
    pods.model_service("minilm", proxy.port)
    (tmp_path / "op").mkdir()
    op = pods.operator(tmp_path / "op", env={"METIS_MODEL_GRACE_SECONDS": "20"}).start()
    try:
        apply_kb(kube, ns, kb("handbook", spec_for(node)))
        s = wait_state(kube, ns, "handbook", "Ready", timeout=120, alive=op.check_alive)
        ready_since = next(c for c in s["conditions"] if c["type"] == "Ready")
        events = state_events(kube, ns, "handbook")
        proxy.stall = 1
        # The slow call, then three answered cheap calls: the prober has recovered.
        wait_for(
            lambda: proxy.models_calls[-3:] == ["answered"] * 3 and "stalled" in proxy.models_calls,
            timeout=60,
            what="a stalled probe, then three answered",
            alive=op.check_alive,
        )
        looked_again(op)
        s = get_kb(kube, ns, "handbook")["status"]
        assert s["state"] == "Ready", s
        assert next(c for c in s["conditions"] if c["type"] == "Ready") == ready_since
        assert state_events(kube, ns, "handbook") == events
    finally:
        op.stop()
        proxy.close()


def managers(obj: dict[str, Any]) -> set[str]:
    return {m["manager"] for m in obj["metadata"].get("managedFields") or []}


def requests_tried(obj: dict[str, Any]) -> list[str]:
    """The last failure kopf recorded of each request still being tried (reindex,
    evaluate): its progress annotations."""
    annotations = obj["metadata"].get("annotations") or {}
    records = [
        json.loads(v)
        for k, v in annotations.items()
        if k.startswith("kopf.metis.astraeus.io/") and v.startswith("{")
    ]
    return [r.get("message") or "" for r in records if isinstance(r, dict) and "retries" in r]


def test_a_paused_base_is_left_alone(
    kube: ControlPlane, namespace: str, models: ModelServer, tmp_path: Path
) -> None:
    install(kube)
    ns = namespace
    setup(kube, ns, models, tmp_path)
    (tmp_path / "op").mkdir()
    op = Operator(kube, tmp_path / "op", free_port()).start()
    try:
        apply_kb(kube, ns, kb("handbook", spec_for("nowhere")))  # no volume, no node: Pending
        wait_state(kube, ns, "handbook", "Pending", alive=op.check_alive)
        obj = get_kb(kube, ns, "handbook")
        assert obj["metadata"].get("finalizers") is None  # nothing holds a deletion
        assert "metis-operator" in managers(obj) and "OpenAPI-Generator" not in managers(obj)
        cm = f"/api/v1/namespaces/{ns}/configmaps/metis-handbook"
        assert managers(kube.rest().get(cm)) == {"metis-operator"}

        kube.kubectl("annotate", "kb", "handbook", "-n", ns, "metis.astraeus.io/paused=true")
        wait_state(
            kube,
            ns,
            "handbook",
            "Pending",
            check=lambda s: any(
                c["type"] == "Paused" and c["status"] == "True" for c in s["conditions"]
            ),
        )
        # A paused base at rest has no timer: the deletion's own wake is its look.
        before = looks(op)
        kube.rest().delete(cm)
        wait_for(lambda: gone(kube, cm), timeout=30, what="the ConfigMap to go")
        wait_for(
            lambda: looks(op) > before,
            timeout=60,
            what="the paused base's turn after its ConfigMap went",
            alive=op.check_alive,
        )
        assert gone(kube, cm), "a paused base's child was recreated"
        kube.kubectl("annotate", "kb", "handbook", "-n", ns, "metis.astraeus.io/reindex=now")
        deferred = ("Deferred", "a pass runs when the pause ends")
        wait_for(
            lambda: deferred in state_events(kube, ns, "handbook"),
            timeout=30,
            what="the Event saying the pass waits for the pause to end",
        )

        # Recorded on the base (by kopf's PATCH once the handler returns, so after the
        # Event), not tried again by kopf while the pause lasts.
        wait_for(
            lambda: (
                get_kb(kube, ns, "handbook")["metadata"]["annotations"].get(DEFERRED_REINDEX)
                == "now"
            ),
            timeout=30,
            what="the deferred pass recorded on the base",
        )
        assert requests_tried(get_kb(kube, ns, "handbook")) == []

        kube.kubectl("annotate", "kb", "handbook", "-n", ns, "metis.astraeus.io/paused-")
        wait_for(lambda: not gone(kube, cm), timeout=30, what="the ConfigMap to come back")
        # Run once the pause ends (the base being Pending, its indexer does not take it yet).
        wait_for(
            lambda: "a pass asked while paused: run now" in op.log(200_000),
            timeout=60,
            what="the pass to be run once the pause ends",
        )
        wait_state(
            kube,
            ns,
            "handbook",
            "Pending",
            check=lambda s: all(c["type"] != "Paused" for c in s["conditions"]),
        )
        lines = [json.loads(x) for x in op.log(200_000).splitlines() if x.startswith("{")]
        said = [x["message"] for x in lines if x.get("base") == f"{ns}/handbook"]
        assert any("paused" in m for m in said) and any("resumed" in m for m in said)
        assert any("ConfigMap metis-handbook created" in m for m in said)
    finally:
        op.stop()


def test_the_operators_own_change_rolls_out_a_few_bases_at_a_time(
    kube: ControlPlane, namespace: str, models: ModelServer, tmp_path: Path
) -> None:
    install(kube)
    ns = namespace
    setup(kube, ns, models, tmp_path)
    (tmp_path / "op").mkdir()
    port = free_port()
    op = Operator(kube, tmp_path / "op", port).start()
    names = ("a", "b", "c")
    try:
        for name in names:
            apply_kb(kube, ns, kb(name, spec_for("nowhere")))
        for name in names:
            wait_state(kube, ns, name, "Pending", alive=op.check_alive)
    finally:
        op.stop()

    def image_of(name: str) -> str:
        d = kube.rest().get(f"/apis/apps/v1/namespaces/{ns}/deployments/metis-{name}")
        return str(d["spec"]["template"]["spec"]["containers"][0]["image"])

    def images() -> dict[str, str]:
        return {name: image_of(name) for name in names if not gone(kube, kb_path(ns, name))}

    old = set(images().values())
    assert len(old) == 1
    # A new indexer image, one rollout at a time: none of these bases gets Ready (no
    # machine), so the first to roll keeps its turn.
    op = Operator(
        kube,
        tmp_path / "op",
        port,
        env={"METIS_INDEXER_IMAGE": "registry.invalid/metis-indexer:2", "METIS_MAX_ROLLOUTS": "1"},
    ).start()
    try:
        wait_for(
            lambda: list(images().values()).count("registry.invalid/metis-indexer:2") == 1,
            timeout=60,
            what="one base to roll out",
            alive=op.check_alive,
        )
        looked_again(op, 6)
        rolled = [n for n, image in images().items() if image not in old]
        assert len(rolled) == 1, images()
        # The rolling base goes: the next one takes its turn.
        kube.kubectl("delete", "kb", rolled[0], "-n", ns, "--timeout=60s")
        wait_for(
            lambda: (
                [i not in old for i in images().values()].count(True) == 1
                and rolled[0] not in images()
            ),
            timeout=60,
            what="the next base to roll out",
            alive=op.check_alive,
        )
        looked_again(op, 6)
        assert [i not in old for i in images().values()].count(True) == 1, images()
    finally:
        op.stop()


def test_uninstall_with_bases_present_completes(
    kube: ControlPlane, namespace: str, models: ModelServer, tmp_path: Path
) -> None:
    install(kube)
    ns = namespace
    setup(kube, ns, models, tmp_path)
    (tmp_path / "op").mkdir()
    op = Operator(kube, tmp_path / "op", free_port()).start()
    try:
        apply_kb(kube, ns, kb("handbook", spec_for("nowhere")))
        wait_state(kube, ns, "handbook", "Pending", alive=op.check_alive)
    finally:
        op.stop()  # uninstall removes the operator first (kubectl delete -k manifests/)
    try:
        kube.kubectl("delete", "crd", CRD, "--timeout=90s")
        assert gone(kube, f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD}")
        assert gone(kube, kb_path(ns, "handbook"))
    finally:
        install(kube)  # the next tests' CRD
