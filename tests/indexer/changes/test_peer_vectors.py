"""A replica that starts empty gets its vectors from a peer: real `metis serve` processes,
real `metis models` servers, real documents (the handbook and two folders of the Helm docs,
read where they lie). What each indexer cost its model is read from the model server's
own count of the texts it embedded (`GET /health`: `embedded`)."""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from metis_indexer.changes.peers import NEW_CHECKS, NOT_READY
from metis_indexer.index.store import PASSED, PASSES_TRACKED
from metis_indexer.schema import HASHES_MAX
from tests.indexer.service.test_service import HANDBOOK
from tests.support.model_server import ModelServer, start_model_server
from tests.support.processes import Process, free_port, indexer, running, wait_ready

DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data"  # next to the repository
HELM = DATA / "perf/helm-www/versioned_docs/version-3"
SOURCES = {
    "handbook": HANDBOOK,
    "practices": HELM / "chart_best_practices",
    "templates": HELM / "chart_template_guide",
}
TOKEN = "the-base-token"
QUESTIONS = (
    "How many vacation days do I get?",
    "How should chart values be named?",
    "What labels should a chart's resources carry?",
    "Who do I call when the database is down?",
)

pytestmark = pytest.mark.skipif(not HELM.is_dir(), reason=f"{HELM} is not on this machine")


def embedded(model: ModelServer) -> int:
    """Texts the model server has embedded so far."""
    return int(httpx.get(f"{model.base_url}/health", timeout=30).json()["embedded"])


def close(a: float | None, b: float | None, within: float) -> bool:
    """The same score (or none), as far as the API's rounding goes."""
    return (a is None) == (b is None) and (a is None or b is None or abs(a - b) <= within)


def pass_seconds(p: Process) -> float:
    """The time of the indexer's passes, from its metrics."""
    for line in p.get("/metrics").text.splitlines():
        if line.startswith("metis_pass_seconds_sum "):
            return float(line.split()[1])
    raise AssertionError("no metis_pass_seconds_sum")


def started(p: Process, token: str | None) -> Process:
    if token is not None:
        p.env["METIS_API_TOKEN"] = token
    return p.start()


def results(p: Process, question: str) -> list[tuple[Any, ...]]:
    """What a search answers, as compared between replicas: the order, the citations and
    the scores of each leg."""
    answer = httpx.post(
        f"{p.base_url}/v1/search",
        json={"query": question, "top_k": 8, "rerank": False},
        timeout=120,
    ).json()
    assert answer["warnings"] == [], answer["warnings"]
    return [
        (
            r["citation"]["source"],
            r["citation"]["document"],
            r["citation"]["headings"],
            r["text"],
            r["scores"].get("dense"),  # absent where a leg did not find it
            r["scores"].get("keyword"),
        )
        for r in answer["results"]
    ]


@pytest.fixture(scope="module")
def models() -> Iterator[ModelServer]:
    server = start_model_server()
    yield server
    server.stop()


@dataclasses.dataclass
class Indexed:
    """Replica A, its documents indexed whole, and the texts that cost its model."""

    process: Process
    cost: int


@pytest.fixture(scope="module")
def indexed(models: ModelServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Indexed]:
    before = embedded(models)
    p = started(indexer(SOURCES, tmp_path_factory.mktemp("a") / "index", models.base_url), TOKEN)
    try:
        wait_ready(p)
        yield Indexed(p, embedded(models) - before)
    finally:
        p.stop()


@pytest.fixture
def first(indexed: Indexed) -> Process:
    return indexed.process


def test_an_empty_replica_takes_its_vectors_from_a_peer(
    indexed: Indexed, first: Process, tmp_path: Path
) -> None:
    a_cost = indexed.cost
    a = first.status()
    assert a["vectors_from_peers"] == 0 and a["vectors_from_model"] == a["chunks"] > 100
    # B's model is not up yet: B loads its empty index and waits, not ready meanwhile.
    port = free_port()
    (tmp_path / "b").mkdir()
    b = indexer(
        SOURCES,
        tmp_path / "b" / "index",
        f"http://127.0.0.1:{port}",
        extra=("--peer", first.base_url),
    )
    started(b, TOKEN)
    model_b: ModelServer | None = None
    try:
        refused = b.wait_for(
            "B loaded and not ready",
            lambda: (
                (r := b.get("/readyz")).status_code == 503
                and r.json()["error"]["message"] == NOT_READY
                and r.json()
            ),
        )
        assert refused["error"]["code"] == "KNOWLEDGE_BASE_NOT_READY"
        model_b = start_model_server(port=port)
        wait_ready(b)
        assert b.get("/readyz").status_code == 200
        b_cost = embedded(model_b)
        s = b.status()
        print(
            f"passages to the model: A {a_cost}, B {b_cost}; pass seconds: "
            f"A {pass_seconds(first):.1f}, B {pass_seconds(b):.1f}"
        )
        # The model embeds only the vectors B checks: all of a new peer's first, then one in
        # 16 drawn at random (peers.NEW_CHECKS, peers.CHECK_RATE).
        assert b_cost <= NEW_CHECKS + 0.15 * a_cost, (a_cost, b_cost)
        assert s["chunks"] == a["chunks"] and s["documents"] == a["documents"]
        checked = s["vectors_from_model"]
        assert checked + 1 == b_cost, "and the word that asks the model's dimensions"
        assert checked >= NEW_CHECKS and s["vectors_from_peers"] == a["chunks"] - checked
        metrics = b.get("/metrics").text
        assert f"metis_vectors_from_peers_total {float(a['chunks'] - checked)}" in metrics
        for question in QUESTIONS:
            got, want = results(b, question), results(first, question)
            assert [r[:4] for r in got] == [r[:4] for r in want], "the same passages, in order"
            # The scores as the API rounds them: a keyword score's last digit moves from one
            # search to the next, on one replica too (its float32 sum in another order).
            for g, w in zip(got, want, strict=True):
                assert close(g[4], w[4], 1e-6) and close(g[5], w[5], 1e-5), (g[4:], w[4:])
        # Restarted with its model away, B is ready as soon as its index is loaded: its
        # first pass ended before, and the index says so.
        b.stop()
        model_b.stop()
        model_b = None
        started(b, TOKEN)
        b.wait_for("B ready again", lambda: b.get("/readyz").status_code == 200)
        assert b.status()["chunks"] == a["chunks"]
    finally:
        b.stop()
        if model_b is not None:
            model_b.stop()


