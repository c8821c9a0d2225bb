"""The operator against the real control plane, with real indexers and a real model
server as local processes: `kubectl apply` a base, watch it go from Pending to
Ready, ask it to reindex and evaluate, change it, break its model, restart the
operator, delete it.

The operator runs as `metis-operator` with its service account's RBAC. The indexer
pods run on the machine's real node where it allows (the project's image, reached
through Services by their cluster names), else on the stand-in kubelet (local
processes on loopback ports), which the run's summary then names: tests/kube/pods.py.
"""

from __future__ import annotations

import itertools
import json
import secrets
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from metis_dev.kubelet import Kubelet
from metis_dev.plane import ControlPlane, gone
from metis_dev.process import free_port, wait_for
from tests.kube.operator_support import (
    Operator,
    get_kb,
    kb,
    kb_path,
    kstatus,
    looks,
    make_drive,
    model_service,
    state_events,
    wait_state,
)
from tests.kube.pods import Pods, RealPods, port_of
from tests.support.model_server import ModelServer
from tests.support.processes import Process

TOPICS = ("vacation", "expenses", "onboarding", "security", "travel", "payroll")


def write_documents(folder: Path, count: int) -> list[str]:
    """`count` Markdown documents and an evaluation set; the documents' names."""
    names = []
    for i in range(count):
        topic = TOPICS[i % len(TOPICS)]
        name = f"{topic}-guide-{i:03d}.md"
        body = f"# {topic.title()} guide {i}\n\n" + (
            f"This page explains the {topic} rules of team {i}. Ask the {topic} desk. " * 12
        )
        (folder / name).write_text(body)
        names.append(name)
    evals = folder / ".metis"
    evals.mkdir()
    cases = [
        {"question": f"What are the {t} rules?", "expected": [f"docs/{t}-guide-{i:03d}.md"]}
        for i, t in enumerate(TOPICS)
    ]
    (evals / "evals.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cases))
    return names


@pytest.fixture
def restricted(kube: ControlPlane, namespace: str) -> str:
    """The test namespace under the restricted Pod Security Standard: the indexer
    pods the operator makes must be admitted there."""
    kube.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    return namespace


@pytest.fixture
def kubelet(kube: ControlPlane, restricted: str, tmp_path: Path) -> Iterator[Kubelet]:
    """The stand-in, for the checks that need no indexer to run (and a web server on
    loopback behind a Service)."""
    with Kubelet(kube, restricted, tmp_path / "kubelet") as k:
        yield k


@pytest.fixture
def loose_node(kube: ControlPlane) -> Iterator[str]:
    """A node object that matches no placement of the test's."""
    name = f"cpu-{secrets.token_hex(3)}"
    kube.add_node(name, {"pool": name})
    yield name
    kube.kubectl("delete", "node", name, "--ignore-not-found", "--wait=false", check=False)


@pytest.fixture
def node(pods: Pods, restricted: str) -> Iterator[tuple[str, str]]:
    """A machine with a pool label of this test's own: (node name, pool)."""
    pool = f"cpu-{secrets.token_hex(3)}"
    with pods.machine({"pool": pool}) as name:
        yield name, pool


def apply_kb(kube: ControlPlane, namespace: str, body: dict[str, Any]) -> None:
    kube.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(body))


def children(kube: ControlPlane, namespace: str, name: str) -> dict[str, dict[str, Any]]:
    api, child = kube.rest(), f"metis-{name}"
    paths = {
        "ConfigMap": f"/api/v1/namespaces/{namespace}/configmaps/{child}",
        "PersistentVolumeClaim": f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{child}",
        "Deployment": f"/apis/apps/v1/namespaces/{namespace}/deployments/{child}",
        "Service": f"/api/v1/namespaces/{namespace}/services/{child}",
    }
    return {kind: api.get(path) for kind, path in paths.items() if not gone(kube, path)}


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == kind)


