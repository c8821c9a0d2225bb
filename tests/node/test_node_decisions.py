"""The node's and the image build's decisions, over plain data (no process, no I/O
beyond a temporary tree)."""

from __future__ import annotations

import os
from pathlib import Path

from metis_dev import images, node

SAVED_NAT = """\
*nat
:PREROUTING ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:CNI-306c ACCEPT [0:0]
:CNI-HP - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-ABC - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -s 10.244.0.2/32 -m comment --comment "name: \\"metis\\" id: \\"82c6\\"" -j CNI-306c
-A POSTROUTING -s 10.88.0.0/16 -m comment --comment "name: \\"podman\\" id: \\"1\\"" -j CNI-HP
-A CNI-306c -d 10.244.0.0/24 -m comment --comment "name: \\"metis\\" id: \\"82c6\\"" -j ACCEPT
-A KUBE-SERVICES -d 10.0.0.12/32 -p tcp -j KUBE-SVC-ABC
COMMIT
"""


def test_the_node_removes_its_own_rules_and_leaves_others() -> None:
    rules, chains = node.node_rules(SAVED_NAT)
    assert chains == ["KUBE-SERVICES", "KUBE-SVC-ABC", "CNI-306c"]
    assert rules == [
        [
            "PREROUTING",
            "-m",
            "comment",
            "--comment",
            "kubernetes service portals",
            "-j",
            "KUBE-SERVICES",
        ],
        [
            "POSTROUTING",
            "-s",
            "10.244.0.2/32",
            "-m",
            "comment",
            "--comment",
            'name: "metis" id: "82c6"',
            "-j",
            "CNI-306c",
        ],
    ]


def test_services_are_named_by_their_cluster_ip() -> None:
    services = [
        {"metadata": {"name": "minilm", "namespace": "t"}, "spec": {"clusterIP": "10.0.0.7"}},
        {"metadata": {"name": "headless", "namespace": "t"}, "spec": {"clusterIP": "None"}},
        {"metadata": {"name": "a", "namespace": "b"}, "spec": {"clusterIP": "10.0.0.3"}},
    ]
    assert node.service_hosts(services) == (
        "10.0.0.3 a.b.svc a.b.svc.cluster.local\n10.0.0.7 minilm.t.svc minilm.t.svc.cluster.local\n"
    )


def test_only_a_claim_without_volume_or_class_gets_a_folder() -> None:
    claim = {
        "metadata": {"name": "metis-kb", "namespace": "t", "uid": "u1"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "2Gi"}}},
    }
    pv = node.claim_volume(claim, Path("/w/volumes/x"))
    assert pv is not None
    assert pv["spec"]["hostPath"]["path"] == "/w/volumes/x"
    assert pv["spec"]["claimRef"] == {"namespace": "t", "name": "metis-kb", "uid": "u1"}
    assert pv["spec"]["capacity"] == {"storage": "2Gi"}
    assert pv["spec"]["storageClassName"] == ""
    bound = {**claim, "spec": {**claim["spec"], "volumeName": "pv-1"}}
    classed = {**claim, "spec": {**claim["spec"], "storageClassName": "fast"}}
    assert node.claim_volume(bound, Path("/w")) is None
    assert node.claim_volume(classed, Path("/w")) is None


def test_volume_names_are_short_and_distinct() -> None:
    long = node.volume_name("n" * 60, "c" * 60)
    assert len(long) <= 63
    assert node.volume_name("a-b", "c") != node.volume_name("a", "b-c")


def test_the_not_ready_taint_goes_once_and_nothing_else() -> None:
    taints = [
        {"key": node.NOT_READY_TAINT, "effect": "NoSchedule"},
        {"key": "pool", "value": "gpu", "effect": "NoSchedule"},
    ]
    assert node.without_not_ready_taint({"spec": {"taints": taints}}) == [taints[1]]
    assert node.without_not_ready_taint({"spec": {"taints": taints[1:]}}) is None
    assert node.without_not_ready_taint({"spec": {}}) is None


def test_podman_limits_stay_where_runc_can_set_them() -> None:
    limits = dict(u.split("=") for u in images.ulimits())
    soft, hard = limits["nproc"].split(":")
    assert soft == hard and int(hard) <= images.NPROC_CEILING
    conf = images.containers_conf(images.ulimits())
    assert 'runtime = "runc"' in conf and "default_ulimits" in conf


def _tree(root: Path) -> None:
    for rel in (
        "pyproject.toml",
        "requirements/image.txt",
        "requirements/test.txt",
        "indexer_image/Dockerfile",
        "metis_operator/a.py",
        "indexer_image/metis_indexer/b.py",
        "indexer_image/metis_indexer/__pycache__/b.cpython-311.pyc",
    ):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rel)


