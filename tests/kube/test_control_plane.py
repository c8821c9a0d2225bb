"""The test control plane behaves like a real cluster: CRD schema and CEL
validation, the status subresource, resourceVersion conflicts, the scheduler
placing pods by node labels, and garbage collection through ownerReferences.

Everything converges asynchronously, so every wait polls with a deadline.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from metis_dev.plane import ControlPlane, gone
from metis_dev.process import wait_for
from metis_dev.rest import KubeApiError

GROUP = "kubetest.metis.io"
CRD_NAME = f"gadgets.{GROUP}"
CEL_MESSAGE = "minReplicas must not exceed maxReplicas"

CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": CRD_NAME},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {
            "plural": "gadgets",
            "singular": "gadget",
            "kind": "Gadget",
            "shortNames": ["gd"],
        },
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": [
                    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"}
                ],
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "required": ["minReplicas", "maxReplicas"],
                                "x-kubernetes-validations": [
                                    {
                                        "rule": "self.minReplicas <= self.maxReplicas",
                                        "message": CEL_MESSAGE,
                                    }
                                ],
                                "properties": {
                                    "minReplicas": {"type": "integer", "minimum": 0},
                                    "maxReplicas": {"type": "integer"},
                                },
                            },
                            "status": {
                                "type": "object",
                                "properties": {"phase": {"type": "string"}},
                            },
                        },
                    }
                },
            }
        ],
    },
}


def gadget(name: str, lo: int, hi: int) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "Gadget",
        "metadata": {"name": name},
        "spec": {"minReplicas": lo, "maxReplicas": hi},
    }


@pytest.fixture(scope="module")
def gadget_crd(kube: ControlPlane) -> Iterator[str]:
    """The Gadget CRD, applied with kubectl and Established."""
    kube.kubectl("apply", "-f", "-", input=yaml.safe_dump(CRD))
    kube.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")
    yield CRD_NAME
    kube.kubectl("delete", "crd", CRD_NAME, "--wait=false", "--ignore-not-found", check=False)


def test_crd_cel_validation_status_subresource_and_conflicts(
    kube: ControlPlane, gadget_crd: str, namespace: str
) -> None:
    ns = namespace
    # The CRD is Established; the first apply may still race discovery, so poll.
    wait_for(
        lambda: kube.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(gadget("good", 1, 3))),
        timeout=30,
        what="the first Gadget to be accepted",
    )
    assert "good" in kube.kubectl("get", "gd", "-n", ns).stdout

    # The CEL rule refuses a bad object, through kubectl and the Python client alike.
    bad = kube.kubectl(
        "apply", "-n", ns, "-f", "-", input=json.dumps(gadget("bad", 5, 2)), check=False
    )
    assert bad.returncode != 0
    assert CEL_MESSAGE in bad.stderr
    from kubernetes import client

    with kube.api_client() as api, pytest.raises(client.ApiException) as err:
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            GROUP, "v1", ns, "gadgets", gadget("bad", 5, 2)
        )
    assert err.value.status == 422
    assert CEL_MESSAGE in str(err.value.body)
    # The OpenAPI schema is enforced too.
    below_min = gadget("neg", -1, 2)
    refused = kube.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(below_min), check=False)
    assert refused.returncode != 0 and "minReplicas" in refused.stderr

    # Status subresource: status is written only through it, and does not bump generation.
    kube.kubectl(
        "patch",
        "gadget",
        "good",
        "-n",
        ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        '{"status": {"phase": "Ready"}}',
    )
    kube.kubectl(
        "wait", "gadget/good", "-n", ns, "--for=jsonpath={.status.phase}=Ready", "--timeout=30s"
    )
    path = f"/apis/{GROUP}/v1/namespaces/{ns}/gadgets/good"
    obj = kube.rest().get(path)
    assert obj["metadata"]["generation"] == 1
    kube.kubectl(
        "patch",
        "gadget",
        "good",
        "-n",
        ns,
        "--type=merge",
        "-p",
        '{"spec": {"maxReplicas": 4}, "status": {"phase": "Bogus"}}',
    )
    obj = kube.rest().get(path)
    assert obj["status"] == {"phase": "Ready"}
    assert obj["metadata"]["generation"] == 2
    assert "Ready" in kube.kubectl("get", "gd", "good", "-n", ns).stdout  # printer column

    # Optimistic concurrency: a write with a stale resourceVersion is a 409 Conflict.
    stale = kube.rest().get(path)
    stale["spec"]["maxReplicas"] = 5
    kube.rest().request("PUT", path, stale)
    stale["spec"]["maxReplicas"] = 6
    with pytest.raises(KubeApiError) as conflict:
        kube.rest().request("PUT", path, stale)
    assert conflict.value.status == 409


def test_deployment_scheduled_by_labels_then_garbage_collected(
    kube: ControlPlane, namespace: str
) -> None:
    ns, tag = namespace, secrets.token_hex(3)
    node_a, node_b = f"node-a-{tag}", f"node-b-{tag}"
    kube.add_node(node_a, {"metis.io/pool": f"a-{tag}"})
    kube.add_node(node_b, {"metis.io/pool": f"b-{tag}"})
    api = kube.rest()
    try:
        deployment = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {
                        "nodeSelector": {"metis.io/pool": f"b-{tag}"},
                        "containers": [{"name": "web", "image": "registry.invalid/web:1"}],
                    },
                },
            },
        }
        kube.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(deployment))
        dep = api.get(f"/apis/apps/v1/namespaces/{ns}/deployments/web")

        def owned_by(items: list[dict[str, Any]], uid: str) -> list[dict[str, Any]]:
            return [
                o
                for o in items
                if any(r["uid"] == uid for r in o["metadata"].get("ownerReferences", []))
            ]

        rs = wait_for(
            lambda: owned_by(
                api.get(f"/apis/apps/v1/namespaces/{ns}/replicasets")["items"],
                dep["metadata"]["uid"],
            ),
            timeout=60,
            what="the Deployment's ReplicaSet",
        )[0]
        rs_name = rs["metadata"]["name"]
        pod = wait_for(
            lambda: owned_by(
                api.get(f"/api/v1/namespaces/{ns}/pods")["items"], rs["metadata"]["uid"]
            ),
            timeout=60,
            what="the ReplicaSet's Pod",
        )[0]
        pod_name = pod["metadata"]["name"]
        pod_path = f"/api/v1/namespaces/{ns}/pods/{pod_name}"
        node = wait_for(
            lambda: api.get(pod_path)["spec"].get("nodeName"),
            timeout=60,
            what="the scheduler to bind the Pod",
        )
        assert node == node_b

        # Acting as the kubelet: the Pod runs, so the Deployment becomes Available.
        kube.mark_pod_running(ns, pod_name, ip="10.244.7.7")
        kube.kubectl(
            "wait", "deployment/web", "-n", ns, "--for=condition=Available", "--timeout=60s"
        )
        assert api.get(pod_path)["status"]["podIP"] == "10.244.7.7"

        # Required node affinity by hostname, and no match at all.
        for name, host in (("pinned", node_a), ("nowhere", f"absent-{tag}")):
            affinity = {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "kubernetes.io/hostname",
                                        "operator": "In",
                                        "values": [host],
                                    }
                                ]
                            }
                        ]
                    }
                }
            }
            api.post(
                f"/api/v1/namespaces/{ns}/pods",
                {
                    "metadata": {"name": name},
                    "spec": {
                        "affinity": affinity,
                        "containers": [{"name": "c", "image": "registry.invalid/c:1"}],
                    },
                },
            )
        pinned = wait_for(
            lambda: api.get(f"/api/v1/namespaces/{ns}/pods/pinned")["spec"].get("nodeName"),
            timeout=60,
            what="the pinned Pod to be scheduled",
        )
        assert pinned == node_a

        def unschedulable() -> bool:
            status = api.get(f"/api/v1/namespaces/{ns}/pods/nowhere")["status"]
            return any(
                c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
                for c in status.get("conditions", [])
            )

        wait_for(unschedulable, timeout=60, what="the unmatched Pod to be Unschedulable")

        # Deleting the owner: the garbage collector removes the ReplicaSet, then the Pod.
        kube.kubectl("delete", "deployment", "web", "-n", ns, "--timeout=60s")
        wait_for(
            lambda: gone(kube, f"/apis/apps/v1/namespaces/{ns}/replicasets/{rs_name}"),
            timeout=90,
            what="the ReplicaSet to be garbage-collected",
        )
        wait_for(lambda: gone(kube, pod_path), timeout=90, what="the Pod to be garbage-collected")
    finally:
        for n in (node_a, node_b):
            kube.kubectl("delete", "node", n, "--ignore-not-found", "--wait=false", check=False)


def test_custom_resource_owner_garbage_collected(
    kube: ControlPlane, gadget_crd: str, namespace: str
) -> None:
    """The GC learns new CRD types on its discovery resync (about 30 s)."""
    ns, api = namespace, kube.rest()
    owner = api.post(f"/apis/{GROUP}/v1/namespaces/{ns}/gadgets", gadget("owner", 0, 1))
    ref = {
        "apiVersion": f"{GROUP}/v1",
        "kind": "Gadget",
        "name": "owner",
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    api.post(
        f"/api/v1/namespaces/{ns}/configmaps",
        {"metadata": {"name": "child", "ownerReferences": [ref]}, "data": {"k": "v"}},
    )
    api.delete(f"/apis/{GROUP}/v1/namespaces/{ns}/gadgets/owner")
    wait_for(
        lambda: gone(kube, f"/api/v1/namespaces/{ns}/configmaps/child"),
        timeout=120,
        interval=1.0,
        what="the ConfigMap owned by a Gadget to be garbage-collected",
    )


def test_namespace_deletion_completes(kube: ControlPlane) -> None:
    """The namespace controller empties a namespace, scheduled pods included
    (the control plane's pod reaper plays the kubelet's part)."""
    ns, tag = f"t-del-{secrets.token_hex(3)}", secrets.token_hex(3)
    api = kube.rest()
    kube.add_node(f"node-{tag}")
    try:
        api.post("/api/v1/namespaces", {"metadata": {"name": ns}})
        wait_for(
            lambda: api.get(f"/api/v1/namespaces/{ns}/serviceaccounts/default"),
            timeout=60,
            what="the default service account",
        )
        api.post(
            f"/api/v1/namespaces/{ns}/pods",
            {
                "metadata": {"name": "p"},
                "spec": {
                    "nodeName": f"node-{tag}",
                    "containers": [{"name": "c", "image": "registry.invalid/c:1"}],
                },
            },
        )
        kube.mark_pod_running(ns, "p")
        kube.kubectl("delete", "namespace", ns, "--timeout=90s")
        assert gone(kube, f"/api/v1/namespaces/{ns}")
    finally:
        kube.kubectl("delete", "node", f"node-{tag}", "--ignore-not-found", check=False)