def test_what_only_the_operator_can_check(
    kube: ControlPlane,
    operator: Operator,
    kubelet: Kubelet,
    loose_node: str,
    restricted: str,
    models: ModelServer,
    tmp_path: Path,
) -> None:
    ns, pool = restricted, f"gpu-{secrets.token_hex(3)}"
    port = models.base_url.rsplit(":", 1)[1]
    model_service(kube, ns, "minilm", int(port))
    web_port = free_port()
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("<html><title>Team wiki</title></html>")
    web = Process(
        f"http://127.0.0.1:{web_port}",
        [
            sys.executable,
            "-m",
            "http.server",
            str(web_port),
            "--bind",
            "127.0.0.1",
            "--directory",
            str(site),
        ],
        tmp_path / "web.log",
    ).start()
    try:
        web.wait_for("the web server", lambda: web.get("/").status_code == 200)
        model_service(kube, ns, "wiki", web_port)
        docs = tmp_path / "docs"
        docs.mkdir()
        make_drive(kube, ns, "docs", docs)
        bases = {
            "no-drive": {"sources": [{"drive": "absent"}], "embedding": {"deployment": "minilm"}},
            "no-model": {"sources": [{"drive": "docs"}], "embedding": {"deployment": "bge-m3"}},
            "not-a-model": {"sources": [{"drive": "docs"}], "embedding": {"deployment": "wiki"}},
            "on-gpu": {
                "sources": [{"drive": "docs"}],
                "embedding": {"deployment": "minilm"},
                "reranker": {"deployment": "minilm"},
                "placement": {"labels": {"pool": pool}},
            },
        }
        for name, spec in bases.items():
            apply_kb(kube, ns, kb(name, spec))
        alive = operator.check_alive
        s = wait_state(kube, ns, "no-drive", "Failed", alive=alive)
        assert "drive absent does not exist" in s["reason"]
        s = wait_state(kube, ns, "no-model", "Failed", alive=alive)
        assert "embedding model bge-m3 does not exist (no Service bge-m3" in s["reason"]
        assert condition(s, "EmbeddingModelAvailable")["reason"] == "ServiceNotFound"
        s = wait_state(kube, ns, "not-a-model", "Failed", alive=alive)
        assert "embedding model Service wiki answers HTTP (SimpleHTTP" in s["reason"]
        assert "serves no model API" in s["reason"]
        assert condition(s, "Ready") | {"lastTransitionTime": None} == {
            "type": "Ready",
            "status": "False",
            "reason": "Failed",
            "message": s["reason"],
            "observedGeneration": 1,
            "lastTransitionTime": None,
        }
        s = wait_state(
            kube,
            ns,
            "on-gpu",
            "Pending",
            alive=alive,
            check=lambda s: "node affinity/selector" in s["reason"],
        )
        assert s["reason"].startswith(f"no machine matches placement labels pool={pool} ")
        assert "(scheduler: 0/" in s["reason"] and "node affinity/selector" in s["reason"]
        assert condition(s, "RerankerAvailable")["status"] == "True"
        assert condition(s, "EmbeddingModelAvailable")["message"].endswith(
            "all-MiniLM-L6-v2 (384 dimensions)"
        )
        # A Failed base gets no children; a valid one gets all four, owned by it.
        assert children(kube, ns, "no-model") == {}
        owned = children(kube, ns, "on-gpu")
        uid = get_kb(kube, ns, "on-gpu")["metadata"]["uid"]
        assert sorted(owned) == ["ConfigMap", "Deployment", "PersistentVolumeClaim", "Service"]
        for obj in owned.values():
            (ref,) = obj["metadata"]["ownerReferences"]
            assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == (
                "KnowledgeBase",
                "on-gpu",
                uid,
                True,
            )
            labels = obj["metadata"]["labels"]
            assert labels["app.kubernetes.io/instance"] == "on-gpu"
            assert labels["app.kubernetes.io/managed-by"] == "metis-operator"
        warnings = [e for e in state_events(kube, ns, "no-model") if e[0] == "Failed"]
        assert len(warnings) == 1
        # The missing drive appears: the base leaves Failed by itself.
        absent = tmp_path / "absent"
        absent.mkdir()
        make_drive(kube, ns, "absent", absent)
        wait_for(
            lambda: get_kb(kube, ns, "no-drive")["status"]["state"] != "Failed",
            timeout=60,
            what="no-drive to leave Failed",
        )
        assert "metis-no-drive" in kube.kubectl("get", "deployments", "-n", ns).stdout
    finally:
        web.stop()