def test_an_image_is_rebuilt_exactly_when_its_inputs_change(tmp_path: Path) -> None:
    _tree(tmp_path)
    assert [str(p) for p in images.context_files(tmp_path)] == [
        "indexer_image/metis_indexer/b.py",
        "metis_operator/a.py",
        "pyproject.toml",
        "requirements/image.txt",
    ]
    key = images.image_key(images.INDEXER, "base-1", tmp_path)
    (tmp_path / "indexer_image/metis_indexer/__pycache__/b.cpython-311.pyc").write_text("x")
    assert images.image_key(images.INDEXER, "base-1", tmp_path) == key
    assert images.image_key(images.INDEXER, "base-2", tmp_path) != key
    assert images.image_key(images.OPERATOR, "base-1", tmp_path) != key
    (tmp_path / "requirements/test.txt").write_text("the tests' lock: not the image's")
    assert images.image_key(images.INDEXER, "base-1", tmp_path) == key
    (tmp_path / "requirements/image.txt").write_text("a new lock")
    assert images.image_key(images.INDEXER, "base-1", tmp_path) != key
    key = images.image_key(images.INDEXER, "base-1", tmp_path)
    (tmp_path / "metis_operator/a.py").write_text("changed")
    assert images.image_key(images.INDEXER, "base-1", tmp_path) != key


def test_the_kubelet_finds_pods_dns_at_the_bridge(tmp_path: Path) -> None:
    config = node.kubelet_config(tmp_path, 10250, 10248)
    assert config["clusterDNS"] == [node.GATEWAY]
    assert config["containerRuntimeEndpoint"] == f"unix://{tmp_path}/containerd.sock"
    containerd = node.containerd_config(tmp_path, tmp_path / "images")
    assert f'sandbox_image = "{node.PAUSE_IMAGE}"' in containerd
    assert f'root = "{tmp_path / "images"}"' in containerd  # images outlive the node
    assert f'state = "{tmp_path}/containerd/state"' in containerd
    (plugin,) = node.cni_config(tmp_path)["plugins"]
    assert plugin["ipam"]["ranges"] == [[{"subnet": node.POD_CIDR, "gateway": node.GATEWAY}]]


def test_the_kubelet_never_resizes_pods_in_place(tmp_path: Path) -> None:
    """Without QoS cgroups, the kubelet's in-place resize path dereferences a pod cgroup
    config its no-op manager leaves nil and crashes (kubernetes/kubernetes#137999)."""
    config = node.kubelet_config(tmp_path, 10250, 10248)
    assert config["cgroupsPerQOS"] is False
    assert config["featureGates"] == {"InPlacePodVerticalScaling": False}


def test_a_model_service_points_at_the_host_on_the_bridge() -> None:
    service, endpoints = node.model_service("demo", "bge-m3", 41234)
    assert "selector" not in service["spec"]  # no pod backs it: the host does
    [port] = service["spec"]["ports"]
    assert (port["port"], port["targetPort"]) == (80, 41234)
    assert endpoints["metadata"]["labels"] == {"kubernetes.io/service-name": "bge-m3"}
    assert endpoints["metadata"]["namespace"] == "demo"
    assert endpoints["endpoints"] == [{"addresses": [node.GATEWAY], "conditions": {"ready": True}}]
    assert endpoints["ports"] == [{"name": port["name"], "port": 41234, "protocol": "TCP"}]


def test_a_host_process_resolves_by_the_nodes_dns(tmp_path: Path) -> None:
    argv = node.host_command(tmp_path / "resolv.conf", ["metis-operator", "--x"])
    assert argv[:2] == ["unshare", "--mount"]
    assert argv[-3:] == [str(tmp_path / "resolv.conf"), "metis-operator", "--x"]
    assert 'mount --bind "$0" /etc/resolv.conf' in argv[-4]


def test_the_machines_one_node_is_said_in_use_while_another_process_holds_it(
    tmp_path: Path,
) -> None:
    lock = tmp_path / "node.lock"
    assert node.in_use(lock) is None
    held = node.claim(lock)
    assert held is not None
    try:
        assert node.claim(lock) is None  # a second claim, even from this process
        busy = f"its one real node is in use by process {os.getpid()} (a test run or a cluster up)"
        assert node.in_use(lock) == busy
        assert node.claim_or_why(lock) == (None, node.unusable() or busy)
    finally:
        os.close(held)
    assert node.in_use(lock) is None