def test_without_a_willing_peer_a_replica_embeds_by_itself(
    models: ModelServer, first: Process, tmp_path: Path
) -> None:
    """A peer that is gone, and one that refuses the token: the pass embeds everything."""
    gone = f"http://127.0.0.1:{free_port()}"
    (tmp_path / "c").mkdir()
    c = indexer(
        SOURCES,
        tmp_path / "c" / "index",
        models.base_url,
        extra=("--peer", gone, "--peer", first.base_url),
    )
    before = embedded(models)
    started(c, "not-the-base-token")
    try:
        s = wait_ready(c)
        assert c.get("/readyz").status_code == 200
        assert s["vectors_from_peers"] == 0
        assert s["vectors_from_model"] == s["chunks"] == first.status()["chunks"]
        assert embedded(models) - before >= s["chunks"]
        assert "answered 401" in c.log() and "did not answer" in c.log()
        top = results(c, QUESTIONS[0])[0]
        assert top[0] == "handbook" and top[4] is not None
    finally:
        c.stop()


def test_an_index_made_before_replicas_stays_ready_when_peers_come(
    models: ModelServer, tmp_path: Path
) -> None:
    """Going from one replica to two gives the answering pod peers: its index, made by a
    version that kept no record of its first pass, must not leave the Service until a
    pass ends (with its model away here, none would)."""
    index = tmp_path / "index"
    p = indexer({"handbook": HANDBOOK}, index, models.base_url)
    with running(p):
        assert wait_ready(p)["chunks"] > 0
    with sqlite3.connect(index / "index.sqlite3") as db:
        db.execute("DELETE FROM meta WHERE key IN (?, ?)", (PASSED, PASSES_TRACKED))
    away = f"http://127.0.0.1:{free_port()}"
    again = indexer({"handbook": HANDBOOK}, index, away, extra=("--peer", away))
    with running(again):
        again.wait_for(
            "the old index ready at once", lambda: again.get("/readyz").status_code == 200
        )
    # An index of this version that has not had its first pass is not ready with peers,
    # even when it holds chunks (a pass cut short).
    fresh = tmp_path / "fresh"
    p = indexer({"handbook": HANDBOOK}, fresh, models.base_url)
    with running(p):
        wait_ready(p)
    with sqlite3.connect(fresh / "index.sqlite3") as db:
        db.execute("DELETE FROM meta WHERE key = ?", (PASSED,))
    cut = indexer({"handbook": HANDBOOK}, fresh, away, extra=("--peer", away))
    with running(cut):
        cut.wait_for(
            "loaded and not ready",
            lambda: (
                (r := cut.get("/readyz")).status_code == 503
                and r.json()["error"]["message"] == NOT_READY
            ),
        )


def _vectors(p: Process, body: object, token: str | None = TOKEN) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.post(f"{p.base_url}/v1/vectors", json=body, headers=headers, timeout=30)


def test_the_vectors_route_refuses_what_it_must(first: Process) -> None:
    h = "0" * 32
    model = first.status()["embedding_model"]
    for body, says in (
        ({"model": model, "hashes": [h] * (HASHES_MAX + 1)}, "hashes"),
        ({"model": model, "hashes": ["not a hash"]}, "hashes.0"),
        ({"hashes": [h]}, "model"),
        ({"model": model, "hashes": [h], "extra": 1}, "extra"),
    ):
        r = _vectors(first, body)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == "INVALID_BODY" and says in r.json()["error"]["message"]
    r = _vectors(first, {"model": model, "hashes": [h]}, token=None)
    assert r.status_code == 401 and r.json()["error"]["code"] == "UNAUTHORIZED"
    assert _vectors(first, {"model": model, "hashes": [h]}, token="wrong").status_code == 401
    unknown = _vectors(first, {"model": model, "hashes": [h]}).json()
    assert unknown["model"] == model and unknown["found"] == [] and unknown["vectors"] == ""
    other = _vectors(first, {"model": "another/model", "hashes": [h]}).json()
    assert other["found"] == [] and other["model"] is None
    assert f"holds the vectors of {model}, not of another/model" in other["reason"]