def indexer_totals(pods: Pods) -> dict[str, Any]:
    return pods.indexer("handbook").status()


def test_a_base_indexes_answers_and_follows_changes(
    kube: ControlPlane,
    pods: Pods,
    node: tuple[str, str],
    pod_operator: Operator,
    pod_models: ModelServer,
    tmp_path: Path,
) -> None:
    ns, (machine, pool), operator, models = pods.namespace, node, pod_operator, pod_models
    alive = operator.check_alive
    docs = tmp_path / "docs"
    docs.mkdir()
    # Enough for a pass to be seen Indexing. On the real node the base can read Waiting
    # for a few seconds right after the pod turns ready (kube-proxy routes its Service a
    # moment after the kubelet reports it ready): the first pass must outlast that.
    names = write_documents(docs, 300 if isinstance(pods, RealPods) else 100)
    pods.drive("docs", docs)
    model_port = int(models.base_url.rsplit(":", 1)[1])
    pods.model_service("minilm", model_port, selector=True)
    kube.rest().post(
        f"/apis/apps/v1/namespaces/{ns}/deployments",
        {
            "metadata": {"name": "minilm"},
            "spec": {
                "replicas": 0,
                "selector": {"matchLabels": {"app": "minilm"}},
                "template": {
                    "metadata": {"labels": {"app": "minilm"}},
                    "spec": {"containers": [{"name": "tei", "image": "registry.invalid/tei:1"}]},
                },
            },
        },
    )
    spec = {
        "sources": [{"drive": "docs"}],
        "embedding": {"deployment": "minilm"},
        "placement": {"labels": {"pool": f"gpu-{pool}"}},
        "rescan_seconds": 0,
    }
    apply_kb(kube, ns, kb("handbook", spec))
    s = wait_state(
        kube,
        ns,
        "handbook",
        "Pending",
        alive=alive,
        check=lambda s: "node affinity/selector" in s["reason"],
    )
    assert s["reason"].startswith(f"no machine matches placement labels pool=gpu-{pool}")

    # The pod the operator made: the drives read-only, the index at /index, no root.
    deployment = children(kube, ns, "handbook")["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/drives/docs"]["readOnly"] is True and "readOnly" not in mounts["/index"]
    claims = {v["name"]: v.get("persistentVolumeClaim") for v in pod["volumes"]}
    assert claims[mounts["/drives/docs"]["name"]] == {"claimName": "docs", "readOnly": True}
    assert claims[mounts["/index"]["name"]] == {"claimName": "metis-handbook"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["resources"] == {
        "requests": {"cpu": "1", "memory": "2Gi"},
        "limits": {"memory": "2Gi"},
    }
    # A replacement starts beside the old pod, on its machine (a ReadWriteOnce index
    # drive), and the old one has time to drain.
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    (same_machine,) = pod["affinity"]["podAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert (
        same_machine["labelSelector"]["matchLabels"]
        == deployment["spec"]["selector"]["matchLabels"]
    )
    assert same_machine["topologyKey"] == "kubernetes.io/hostname"
    assert pod["terminationGracePeriodSeconds"] == 40

    # A machine matches: the pod is placed and starts (the kubelet held a moment).
    with pods.held():
        spec["placement"] = {"labels": {"pool": pool}}
        apply_kb(kube, ns, kb("handbook", spec))
        s = wait_state(kube, ns, "handbook", "Starting", alive=alive)
        assert s["reason"] == f"its indexer is starting on machine {machine}"
    s = wait_state(kube, ns, "handbook", "Ready", alive=alive, timeout=180)
    pods.check()
    totals = indexer_totals(pods)
    index = s["observed"]["index"]
    assert {k: index[k] for k in ("documents", "chunks", "failed")} == {
        k: totals[k] for k in ("documents", "chunks", "failed")
    }
    assert index["documents"] == len(names) and index["dimensions"] == 384
    assert index["last_indexed_at"] == totals["last_indexed_at"]
    assert s["observed"]["machine"] == machine
    assert s["observed"]["address"] == f"http://metis-handbook.{ns}.svc:{operator.indexer_port}"
    # The local-path drive is the node's own disk: whether it is 80 % full is the CI
    # machine's, so the drive's warning must agree with its condition, not be absent.
    warnings = s["observed"]["warnings"]
    drive_warnings = [w for w in warnings if w.startswith("index drive ")]
    assert [w for w in warnings if w not in drive_warnings] == [
        "embedding model minilm: Deployment minilm is scaled to zero; the base does not wake "
        "it (keep one replica)"
    ]
    assert bool(drive_warnings) == (condition(s, "DriveFilling")["status"] == "True")
    assert condition(s, "Ready")["status"] == "True"
    assert condition(s, "EmbeddingModelAvailable")["status"] == "True"
    assert s["observedGeneration"] == get_kb(kube, ns, "handbook")["metadata"]["generation"]
    states = [reason for reason, _ in state_events(kube, ns, "handbook")]
    assert states[:2] == ["Pending", "Starting"] and states[-1] == "Ready"
    assert "Indexing" in states
    wait = kube.kubectl("wait", "--for=condition=Ready", "kb/handbook", "-n", ns, "--timeout=10s")
    assert "condition met" in wait.stdout
    row = kube.kubectl("get", "kb", "handbook", "-n", ns).stdout.splitlines()[1].split()
    assert row[:4] == ["handbook", "Ready", str(index["documents"]), str(index["chunks"])]

    # Reindex and evaluate by annotation; each runs again only when its value changes.
    passes = totals["passes"]
    kube.kubectl("annotate", "kb", "handbook", "-n", ns, "metis.astraeus.io/reindex=1")
    wait_for(
        lambda: indexer_totals(pods)["passes"] == passes + 1,
        timeout=30,
        what="a pass after the reindex annotation",
    )
    kube.kubectl(
        "annotate", "kb", "handbook", "-n", ns, "--overwrite", "metis.astraeus.io/reindex=full-2"
    )
    wait_for(lambda: indexer_totals(pods)["passes"] == passes + 2, timeout=120, what="a full pass")
    assert indexer_totals(pods)["last_pass"]["read"] == len(names)
    # Those passes were the operator's, sent with the base's token; without it, none.
    refused = pods.indexer("handbook").post("/v1/reindex", {"full": True})
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "UNAUTHORIZED"
    kube.kubectl("annotate", "kb", "handbook", "-n", ns, "metis.astraeus.io/evaluate=k=5")
    s = wait_state(kube, ns, "handbook", "Ready", check=lambda s: "evaluation" in s)
    evaluation = s["evaluation"]
    assert set(evaluation) == {"k", "cases", "recall_at_k", "mrr", "at", "retrieval"}
    assert (evaluation["k"], evaluation["cases"]) == (5, len(TOPICS))
    assert 0 < evaluation["recall_at_k"] <= 1

    # A data source's new revision: the indexer reads it, the status says so.
    seen = len(state_events(kube, ns, "handbook"))
    kube.rest().patch(
        f"/api/v1/namespaces/{ns}/persistentvolumeclaims/docs",
        {"metadata": {"annotations": {"metis.astraeus.io/revision": "r7"}}},
    )
    # The revision reaches the indexer in its ConfigMap (on a real kubelet up to ~90 s);
    # the base is not Ready meanwhile, nor until a pass has read it.
    s = wait_state(
        kube,
        ns,
        "handbook",
        "Ready",
        timeout=180,
        check=lambda s: s["observed"].get("indexed_revisions") == {"docs": "r7"},
    )
    assert s["observed"]["revisions"] == {"docs": "r7"}
    since = state_events(kube, ns, "handbook")[seen:]
    assert since[0] == (
        "Starting",
        "drive docs has revision r7: its indexer still reads no revision",
    )
    assert since[-1][0] == "Ready" and "Ready" not in [reason for reason, _ in since[:-1]]

    # The embedding model stops: Waiting, with why; back: Ready again.
    models.stop()
    s = wait_state(kube, ns, "handbook", "Waiting", alive=alive)
    assert s["reason"] == "waiting for embedding model minilm: connection refused"
    assert condition(s, "EmbeddingModelAvailable")["reason"] == "NotAnswering"
    restarted = pods.models(port=model_port)
    try:
        s = wait_state(kube, ns, "handbook", "Ready", alive=alive)
        assert kstatus(kube, get_kb(kube, ns, "handbook"))["status"] == "Current"
        # Chunking changes: every document is read again, by the running indexer. The
        # ConfigMap reaches the pod late (held here; a real kubelet takes up to a
        # minute): until the indexer runs generation 3 and has indexed it, kstatus
        # (Flux) reads the base as InProgress.
        with pods.held():
            spec["chunking"] = {"size": 400, "overlap": 50}
            apply_kb(kube, ns, kb("handbook", spec))
            s = wait_state(
                kube,
                ns,
                "handbook",
                "Starting",
                alive=alive,
                check=lambda s: s["observedGeneration"] == 3,
            )
            assert s["reason"] == "applying generation 3: the indexer still runs generation 2"
            assert condition(s, "Ready")["status"] == "False"
            assert condition(s, "Reconciling")["status"] == "True"
            seen = kstatus(kube, get_kb(kube, ns, "handbook"))
            assert seen["status"] == "InProgress", seen
            wait = kube.kubectl(
                "wait",
                "--for=condition=Ready",
                "kb/handbook",
                "-n",
                ns,
                "--timeout=2s",
                check=False,
            )
            assert wait.returncode != 0

        def current() -> dict[str, Any] | None:
            obj = get_kb(kube, ns, "handbook")
            if kstatus(kube, obj)["status"] != "Current":
                return None
            # Current only once the indexer's totals reflect the new chunking.
            totals = indexer_totals(pods)
            assert totals["indexed_generation"] == 3, totals
            assert obj["status"]["observed"]["index"]["chunks"] == totals["chunks"]
            return obj

        obj = wait_for(current, timeout=240, what="kstatus Current", alive=alive)
        assert obj["status"]["observed"]["index"]["chunks"] > index["chunks"]
        assert obj["status"]["state"] == "Ready" and obj["status"]["observedGeneration"] == 3
        assert indexer_totals(pods)["last_pass"]["read"] == len(names)

        # A new source changes the mounts: a replacement takes over, then Ready.
        more = tmp_path / "runbooks"
        more.mkdir()
        (more / "restart-guide.md").write_text("# Restarting\n\nHow to restart the service.\n")
        pods.drive("runbooks", more)
        before = len(state_events(kube, ns, "handbook"))
        spec["sources"].append({"drive": "runbooks"})
        apply_kb(kube, ns, kb("handbook", spec))
        s = wait_state(
            kube,
            ns,
            "handbook",
            "Ready",
            alive=alive,
            timeout=180,
            check=lambda s: s["observed"]["index"]["documents"] == len(names) + 1,
        )
        later = [reason for reason, _ in state_events(kube, ns, "handbook")[before:]]
        assert "Starting" in later and later[-1] == "Ready"

        # Nothing in the resource or its Events names a document.
        dumped = kube.kubectl("get", "kb", "handbook", "-n", ns, "-o", "yaml").stdout
        dumped += yaml.safe_dump(state_events(kube, ns, "handbook"))
        for name in [*names, "restart-guide.md"]:
            assert name.removesuffix(".md") not in dumped

        metrics = operator.metrics()
        assert 'metis_operator_knowledge_bases{state="Ready"} 1.0' in metrics
        assert "metis_operator_reconciliations_total" in metrics
        base = f'knowledgebase="handbook",namespace="{ns}"'
        assert f'metis_knowledge_base_state{{{base},state="Ready"}} 1.0' in metrics
        assert f'metis_knowledge_base_state{{{base},state="Waiting"}} 0.0' in metrics

        # Deleting the base deletes its children (the garbage collector, by owner).
        owned = children(kube, ns, "handbook")
        assert len(owned) == 4
        kube.kubectl("delete", "kb", "handbook", "-n", ns, "--timeout=60s")
        wait_for(
            lambda: children(kube, ns, "handbook") == {},
            timeout=120,
            interval=1,
            what="the children to be garbage-collected",
        )
        assert gone(kube, kb_path(ns, "handbook"))
        wait_for(
            lambda: 'metis_operator_knowledge_bases{state="Ready"} 0.0' in operator.metrics(),
            timeout=30,
            what="the deleted base to leave the metrics",
        )
        assert 'knowledgebase="handbook"' not in operator.metrics()
    finally:
        restarted.stop()


def test_restarting_the_operator_creates_nothing_twice_and_does_not_flap(
    kube: ControlPlane,
    pods: Pods,
    node: tuple[str, str],
    pod_operator: Operator,
    pod_models: ModelServer,
    tmp_path: Path,
) -> None:
    ns, (_, pool), operator = pods.namespace, node, pod_operator
    docs = tmp_path / "docs"
    docs.mkdir()
    write_documents(docs, 12)
    pods.drive("docs", docs)
    pods.model_service("minilm", port_of(pod_models))
    spec = {
        "sources": [{"drive": "docs"}],
        "embedding": {"deployment": "minilm"},
        "placement": {"labels": {"pool": pool}},
        "rescan_seconds": 0,
    }

    def unchanged_while_restarted(sig: int) -> None:
        status = get_kb(kube, ns, "handbook")["status"]
        events = state_events(kube, ns, "handbook")
        operator.stop(sig)
        operator.start()
        wait_for(lambda: looks(operator, timer=True) >= 4, timeout=30, what="4 timer looks")
        assert get_kb(kube, ns, "handbook")["status"] == status
        assert state_events(kube, ns, "handbook") == events

    with pods.held():
        apply_kb(kube, ns, kb("handbook", spec))
        # Killed as soon as it has made its first child, before it made them all.
        cm = f"/api/v1/namespaces/{ns}/configmaps/metis-handbook"
        wait_for(lambda: not gone(kube, cm), timeout=60, interval=0.05, what="the first child")
        operator.stop(signal.SIGKILL)
        operator.start()
        wait_state(kube, ns, "handbook", "Starting", alive=operator.check_alive)
        first = {kind: o["metadata"]["uid"] for kind, o in children(kube, ns, "handbook").items()}
        assert len(first) == 4
        unchanged_while_restarted(signal.SIGKILL)  # while Starting
    wait_state(kube, ns, "handbook", "Ready", alive=operator.check_alive, timeout=180)
    unchanged_while_restarted(signal.SIGTERM)  # while Ready

    now = {kind: o["metadata"]["uid"] for kind, o in children(kube, ns, "handbook").items()}
    assert now == first
    selector = "app.kubernetes.io/instance=handbook"
    for collection in (
        "api/v1/namespaces/{ns}/configmaps",
        "api/v1/namespaces/{ns}/services",
        "api/v1/namespaces/{ns}/persistentvolumeclaims",
        "apis/apps/v1/namespaces/{ns}/deployments",
        "apis/apps/v1/namespaces/{ns}/replicasets",
        "api/v1/namespaces/{ns}/pods",
    ):
        found = kube.rest().get(f"/{collection.format(ns=ns)}?labelSelector={selector}")["items"]
        assert len(found) == 1, (collection, [o["metadata"]["name"] for o in found])
    states = [reason for reason, _ in state_events(kube, ns, "handbook")]
    assert states.count("Starting") == 1 and states[-1] == "Ready", states
    assert all(a != b for a, b in itertools.pairwise(states)), states
