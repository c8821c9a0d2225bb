"""A search while a big document is embedded, with the indexer's defaults: a real
`metis serve`, a real `metis models`, a document of thousands of chunks. The question
goes ahead of the pass's batches at the model, and every search is answered by meaning.

What ran in which order is read from the model server's own count of its work
(`GET /health`: requests of each kind waiting, started and answered)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.support.model_server import ModelServer, start_model_server
from tests.support.processes import indexer, running

from .test_faults import write_huge_docx
from .test_service import HANDBOOK

SEARCHES = 20


@pytest.fixture(scope="module")
def models() -> Iterator[ModelServer]:
    server = start_model_server()
    yield server
    server.stop()


def batches(model: httpx.Client) -> dict[str, int]:
    """The model server's count of batch requests (an indexer's passages)."""
    return model.get("/health").json()["work"]["bulk"]


def test_searches_go_ahead_of_the_pass_at_the_model(models, tmp_path):
    big = tmp_path / "big"
    big.mkdir()
    write_huge_docx(big / "huge.docx")  # about 2,400 chunks: minutes of embedding
    p = indexer({"a-handbook": HANDBOOK, "z-big": big}, tmp_path / "index", models.base_url)
    # One client each, kept open: a client made per call costs tens of milliseconds (its
    # TLS context), long enough for a batch to be answered between the reads around a search.
    with (
        running(p),
        httpx.Client(base_url=models.base_url, timeout=30) as model,
        httpx.Client(base_url=p.base_url, timeout=120) as api,
    ):
        p.wait_status(
            "only the huge document left",
            lambda s: s["documents"] >= 6 and s["phase"] == "indexing",
            timeout=300,
        )
        p.wait_for(
            "a batch of the pass running at the model",
            lambda: batches(model)["started"],
            timeout=300,
        )
        ahead = 0
        for _ in range(SEARCHES):
            before = batches(model)
            answer = api.post(
                "/v1/search",
                json={"query": "How many vacation days do I get?", "top_k": 3, "rerank": False},
            ).json()
            after = batches(model)
            assert answer["warnings"] == [], answer["warnings"]
            top = answer["results"][0]
            assert top["scores"].get("dense") is not None, "found by meaning"
            assert top["citation"]["source"] == "a-handbook"
            # A batch was running when the question was sent, and none was answered
            # before the question was: it went ahead of that batch.
            ahead += before["started"] >= 1 and after["answered"] == before["answered"]
        assert p.status()["phase"] == "indexing", "the huge document was still embedding"
        # Between two batches none is running for a moment: wait for the next one.
        p.wait_for(
            "the pass still sending batches to the model",
            lambda: batches(model)["started"],
            timeout=60,
        )
    assert ahead >= SEARCHES // 2, f"{ahead} of {SEARCHES} searches went ahead of a batch"
