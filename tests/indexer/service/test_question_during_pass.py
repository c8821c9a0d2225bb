"""A search while a big document is embedded, with the indexer's defaults: a real
`metis serve`, a real `metis models`, a document of thousands of chunks. The question
goes ahead of the pass's batches at the model, and every search is answered by meaning.

What ran in which order is read from the model server's own count of its work
(`GET /health`: requests of each kind waiting, started and answered)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.model_server import ModelServer, start_model_server

from .busy_model import batches, pass_busy_at_the_model

SEARCHES = 20


@pytest.fixture(scope="module")
def models() -> Iterator[ModelServer]:
    server = start_model_server()
    yield server
    server.stop()


def test_searches_go_ahead_of_the_pass_at_the_model(models, tmp_path):
    with pass_busy_at_the_model(models, tmp_path) as (p, model, api):
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
