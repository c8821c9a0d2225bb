"""A source read from an artifact, as a Flux source object's revision reaches the indexer:
`metis serve` following its configuration file, `metis models` and a loopback artifact
server as real processes. A new revision is read exactly: what changed embedded again
and nothing else, what is gone dropped; one that cannot be had leaves the base answering
from the revision it has, saying why."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.artifacts import Server, digest, server, tarball
from tests.support.model_server import ModelServer, start_model_server
from tests.support.processes import Process, free_port, running, served, wait_ready

__all__ = ["server"]  # a fixture

ROOT = Path(__file__).resolve().parents[3]
HANDBOOK = ROOT / "examples" / "handbook"
ORIGIN = "GitRepository docs"
LEAVE = "policies/leave.md"


@pytest.fixture(scope="module")
def models() -> Iterator[ModelServer]:
    model = start_model_server()
    yield model
    model.stop()


def handbook() -> dict[str, bytes]:
    return {
        str(p.relative_to(HANDBOOK)): p.read_bytes()
        for p in sorted(HANDBOOK.rglob("*"))
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(HANDBOOK).parts)
    }


def configure(path: Path, tmp: Path, url: str, artifact: dict[str, str]) -> None:
    config = {
        "sources": [
            {
                "drive": "docs",
                "root": str(tmp / "index" / "artifacts" / "docs"),
                "artifact": artifact,
            }
        ],
        "embedding": {"url": url, "name": "minilm"},
        "index_dir": str(tmp / "index"),
        "rescan_seconds": 0,
        "port": int(path.parent.joinpath("port").read_text()),
    }
    path.with_suffix(".tmp").write_text(json.dumps(config))
    path.with_suffix(".tmp").replace(path)  # whole, as a ConfigMap's mount changes


def revision(
    server: Server, name: str, files: dict[str, bytes], wrong: bool = False
) -> dict[str, str]:
    data = tarball(files)
    server.archives[name] = data
    return {
        "url": server.url(name),
        "digest": digest(b"tampered" if wrong else data),
        "revision": f"main@sha1:{name}",
        "origin": ORIGIN,
    }


def documents(p: Process) -> dict[str, int]:
    rows = p.get("/v1/documents", params={"page_size": 1000}).json()["documents"]
    return {r["document"]: r["chunks"] for r in rows if r["source"] == "docs"}


def top(p: Process, question: str) -> list[str]:
    answer = p.post("/v1/search", {"query": question, "top_k": 3, "mode": "keyword"}).json()
    return [r["citation"]["document"] for r in answer["results"]]


def test_each_revision_is_read_exactly_and_one_that_cannot_be_had_is_said(
    models: ModelServer, server: Server, tmp_path: Path
) -> None:
    port = free_port()
    (tmp_path / "port").write_text(str(port))
    config = tmp_path / "config.json"
    first = handbook()
    assert LEAVE in first and "security.html" in first
    configure(config, tmp_path, models.base_url, revision(server, "aaa", first))
    p = served(config, port, tmp_path / "indexer.log")
    with running(p):
        status = wait_ready(p)
        assert status["indexed_revisions"] == {"docs": "main@sha1:aaa"}
        assert status["revisions"] == {"docs": "main@sha1:aaa"}
        before = documents(p)
        assert set(before) == set(first)
        made = status["vectors_from_model"]
        assert made == sum(before.values())

        second = dict(first)
        second[LEAVE] = first[LEAVE].replace(b"leave", b"leave (zebra rules apply)", 1)
        second["kitchen.md"] = b"# Kitchen\n\nThe office kitchen is cleaned every Friday.\n"
        del second["security.html"]
        configure(config, tmp_path, models.base_url, revision(server, "bbb", second))
        status = p.wait_status(
            "revision bbb indexed",
            lambda s: s["indexed_revisions"] == {"docs": "main@sha1:bbb"} and s["phase"] == "ready",
        )
        after = documents(p)
        assert set(after) == set(second)
        assert status["last_pass"] == {
            "read": 2,
            "unchanged": 0,
            "dropped": 1,
        }  # no other file opened
        assert status["vectors_from_model"] - made == after[LEAVE] + after["kitchen.md"]
        assert top(p, "zebra rules")[:1] == [LEAVE]
        assert top(p, "office kitchen cleaned Friday")[:1] == ["kitchen.md"]
        store = tmp_path / "index" / "artifacts" / "docs"
        kept = sorted(x.name for x in store.iterdir())
        assert len(kept) == 2 and kept[0] == "current", "revision aaa's folder is gone"

        tampered = revision(
            server, "ccc", {**second, "kitchen.md": b"# Kitchen\n\nClosed.\n"}, wrong=True
        )
        configure(config, tmp_path, models.base_url, tampered)
        status = p.wait_status(
            "revision ccc refused",
            lambda s: s["revisions"] == {"docs": "main@sha1:ccc"} and s["phase"] == "ready",
        )
        assert status["indexed_revisions"] == {"docs": "main@sha1:bbb"}
        assert [w for w in status["warnings"] if ORIGIN in w] == [
            f"cannot read {ORIGIN} at main@sha1:ccc: the artifact at {server.url('ccc')} is "
            f"{digest(server.archives['ccc'])}, not {tampered['digest']} as its source says: "
            "refused; read at main@sha1:bbb meanwhile"
        ]
        assert top(p, "office kitchen cleaned Friday")[:1] == ["kitchen.md"]

        gone = {**revision(server, "ddd", second), "url": f"http://127.0.0.1:{free_port()}/ddd"}
        configure(config, tmp_path, models.base_url, gone)
        status = p.wait_status(
            "revision ddd unreachable",
            lambda s: s["revisions"] == {"docs": "main@sha1:ddd"} and s["phase"] == "ready",
        )
        assert status["indexed_revisions"] == {"docs": "main@sha1:bbb"}
        said = [w for w in status["warnings"] if ORIGIN in w]
        assert len(said) == 1 and said[0].startswith(
            f"cannot read {ORIGIN} at main@sha1:ddd: cannot fetch the artifact at"
        )
        assert set(documents(p)) == set(second)

    p = served(config, port, tmp_path / "again.log")
    with running(p):  # a restart still has revision bbb to read, and reads nothing again
        status = wait_ready(p)
        assert status["indexed_revisions"] == {"docs": "main@sha1:bbb"}
        assert status["last_pass"]["read"] == 0
        assert set(documents(p)) == set(second)
