"""Backups and restores as the operator decides them, without I/O: spec.backup and
spec.restore into the indexer's configuration and the pod's volumes, their validation
messages, a base's restore in its state and conditions, a KnowledgeBaseBackup's status
from the indexer's answers, a schedule's plan, the backup metrics and the backup CRDs."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import datetime as dt
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from metis_indexer.schema import Backup
from metis_operator import backups, children, kube
from metis_operator.api import crd as crd_gen
from metis_operator.api import identity
from metis_operator.api.backup import BackupSpec, BackupStatus, ScheduleSpec, every_seconds
from metis_operator.api.spec import SpecError, parse, to_indexer_config
from metis_operator.metrics import Metrics
from metis_operator.settings import IndexerSettings, Settings
from metis_operator.state import State, derive
from metis_operator.status import compose
from metis_operator.status.compose import RESTORED_CONDITION
from tests.operator.contexts import context
from tests.operator.test_state import HEALTHY, given, ix

ROOT = Path(__file__).resolve().parents[2]
OWNER = children.Owner("handbook", "team-a", "uid-1")
SETTINGS = Settings(indexer=IndexerSettings(image="registry.example/metis-indexer:1", port=7700))
STORE = {
    "endpoint": "http://minio.storage.svc:9000",
    "bucket": "metis-backups",
    "prefix": "team-a",
    "secret_name": "backup-keys",
}


def base_spec(**changes: Any) -> dict[str, Any]:
    return {"sources": [{"drive": "docs"}], "embedding": {"deployment": "bge-m3"}, **changes}


def config_of(**changes: Any) -> dict[str, Any]:
    spec = parse("handbook", base_spec(**changes))
    config = to_indexer_config(
        "handbook",
        spec,
        port=7700,
        embedding_url="http://bge-m3:80",
        reranker_url=None,
        revisions={},
    )
    return config.model_dump(mode="json", exclude_none=True)


def test_a_backup_store_is_the_indexers_with_its_secrets_folder() -> None:
    config = config_of(backup={"object_store": STORE})
    assert config["backup_store"] == {
        "endpoint": "http://minio.storage.svc:9000",
        "bucket": "metis-backups",
        "prefix": "team-a",
        "region": "us-east-1",
        "secret_dir": "/etc/metis-stores/backup",
    }
    assert "restore" not in config


def test_a_restore_names_the_store_in_full_and_the_backup() -> None:
    other = {**STORE, "prefix": "team-b", "region": "eu-west-1", "secret_name": "team-b-keys"}
    config = config_of(restore={"object_store": other, "backup": "nightly-20261207"})
    assert config["restore"] == {
        "store": {
            "endpoint": "http://minio.storage.svc:9000",
            "bucket": "metis-backups",
            "prefix": "team-b",
            "region": "eu-west-1",
            "secret_dir": "/etc/metis-stores/restore",
        },
        "backup": "nightly-20261207",
    }
    assert "backup_store" not in config


def test_without_either_the_configuration_has_neither() -> None:
    config = config_of()
    assert "backup_store" not in config and "restore" not in config


def test_the_pod_mounts_each_stores_secret_read_only() -> None:
    spec = parse(
        "handbook",
        base_spec(
            backup={"object_store": STORE},
            restore={"object_store": {**STORE, "secret_name": "old-keys"}, "backup": "b1"},
        ),
    )
    pod = children.deployment(OWNER, spec, SETTINGS)["spec"]["template"]["spec"]
    secrets = {v["name"]: v["secret"] for v in pod["volumes"] if "secret" in v}
    assert secrets == {
        "backup-store": {
            "secretName": "backup-keys",
            "defaultMode": 0o440,
            "items": [
                {"key": "accesskey", "path": "accesskey"},
                {"key": "secretkey", "path": "secretkey"},
            ],
        },
        "restore-store": {
            "secretName": "old-keys",
            "defaultMode": 0o440,
            "items": [
                {"key": "accesskey", "path": "accesskey"},
                {"key": "secretkey", "path": "secretkey"},
            ],
        },
    }
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["backup-store"] == {
        "name": "backup-store",
        "mountPath": "/etc/metis-stores/backup",
        "readOnly": True,
    }
    assert mounts["restore-store"]["mountPath"] == "/etc/metis-stores/restore"


def test_a_base_without_stores_keeps_its_pod_inputs_digest() -> None:
    """Bases made before backups keep the digest their Deployment carries: no rollout."""
    spec = parse("handbook", base_spec())
    inputs = children.pod_inputs(spec)
    place = spec.placement.model_dump(mode="json", by_alias=True)
    del place["tolerations"], place["node_affinity"]
    assert inputs.digest() == children._digest([spec.drives, place, spec.replicas])
    with_store = children.pod_inputs(parse("handbook", base_spec(backup={"object_store": STORE})))
    assert with_store.digest() != inputs.digest(), "a new Secret to mount replaces the pod"


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("endpoint", "minio:9000", "'minio:9000' is not an http:// or https:// URL"),
        ("endpoint", "ftp://minio", "is not an http:// or https:// URL"),
        ("bucket", "My_Bucket", "'My_Bucket' is not a bucket name"),
        ("bucket", "ab", "is not a bucket name: 3 to 63"),
        ("secret_name", "Keys!", "'Keys!' is not a Secret's name"),
        ("region", "EU West", "is not a region"),
        ("prefix", "a/../b", "must be a plain key prefix"),
    ],
)
def test_a_bad_object_store_is_refused_naming_the_field(field: str, value: str, said: str) -> None:
    with pytest.raises(SpecError) as e:
        parse("handbook", base_spec(backup={"object_store": {**STORE, field: value}}))
    assert f"spec.backup.object_store.{field}: " in str(e.value)
    assert said in str(e.value)


def test_a_bad_backup_name_is_refused() -> None:
    with pytest.raises(SpecError, match=r"spec.restore.backup: 'Nightly' is not a backup's name"):
        parse("handbook", base_spec(restore={"object_store": STORE, "backup": "Nightly"}))


def test_an_object_store_needs_its_secret() -> None:
    store = {k: v for k, v in STORE.items() if k != "secret_name"}
    with pytest.raises(SpecError, match=r"spec.backup.object_store.secret_name: Field required"):
        parse("handbook", base_spec(backup={"object_store": store}))


def restore(phase: str, **kw: Any) -> dict[str, Any]:
    return {
        "backup": "nightly",
        "phase": phase,
        "chunks": 120,
        "notes": 3,
        "error": None,
        "reembedding": None,
        **kw,
    }


def test_a_base_that_restores_is_pending_with_reason_restoring() -> None:
    o = given(indexer=ix("loading", restore=restore("Restoring")), restore_from="nightly")
    verdict = derive(o)
    assert verdict.state is State.PENDING
    assert verdict.reason == (
        "restoring backup nightly from its object store; 120 chunks and 3 notes read so far"
    )
    conditions = {c.type: c for c in compose.conditions(verdict, o, 2, False)}
    assert conditions["Ready"].reason == "Restoring"
    assert conditions["Reconciling"].reason == "Restoring"
    assert conditions[RESTORED_CONDITION].status == "False"
    assert conditions[RESTORED_CONDITION].reason == "Restoring"


def test_a_restore_that_fails_fails_the_base_with_the_indexers_reason() -> None:
    failed = restore("Failed", error="object index.sqlite3: checksum mismatch")
    o = given(indexer=ix("loading", restore=failed))
    verdict = derive(o)
    assert verdict.state is State.FAILED
    assert verdict.reason == (
        "restoring backup nightly failed: object index.sqlite3: checksum mismatch (it is tried "
        "again)"
    )
    conditions = {c.type: c for c in compose.conditions(verdict, o, 2, False)}
    assert conditions["Stalled"].reason == "RestoreFailed"
    assert conditions[RESTORED_CONDITION].reason == "RestoreFailed"


def test_a_restored_base_says_what_it_embeds_again() -> None:
    done = restore("Restored", reembedding="every chunk: the backup's model is all-minilm")
    o = given(indexer=ix("ready", passes=1, restore=done), restore_from="nightly")
    verdict = derive(o)
    assert verdict.state is State.READY
    (cond,) = [c for c in compose.conditions(verdict, o, 2, False) if c.type == "Restored"]
    assert cond.status == "True"
    assert cond.message == (
        "made from backup nightly: 120 chunks and 3 notes; embedded again: every chunk: the "
        "backup's model is all-minilm"
    )


def test_a_restore_is_kept_in_the_status_once_the_indexer_no_longer_says_it() -> None:
    done = restore("Restored")
    o = given(indexer=ix("ready", passes=1, restore=done), restore_from="nightly")
    first = compose.compose(
        {}, derive(o), o, generation=2, address=None, revisions={}, with_reranker=False, now="t"
    ).dump()
    assert first["observed"]["restore"] == {
        "backup": "nightly",
        "phase": "Restored",
        "chunks": 120,
        "notes": 3,
    }
    later = given(restore_from="nightly")  # the indexer restarted: it says no restore
    again = compose.compose(
        first,
        derive(later),
        later,
        generation=2,
        address=None,
        revisions={},
        with_reranker=False,
        now="t2",
    ).dump()
    assert again["observed"]["restore"] == first["observed"]["restore"]
    assert not again["observed"].get("warnings")
    (cond,) = [c for c in again["conditions"] if c["type"] == "Restored"]
    assert (
        cond["message"]
        == "made from backup nightly: 120 chunks and 3 notes, nothing embedded again"
    )


def test_a_restore_named_on_a_base_that_has_an_index_is_only_said() -> None:
    o = given(restore_from="nightly")
    status = compose.compose(
        {}, derive(o), o, generation=2, address=None, revisions={}, with_reranker=False, now="t"
    ).dump()
    assert status["state"] == "Ready"
    assert status["observed"]["warnings"] == [
        "spec.restore names backup nightly, but a base is restored only when it is created, "
        "into an empty index: this one was not made from a backup; create a new base to "
        "restore it"
    ]
    assert HEALTHY.restore_from is None


def backup_body(**status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "metis.astraeus.io/v1",
        "kind": "KnowledgeBaseBackup",
        "metadata": {"name": "b1", "namespace": "team-a"},
        "spec": {"knowledge_base": "handbook", "method": "object_store"},
        "status": status,
    }


@pytest.mark.parametrize(
    ("base", "said"),
    [
        pytest.param(
            None, "KnowledgeBase handbook does not exist in namespace team-a", id="no-base"
        ),
        pytest.param(
            {"metadata": {"name": "handbook"}, "spec": base_spec()},
            "KnowledgeBase handbook has no spec.backup.object_store: name the object store its "
            "backups go to",
            id="no-store",
        ),
        pytest.param(
            {"metadata": {"name": "handbook", "deletionTimestamp": "x"}, "spec": base_spec()},
            "KnowledgeBase handbook is being deleted",
            id="going",
        ),
        pytest.param(
            {"metadata": {"name": "handbook"}, "spec": base_spec(backup={"object_store": STORE})},
            None,
            id="can",
        ),
    ],
)
def test_a_backup_of_a_base_without_a_store_fails_naming_what_is_missing(
    base: dict[str, Any] | None, said: str | None
) -> None:
    spec = BackupSpec(knowledge_base="handbook")
    assert backups.refusal(spec, "team-a", base) == said


def indexer_backup(**kw: Any) -> Backup:
    return Backup.model_validate(
        {
            "name": "b1",
            "phase": "Completed",
            "started_at": "2026-12-07T22:00:00Z",
            "finished_at": "2026-12-07T22:00:09Z",
            "bytes": 5_400_000,
            "chunks": 1200,
            "notes": 4,
            "model": "all-minilm",
            "dimensions": 384,
            "chunking": {"size": 1200, "overlap": 200},
            "base": "handbook",
            "error": None,
            **kw,
        }
    )


def test_the_indexers_account_is_the_backups_status() -> None:
    assert backups.from_indexer(indexer_backup()).dump() == {
        "phase": "Completed",
        "startedAt": "2026-12-07T22:00:00Z",
        "finishedAt": "2026-12-07T22:00:09Z",
        "bytes": 5_400_000,
        "chunks": 1200,
        "notes": 4,
        "model": "all-minilm",
        "dimensions": 384,
        "chunking": "1200/200",
        "size": "5.1 MiB",
    }
    failed = backups.from_indexer(indexer_backup(phase="Failed", error="bucket is gone"))
    assert (failed.phase, failed.message) == ("Failed", "bucket is gone")


@pytest.mark.parametrize(
    ("code", "phase", "message"),
    [
        ("BACKUP_RUNNING", "Pending", "another backup of KnowledgeBase handbook is running"),
        (
            "NO_BACKUP_STORE",
            "Pending",
            "the indexer of KnowledgeBase handbook has no object store yet",
        ),
        (
            "INVALID_BODY",
            "Failed",
            "the indexer of KnowledgeBase handbook refused it: INVALID_BODY: x",
        ),
    ],
)
def test_a_refusal_waits_or_fails(code: str, phase: str, message: str) -> None:
    status = backups.on_refused(code, f"{code}: x", "KnowledgeBase handbook")
    assert status is not None and status.phase == phase
    assert status.message is not None and status.message.startswith(message)


def test_an_existing_backup_of_that_name_is_this_objects() -> None:
    """Asked again after an operator restart: where it stands is asked next."""
    assert backups.on_refused("BACKUP_EXISTS", "", "KnowledgeBase handbook") is None


def test_the_end_of_a_backup_is_said_once() -> None:
    running = BackupStatus(phase="Running")
    done = backups.from_indexer(indexer_backup())
    event = backups.finished_event(running, done)
    assert event is not None and (event.kind, event.reason) == ("Normal", "BackupCompleted")
    assert event.message == "backup completed: 1200 chunks, 4 notes, 5.1 MiB"
    assert backups.finished_event(done, done) is None
    failed = BackupStatus(phase="Failed", message="no such bucket")
    event = backups.finished_event(BackupStatus(), failed)
    assert event is not None and event.reason == "BackupFailed"


@pytest.mark.parametrize(
    ("n", "said"), [(0, "0 B"), (1023, "1023 B"), (2048, "2.0 KiB"), (5 << 30, "5.0 GiB")]
)
def test_a_size_in_words(n: int, said: str) -> None:
    assert backups.size(n) == said


def test_a_completed_backup_moves_its_bases_metric_to_the_newest() -> None:
    body = backup_body(phase="Completed", finishedAt="2026-12-07T22:00:09Z")
    key, at = backups.completed_at(body) or ((), 0.0)
    assert key == ("team-a", "handbook")
    m = Metrics.create()
    m.backup_finished(("team-a", "handbook"), at)
    m.backup_finished(("team-a", "handbook"), at - 3600)  # an older one, listed later
    value = m.registry.get_sample_value(
        "metis_backup_last_completed_timestamp_seconds",
        {"namespace": "team-a", "knowledgebase": "handbook"},
    )
    assert value == at
    assert backups.completed_at(backup_body(phase="Running")) is None


def test_a_base_with_a_store_expects_backups_since_its_creation() -> None:
    base = {
        "metadata": {"name": "handbook", "creationTimestamp": "2026-12-07T00:00:00Z"},
        "spec": base_spec(backup={"object_store": STORE}),
    }
    assert backups.expected_since(base) == dt.datetime(2026, 12, 7, tzinfo=dt.UTC).timestamp()
    assert backups.expected_since({**base, "spec": base_spec()}) is None


NOW = dt.datetime(2026, 12, 7, 22, 0, 0, tzinfo=dt.UTC)


def made(name: str, hours_ago: float, phase: str | None = "Completed") -> backups.ScheduledBackup:
    return backups.ScheduledBackup(name, NOW - dt.timedelta(hours=hours_ago), phase)


@pytest.mark.parametrize(
    ("spec", "existing", "make", "delete"),
    [
        pytest.param({}, [], "nightly-20261207220000", (), id="first-at-once"),
        pytest.param({}, [made("a", 3)], None, (), id="not-due"),
        pytest.param({}, [made("a", 24)], "nightly-20261207220000", (), id="due"),
        pytest.param({"suspend": True}, [made("a", 30)], None, (), id="suspended"),
        pytest.param(
            {"keep": 2},
            [made("a", 72), made("b", 48), made("c", 24), made("d", 1, "Running")],
            None,
            ("a",),
            id="oldest-beyond-keep",
        ),
        pytest.param(
            {"keep": 2},
            [made("f", 30, "Failed"), made("c", 24), made("e", 2, "Failed")],
            None,
            ("f",),
            id="failed-older-than-a-completed",
        ),
    ],
)
def test_a_schedule_makes_one_when_due_and_keeps_n(
    spec: dict[str, Any],
    existing: list[backups.ScheduledBackup],
    make: str | None,
    delete: tuple[str, ...],
) -> None:
    s = ScheduleSpec.model_validate({"knowledge_base": "handbook", "every": "24h", **spec})
    plan = backups.schedule_plan("nightly", s, existing, NOW)
    assert (plan.make, plan.delete) == (make, delete)


def test_the_next_backup_is_an_interval_after_the_last() -> None:
    s = ScheduleSpec(knowledge_base="handbook", every="6h")
    assert backups.schedule_plan("s", s, [made("a", 2)], NOW).next_at == NOW + dt.timedelta(hours=4)


@pytest.mark.parametrize(
    ("every", "seconds"),
    [
        ("24h", 86400),
        ("1h30m", 5400),
        ("90m", 5400),
        ("5m", 300),
        ("4m", None),
        ("", None),
        ("1d", None),
    ],
)
def test_an_interval(every: str, seconds: int | None) -> None:
    assert every_seconds(every) == seconds


def test_a_bad_interval_is_refused_with_what_it_takes() -> None:
    with pytest.raises(ValueError, match="'2m' is not an interval of at least 5m"):
        ScheduleSpec.model_validate({"knowledge_base": "handbook", "every": "2m"})


def test_the_committed_backup_crds_are_what_the_models_make() -> None:
    assert (ROOT / "crds" / "backups.yaml").read_text() == crd_gen.render_backups(), "run make crd"
    assert (
        ROOT / "charts" / "metis" / "crds" / "backups.yaml"
    ).read_text() == crd_gen.render_backups()
    assert "backups.yaml" in (ROOT / "crds" / "kustomization.yaml").read_text()


def test_the_backup_kinds_are_namespaced_with_their_columns() -> None:
    backup, schedule = yaml.safe_load_all(crd_gen.render_backups())
    assert backup["spec"]["names"]["shortNames"] == ["kbbackup"]
    assert backup["spec"]["scope"] == "Namespaced"
    (version,) = backup["spec"]["versions"]
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Base",
        "Phase",
        "Chunks",
        "Notes",
        "Size",
        "Age",
        "Message",
    ]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"]["method"]["enum"] == ["object_store"]
    assert spec["x-kubernetes-validations"][0]["rule"] == "self == oldSelf"
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert status["phase"]["enum"] == ["Pending", "Running", "Completed", "Failed"]
    assert schedule["spec"]["names"]["kind"] == "KnowledgeBaseBackupSchedule"


def test_the_backup_crd_reads_back_its_own_objects() -> None:
    body = backup_body(phase="Completed", startedAt="t", chunks=3)
    assert BackupStatus.read(body["status"]).chunks == 3
    assert dataclasses.is_dataclass(backups.SchedulePlan)


class Cluster:
    """The API server as the backup steps read it: objects by path."""

    def __init__(self, objects: dict[str, dict[str, Any]]) -> None:
        self.objects = objects

    async def get(self, path: str) -> dict[str, Any] | None:
        return self.objects.get(path)


def indexer(answers: list[tuple[int, Any]], asked: list[tuple[str, str, str]]) -> httpx.AsyncClient:
    """An indexer answering the backups routes in turn, recording what it was asked."""

    def handle(request: httpx.Request) -> httpx.Response:
        asked.append((request.method, request.url.path, request.headers.get("authorization", "")))
        status, body = answers.pop(0)
        return httpx.Response(status, json=body)

    return httpx.AsyncClient(transport=httpx.MockTransport(handle))


def stepped(
    answers: list[tuple[int, Any]], status: dict[str, Any], base: bool = True
) -> tuple[BackupStatus, list[tuple[str, str, str]]]:
    objects = {
        kube.path("v1", "secrets", "team-a", "metis-handbook"): {
            "data": {"token": base64.b64encode(b"t0ken").decode()}
        }
    }
    if base:
        objects[identity.path("team-a", "handbook")] = {
            "metadata": {"name": "handbook", "namespace": "team-a", "uid": "u1"},
            "spec": base_spec(backup={"object_store": STORE}),
        }
    asked: list[tuple[str, str, str]] = []
    ctx = context(http=indexer(answers, asked), cluster=Cluster(objects))
    out = asyncio.run(backups.step(ctx, backup_body(**status)))
    return out, asked


ERROR = {"error": {"code": "BACKUP_EXISTS", "message": "backup b1 exists"}}


def test_a_new_backup_is_asked_of_the_indexer_with_the_operators_token() -> None:
    running = indexer_backup(phase="Running", finished_at=None, bytes=0).model_dump()
    status, asked = stepped([(202, running)], {})
    assert asked == [("POST", "/v1/backups", "Bearer t0ken")]
    assert status.phase == "Running" and status.started_at == "2026-12-07T22:00:00Z"


def test_a_running_backup_is_asked_where_it_stands() -> None:
    status, asked = stepped([(200, indexer_backup().model_dump())], {"phase": "Running"})
    assert [a[:2] for a in asked] == [("GET", "/v1/backups/b1")]
    assert status.phase == "Completed" and status.chunks == 1200


def test_a_backup_asked_again_after_a_restart_is_followed() -> None:
    status, asked = stepped([(409, ERROR), (200, indexer_backup().model_dump())], {})
    assert [a[:2] for a in asked] == [("POST", "/v1/backups"), ("GET", "/v1/backups/b1")]
    assert status.phase == "Completed"


def test_an_indexer_that_does_not_answer_keeps_it_waiting() -> None:
    status, _ = stepped([(503, {"error": {"code": "NOT_READY", "message": "loading"}})], {})
    assert status.phase == "Pending"
    assert status.message == (
        "waiting for the indexer of KnowledgeBase handbook: NOT_READY: loading"
    )


def test_a_backup_of_a_missing_base_fails_at_once_without_asking() -> None:
    status, asked = stepped([], {}, base=False)
    assert asked == []
    assert (status.phase, status.message) == (
        "Failed",
        "KnowledgeBase handbook does not exist in namespace team-a",
    )


def test_a_running_backup_whose_indexer_is_not_serving_stays_running() -> None:
    status, _ = stepped(
        [(503, {"error": {"code": "NOT_READY", "message": "loading"}})],
        {
            "phase": "Running",
            "startedAt": "2026-12-07T22:00:00Z",
        },
    )
    assert (status.phase, status.started_at) == ("Running", "2026-12-07T22:00:00Z")
