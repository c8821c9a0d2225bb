"""The children as pure manifests, and when one must be applied again."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest

from metis_indexer.config import IndexerConfig
from metis_operator import children
from metis_operator.api.spec import KnowledgeBaseSpec, Placement, parse, to_indexer_config
from metis_operator.settings import IndexerSettings, Settings

OWNER = children.Owner("handbook", "team-a", "uid-1")
SETTINGS = Settings(indexer=IndexerSettings(image="registry.example/metis-indexer:1", port=7700))


def spec_with(**changes: Any) -> KnowledgeBaseSpec:
    body = {
        "sources": [
            {"drive": "docs", "path": "handbook"},
            {"drive": "docs", "path": "faq"},
            {"drive": "runbooks"},
        ],
        "embedding": {"deployment": "bge-m3"},
        **changes,
    }
    return parse("handbook", body)


def every_child(spec: KnowledgeBaseSpec) -> list[dict[str, Any]]:
    config = to_indexer_config(
        "handbook",
        spec,
        port=7700,
        embedding_url="http://bge-m3.team-a.svc:80",
        reranker_url=None,
        revisions={},
    )
    return [
        children.config_map(OWNER, config),
        children.index_claim(OWNER, SETTINGS),
        children.deployment(OWNER, spec, SETTINGS),
        children.service(OWNER, SETTINGS),
        children.api_secret(OWNER),
        children.network_policy(OWNER, SETTINGS, "metis-system"),
    ]


def test_each_child_is_named_labelled_and_owned_by_the_base() -> None:
    for child in every_child(spec_with()):
        meta = child["metadata"]
        assert (meta["name"], meta["namespace"]) == ("metis-handbook", "team-a")
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "metis.astraeus.io/v1",
                "kind": "KnowledgeBase",
                "name": "handbook",
                "uid": "uid-1",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        labels = meta["labels"]
        assert labels["app.kubernetes.io/name"] == "metis-indexer"
        assert labels["app.kubernetes.io/instance"] == "handbook"
        assert labels["app.kubernetes.io/managed-by"] == "metis-operator"
        assert labels["app.kubernetes.io/part-of"] == "metis"


def test_the_pod_mounts_each_drive_once_read_only_and_runs_unprivileged() -> None:
    dep = children.deployment(OWNER, spec_with(), SETTINGS)
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert sorted(mounts) == ["/drives/docs", "/drives/runbooks", "/etc/metis", "/index", "/tmp"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    for drive in ("docs", "runbooks"):
        m = mounts[f"/drives/{drive}"]
        assert m["readOnly"] is True
        assert volumes[m["name"]]["persistentVolumeClaim"] == {"claimName": drive, "readOnly": True}
    assert volumes[mounts["/index"]["name"]]["persistentVolumeClaim"] == {
        "claimName": "metis-handbook"
    }
    assert volumes[mounts["/etc/metis"]["name"]]["configMap"] == {"name": "metis-handbook"}
    assert "subPath" not in mounts["/etc/metis"]  # so ConfigMap updates reach the pod
    assert c["image"] == "registry.example/metis-indexer:1"
    assert c["command"] == ["metis", "serve", "--config", "/etc/metis/config.json"]
    assert c["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["automountServiceAccountToken"] is False
    assert c["ports"] == [{"name": "http", "containerPort": 7700, "protocol": "TCP"}]
    assert dep["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["selector"]["matchLabels"] == children.selector("handbook")


@pytest.mark.parametrize(
    ("placement", "expected"),
    [
        ({}, {}),
        ({"labels": {"pool": "gpu"}}, {"nodeSelector": {"pool": "gpu"}}),
        (
            {"machines": ["n1", "n2"]},
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {
                                            "key": "kubernetes.io/hostname",
                                            "operator": "In",
                                            "values": ["n1", "n2"],
                                        }
                                    ]
                                }
                            ]
                        }
                    }
                }
            },
        ),
    ],
    ids=["anywhere", "labels", "machines"],
)
def test_placement(placement: dict[str, Any], expected: dict[str, Any]) -> None:
    pod = children.deployment(OWNER, spec_with(placement=placement), SETTINGS)["spec"]["template"]
    got = {k: pod["spec"][k] for k in ("nodeSelector", "affinity") if k in pod["spec"]}
    # The pod affinity that holds a replacement to the old pod's machine is not placement.
    got.get("affinity", {}).pop("podAffinity", None)
    assert {k: v for k, v in got.items() if v} == expected


def test_cpu_is_requested_and_memory_requested_and_limited() -> None:
    dep = children.deployment(
        OWNER, spec_with(placement={"cpu_cores": 4, "memory_gb": 16}), SETTINGS
    )
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["resources"] == {
        "requests": {"cpu": "4", "memory": "16Gi"},
        "limits": {"memory": "16Gi"},
    }


def test_a_configuration_change_does_not_replace_the_pod_but_a_new_source_does() -> None:
    base = children.deployment(OWNER, spec_with(), SETTINGS)
    rechunked = spec_with(chunking={"size": 800}, rescan_seconds=0)
    assert children.deployment(OWNER, rechunked, SETTINGS) == base
    reordered = spec_with(sources=[{"drive": "runbooks"}, {"drive": "docs"}])
    assert children.deployment(OWNER, reordered, SETTINGS) == children.deployment(
        OWNER, spec_with(sources=[{"drive": "docs"}, {"drive": "runbooks"}]), SETTINGS
    )
    grown = spec_with(sources=[{"drive": "docs"}, {"drive": "runbooks"}, {"drive": "wiki"}])
    assert children.deployment(OWNER, grown, SETTINGS) != base


def test_the_configmap_holds_the_indexers_configuration() -> None:
    cm = every_child(spec_with())[0]
    config = json.loads(cm["data"]["config.json"])
    assert config["index_dir"] == "/index" and config["sources"][0]["root"] == "/drives/docs"


def test_volume_names_are_dns_labels_for_any_drive_name() -> None:
    name = children.volume_name("a." * 100 + "b")
    assert len(name) <= 63 and name == children.volume_name("a." * 100 + "b")


def test_index_claim_class_only_when_set() -> None:
    assert "storageClassName" not in children.index_claim(OWNER, SETTINGS)["spec"]
    fast = Settings(indexer=IndexerSettings(storage_class="fast", index_storage="50Gi"))
    spec = children.index_claim(OWNER, fast, storage_class="fast")["spec"]
    assert spec["storageClassName"] == "fast"
    assert spec["resources"] == {"requests": {"storage": "50Gi"}}


def test_a_bases_storage_class_wins_over_the_operators() -> None:
    fast = Settings(indexer=IndexerSettings(storage_class="fast"))
    assert children.storage_class(spec_with(), SETTINGS) is None
    assert children.storage_class(spec_with(), fast) == "fast"
    own = spec_with(index_drive={"storage_class": "nvme"})
    assert children.storage_class(own, fast) == "nvme"


def test_a_shared_index_drive_lets_a_replacement_start_beside_the_old_pod() -> None:
    assert children.index_claim(OWNER, SETTINGS)["spec"]["accessModes"] == ["ReadWriteOnce"]
    shared = Settings(indexer=IndexerSettings(index_access_mode="ReadWriteMany"))
    assert children.index_claim(OWNER, shared)["spec"]["accessModes"] == ["ReadWriteMany"]
    dep = children.deployment(OWNER, spec_with(), shared)
    assert dep["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }


def served(manifest: dict[str, Any]) -> dict[str, Any]:
    """The object as the API server returns it: defaults and status added."""
    out = copy.deepcopy(manifest)
    out["metadata"] |= {"uid": "u", "resourceVersion": "7", "managedFields": []}
    out["spec"]["progressDeadlineSeconds"] = 600
    c = out["spec"]["template"]["spec"]["containers"][0]
    c["terminationMessagePath"] = "/dev/termination-log"
    c["livenessProbe"]["httpGet"]["scheme"] = "HTTP"
    out["status"] = {"replicas": 1}
    return out


def test_needs_apply() -> None:
    desired = children.with_hash(children.deployment(OWNER, spec_with(), SETTINGS))
    actual = served(desired)
    assert children.needs_apply(desired, None)
    assert not children.needs_apply(desired, actual)

    drifted = copy.deepcopy(actual)
    drifted["spec"]["replicas"] = 3  # someone scaled it
    assert children.needs_apply(desired, drifted)

    # A placement label removed: the subset test cannot see it, the hash does.
    labelled = children.with_hash(
        children.deployment(OWNER, spec_with(placement={"labels": {"pool": "a"}}), SETTINGS)
    )
    assert children.needs_apply(desired, served(labelled))


def test_the_token_is_random_opaque_and_reaches_the_indexer_from_the_secret() -> None:
    secret = children.api_secret(OWNER)
    assert (secret["kind"], secret["type"]) == ("Secret", "Opaque")
    token = base64.b64decode(secret["data"]["token"], validate=True).decode()
    assert len(token) >= 43 and token.isascii()  # 32 random bytes, URL-safe
    assert children.api_secret(OWNER)["data"]["token"] != secret["data"]["token"]
    (c,) = children.deployment(OWNER, spec_with(), SETTINGS)["spec"]["template"]["spec"][
        "containers"
    ]
    assert c["env"] == [
        {
            "name": "METIS_API_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": "metis-handbook", "key": "token"}},
        }
    ]


def test_only_the_bases_namespace_and_the_operators_reach_the_indexer_port() -> None:
    policy = children.network_policy(OWNER, SETTINGS, "metis-ops")
    assert policy["apiVersion"] == "networking.k8s.io/v1" and policy["kind"] == "NetworkPolicy"
    spec = policy["spec"]
    # The indexer pods, exactly as the Deployment and the Service pick them.
    dep = children.deployment(OWNER, spec_with(), SETTINGS)
    picked = spec["podSelector"]["matchLabels"]
    assert picked == dep["spec"]["selector"]["matchLabels"]
    assert picked == children.service(OWNER, SETTINGS)["spec"]["selector"]
    assert spec["policyTypes"] == ["Ingress"]
    (rule,) = spec["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 7700}]
    assert rule["from"] == [
        {"podSelector": {}},  # without a namespaceSelector: the policy's own namespace only
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "metis-ops"}}},
    ]


def test_the_policy_follows_the_indexers_port() -> None:
    moved = Settings(indexer=IndexerSettings(port=17700))
    (rule,) = children.network_policy(OWNER, moved, "metis-system")["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 17700}]


SAME_MACHINE = {
    "requiredDuringSchedulingIgnoredDuringExecution": [
        {
            "labelSelector": {
                "matchLabels": {
                    "app.kubernetes.io/name": "metis-indexer",
                    "app.kubernetes.io/instance": "handbook",
                }
            },
            "topologyKey": "kubernetes.io/hostname",
        }
    ]
}
ON_N1 = {
    "requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [
            {
                "matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}
                ]
            }
        ]
    }
}
ROLLING = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}


@pytest.mark.parametrize(
    ("mode", "machines", "strategy", "affinity"),
    [
        ("ReadWriteOnce", [], ROLLING, {"podAffinity": SAME_MACHINE}),
        ("ReadWriteOnce", ["n1"], ROLLING, {"nodeAffinity": ON_N1, "podAffinity": SAME_MACHINE}),
        ("ReadWriteMany", [], ROLLING, None),
        ("ReadWriteMany", ["n1"], ROLLING, {"nodeAffinity": ON_N1}),
        # Two pods never mount a ReadWriteOncePod drive, not even on one machine.
        ("ReadWriteOncePod", ["n1"], {"type": "Recreate"}, {"nodeAffinity": ON_N1}),
    ],
    ids=["rwo", "rwo-machines", "rwx", "rwx-machines", "rwop"],
)
def test_a_replacement_starts_beside_the_old_pod_on_the_machine_its_drive_allows(
    mode: str, machines: list[str], strategy: dict[str, Any], affinity: dict[str, Any] | None
) -> None:
    settings = Settings(indexer=IndexerSettings(index_access_mode=mode))
    dep = children.deployment(OWNER, spec_with(placement={"machines": machines}), settings)
    assert dep["spec"]["strategy"] == strategy
    pod = dep["spec"]["template"]["spec"]
    assert pod.get("affinity") == affinity
    # The pod affinity picks the base's own pods: those its Deployment selects.
    assert (
        SAME_MACHINE["requiredDuringSchedulingIgnoredDuringExecution"][0]["labelSelector"][
            "matchLabels"
        ]
        == (dep["spec"]["selector"]["matchLabels"])
    )


def test_the_kubelet_lets_the_indexer_drain_before_it_kills_it() -> None:
    pod = children.deployment(OWNER, spec_with(), SETTINGS)["spec"]["template"]["spec"]
    drain = IndexerConfig.model_fields["drain_seconds"].default
    assert pod["terminationGracePeriodSeconds"] == 40
    assert pod["terminationGracePeriodSeconds"] >= drain + 20


def test_a_drive_that_must_move_stops_the_old_pod_first() -> None:
    moving = children.deployment(OWNER, spec_with(), SETTINGS, moving=True)
    assert moving["spec"]["strategy"] == {"type": "Recreate"}
    # Only the strategy: the template is the same, so the switch back replaces no pod.
    assert (
        moving["spec"]["template"]
        == children.deployment(OWNER, spec_with(), SETTINGS)["spec"]["template"]
    )
    shared = Settings(indexer=IndexerSettings(index_access_mode="ReadWriteMany"))
    assert children.deployment(OWNER, spec_with(), shared, moving=True)["spec"]["strategy"] == (
        ROLLING
    )


def running(
    placement: dict[str, Any], *, strategy: str = "RollingUpdate", rolled: bool = True
) -> dict[str, Any]:
    """The Deployment as the API server has it after a rollout (or in the middle of one)."""
    dep = served(children.deployment(OWNER, spec_with(placement=placement), SETTINGS))
    dep["spec"]["strategy"] = {"type": strategy}
    dep["metadata"]["generation"] = 4
    dep["status"] = {"observedGeneration": 4 if rolled else 3, "updatedReplicas": 1}
    return dep


@pytest.mark.parametrize(
    ("placement", "actual", "node", "moves"),
    [
        ({}, None, None, False),
        ({}, running({}), "n1", False),
        ({"machines": ["n1", "n2"]}, running({}), "n1", False),
        ({"machines": ["n2"]}, running({}), "n1", True),
        ({"machines": ["n2"]}, running({}), None, False),
        ({"labels": {"pool": "a"}}, running({"labels": {"pool": "a", "zone": "b"}}), "n1", False),
        ({"labels": {"pool": "b"}}, running({"labels": {"pool": "a"}}), "n1", True),
        ({"labels": {"pool": "a"}}, running({}), "n1", True),
        ({}, running({}, strategy="Recreate", rolled=False), "n1", True),
        ({}, running({}, strategy="Recreate"), "n1", False),
    ],
    ids=[
        "first",
        "same-placement",
        "machines-keep-its-machine",
        "machines-leave-its-machine",
        "no-pod-on-a-machine",
        "fewer-labels",
        "other-labels",
        "new-label",
        "recreating-not-done",
        "recreated",
    ],
)
def test_when_the_index_drive_must_move(
    placement: dict[str, Any], actual: dict[str, Any] | None, node: str | None, moves: bool
) -> None:
    assert children.must_move(Placement(**placement), actual, node) is moves
