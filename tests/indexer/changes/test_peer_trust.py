"""A replica trusts the model, not its peers: real `metis serve` processes and a real
`metis models` server; the peer that lies is a real replica's answers tampered with
(tests/support/tampering_peer.py), since no real replica can be made to lie.

Each wrong peer (noise, zeros, vectors shifted by one passage, a byte every 2 s, 150 MB)
leaves a new replica whose dense results are the honest replica's, with no vector of the
peer kept, and a status, a metric and a log line that say what was refused."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from metis_indexer.changes import peers
from tests.indexer.service.test_service import HANDBOOK
from tests.support.model_server import ModelServer, start_model_server
from tests.support.processes import Process, indexer, wait_ready
from tests.support.tampering_peer import TamperingPeer

from .test_peer_vectors import HELM, TOKEN, close, embedded, results, started

SOURCES = {"handbook": HANDBOOK, "practices": HELM / "chart_best_practices"}
QUESTIONS = (
    "How many vacation days do I get?",
    "How should chart values be named?",
    "Who do I call when the database is down?",
)

pytestmark = pytest.mark.skipif(not HELM.is_dir(), reason=f"{HELM} is not on this machine")


@pytest.fixture(scope="module")
def models() -> Iterator[ModelServer]:
    server = start_model_server()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def honest(models: ModelServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    folder = tmp_path_factory.mktemp("honest")
    p = started(indexer(SOURCES, folder / "index", models.base_url), TOKEN)
    try:
        wait_ready(p)
        yield p
    finally:
        p.stop()


def refused(p: Process) -> dict[str, float]:
    """The replica's count of refused peer answers, by reason."""
    found = re.findall(
        r'^metis_peer_answers_refused_total\{reason="(\w+)"\} (\S+)$',
        p.get("/metrics").text,
        re.MULTILINE,
    )
    return {reason: float(n) for reason, n in found}


def same_dense_results(p: Process, honest: Process) -> None:
    for question in QUESTIONS:
        got, want = results(p, question), results(honest, question)
        assert [r[:4] for r in got] == [r[:4] for r in want], question
        for g, w in zip(got, want, strict=True):
            # The model embeds a passage in another batch here: the last digit may move.
            assert close(g[4], w[4], 1e-5), (question, g[4], w[4])


@pytest.mark.parametrize(
    ("mode", "reason", "says"),
    [
        ("random", "unlike_model", "unlike the model's own"),
        ("shifted", "unlike_model", "unlike the model's own"),
        ("zeros", "malformed", "vectors of zeros"),
        ("tarpit", "too_slow", f"took over {peers.ASK_SECONDS:g} s"),
        ("huge", "too_large", "bytes"),
    ],
)
def test_a_wrong_peer_is_refused_and_the_replica_is_the_models(
    models: ModelServer, honest: Process, tmp_path: Path, mode: str, reason: str, says: str
) -> None:
    with TamperingPeer(honest.base_url, mode, TOKEN).serving() as liar:
        b = started(
            indexer(SOURCES, tmp_path / "index", models.base_url, extra=("--peer", liar.base_url)),
            TOKEN,
        )
        try:
            # A tarpit costs each answer its whole deadline, and then no more: the pass ends.
            s = wait_ready(b, timeout=120)
            assert liar.asked >= 1, "the peer was asked"
            assert s["vectors_from_peers"] == 0, "no vector of the lying peer is kept"
            assert s["vectors_from_model"] == s["chunks"] == honest.status()["chunks"]
            assert refused(b)[reason] >= 1, refused(b)
            assert sum(refused(b).values()) == refused(b)[reason]
            [warning] = [w for w in s["warnings"] if liar.base_url in w]
            assert says in warning and "not used until" in warning, warning
            assert f"peer {liar.base_url}: its vectors are refused" in b.log()
            same_dense_results(b, honest)
        finally:
            b.stop()


def test_an_honest_peer_is_checked_and_a_full_reindex_asks_the_model_alone(
    models: ModelServer, honest: Process, tmp_path: Path
) -> None:
    before = embedded(models)
    b = started(
        indexer(SOURCES, tmp_path / "index", models.base_url, extra=("--peer", honest.base_url)),
        TOKEN,
    )
    try:
        s = wait_ready(b)
        chunks = s["chunks"]
        checked = s["vectors_from_model"]
        assert s["vectors_from_peers"] + checked == chunks
        # Every vector of a new peer up to NEW_CHECKS is checked, then one in 16 on average.
        assert peers.NEW_CHECKS <= checked < peers.NEW_CHECKS + 0.25 * chunks, (checked, chunks)
        assert embedded(models) - before == checked + 1, "and the word asking its dimensions"
        assert refused(b) == dict.fromkeys(peers.REFUSALS, 0.0)
        assert f"metis_peer_vectors_checked_total {float(checked)}" in b.get("/metrics").text
        same_dense_results(b, honest)

        asked = httpx.post(
            f"{b.base_url}/v1/reindex",
            json={"full": True},
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=30,
        )
        assert asked.status_code == 202, asked.text
        again = b.wait_status(
            "the full reindex done", lambda t: t["passes"] > s["passes"] and t["phase"] == "ready"
        )
        assert again["vectors_from_peers"] == s["vectors_from_peers"], "no peer was asked"
        assert again["vectors_from_model"] == checked + chunks
    finally:
        b.stop()
