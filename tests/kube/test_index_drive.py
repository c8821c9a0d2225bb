"""A base's index drive on the real control plane: made of the size its memory asks
(metis_operator/index_drive.py), asked to grow when `placement.memory_gb` grows where the
claim's StorageClass allows expansion (the API server's admission decides), and a warning
naming why where it does not. The claim is bound by hand to a volume of its class: the
expansion itself is the storage driver's, which a control plane alone does not run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from metis_dev.kubelet import hostpath_volume
from metis_dev.plane import ControlPlane
from metis_dev.process import free_port, wait_for
from metis_operator import index_drive
from tests.kube.operator_support import kb, kb_path, make_drive, model_service, running_operator
from tests.support.model_server import ModelServer


def claim(kube: ControlPlane, ns: str) -> dict[str, Any] | None:
    found = kube.rest().get(f"/api/v1/namespaces/{ns}/persistentvolumeclaims")["items"]
    return next((c for c in found if c["metadata"]["name"] == "metis-handbook"), None)


def requested(c: dict[str, Any] | None) -> str | None:
    return None if c is None else c["spec"]["resources"]["requests"]["storage"]


@pytest.mark.parametrize("expandable", [True, False], ids=["class-allows", "class-refuses"])
def test_a_larger_memory_grows_the_index_drive_where_its_class_allows(
    kube: ControlPlane,
    installed: None,
    models: ModelServer,
    namespace: str,
    tmp_path: Path,
    expandable: bool,
) -> None:
    ns, api = namespace, kube.rest()
    storage_class = f"{ns}-{'grows' if expandable else 'fixed'}"
    api.post(
        "/apis/storage.k8s.io/v1/storageclasses",
        {
            "metadata": {"name": storage_class},
            "provisioner": "example.com/none",
            "allowVolumeExpansion": expandable,
        },
    )
    model_service(kube, ns, "minilm", int(models.base_url.rsplit(":", 1)[1]))
    (tmp_path / "docs").mkdir()
    make_drive(kube, ns, "docs", tmp_path / "docs")
    workdir = tmp_path / "operator"
    workdir.mkdir()
    env = {"METIS_STORAGE_CLASS": storage_class}
    with running_operator(kube, workdir, free_port(), env=env) as operator:
        spec = {"sources": [{"drive": "docs"}], "embedding": {"deployment": "minilm"}}
        kube.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(kb("handbook", spec)))
        made = wait_for(
            lambda: claim(kube, ns), timeout=60, what="the index drive", alive=operator.check_alive
        )
        assert requested(made) == f"{index_drive.size_gib(2, 'float32', '10Gi')}Gi" == "10Gi"
        volume = hostpath_volume(f"{ns}-index", tmp_path / "index", ns, "metis-handbook")
        volume["spec"]["storageClassName"] = storage_class
        api.post("/api/v1/persistentvolumes", volume)
        wait_for(
            lambda: (claim(kube, ns) or {}).get("status", {}).get("phase") == "Bound",
            timeout=60,
            what="the index drive bound",
        )
        kube.kubectl(
            *("patch", "kb", "handbook", "-n", ns, "--type=merge"),
            *("-p", '{"spec":{"placement":{"memory_gb":8}}}'),
        )
        wanted = f"{index_drive.size_gib(8, 'float32', '10Gi')}Gi"
        assert wanted == "40Gi"
        if expandable:
            wait_for(
                lambda: requested(claim(kube, ns)) == wanted,
                timeout=60,
                what=f"the claim asked to grow to {wanted}",
                alive=operator.check_alive,
            )
            # Said after the turn's status write: a moment after the claim grew.
            wait_for(
                lambda: (
                    "PersistentVolumeClaim metis-handbook asked to grow 10Gi"
                    in operator.log(100_000)
                ),
                timeout=30,
                what="the growth said in the log",
                alive=operator.check_alive,
            )
        else:

            def warned() -> str | None:
                status = api.get(kb_path(ns, "handbook")).get("status") or {}
                said = (status.get("observed") or {}).get("warnings") or []
                return next((w for w in said if "cannot grow" in w), None)

            warning = wait_for(warned, timeout=60, what="the warning", alive=operator.check_alive)
            assert warning.startswith(
                "index drive metis-handbook has 10Gi, the base's memory holds what needs 40Gi, "
                "and the claim cannot grow ("
            )
            assert "storageclass that provisions the pvc must support resize" in warning
            assert requested(claim(kube, ns)) == "10Gi"
    api.delete(f"/apis/storage.k8s.io/v1/storageclasses/{storage_class}")
