"""The status tells how the last minute's searches were answered: a real `metis serve`, a
real `metis models` that is stopped halfway, and a reranker nobody serves."""

from __future__ import annotations

from tests.support.model_server import start_model_server
from tests.support.processes import free_port, indexer, running, wait_ready

from .test_service import HANDBOOK

QUESTION = "How many vacation days do I get?"


def test_the_status_counts_searches_by_how_they_were_answered(tmp_path):
    nobody = f"http://127.0.0.1:{free_port()}"
    server = start_model_server()
    p = indexer({"handbook": HANDBOOK}, tmp_path / "index", server.base_url, reranker=nobody)
    try:
        with running(p):
            status = wait_ready(p)
            assert status["searches"] == {
                "seconds": 60,
                "answered": 0,
                "by_words_only": 0,
                "without_reranker": 0,
                "failed": 0,
                "reason": None,
            }
            for _ in range(2):
                answer = p.post("/v1/search", {"query": QUESTION, "rerank": False}).json()
                assert answer["mode"] == "hybrid" and answer["warnings"] == []
            unranked = p.post("/v1/search", {"query": QUESTION}).json()
            assert unranked["mode"] == "hybrid" and not unranked["reranked"]
            server.stop()
            for _ in range(3):
                answer = p.post("/v1/search", {"query": QUESTION, "rerank": False}).json()
                assert answer["mode"] == "keyword" and answer["results"]
            [by_words] = answer["warnings"]
            dense = p.post("/v1/search", {"query": QUESTION, "mode": "dense"})
            assert dense.status_code == 503
            refused = p.post("/v1/search", {"query": " "})
            assert refused.status_code == 400, "a refused question is no search: not counted"
            assert p.status()["searches"] == {
                "seconds": 60,
                "answered": 2,
                "by_words_only": 3,
                "without_reranker": 1,
                "failed": 1,
                "reason": by_words,
            }
            assert by_words.endswith(
                "did not answer (connection refused): results by keywords only"
            )
    finally:
        server.stop()
