"""A base's backups to S3-compatible object storage and its restore into a new, empty
index, on real parts: `metis serve` following its configuration file, `metis models`, and
versitygw (a real S3 server) over loopback. A restore costs the model nothing (the one
word that asks its dimensions aside); a backup cut short before its manifest is invisible
and leaves the earlier one whole; an object that does not match its manifest refuses the
restore, naming it, with nothing embedded; a restore under another model says what it
embeds again, and ends with that model's vectors; a new replica starts from the newest
backup, and refuses one whose vectors are not the model's."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import re
import signal
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from aiohttp import web

from tests.support import layered_model
from tests.support.model_server import ModelServer, start_model_server
from tests.support.processes import Process, free_port, served, wait_ready
from tests.support.s3_server import Holding, S3Server, s3_server

ROOT = Path(__file__).resolve().parents[3]
HANDBOOK = ROOT / "examples" / "handbook"
BUCKET = "backups"
PREFIX = "team-a/team"
NOTES = (
    {"id": "oncall", "text": "The on-call rotation is weekly, handed over on Mondays."},
    {
        "id": "oncall-2",
        "text": "The on-call rotation is every two weeks from January.",
        "replaces": ["oncall"],
    },
)
HEARTBEAT = 1
ABANDONED = 4 * HEARTBEAT
QUESTIONS = ("How often does the on-call rotation change?", "How many vacation days do I get?")


@pytest.fixture(scope="module")
def models() -> Iterator[ModelServer]:
    server = start_model_server()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with s3_server(tmp_path_factory.mktemp("s3")) as server:
        server.make_bucket(BUCKET)
        yield server


def store(s3: S3Server, keys: Path, endpoint: str | None = None) -> dict[str, str]:
    return {
        "endpoint": endpoint or s3.url,
        "bucket": BUCKET,
        "prefix": PREFIX,
        "secret_dir": str(s3.write_keys(keys)),
    }


def configure(path: Path, index: Path, url: str, port: int, **extra: Any) -> None:
    config = {
        "name": "team",
        "sources": [{"drive": "handbook", "root": str(HANDBOOK)}],
        "embedding": {"url": url, "name": "minilm"},
        "index_dir": str(index),
        "rescan_seconds": 0,
        "drain_seconds": 0,
        "port": port,
        **extra,
    }
    staged = path.with_suffix(".tmp")
    staged.write_text(json.dumps(config))
    staged.replace(path)


def start(folder: Path, url: str, **extra: Any) -> Process:
    """`metis serve` on its configuration in `folder`, its index in folder/index; a backup's
    state renewed every second (abandoned after 4)."""
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    configure(folder / "config.json", folder / "index", url, port, **extra)
    p = served(folder / "config.json", port)
    p.env = {"METIS_BACKUP_HEARTBEAT_SECONDS": str(HEARTBEAT)}
    return p.start()


def embedded(model: ModelServer) -> int:
    """Texts the model server has embedded so far."""
    return int(httpx.get(f"{model.base_url}/health", timeout=30).json()["embedded"])


def chunks(index: Path) -> list[tuple[Any, ...]]:
    """Every chunk of an index: its id, document, text and vector."""
    db = sqlite3.connect(f"file:{index / 'index.sqlite3'}?mode=ro", uri=True)
    try:
        return db.execute(
            "SELECT c.id, f.source, f.path, c.ord, c.text, c.vector"
            " FROM chunks c JOIN files f ON f.id = c.file_id ORDER BY c.id"
        ).fetchall()
    finally:
        db.close()


def notes(p: Process) -> list[dict[str, Any]]:
    return list(p.get("/v1/notes").json()["notes"])


def results(p: Process, question: str) -> list[tuple[Any, ...]]:
    answer = p.post("/v1/search", {"query": question, "top_k": 5, "rerank": False}).json()
    return [
        (r["citation"]["source"], r["citation"]["document"], r["text"]) for r in answer["results"]
    ]


def backed_up(p: Process, name: str) -> dict[str, Any]:
    started = p.post("/v1/backups", {"name": name})
    assert started.status_code == 202, started.text
    assert started.json()["phase"] == "Running"
    return dict(
        p.wait_for(
            f"backup {name} completed",
            lambda: (b := p.get(f"/v1/backups/{name}").json()).get("phase") == "Completed" and b,
        )
    )


@dataclasses.dataclass
class Original:
    """The base backed up (as `team-1`), stopped: its folder, what it held and answered."""

    folder: Path
    status: dict[str, Any]
    notes: list[dict[str, Any]]
    answers: dict[str, list[tuple[Any, ...]]]
    backup: dict[str, Any]


@pytest.fixture(scope="module")
def original(
    models: ModelServer, s3: S3Server, tmp_path_factory: pytest.TempPathFactory
) -> Original:
    folder = tmp_path_factory.mktemp("original")
    p = start(folder, models.base_url, backup_store=store(s3, folder / "keys"))
    try:
        wait_ready(p)
        for note in NOTES:
            assert p.post("/v1/notes", note).status_code == 201
        status = wait_ready(p)
        backup = backed_up(p, "team-1")
        answers = {q: results(p, q) for q in QUESTIONS}
        return Original(folder, status, notes(p), answers, backup)
    finally:
        p.stop()


def test_a_backup_restores_into_a_new_index_and_the_model_embeds_nothing(
    original: Original, models: ModelServer, s3: S3Server, tmp_path: Path
) -> None:
    backup = original.backup
    assert backup["chunks"] == original.status["chunks"] and backup["notes"] == 2
    assert backup["base"] == "team" and backup["model"] == original.status["embedding_model"]
    assert backup["error"] is None and backup["bytes"] > 0
    keys = [k for k in s3.keys(BUCKET) if k.startswith(f"{PREFIX}/team-1/")]
    assert keys == [f"{PREFIX}/team-1/{o}" for o in ("index.sqlite3", "manifest.json", "notes.tar")]

    before = embedded(models)
    restore = {"store": store(s3, tmp_path / "keys"), "backup": "team-1"}
    p = start(tmp_path, models.base_url, restore=restore)
    try:
        status = wait_ready(p)
        assert status["restore"] == {
            "backup": "team-1",
            "phase": "Restored",
            "chunks": backup["chunks"],
            "notes": 2,
            "error": None,
            "reembedding": None,
        }
        assert status["chunks"] == original.status["chunks"]
        assert status["vectors_from_model"] == 0
        assert status["last_pass"]["read"] == 0, "every file unchanged by its size and mtime"
        assert embedded(models) - before == 1, "only the word that asks the model's dimensions"
        assert notes(p) == original.notes, "the same notes: ids, times, replacements"
        for question, answered in original.answers.items():
            assert results(p, question) == answered
    finally:
        p.stop()
    assert chunks(tmp_path / "index") == chunks(original.folder / "index"), (
        "the same chunks: ids, texts, vectors"
    )


def test_a_backup_killed_before_its_manifest_is_none_and_the_earlier_one_restores(
    original: Original, models: ModelServer, s3: S3Server, tmp_path: Path
) -> None:
    def manifest_of_team_2(method: str, path: str) -> bool:
        return method == "PUT" and path.endswith("/team-2/manifest.json")

    with Holding(s3, manifest_of_team_2) as proxy:
        backing = store(s3, tmp_path / "keys", proxy.url)
        p = start(original.folder, models.base_url, backup_store=backing)
        try:
            wait_ready(p)
            assert p.post("/v1/backups", {"name": "team-2"}).status_code == 202
            assert proxy.held.wait(120), "the manifest's upload was reached"
            p.stop(signal.SIGKILL)
        finally:
            p.stop()
    left = [k for k in s3.keys(BUCKET) if "/team-2/" in k]
    assert f"{PREFIX}/team-2/index.sqlite3" in left and f"{PREFIX}/team-2/manifest.json" not in left
    assert f"{PREFIX}/team-2/state.json" in left

    p = start(original.folder, models.base_url, backup_store=store(s3, tmp_path / "keys"))
    try:
        wait_ready(p)
        abandoned = p.wait_for(
            "team-2 abandoned",
            lambda: (b := p.get("/v1/backups/team-2").json()).get("phase") == "Failed" and b,
            timeout=60,
        )
        assert "backup team-2 was abandoned: its indexer" in abandoned["error"]
        listed = p.get("/v1/backups").json()["backups"]
        assert [(b["name"], b["phase"]) for b in listed] == [
            ("team-1", "Completed"),
            ("team-2", "Failed"),
        ], "only one whole backup"
        assert p.post("/v1/backups", {"name": "team-1"}).json()["error"]["code"] == "BACKUP_EXISTS"
        assert backed_up(p, "team-2")["phase"] == "Completed", "written over what was left"
        gone = httpx.delete(f"{p.base_url}/v1/backups/team-2", timeout=30)
        assert gone.status_code == 204, gone.text
        assert [b["name"] for b in p.get("/v1/backups").json()["backups"]] == ["team-1"]
    finally:
        p.stop()
    assert not [k for k in s3.keys(BUCKET) if "/team-2/" in k]

    restore = {"store": store(s3, tmp_path / "keys"), "backup": "team-1"}
    q = start(tmp_path / "restored", models.base_url, restore=restore)
    try:
        assert wait_ready(q)["restore"]["phase"] == "Restored"
        assert chunks(tmp_path / "restored" / "index") == chunks(original.folder / "index")
    finally:
        q.stop()


def test_an_object_that_does_not_match_its_manifest_refuses_the_restore(
    original: Original, models: ModelServer, s3: S3Server, tmp_path: Path
) -> None:
    whole = f"{PREFIX}/team-1/"
    bad = f"{PREFIX}/team-bad/"
    for obj in ("index.sqlite3", "notes.tar"):
        s3.put(BUCKET, bad + obj, s3.get(BUCKET, whole + obj))
    m = json.loads(s3.get(BUCKET, whole + "manifest.json"))
    s3.put(BUCKET, bad + "manifest.json", json.dumps({**m, "name": "team-bad"}).encode())
    data = bytearray(s3.get(BUCKET, bad + "index.sqlite3"))
    data[len(data) // 2] ^= 0xFF  # one byte flipped, the size the same
    s3.put(BUCKET, bad + "index.sqlite3", bytes(data))

    before = embedded(models)
    restore = {"store": store(s3, tmp_path / "keys"), "backup": "team-bad"}
    p = start(tmp_path, models.base_url, restore=restore)
    try:
        status = p.wait_status(
            "the restore refused", lambda s: (s.get("restore") or {}).get("phase") == "Failed"
        )
        error = status["restore"]["error"]
        assert error.startswith(
            "backup team-bad: index.sqlite3 does not match its manifest (sha256"
        )
        assert status["phase"] == "waiting" and error in status["reason"]
        assert status["chunks"] == 0 and p.get("/readyz").status_code == 503
        assert embedded(models) == before, "nothing embedded from scratch"
        assert not (tmp_path / "index" / "index.sqlite3").exists()
    finally:
        p.stop()


def test_a_restore_under_another_model_says_so_and_ends_with_its_vectors(
    original: Original, s3: S3Server, tmp_path: Path
) -> None:
    new = layered_model.start(tmp_path / "layered")
    try:
        restore = {"store": store(s3, tmp_path / "keys"), "backup": "team-1"}
        p = start(tmp_path, new.base_url, restore=restore)
        try:
            done = p.wait_status(
                "the new model's vectors answering",
                lambda s: (
                    s["phase"] == "ready"
                    and (s.get("embedding") or {}).get("answering") == layered_model.MODEL_ID
                    and s["embedding"]["next"] is None
                ),
                timeout=300,
            )
            said = done["restore"]["reembedding"]
            assert said == (
                f"embedding model {original.backup['model']} → {layered_model.MODEL_ID}: "
                f"{original.backup['chunks']:,} chunks are embedded again beside the restored ones"
            )
            assert said in p.log_path.read_text()
            assert done["chunks"] == original.status["chunks"]
            assert notes(p) == original.notes
        finally:
            p.stop()
        restored = chunks(tmp_path / "index")
        old = {row[0]: row[5] for row in chunks(original.folder / "index")}
        assert len(restored) == len(old)
        assert all(row[5] is not None and row[5] != old.get(row[0]) for row in restored), (
            "every chunk holds the new model's vector"
        )
    finally:
        new.stop()


class Releasing(Holding):
    """The Holding proxy whose held requests go on, forwarded as they came, once `release`
    is called (those held when it closes are answered 503, as Holding's)."""

    def __init__(self, server: S3Server, hold: Callable[[str, str], bool]) -> None:
        self.released = threading.Event()
        super().__init__(
            server, lambda method, path: not self.released.is_set() and hold(method, path)
        )

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        if self.hold(request.method, request.path):
            self.held.set()
            while not self.released.is_set():
                if self._closing:
                    return web.Response(status=503)
                await asyncio.sleep(0.05)
        return await super()._forward(request)

    def release(self) -> None:
        self.released.set()


@dataclasses.dataclass
class Replicas:
    """Two indexers' folders of one base (two drives, the same documents), sharing its
    backup store as a base's replicas behind one Service do."""

    a: Path
    b: Path


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Replicas:
    return Replicas(tmp_path_factory.mktemp("replica-a"), tmp_path_factory.mktemp("replica-b"))


def uploading(name: str) -> Callable[[str, str], bool]:
    """The upload of backup `name`'s index (one PUT: the handbook's index is small)."""
    return lambda method, path: method == "PUT" and path.endswith(f"/{name}/index.sqlite3")


@contextlib.contextmanager
def two_replicas(
    replicas: Replicas, models: ModelServer, s3: S3Server, name: str
) -> Iterator[tuple[Process, Process, Releasing]]:
    """Replicas A and B of one base sharing a store, both ready; A's uploads of backup
    `name` held by the proxy it reaches the store through."""
    with Releasing(s3, uploading(name)) as proxy:
        a = start(replicas.a, models.base_url, backup_store=store(s3, replicas.a / "k", proxy.url))
        b = start(replicas.b, models.base_url, backup_store=store(s3, replicas.b / "k"))
        try:
            yield a, b, proxy
        finally:
            a.stop()
            b.stop()


def seen(p: Process, name: str) -> dict[str, Any]:
    return dict(p.get(f"/v1/backups/{name}").json())


def test_every_replica_answers_a_backup_one_of_them_runs_and_none_starts_it_again(
    replicas: Replicas, models: ModelServer, s3: S3Server
) -> None:
    name = "team-r1"
    with two_replicas(replicas, models, s3, name) as (a, b, proxy):
        assert wait_ready(a)["chunks"] == wait_ready(b)["chunks"], "the same documents"
        started = a.post("/v1/backups", {"name": name})
        assert started.status_code == 202, started.text
        assert seen(b, name) == started.json(), "its state written before the answer"
        assert proxy.held.wait(60), "A's upload of the index was reached"
        time.sleep(ABANDONED + 2)  # A's heartbeat keeps it live past ABANDONED
        running = seen(b, name)
        assert running == {**started.json(), "phase": "Running"}
        listed = {x["name"]: x["phase"] for x in b.get("/v1/backups").json()["backups"]}
        assert listed[name] == "Running"

        again = b.post("/v1/backups", {"name": name})
        assert again.status_code == 409, again.text
        error = again.json()["error"]
        assert error["code"] == "BACKUP_RUNNING"
        assert f"backup {name} is running on {socket.gethostname()}" in error["message"]
        gone = httpx.delete(f"{b.base_url}/v1/backups/{name}", timeout=30)
        assert gone.status_code == 409 and gone.json()["error"]["code"] == "BACKUP_RUNNING"

        proxy.release()
        done = [
            p.wait_for(
                f"{name} completed on {p.base_url}",
                lambda p=p: (x := seen(p, name)).get("phase") == "Completed" and x,
            )
            for p in (a, b)
        ]
        assert done[0] == done[1] and done[0]["error"] is None and done[0]["bytes"] > 0
    keys = [k for k in s3.keys(BUCKET) if f"/{name}/" in k]
    assert keys == [f"{PREFIX}/{name}/{o}" for o in ("index.sqlite3", "manifest.json", "notes.tar")]


def test_a_replica_killed_mid_backup_leaves_it_abandoned_and_another_makes_it(
    replicas: Replicas, models: ModelServer, s3: S3Server
) -> None:
    name = "team-r2"
    with two_replicas(replicas, models, s3, name) as (a, b, proxy):
        wait_ready(a)
        wait_ready(b)
        assert a.post("/v1/backups", {"name": name}).status_code == 202
        assert proxy.held.wait(60), "A's upload of the index was reached"
        assert seen(b, name)["phase"] == "Running"
        a.stop(signal.SIGKILL)
        killed = time.monotonic()
        failed = b.wait_for(
            f"{name} abandoned",
            lambda: (x := seen(b, name)).get("phase") == "Failed" and x,
            timeout=60,
        )
        assert time.monotonic() - killed > ABANDONED - HEARTBEAT - 1, "not before its time"
        assert re.fullmatch(
            rf"backup {name} was abandoned: its indexer \({re.escape(socket.gethostname())}\) "
            r"stopped answering at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ",
            failed["error"],
        ), failed["error"]
        assert failed["finished_at"] is not None

        assert backed_up(b, name)["phase"] == "Completed", "started again over it on B"
    keys = [k for k in s3.keys(BUCKET) if f"/{name}/" in k]
    assert keys == [f"{PREFIX}/{name}/{o}" for o in ("index.sqlite3", "manifest.json", "notes.tar")]


def test_a_replica_stopped_mid_backup_says_at_once_that_it_failed(
    replicas: Replicas, models: ModelServer, s3: S3Server
) -> None:
    name = "team-r3"
    with two_replicas(replicas, models, s3, name) as (a, b, proxy):
        wait_ready(a)
        wait_ready(b)
        assert a.post("/v1/backups", {"name": name}).status_code == 202
        assert proxy.held.wait(60), "A's upload of the index was reached"
        assert a.proc is not None
        a.proc.send_signal(signal.SIGTERM)
        failed = b.wait_for(
            f"{name} failed",
            lambda: (x := seen(b, name)).get("phase") == "Failed" and x,
            timeout=ABANDONED - 1,
        )
        assert failed["error"] == (
            f"backup {name}: uploading index.sqlite3: cut short, the indexer stopping"
        ), "said by A as it stopped, not abandoned"
        proxy.release()  # the upload A's thread waits on, so that it exits
        a.stop()
        assert backed_up(b, name)["phase"] == "Completed", "started again over it on B"


def copied(
    s3: S3Server, prefix: str, name: str, change: Callable[[bytes], bytes] | None = None
) -> None:
    """team-1 copied under `prefix` as `name`, its index changed by `change` (the manifest's
    checksums made the changed index's: a backup whole, whatever its vectors)."""
    whole = f"{PREFIX}/team-1/"
    m = json.loads(s3.get(BUCKET, whole + "manifest.json"))
    index = s3.get(BUCKET, whole + "index.sqlite3")
    if change is not None:
        index = change(index)
    files = {**m["files"], "index.sqlite3": {"bytes": len(index), "sha256": sha256(index)}}
    s3.put(BUCKET, f"{prefix}/{name}/index.sqlite3", index)
    s3.put(BUCKET, f"{prefix}/{name}/notes.tar", s3.get(BUCKET, whole + "notes.tar"))
    later = {**m, "name": name, "files": files, "finished_at": "2099-01-01T00:00:00Z"}
    s3.put(BUCKET, f"{prefix}/{name}/manifest.json", json.dumps(later).encode())


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def negated(index: bytes, tmp: Path) -> bytes:
    """The index with every vector pointing the other way: unlike the model's."""
    path = tmp / "negated.sqlite3"
    path.write_bytes(index)
    db = sqlite3.connect(path)
    try:
        rows = db.execute("SELECT id, vector FROM chunks WHERE vector IS NOT NULL").fetchall()
        db.executemany(
            "UPDATE chunks SET vector = ? WHERE id = ?",
            [((-np.frombuffer(v, dtype="<f4")).astype("<f4").tobytes(), i) for i, v in rows],
        )
        db.commit()
    finally:
        db.close()
    return path.read_bytes()


def test_a_new_replica_starts_from_the_newest_backup_and_refuses_one_unlike_the_model(
    original: Original, models: ModelServer, s3: S3Server, tmp_path: Path
) -> None:
    prefix = "team-a/seeds"
    copied(s3, prefix, "team-1")
    seeds = {**store(s3, tmp_path / "keys"), "prefix": prefix}
    nobody = f"http://127.0.0.1:{free_port()}"  # its peers: none answers

    before = embedded(models)
    p = start(tmp_path / "replica", models.base_url, backup_store=seeds, peers=[nobody])
    try:
        status = wait_ready(p)
        assert status["chunks"] == original.status["chunks"]
        assert status["vectors_from_model"] == 0 and status["last_pass"]["read"] == 0
        checks = min(16, original.status["chunks"])
        assert embedded(models) - before == checks, "the checks alone (they gave the dimensions)"
        assert "started from backup team-1" in p.log()
        assert results(p, QUESTIONS[1]) == original.answers[QUESTIONS[1]]
        assert p.get("/v1/backups/team-1").json()["phase"] == "Completed"
    finally:
        p.stop()

    copied(s3, prefix, "team-2", lambda index: negated(index, tmp_path))
    q = start(tmp_path / "distrusting", models.base_url, backup_store=seeds, peers=[nobody])
    try:
        status = wait_ready(q)
        assert "backup team-2 is not started from:" in q.log() and "cosine" in q.log()
        assert status["vectors_from_model"] == status["chunks"] > 0, "every vector the model's"
        assert notes(q) == [], "nothing of the seed refused is kept"
        assert results(q, QUESTIONS[1]) == original.answers[QUESTIONS[1]]
    finally:
        q.stop()
