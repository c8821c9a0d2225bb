"""A base's pod settings for real node pools (tolerations, node affinity, a priority
class, pod labels and annotations, the index drive's class and size), the operator's pull
secrets and the NetworkPolicy's extra peers: as the spec takes them, refuses them, and as
the children carry them."""

from __future__ import annotations

import base64
import json
from importlib.metadata import version
from typing import Any

import pytest

from metis_operator import children, index_drive, observe, state
from metis_operator.api import identity
from metis_operator.api.spec import (
    OWN_LABELS,
    OWN_PREFIX,
    Placement,
    SpecError,
    parse,
    unknown_fields,
)
from metis_operator.settings import IndexerSettings, NetworkSettings, Settings, load

OWNER = children.Owner("handbook", "team-a", "uid-1")
SETTINGS = Settings(indexer=IndexerSettings(image="registry.example/metis-indexer:1"))
TOLERATION = {"key": "dedicated", "operator": "Equal", "value": "search", "effect": "NoSchedule"}
ZONE = {
    "matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}]
}


def spec(**changes: Any) -> Any:
    body = {"sources": [{"drive": "docs"}], "embedding": {"deployment": "bge-m3"}, **changes}
    return parse("handbook", body)


def pod_of(deployment: dict[str, Any]) -> dict[str, Any]:
    return dict(deployment["spec"]["template"]["spec"])


def test_the_operators_labels_are_the_ones_the_spec_keeps_for_it() -> None:
    assert tuple(children.labels("handbook", "indexer")) == OWN_LABELS
    assert OWN_PREFIX == identity.GROUP + "/"


