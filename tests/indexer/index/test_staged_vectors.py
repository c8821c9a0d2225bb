"""A new model's vectors staged beside the ones that answer, and switched to at once."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest

from metis_indexer.index.memory import Index, IndexSettings
from metis_indexer.index.store import FileRecord
from metis_indexer.schema import SearchRequest
from metis_indexer.search import hybrid
from tests.indexer.index.helpers import DIM, axis, chunk, new_index, record

NEW_DIM = 5
OLD = IndexSettings("test-model", DIM, 1200, 200)
NEW = IndexSettings("new-model", NEW_DIM, 1200, 200)


def built(path: str, chunks: int = 1) -> FileRecord:
    return dataclasses.replace(record(path, chunks=chunks), built_with=OLD.key)


def written(index: Index, n_files: int) -> None:
    for f in range(n_files):
        chunks = [chunk(f"file {f} chunk {c}") for c in range(3)]
        vectors = np.stack([axis((f + c) % DIM) for c in range(3)])
        index.put_document(built(f"{f}.md", 3), chunks, vectors)


def new_vector(chunk_id: int) -> np.ndarray:
    """A chunk's vector of the new model: its own axis pair, not yet of unit length."""
    v = np.zeros(NEW_DIM, dtype=np.float32)
    v[chunk_id % NEW_DIM] = 2.0
    v[(chunk_id + 1) % NEW_DIM] = 1.0
    return v


def stage_all(index: Index) -> None:
    while batch := index.store.lacking_staged(0, 4):
        ids = [b[0] for b in batch]
        index.put_staged(ids, [new_vector(i) for i in ids])


@pytest.mark.parametrize("kind", ["float32", "int8"])
def test_staged_vectors_answer_only_after_the_switch_and_as_a_fresh_load(tmp_path, kind):
    index = new_index(tmp_path, vectors=kind)
    written(index, 4)
    index.drop_files([("docs", "1.md")])  # dead rows among the live ones
    index.put_document(built("later.md"), [chunk("later chunk")], np.stack([axis(2)]))
    before = index.dense(axis(0), index.allowed(None), 3)
    stage_all(index)
    assert index.store.staged_counts() == (index.chunk_count, index.chunk_count)
    assert index.dense(axis(0), index.allowed(None), 3) == before, "the old vectors answer"

    index.store.set_meta({"answering": "old"})
    assert index.switch(NEW, {"answering": "new"}, ["staging"])
    assert index.settings() == NEW and index.store.meta()["answering"] == "new"
    assert index.dimensions == NEW_DIM and index.store.staged_counts() == (0, index.chunk_count)
    assert {r.built_with for _, r in index.store.files()} == {NEW.key}
    assert {f.record.built_with for f in index.files.values()} == {NEW.key}
    n = index.n_rows
    live = np.flatnonzero(index.alive[:n])
    assert index.has_vector[live].all() and not index.has_vector[:n][~index.alive[:n]].any()
    ids = index.row_chunk[live]
    want = np.stack([new_vector(int(i)) / np.linalg.norm(new_vector(int(i))) for i in ids])
    assert np.allclose(index.vectors.exact(live.astype(np.int64)), want, atol=1e-6)

    fresh = Index(tmp_path, kind)
    fresh.load()
    for query in want[:3]:
        switched = index.dense(query, index.allowed(None), 4)
        loaded = fresh.dense(query, fresh.allowed(None), 4)
        assert [int(index.row_chunk[r]) for r, _ in switched] == [
            int(fresh.row_chunk[r]) for r, _ in loaded
        ], "the switched index answers as a fresh load of it"
        assert [s for _, s in switched] == pytest.approx([s for _, s in loaded])


def test_a_chunk_dropped_takes_its_staged_vector_and_one_added_must_be_staged(tmp_path):
    index = new_index(tmp_path)
    written(index, 2)
    stage_all(index)
    index.drop_files([("docs", "0.md")])
    assert index.store.staged_counts() == (3, 3), "dead rows need no staged vector"
    index.put_document(built("new.md"), [chunk("new")], np.stack([axis(1)]))
    assert not index.switch(NEW, {}, []), "a live chunk lacks a staged vector"
    assert index.settings() == OLD
    assert index.dimensions == DIM and (index.has_vector & index.alive)[: index.n_rows].sum() == 4
    [(chunk_id, _, _, text)] = index.store.lacking_staged(0, 10)
    assert text == "new"
    index.put_staged([chunk_id], [None])  # the new model refused it
    assert index.switch(NEW, {}, [])
    records = {r.path: r for _, r in index.store.files()}
    assert records["1.md"].built_with == NEW.key
    assert records["new.md"].built_with == OLD.key, "a refused chunk's file is read again"
    held = {f.record.path: f.record.built_with for f in index.files.values()}
    assert held == {"1.md": NEW.key, "new.md": OLD.key}
    again = Index(tmp_path)
    again.load()
    assert again.settings() == NEW
    assert again.has_vector[: again.n_rows].tolist() == [True, True, True, False]


def test_a_question_embedded_before_the_switch_is_asked_again_of_the_new_model(tmp_path):
    index = new_index(tmp_path)
    written(index, 2)
    stage_all(index)
    asked: list[int] = []

    async def embed(text: str) -> np.ndarray:
        asked.append(index.vectors_epoch)
        if len(asked) == 1:  # the switch lands while the old model embeds the question
            assert index.switch(NEW, {}, [])
            return axis(0)
        return new_vector(2)  # chunk 2 (ids count from 1): file 0's second

    request = SearchRequest(query="file chunk", top_k=1, mode="dense")
    answer = asyncio.run(hybrid.search(index, request, hybrid.Models(embed=embed), "empty"))
    assert len(asked) == 2 and asked[0] != asked[1], "asked again after the switch"
    assert answer.mode == "dense" and answer.warnings == []
    [top] = answer.results
    assert top.text == "file 0 chunk 1" and top.scores.dense == pytest.approx(1.0)
