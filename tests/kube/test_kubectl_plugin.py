"""`kubectl metis` as users run it: the real kubectl (built with the control plane) finds
`kubectl-metis` on PATH and runs it against the real API server, with a real operator,
a real indexer (metis_dev's stand-in kubelet) and the real local model.

Search goes through the API server's service proxy. The API server proxies a Service to
an address of its Endpoints, and the API refuses loopback addresses in Endpoints ("may not
be in the loopback range"), so the indexer of this test listens on every address and its
pod and Endpoints carry this machine's own non-loopback address (the one the test API
server advertises): the API server's proxy connects there, on this machine. The test
writes the Endpoints itself, as the endpoints controller (not run here) would. Before it
does, the proxy cannot reach the Ready base, as on metis-dev's local cluster: the error
says what failed, and `--url` asks the indexer at its loopback port instead.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from metis_dev.kubelet import Kubelet
from metis_dev.plane import ControlPlane
from metis_dev.process import wait_for
from tests.kube.operator_support import (
    Operator,
    get_kb,
    kb,
    kubectl_metis,
    make_drive,
    model_service,
    ok,
    state_events,
    wait_state,
)
from tests.support.model_server import ModelServer
from tests.support.processes import metis

ROOT = Path(__file__).resolve().parents[2]
HANDBOOK = ROOT / "examples" / "handbook"


class AnyAddressKubelet(Kubelet):
    """The test kubelet, its indexers listening on every address (see the module's doc)."""

    @staticmethod
    def _localised(text: str, mounts: dict[str, Path], port: int | None = None) -> str:
        config = json.loads(Kubelet._localised(text, mounts, port))
        config["host"] = "0.0.0.0"
        return json.dumps(config, indent=2)


@pytest.fixture
def kubelet(kube: ControlPlane, namespace: str, tmp_path: Path) -> Iterator[Kubelet]:
    with AnyAddressKubelet(kube, namespace, tmp_path / "kubelet") as k:
        yield k


def publish(kube: ControlPlane, namespace: str, base: str, port: int) -> str:
    """The indexer's pod at this machine's own address, and the Endpoints of its Service
    pointing there (what a kubelet and the endpoints controller would write)."""
    api = kube.rest()
    (subset,) = api.get("/api/v1/namespaces/default/endpoints/kubernetes")["subsets"]
    ip = subset["addresses"][0]["ip"]  # the API server's own address, on this machine
    with socket.socket() as s:
        s.bind((ip, 0))  # fails here, plainly, where the address is not this machine's
    pods = api.get(
        f"/api/v1/namespaces/{namespace}/pods?labelSelector=app.kubernetes.io/instance={base}"
    )["items"]
    (pod,) = [p for p in pods if p.get("status", {}).get("phase") == "Running"]
    name = pod["metadata"]["name"]
    api.patch(
        f"/api/v1/namespaces/{namespace}/pods/{name}/status",
        {"status": {"podIP": ip, "podIPs": [{"ip": ip}]}},
    )
    api.post(
        f"/api/v1/namespaces/{namespace}/endpoints",
        {
            "metadata": {"name": f"metis-{base}"},
            "subsets": [
                {
                    "addresses": [
                        {
                            "ip": ip,
                            "targetRef": {
                                "kind": "Pod",
                                "namespace": namespace,
                                "name": name,
                                "uid": pod["metadata"]["uid"],
                            },
                        }
                    ],
                    "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
                }
            ],
        },
    )
    return ip


def test_kubectl_metis_status_search_and_requests(
    kube: ControlPlane,
    operator: Operator,
    kubelet: Kubelet,
    node_object: str,
    namespace: str,
    models: ModelServer,
    tmp_path: Path,
) -> None:
    ns, alive = namespace, operator.check_alive
    drive = tmp_path / "handbook"
    shutil.copytree(HANDBOOK, drive)
    (drive / "broken.pdf").write_bytes(b"%PDF-1.4 this is not a PDF at all")
    make_drive(kube, ns, "handbook", drive)
    model_service(kube, ns, "minilm", int(models.base_url.rsplit(":", 1)[1]))
    spec = {
        "sources": [{"drive": "handbook"}],
        "embedding": {"deployment": "minilm"},
        "rescan_seconds": 0,
    }
    for name, body in (("handbook", spec), ("lost", {**spec, "sources": [{"drive": "absent"}]})):
        kube.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(kb(name, body)))
    wait_state(kube, ns, "lost", "Failed", alive=alive)
    s = wait_state(kube, ns, "handbook", "Ready", alive=alive, timeout=180)
    kubelet.check()

    # status of a Ready base: state, totals, conditions with ages, its Events.
    out = ok(kubectl_metis(kube, "status", "handbook", "-n", ns))
    index = s["observed"]["index"]
    assert "State:           Ready" in out
    assert f"Documents:     {index['documents']} (1 failed)" in out
    assert f"Chunks:        {index['chunks']}" in out
    assert f"Address:         http://metis-handbook.{ns}.svc:{operator.indexer_port}" in out
    assert f"Machine:         {node_object}" in out
    conditions = out.split("\nConditions\n")[1].split("\nEvents\n")
    assert any(
        line.split()[:3] == ["Ready", "True", "Ready"] for line in conditions[0].splitlines()
    )
    assert any(line.split()[1:3] == ["Normal", "Ready"] for line in conditions[1].splitlines())
    assert "none (kubectl metis evaluate handbook)" in out

    # status of a Failed base names why; the namespace is taken from the flag after it too.
    out = ok(kubectl_metis(kube, "-n", ns, "status", "lost"))
    assert "State:           Failed" in out and "drive absent does not exist" in out

    # Without a base: a table; -A adds the namespace.
    rows = [line.split()[:2] for line in ok(kubectl_metis(kube, "status", "-n", ns)).splitlines()]
    assert rows[0] == ["NAME", "STATE"]
    assert ["handbook", "Ready"] in rows and ["lost", "Failed"] in rows
    everywhere = ok(kubectl_metis(kube, "status", "-A")).splitlines()
    assert everywhere[0].split()[:2] == ["NAMESPACE", "NAME"]
    assert [ns, "handbook", "Ready"] in [line.split()[:3] for line in everywhere]

    # Errors name what is missing.
    missing = kubectl_metis(kube, "status", "nope", "-n", ns)
    assert missing.returncode == 1
    assert f'error: no knowledge base "nope" in namespace "{ns}"' in missing.stderr
    stranger = kube.write_kubeconfig(
        tmp_path / "stranger.kubeconfig", "someone-else", groups=("metis-test:nobody",)
    )
    refused = kubectl_metis(kube, "status", "handbook", "-n", ns, kubeconfig=stranger)
    assert refused.returncode == 1 and "error: not allowed: " in refused.stderr
    assert 'User "someone-else" cannot get resource "knowledgebases"' in refused.stderr
    not_ready = kubectl_metis(kube, "search", "lost", "anything", "-n", ns)
    assert not_ready.returncode == 1
    assert "error: knowledge base lost is not ready: it is Failed (" in not_ready.stderr

    # A Ready base the proxy cannot reach (its Service has no Endpoints object yet) is not
    # "not ready": the error names the Service, what is missing and the way around it.
    unreached = kubectl_metis(kube, "search", "handbook", "anything", "-n", ns)
    assert unreached.returncode == 1 and "not ready" not in unreached.stderr
    assert (
        "error: the API server's proxy could not reach knowledge base handbook (it is Ready) "
        f"through Service metis-handbook in namespace {ns}: Service metis-handbook exists but "
        "has no Endpoints object"
    ) in unreached.stderr
    url = f"http://127.0.0.1:{operator.indexer_port}"
    assert f"then add --url {url} " in unreached.stderr
    question = ("search", "handbook", "How many holidays do I get?", "--top-k", "2", "-n", ns)
    through_url = ok(kubectl_metis(kube, *question, "--url", url)).splitlines()
    assert through_url[0].startswith("1. handbook/policies/leave.md, line ")
    nowhere = kubectl_metis(kube, *question, "--url", "http://127.0.0.1:1")
    assert nowhere.returncode == 1
    assert "error: cannot reach the indexer of handbook at http://127.0.0.1:1: " in nowhere.stderr

    # Search through the API server's service proxy, printed as `metis search` prints.
    publish(kube, ns, "handbook", operator.indexer_port)
    out = ok(kubectl_metis(kube, *question))
    direct = subprocess.run(
        metis(
            "search",
            "How many holidays do I get?",
            "--top-k",
            "2",
            "--url",
            f"http://127.0.0.1:{operator.indexer_port}",
        ),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    lines = out.splitlines()
    assert lines[:-1] == direct.splitlines()[:-1] == through_url[:-1]  # all but the time
    assert lines[0].startswith("1. handbook/policies/leave.md, line ")
    assert lines[-1].startswith("(hybrid; ") and lines[-1].endswith(" ms)")
    answer = json.loads(
        ok(
            kubectl_metis(
                kube, "search", "handbook", "Xid 79", "--mode", "keyword", "--json", "-n", ns
            )
        )
    )
    assert answer["mode"] == "keyword"
    assert answer["results"][0]["citation"]["document"] == "runbooks/gpu-errors.txt"
    bad = kubectl_metis(kube, "search", "handbook", "x", "--top-k", "99", "-n", ns)
    assert bad.returncode == 1 and "error: handbook: TOP_K_OUT_OF_RANGE: " in bad.stderr

    # Notes through the proxy: a write carries the base's token, read from its Secret (the
    # API server drops an Authorization header before proxying).
    fact = "Deploys freeze on Fridays after 3 pm, until the Monday stand-up."
    added = ok(kubectl_metis(kube, "note", "add", "handbook", fact, "--id", "freeze", "-n", ns))
    assert added.startswith("note freeze, written ") and fact in added
    listed = ok(kubectl_metis(kube, "note", "list", "handbook", "-n", ns))
    assert listed.startswith("note freeze, written ") and "(1 notes)" in listed
    out = ok(kubectl_metis(kube, "search", "handbook", "When do deploys freeze?", "-n", ns))
    assert "1. metis-handbook/freeze.md" in out and "   note freeze, written " in out
    empty = kubectl_metis(kube, "note", "add", "handbook", "  ", "-n", ns)
    assert empty.returncode == 1 and "error: handbook: NOTE_EMPTY: " in empty.stderr
    ok(kubectl_metis(kube, "note", "rm", "handbook", "freeze", "-n", ns))
    assert "No notes." in ok(kubectl_metis(kube, "note", "list", "handbook", "-n", ns))

    out = ok(kubectl_metis(kube, "documents", "handbook", "--failed", "-n", ns))
    (row,) = [line for line in out.splitlines() if "broken.pdf" in line]
    assert row.split()[:4] == ["handbook", "broken.pdf", "pdf", "failed"]
    assert "malformed document" in row

    # reindex and evaluate are the annotations; the operator acts on them.
    out = ok(kubectl_metis(kube, "reindex", "handbook", "--full", "-n", ns))
    value = _annotation(kube, ns, "handbook", "metis.astraeus.io/reindex")
    assert value.startswith("full ") and f"annotated metis.astraeus.io/reindex={value}" in out
    wait_for(
        lambda: ("Reindex", "a full reindex started") in state_events(kube, ns, "handbook"),
        timeout=60,
        what="the Reindex Event",
        alive=alive,
    )
    ok(kubectl_metis(kube, "evaluate", "handbook", "--k", "3", "-n", ns))
    assert _annotation(kube, ns, "handbook", "metis.astraeus.io/evaluate").startswith("k=3 ")
    evaluation: dict[str, Any] = wait_for(
        lambda: get_kb(kube, ns, "handbook").get("status", {}).get("evaluation"),
        timeout=120,
        what="the evaluation in the status",
        alive=alive,
    )
    assert evaluation["k"] == 3
    out = ok(kubectl_metis(kube, "status", "handbook", "-n", ns))
    assert (
        f"recall@3 {evaluation['recall_at_k']:.3f} · MRR {evaluation['mrr']:.3f} over "
        f"{evaluation['cases']} questions"
    ) in out
    gone = kubectl_metis(kube, "reindex", "nope", "-n", ns)
    assert gone.returncode == 1 and f'no knowledge base "nope" in namespace "{ns}"' in gone.stderr


def _annotation(kube: ControlPlane, namespace: str, name: str, key: str) -> str:
    return str(get_kb(kube, namespace, name)["metadata"]["annotations"][key])