def test_tolerations_affinity_and_priority_reach_the_pod() -> None:
    place = {
        "labels": {"pool": "search"},
        "machines": ["node-1"],
        "tolerations": [
            TOLERATION,
            {"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60},
        ],
        "node_affinity": [ZONE],
    }
    own = {"priority_class": "search-critical"}
    pod = pod_of(children.deployment(OWNER, spec(placement=place, pod=own), SETTINGS))
    assert pod["tolerations"] == [
        TOLERATION,
        {"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60},
    ]
    assert pod["priorityClassName"] == "search-critical"
    assert pod["nodeSelector"] == {"pool": "search"}
    # Machines and the user's term must both hold: the machines rule joins each term.
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms == {
        "nodeSelectorTerms": [
            {
                "matchExpressions": [
                    ZONE["matchExpressions"][0],
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-1"]},
                ]
            }
        ]
    }


def test_a_pod_without_settings_is_as_before() -> None:
    pod = pod_of(children.deployment(OWNER, spec(), SETTINGS))
    for absent in ("tolerations", "priorityClassName", "imagePullSecrets"):
        assert absent not in pod
    assert "nodeAffinity" not in pod["affinity"]


def test_pod_labels_and_annotations_go_on_the_template_beside_the_operators() -> None:
    own = {
        "labels": {"team": "support", "cost-center": "42"},
        "annotations": {"sidecar.istio.io/inject": "false"},
    }
    dep = children.deployment(OWNER, spec(pod=own), SETTINGS)
    meta = dep["spec"]["template"]["metadata"]
    assert meta["labels"] == {
        "team": "support",
        "cost-center": "42",
        **children.labels("handbook", "indexer"),
    }
    assert meta["annotations"] == {"sidecar.istio.io/inject": "false"}
    # The selector stays the operator's: the Deployment still picks its pods.
    assert dep["spec"]["selector"]["matchLabels"].items() <= meta["labels"].items()


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        (
            {"pod": {"labels": {"app.kubernetes.io/instance": "other"}}},
            "spec.pod.labels: app.kubernetes.io/instance is a label the operator sets",
        ),
        (
            {"pod": {"labels": {"metis.astraeus.io/replica": "3"}}},
            "spec.pod.labels: metis.astraeus.io/replica is a label the operator sets",
        ),
        (
            {"pod": {"annotations": {"metis.astraeus.io/pod-inputs": "x"}}},
            "spec.pod.annotations: metis.astraeus.io/pod-inputs is under metis.astraeus.io/",
        ),
        ({"pod": {"labels": {"team": "a b"}}}, "'a b' (of team) is not a label value"),
        (
            {"placement": {"tolerations": [{"value": "x"}]}},
            "spec.placement.tolerations[0]: a toleration without a key must have operator Exists",
        ),
        (
            {"placement": {"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}},
            "a toleration with operator Exists has no value",
        ),
        (
            {"placement": {"tolerations": [{"key": "k", "tolerationSeconds": 5}]}},
            "tolerationSeconds is for effect NoExecute only",
        ),
        (
            {"placement": {"tolerations": [{"key": "k", "effect": "NoWay"}]}},
            "spec.placement.tolerations[0].effect",
        ),
        (
            {
                "placement": {
                    "node_affinity": [{"matchExpressions": [{"key": "zone", "operator": "In"}]}]
                }
            },
            "spec.placement.node_affinity[0].matchExpressions[0]: operator In takes at least one",
        ),
        (
            {
                "placement": {
                    "node_affinity": [
                        {
                            "matchExpressions": [
                                {"key": "cores", "operator": "Gt", "values": ["many"]}
                            ]
                        }
                    ]
                }
            },
            "operator Gt takes one integer value",
        ),
        (
            {"placement": {"node_affinity": [{"matchExpressions": []}]}},
            "spec.placement.node_affinity[0].matchExpressions",
        ),
        ({"pod": {"priority_class": "Not_A_Name"}}, "spec.pod.priority_class"),
        ({"index_drive": {"size_gb": 0}}, "spec.index_drive.size_gb"),
    ],
)
def test_settings_that_would_break_the_pod_are_refused_naming_the_field(
    changes: dict[str, Any], said: str
) -> None:
    with pytest.raises(SpecError) as e:
        spec(**changes)
    assert said in str(e.value)


def test_a_kubernetes_spelt_field_is_known_and_a_misspelt_one_is_not() -> None:
    raw = {
        "sources": [{"drive": "docs"}],
        "embedding": {"deployment": "m"},
        "placement": {
            "tolerations": [
                {"key": "k", "effect": "NoExecute", "tolerationSeconds": 3, "tolerationSecond": 3}
            ]
        },
    }
    assert unknown_fields(raw) == ["spec.placement.tolerations[0].tolerationSecond"]


def test_a_base_made_before_the_settings_keeps_its_pod_digest() -> None:
    """An operator that knows the new fields must not replace every running pod."""
    before = children.PodInputs(["docs"], Placement(), 1).digest()
    assert children.pod_inputs(spec()).digest() == before
    tolerating = spec(placement={"tolerations": [TOLERATION]})
    assert children.pod_inputs(tolerating).digest() != before
    labelled = spec(pod={"labels": {"team": "a"}})
    assert children.pod_inputs(labelled).digest() != before


def _running(place: dict[str, Any]) -> dict[str, Any]:
    """A Deployment as the API server holds it, made for `place`, settled."""
    dep = children.deployment(OWNER, spec(placement=place), SETTINGS)
    dep["metadata"]["generation"] = 1
    dep["status"] = {"observedGeneration": 1, "updatedReplicas": 1}
    return dep


def test_a_new_node_rule_or_a_toleration_taken_away_may_move_the_drive() -> None:
    tolerated = {"tolerations": [TOLERATION]}
    actual = _running(tolerated)
    assert not children.must_move(spec(placement=tolerated).placement, actual, "node-1")
    # A toleration added only widens where the pod may go.
    more = {"tolerations": [TOLERATION, {"key": "gpu", "operator": "Exists"}]}
    assert not children.must_move(spec(placement=more).placement, actual, "node-1")
    # Taken away: the machine's taint may now keep the pod off it.
    assert children.must_move(spec().placement, actual, "node-1")
    zoned = {"node_affinity": [ZONE]}
    assert children.must_move(spec(placement=zoned).placement, _running({}), "node-1")
    assert not children.must_move(spec(placement=zoned).placement, _running(zoned), "node-1")


def _pull(name: str, auths: dict[str, Any], key: str = ".dockerconfigjson") -> dict[str, Any]:
    raw = {"auths": auths} if key == ".dockerconfigjson" else auths
    data = base64.b64encode(json.dumps(raw).encode()).decode()
    return {"metadata": {"name": name}, "data": {key: data}}


def test_the_pull_secrets_are_copied_as_one_owned_by_the_base() -> None:
    a = _pull("regcred", {"registry.team:5000": {"auth": "YTpi"}})
    b = _pull(
        "mirror",
        {"mirror.team": {"auth": "Yzpk"}, "registry.team:5000": {"auth": "x"}},
        ".dockercfg",
    )
    secret = children.pull_secret(OWNER, [a, b])
    assert secret["metadata"]["name"] == "metis-handbook-pull"
    assert secret["metadata"]["namespace"] == "team-a"
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert secret["type"] == "kubernetes.io/dockerconfigjson"
    config = json.loads(base64.b64decode(secret["data"][".dockerconfigjson"]))
    assert config == {
        "auths": {"registry.team:5000": {"auth": "YTpi"}, "mirror.team": {"auth": "Yzpk"}}
    }
    with_pulls = Settings(indexer=IndexerSettings(image_pull_secrets=("regcred", "mirror")))
    pod = pod_of(children.deployment(OWNER, spec(), with_pulls))
    assert pod["imagePullSecrets"] == [{"name": "metis-handbook-pull"}]


@pytest.mark.parametrize(
    ("secret", "said"),
    [
        (
            {"metadata": {"name": "opaque"}, "data": {"token": "eA=="}},
            "Secret opaque holds no .dockerconfigjson",
        ),
        (
            {"metadata": {"name": "broken"}, "data": {".dockerconfigjson": "bm90IGpzb24="}},
            "Secret broken holds no registry credentials",
        ),
    ],
)
def test_a_secret_without_credentials_is_named(secret: dict[str, Any], said: str) -> None:
    with pytest.raises(children.PullProblem, match=said):
        children.pull_secret(OWNER, [secret])


def test_the_network_policy_admits_the_peers_the_operator_is_told() -> None:
    wide = Settings(
        network=NetworkSettings(allow_namespaces=("monitoring",), allow_cidrs=("10.0.0.0/24",))
    )
    (rule,) = children.network_policy(OWNER, wide, "metis-system")["spec"]["ingress"]
    assert rule["from"] == [
        {"podSelector": {}},
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "metis-system"}}},
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}},
        {"ipBlock": {"cidr": "10.0.0.0/24"}},
    ]


