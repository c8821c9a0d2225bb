"""The decisions of a change of embedding model, over plain data."""

from __future__ import annotations

import asyncio

from metis_indexer.changes import model_change
from metis_indexer.config import EmbeddingConfig
from metis_indexer.index.memory import IndexSettings

OLD = IndexSettings("old-model", 384, 1200, 200)


def test_a_new_model_or_new_dimensions_are_staged_where_there_are_chunks():
    assert model_change.needs_staging(OLD, IndexSettings("new-model", 384, 1200, 200), 10)
    assert model_change.needs_staging(OLD, IndexSettings("old-model", 768, 1200, 200), 10)
    assert model_change.needs_staging(OLD, IndexSettings("new-model", 384, 800, 100), 10)
    assert not model_change.needs_staging(OLD, IndexSettings("old-model", 384, 800, 100), 10), (
        "a chunking change alone reads the files again, as before"
    )
    assert not model_change.needs_staging(OLD, IndexSettings("new-model", 384, 1200, 200), 0)
    assert not model_change.needs_staging(None, OLD, 10)
    assert not model_change.needs_staging(IndexSettings("", 0, 1200, 200), OLD, 10), "no vectors"
    assert not model_change.needs_staging(OLD, IndexSettings("", 0, 1200, 200), 10), "no model now"


def test_the_staged_vectors_must_fit_on_the_drive_before_staging_starts():
    # 100,000 chunks of 1,024 dimensions: 414.8 MB staged, plus a 600 MB database that the
    # switch's log may write again
    need = model_change.staging_megabytes(100_000, 100_000, 1024, "float32", 600_000_000)
    assert need == 1015
    assert model_change.no_room(need, need + model_change.LOG_MEGABYTES, "bge-m3") is None
    why = model_change.no_room(need, 900, "bge-m3")
    assert why is not None
    assert why.startswith(
        "the vectors of embedding model bge-m3 need 1015 MB and 900 MB are free on the index"
    )


def test_what_is_staged_already_is_not_counted_again_and_int8_needs_its_files():
    full = model_change.staging_megabytes(1000, 1000, 384, "float32", 0)
    half = model_change.staging_megabytes(500, 1000, 384, "float32", 0)
    assert (full, half) == (2, 1)
    assert model_change.staging_megabytes(0, 1000, 384, "int8", 0) == 2, "vectors and codes"


def test_the_answering_endpoint_round_trips_through_the_meta():
    endpoint = EmbeddingConfig(url="http://old:80", name="old", query_prefix="q: ")
    meta = model_change.endpoint_meta(endpoint)
    assert model_change.recorded_endpoint(meta) == endpoint
    assert model_change.recorded_endpoint({}) is None
    assert model_change.recorded_endpoint({model_change.ANSWERING: "{not json"}) is None
    assert model_change.staged_model(model_change.staging_meta(OLD)) == "old-model|384"


def test_a_model_let_go_of_closes_after_the_searches_asking_it_or_at_once_at_exit() -> None:
    """A search that asked the old model just before the switch waits for its answer:
    closing the client under it made it a search by words only (a ReadError)."""

    class Client:
        closed_at: float | None = None

        async def close(self) -> None:
            self.closed_at = asyncio.get_running_loop().time()

    async def scenario() -> tuple[float, bool]:
        loop = asyncio.get_running_loop()
        late, early = Client(), Client()
        start = loop.time()
        await model_change.Answering(OLD, None, late, None, 0).retire(0.2)  # type: ignore[arg-type]
        task = asyncio.create_task(model_change.Answering(OLD, None, early, None, 0).retire(60))  # type: ignore[arg-type]
        await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert late.closed_at is not None
        return late.closed_at - start, early.closed_at is not None

    waited, closed_at_exit = asyncio.run(scenario())
    assert waited >= 0.2 and closed_at_exit
