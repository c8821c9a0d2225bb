"""Backups to object storage and a base restored from one (issue 45), on the real API
server with the operator, a real indexer on the stand-in kubelet and a real S3-compatible
server on loopback (versitygw, checking SigV4 signatures against the key pair of the
base's Secret, mounted in the indexer pod as files).

A base with spec.backup is backed up by `kubectl metis backup --wait` (a
KnowledgeBaseBackup, Completed, with its chunks, notes, size, model and chunking); the
base is deleted; a new base that `kubectl metis restore -f` makes from the manifest its
`--dry-run` printed (the base's spec, spec.restore of that backup) comes up Ready with
the same documents, chunks, notes and answers, and its indexer sent the embedding model
nothing. A schedule makes its first
backup at once; deleting a backup of a base that is there deletes its copy, and deleting
one while its base is gone lets it go at once, said in an Event, the copy kept."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from metis_dev.kubelet import Kubelet
from metis_dev.plane import ControlPlane
from metis_dev.process import wait_for
from tests.kube.operator_support import (
    GROUP,
    Operator,
    get_kb,
    kb,
    kubectl_metis,
    make_drive,
    model_service,
    ok,
    wait_state,
)
from tests.support.model_server import ModelServer
from tests.support.s3_server import S3Server, s3_server

BUCKET = "metis-backups"
SECRET = "backup-keys"
BACKUP = "handbook-first"
FILES = {
    "leave.md": "# Leave\n\nTwenty-five days of paid leave a year; ask two weeks ahead.\n",
    "security.md": "# Security\n\nLock your screen whenever you leave your desk.\n",
    "travel.md": "# Travel\n\nBook trains second class; flights only beyond six hours.\n",
}
NOTE = "The VPN gateway moved to vpn2.example.com on Monday."


@pytest.fixture(scope="module")
def backup_kinds(kube: ControlPlane, installed: None) -> None:
    """The backup kinds served before the operator starts (it watches them from its start)."""
    for plural in ("knowledgebasebackups", "knowledgebasebackupschedules"):
        kube.kubectl(
            "wait", "--for=condition=Established", f"crd/{plural}.{GROUP}", "--timeout=60s"
        )


@pytest.fixture
def s3(tmp_path: Path) -> Iterator[S3Server]:
    with s3_server(tmp_path / "s3-server") as s:
        yield s


@pytest.fixture
def kubelet(
    kube: ControlPlane, namespace: str, node_object: str, tmp_path: Path
) -> Iterator[Kubelet]:
    with Kubelet(kube, namespace, tmp_path / "kubelet") as k:
        yield k


def apply(kube: ControlPlane, ns: str, obj: dict[str, Any]) -> None:
    kube.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(obj))


def backup_path(ns: str, name: str = BACKUP) -> str:
    return f"/apis/{GROUP}/v1/namespaces/{ns}/knowledgebasebackups/{name}"


def token(kube: ControlPlane, ns: str, base: str) -> str:
    secret = kube.rest().get(f"/api/v1/namespaces/{ns}/secrets/metis-{base}")
    return base64.b64decode(secret["data"]["token"]).decode()


def events(kube: ControlPlane, ns: str, name: str) -> list[tuple[str, str]]:
    items = kube.rest().get(
        f"/api/v1/namespaces/{ns}/events?fieldSelector=involvedObject.name={name}"
    )["items"]
    return [(e["reason"], e["message"]) for e in items]


def test_a_backup_restores_into_a_new_base_without_one_embedding_call(
    kube: ControlPlane,
    backup_kinds: None,
    operator: Operator,
    kubelet: Kubelet,
    namespace: str,
    models: ModelServer,
    s3: S3Server,
    tmp_path: Path,
) -> None:
    ns = namespace

    def alive() -> None:
        operator.check_alive()
        kubelet.check()
        s3.check_alive()

    docs = tmp_path / "docs"
    docs.mkdir()
    for name, text in FILES.items():
        (docs / name).write_text(text)
    make_drive(kube, ns, "docs", docs)
    model_service(kube, ns, "minilm", int(models.base_url.rsplit(":", 1)[1]))
    s3.make_bucket(BUCKET)
    apply(
        kube,
        ns,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": SECRET},
            "stringData": {"accesskey": s3.access_key, "secretkey": s3.secret_key},
        },
    )
    store = {"endpoint": s3.url, "bucket": BUCKET, "prefix": "team-a", "secret_name": SECRET}
    spec = {
        "sources": [{"drive": "docs"}],
        "embedding": {"deployment": "minilm"},
        "rescan_seconds": 0,
    }
    apply(kube, ns, kb("handbook", {**spec, "backup": {"object_store": store}}))
    wait_state(kube, ns, "handbook", "Ready", timeout=240, alive=alive)
    indexer = kubelet.indexer()
    written = httpx.post(
        f"{indexer.base_url}/v1/notes",
        json={"text": NOTE, "title": "VPN"},
        headers={"Authorization": f"Bearer {token(kube, ns, 'handbook')}"},
        timeout=30,
    )
    assert written.status_code == 201, written.text
    before = snapshot(indexer)
    assert before["chunks"] > 0 and [n[1] for n in before["notes"]] == [NOTE]

    # `kubectl metis backup --wait` makes the KnowledgeBaseBackup and follows it to its end.
    refused = kubectl_metis(kube, "backup", "nowhere", "-n", ns)
    assert refused.returncode == 1 and 'no knowledge base "nowhere"' in refused.stderr
    said = ok(kubectl_metis(kube, "backup", "handbook", "--name", BACKUP, "--wait", "-n", ns))
    assert said.splitlines()[0] == f"knowledgebasebackup.{GROUP}/{BACKUP} created", said
    assert said.splitlines()[1].startswith(f"backup {BACKUP} completed: "), said
    status = kube.rest().get(backup_path(ns)).get("status") or {}
    listed = ok(kubectl_metis(kube, "backups", "handbook", "-n", ns)).splitlines()
    assert listed[1].split()[:3] == [BACKUP, "handbook", "Completed"], listed
    assert status["phase"] == "Completed", status
    assert status["chunks"] > 0 and status["notes"] == 1
    assert status["bytes"] > 0 and status["size"]
    assert status["chunking"] == "1200/200"
    assert status["model"] and status["startedAt"] and status["finishedAt"]
    assert any(k.startswith(f"team-a/{BACKUP}/") for k in s3.keys(BUCKET)), s3.keys(BUCKET)
    wait_for(
        lambda: ("BackupCompleted" in dict(events(kube, ns, BACKUP))) or None,
        timeout=30,
        what="the BackupCompleted Event",
        alive=alive,
    )
    assert "metis_backup_last_completed_timestamp_seconds{" in operator.metrics()

    # A schedule makes its first backup at once; deleting that backup deletes its copy.
    apply(
        kube,
        ns,
        {
            "apiVersion": f"{GROUP}/v1",
            "kind": "KnowledgeBaseBackupSchedule",
            "metadata": {"name": "nightly"},
            "spec": {"knowledge_base": "handbook", "every": "24h", "keep": 1},
        },
    )

    def scheduled() -> str | None:
        listed = kube.rest().get(
            f"/apis/{GROUP}/v1/namespaces/{ns}/knowledgebasebackups"
            f"?labelSelector={GROUP}/schedule=nightly"
        )["items"]
        done = [b for b in listed if (b.get("status") or {}).get("phase") == "Completed"]
        return done[0]["metadata"]["name"] if done else None

    made = wait_for(scheduled, timeout=120, what="the schedule's first backup", alive=alive)
    assert made.startswith("nightly-") and len(made) == len("nightly-") + 14, made
    assert any(k.startswith(f"team-a/{made}/") for k in s3.keys(BUCKET))
    kube.kubectl("delete", "kbschedule", "nightly", "-n", ns)
    kube.kubectl("delete", "kbbackup", made, "-n", ns, "--wait=true", "--timeout=60s")
    wait_for(
        lambda: not any(k.startswith(f"team-a/{made}/") for k in s3.keys(BUCKET)) or None,
        timeout=30,
        what=f"the copy of {made} deleted from the store",
        alive=alive,
    )
    assert any(k.startswith(f"team-a/{BACKUP}/") for k in s3.keys(BUCKET)), "the other stays"
    assert 'metis_backup_expected_since_timestamp_seconds{knowledgebase="handbook"' in (
        operator.metrics()
    )

    # The new base's manifest, saved while the base is there (its spec, spec.restore added).
    manifest = ok(
        kubectl_metis(kube, "restore", "restored", "--from", BACKUP, "--dry-run", "-n", ns)
    )
    saved = yaml.safe_load(manifest)
    defaulted = {**store, "region": "us-east-1"}  # as the API server holds it
    assert saved["spec"]["restore"] == {"object_store": defaulted, "backup": BACKUP}, saved
    (tmp_path / "restored.yaml").write_text(manifest)

    # The base goes; a new one is made from its backup by `kubectl metis restore -f`.
    kube.kubectl("delete", "kb", "handbook", "-n", ns, "--wait=true", "--timeout=60s")
    wait_for(lambda: not kubelet.pods or None, timeout=120, what="the old indexer stopped")
    gone = kubectl_metis(kube, "restore", "restored", "--from", BACKUP, "-n", ns)
    assert gone.returncode == 1 and "no longer exists: give the new base's spec with -f" in (
        gone.stderr
    )
    made = kubectl_metis(
        kube,
        "restore",
        "restored",
        "--from",
        BACKUP,
        "-f",
        str(tmp_path / "restored.yaml"),
        "-n",
        ns,
    )
    assert ok(made).strip() == f"knowledgebase.{GROUP}/restored created from backup {BACKUP}"
    s = wait_state(
        kube,
        ns,
        "restored",
        "Ready",
        timeout=240,
        alive=alive,
        check=lambda s: (s["observed"].get("restore") or {}).get("phase") == "Restored",
    )
    assert s["observed"]["restore"] == {
        "backup": BACKUP,
        "phase": "Restored",
        "chunks": status["chunks"],
        "notes": 1,
    }
    (cond,) = [c for c in s["conditions"] if c["type"] == "Restored"]
    assert cond["status"] == "True" and "nothing embedded again" in cond["message"], cond
    indexer = kubelet.indexer()
    after = snapshot(indexer)
    assert after == before
    assert indexer.status()["vectors_from_model"] == 0, "not one passage sent to the model"

    # The backup of a base that is gone is let go at once, the copy kept.
    kube.kubectl("delete", "kbbackup", BACKUP, "-n", ns, "--wait=true", "--timeout=60s")
    wait_for(
        lambda: "CopyKept" in dict(events(kube, ns, BACKUP)) or None,
        timeout=30,
        what="the CopyKept Event",
        alive=alive,
    )
    assert any(k.startswith(f"team-a/{BACKUP}/") for k in s3.keys(BUCKET))
    assert get_kb(kube, ns, "restored")["status"]["state"] == "Ready"


def snapshot(indexer: Any) -> dict[str, Any]:
    """What a restore must give back: documents and their chunks, the notes (ids, texts
    and times), and the answers to a few questions. Without the sources' names: a base's
    notes are cited under its own name (metis-<name>), and the restored base has another."""
    rows = indexer.get("/v1/documents", params={"page_size": 100}).json()["documents"]
    notes = indexer.get("/v1/notes").json()
    answers = {}
    for question in ("trains or flights?", "how many days of leave", "VPN gateway"):
        found = indexer.post("/v1/search", {"query": question, "top_k": 3, "rerank": False})
        answers[question] = [r["citation"]["document"] for r in found.json()["results"]]
    return {
        "documents": sorted((r["document"], r["chunks"]) for r in rows),
        "chunks": indexer.status()["chunks"],
        "notes": sorted((n["id"], n["text"], n["written_at"]) for n in notes["notes"]),
        "answers": answers,
    }


@pytest.mark.parametrize(
    ("store", "said"),
    [
        ({"endpoint": "minio:9000"}, "object_store.endpoint must be an http:// or https:// URL"),
        ({"bucket": "My_Bucket"}, "object_store.bucket must be a bucket name"),
        ({"secret_name": "Keys!"}, "spec.backup.object_store.secret_name"),
    ],
)
def test_the_api_server_refuses_a_bad_object_store_naming_it(
    kube: ControlPlane, installed: None, namespace: str, store: dict[str, str], said: str
) -> None:
    good = {"endpoint": "http://minio:9000", "bucket": "metis-backups", "secret_name": "keys"}
    spec = {
        "sources": [{"drive": "docs"}],
        "embedding": {"deployment": "minilm"},
        "backup": {"object_store": {**good, **store}},
    }
    out = kube.kubectl(
        "apply", "-n", namespace, "-f", "-", input=json.dumps(kb("handbook", spec)), check=False
    )
    assert out.returncode != 0 and said in out.stderr, out.stderr


def test_a_backups_spec_cannot_change(
    kube: ControlPlane, backup_kinds: None, namespace: str
) -> None:
    backup = {
        "apiVersion": f"{GROUP}/v1",
        "kind": "KnowledgeBaseBackup",
        "metadata": {"name": "b1"},
        "spec": {"knowledge_base": "handbook"},
    }
    apply(kube, namespace, backup)
    backup["spec"] = {"knowledge_base": "wiki"}
    out = kube.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(backup), check=False)
    assert out.returncode != 0 and "a backup's spec cannot change" in out.stderr, out.stderr