def test_network_settings_come_from_the_environment_and_a_bad_range_is_named() -> None:
    s = load(
        {
            "METIS_NETWORK_ALLOW_NAMESPACES": "monitoring, ingress",
            "METIS_NETWORK_ALLOW_CIDRS": "10.0.0.0/16",
            "METIS_INDEXER_IMAGE_PULL_SECRETS": "regcred",
        }
    )
    assert s.network.allow_namespaces == ("monitoring", "ingress")
    assert s.indexer.image_pull_secrets == ("regcred",)
    with pytest.raises(ValueError) as e:
        load({"METIS_NETWORK_ALLOW_CIDRS": "10.0.0/33"})
    assert "'10.0.0/33' is not an IP range" in str(e.value)


def test_the_default_indexer_image_is_the_operators_own_release() -> None:
    assert IndexerSettings().image == f"ghcr.io/astraeus/metis-indexer:{version('metis')}"


def test_the_index_drive_asks_at_least_the_bases_size() -> None:
    assert index_drive.size_gib(2, "float32", "10Gi", 500) == 500
    assert index_drive.size_gib(2, "float32", "10Gi", 1) == index_drive.size_gib(
        2, "float32", "10Gi"
    )


def test_a_drive_of_another_class_is_said_once_asked() -> None:
    claim = {"metadata": {"name": "metis-handbook"}, "spec": {"storageClassName": "standard"}}
    assert index_drive.class_note(claim, None) is None
    assert index_drive.class_note(claim, "standard") is None
    note = index_drive.class_note(claim, "nvme")
    assert note is not None
    assert note.startswith(
        "index drive metis-handbook has StorageClass standard, the base asks nvme"
    )


def test_an_untolerated_taint_is_named_with_what_to_do() -> None:
    said = (
        "0/2 nodes are available: 1 node(s) had untolerated taint {dedicated: search}, "
        "1 node(s) had untolerated taint {nvidia.com/gpu: }. preemption: 0/2 nodes are "
        "available: 2 Preemption is not helpful for scheduling."
    )
    reason = state.unschedulable(said, Placement())
    assert reason.startswith(
        "machines have taints it does not tolerate (dedicated: search, nvidia.com/gpu): add "
        "them to placement.tolerations"
    )
    assert "(scheduler: 0/2 nodes are available" in reason


def _node(labels: dict[str, str], *taints: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"labels": labels}, "spec": {"taints": list(taints)}}


def test_the_taints_that_keep_a_pod_off_its_machines_are_named() -> None:
    """Newer schedulers say "had untolerated taint(s)" and no more: the operator reads the
    machines the pod's node selector picks."""
    search = {"key": "dedicated", "value": "search", "effect": "NoSchedule"}
    gpu = {"key": "nvidia.com/gpu", "effect": "NoExecute"}
    soft = {"key": "spot", "value": "true", "effect": "PreferNoSchedule"}
    nodes = [
        _node({"pool": "search"}, search, soft),
        _node({"pool": "search"}, gpu),
        _node({"pool": "other"}, {"key": "elsewhere", "effect": "NoSchedule"}),
    ]
    pod = {"nodeSelector": {"pool": "search"}}
    assert observe.untolerated(nodes, pod) == (
        "dedicated=search:NoSchedule",
        "nvidia.com/gpu:NoExecute",
    )
    pod["tolerations"] = [{**TOLERATION}, {"operator": "Exists", "effect": "NoExecute"}]
    assert observe.untolerated(nodes, pod) == ()
    pod["tolerations"] = [{"key": "dedicated", "operator": "Equal", "value": "other"}]
    assert "dedicated=search:NoSchedule" in observe.untolerated(nodes, pod)
    reason = state.unschedulable(
        "0/3 nodes are available: 2 node(s) had untolerated taint(s).",
        Placement(),
        observe.untolerated(nodes, {"nodeSelector": {"pool": "search"}}),
    )
    assert reason.startswith(
        "machines have taints it does not tolerate (dedicated=search:NoSchedule, "
        "nvidia.com/gpu:NoExecute): add them to placement.tolerations"
    )
