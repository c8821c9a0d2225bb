"""The search core over a real on-disk index; vectors are chosen by the test, so the
dense leg's order is known. Real model servers are exercised in the service tests."""

import asyncio
import json

import numpy as np
import pytest

from metis_indexer.errors import BadRequest, Unavailable
from metis_indexer.schema import SearchRequest, parse_body
from metis_indexer.search.hybrid import Models, leg_size, rank, rerank_size, search, where
from tests.indexer.index.helpers import DIM, axis, chunk, new_index, record

EMPTY = "nothing is indexed yet: the index is loading"


@pytest.fixture
def index(tmp_path):
    index = new_index(tmp_path)
    docs = [
        ("docs", "handbook/leave.md", "md", "Twenty-five days of paid vacation a year.", 0),
        ("docs", "handbook/sick.md", "md", "Sick leave needs a note after three days.", 1),
        ("docs", "ops/xid.txt", "txt", "Xid 79 means the GPU fell off the bus.", 2),
        ("runbooks", "gpu.html", "html", "Run nvidia-smi to see the GPU state.", 3),
        ("runbooks", "manual.pdf", "pdf", "The manual, page two: vacation planning.", 4),
    ]
    for source, path, kind, text, axis_i in docs:
        page = 2 if kind == "pdf" else None
        line = 1 if kind in ("md", "txt") else None
        index.put_document(
            record(path, source=source, kind=kind, title=path.upper()),
            [chunk(text, ("Policies",), line=line, page=page, title=path.upper())],
            np.stack([axis(axis_i)]),
        )
    return index


def embed_as(vector):
    async def embed(_: str) -> np.ndarray:
        return vector

    return embed


def ask(index, models=None, **body):
    """A search with `body` parsed as the API parses it (JSON, so `"pdf"` is a kind)."""
    req = parse_body(SearchRequest, json.dumps(body).encode())
    return asyncio.run(search(index, req, models or Models(), EMPTY))


def paths(answer):
    return [r.citation.document for r in answer.results]


def test_keyword_mode_finds_exact_terms_and_cites_them(index):
    a = ask(index, query="Xid 79", mode="keyword")
    assert paths(a)[0] == "ops/xid.txt"
    top = a.results[0]
    assert top.citation.source == "docs" and top.citation.kind == "txt"
    assert top.citation.line == 1 and top.citation.headings == ["Policies"]
    assert "Xid 79" in top.citation.snippet and top.text.startswith("Xid 79")
    assert top.scores.keyword_rank == 1 and top.scores.dense is None
    assert a.mode == "keyword" and not a.reranked and a.warnings == []


def test_hybrid_fuses_both_legs(index):
    a = ask(index, Models(embed=embed_as(axis(1))), query="vacation", top_k=5)
    first = a.results[0]
    assert first.scores.dense_rank is not None and first.scores.keyword_rank is not None
    both = {r.citation.document for r in a.results if r.scores.dense_rank and r.scores.keyword_rank}
    assert paths(a)[0] in both
    assert a.results[0].score == pytest.approx(first.scores.fused)
    assert [r.score for r in a.results] == sorted((r.score for r in a.results), reverse=True)
    assert a.took.total >= a.took.dense


def test_dense_mode_orders_by_cosine(index):
    q = axis(3) + 0.5 * axis(2)
    a = ask(index, Models(embed=embed_as(q)), query="anything", mode="dense", top_k=2)
    assert paths(a) == ["gpu.html", "ops/xid.txt"]
    assert a.results[0].scores.dense == pytest.approx(1 / np.sqrt(1.25), rel=1e-5)
    assert a.results[0].scores.keyword is None


def test_filters_apply_before_ranking(index):
    models = Models(embed=embed_as(axis(0)))
    a = ask(index, models, query="vacation", filters={"sources": ["runbooks"]})
    assert set(paths(a)) == {"gpu.html", "manual.pdf"}, "both runbooks, nothing else"
    assert all(r.citation.source == "runbooks" for r in a.results)
    a = ask(index, models, query="vacation", filters={"kinds": ["pdf"]})
    assert paths(a) == ["manual.pdf"] and a.results[0].citation.page == 2
    a = ask(index, models, query="days", filters={"path_prefix": "handbook/"})
    assert set(paths(a)) == {"handbook/leave.md", "handbook/sick.md"}


def test_the_embedding_model_silent_degrades_to_keywords(index):
    async def silent(_: str) -> np.ndarray:
        await asyncio.Event().wait()  # a model that never answers
        raise AssertionError("unreachable")

    models = Models(embed=silent, embedding_name="model bge-m3", timeout=0.05)
    a = ask(index, models, query="vacation")
    assert a.mode == "keyword" and paths(a)
    assert a.warnings == [
        "model bge-m3 did not answer (no answer within 0.05 s): results by keywords only"
    ]
    with pytest.raises(Unavailable) as e:
        ask(index, models, query="vacation", mode="dense")
    assert e.value.code == "EMBEDDING_MODEL_UNAVAILABLE"


def test_dense_without_an_embedding_model_is_refused(index):
    with pytest.raises(BadRequest) as e:
        ask(index, query="vacation", mode="dense")
    assert e.value.code == "NO_EMBEDDING_MODEL"


def test_the_reranker_orders_and_its_failure_keeps_the_fused_order(index):
    async def by_length(query: str, passages: list[str]) -> list[float]:
        return [float(len(p)) for p in passages]

    async def broken(query: str, passages: list[str]) -> list[float]:
        raise ConnectionError("connection refused")

    a = ask(index, Models(rerank=by_length), query="days vacation gpu")
    assert a.reranked and [r.score for r in a.results] == sorted(
        (r.score for r in a.results), reverse=True
    )
    assert all(r.scores.rerank is not None for r in a.results)
    fused = ask(index, query="days vacation gpu")
    b = ask(index, Models(rerank=broken, reranker_name="reranker bge"), query="days vacation gpu")
    assert not b.reranked and paths(b) == paths(fused)
    assert b.warnings == [
        "reranker bge did not answer (connection refused): results in the fused order"
    ]
    c = ask(index, Models(rerank=by_length), query="days vacation gpu", rerank=False)
    assert not c.reranked and paths(c) == paths(fused)


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"query": "  "}, "QUERY_EMPTY"),
        ({"query": "x" * 4001}, "QUERY_TOO_LONG"),
        ({"query": "x", "top_k": 0}, "TOP_K_OUT_OF_RANGE"),
        ({"query": "x", "top_k": 51}, "TOP_K_OUT_OF_RANGE"),
    ],
)
def test_invalid_searches_get_the_spec_codes(index, body, code):
    with pytest.raises(BadRequest) as e:
        ask(index, **body)
    assert e.value.code == code


def test_an_empty_index_answers_with_why(tmp_path):
    a = ask(new_index(tmp_path), query="anything")
    assert a.results == [] and a.warnings == [EMPTY]


def test_chunks_without_vectors_are_found_by_words(tmp_path):
    index = new_index(tmp_path)
    index.put_document(record("a.md"), [chunk("plain words")], None)
    a = ask(index, Models(embed=embed_as(axis(0))), query="plain words")
    assert a.mode == "keyword" and paths(a) == ["a.md"]
    assert a.warnings[0].startswith("no chunk has a vector yet")
    index.put_document(record("b.md"), [chunk("vector words")], np.stack([axis(0)]))
    a = ask(index, Models(embed=embed_as(axis(0))), query="plain words")
    assert a.mode == "hybrid" and set(paths(a)) == {"a.md", "b.md"}
    plain = next(r for r in a.results if r.citation.document == "a.md")
    assert plain.scores.dense_rank is None and plain.scores.keyword_rank == 1
    assert a.warnings == [
        "1 chunks have no vector yet (indexed while the embedding model did "
        "not answer): they are found by keywords only"
    ]


def test_candidate_counts_follow_the_spec():
    assert leg_size(5) == 50 and leg_size(20) == 80
    assert rerank_size(1) == 20 and rerank_size(10) == 30 and rerank_size(50) == 50
    assert DIM == 8


@pytest.fixture
def legs(tmp_path):
    """Four chunks whose ranks in each leg are known by construction.

    Inserted in this order (rows 0 to 3):
    - a.md, vector along axis 0, "zebra crossing": dense #1, no word of the question;
    - b.md, no vector, "vacation days paid": keyword #1 (all three words), not in the dense leg;
    - c.md, axis 1, "vacation days": dense #2 (cosine 0.447), keyword #2;
    - d.md, axis 2, "vacation": dense #3 (cosine 0), keyword #3.
    a.md comes first so that its row is lower than b.md's: a tie broken by row would put it
    first, a tie kept in the order met (keyword leg first) does not.
    """
    index = new_index(tmp_path)
    for path, text, vector in [
        ("a.md", "zebra crossing", axis(0)),
        ("b.md", "vacation days paid", None),
        ("c.md", "vacation days", axis(1)),
        ("d.md", "vacation", axis(2)),
    ]:
        index.put_document(
            record(path), [chunk(text)], None if vector is None else np.stack([vector])
        )
    return index


def test_hybrid_fuses_both_legs_to_the_hand_worked_order_and_scores(legs):
    """RRF with k = 60: c.md 1/62 + 1/62, d.md 1/63 + 1/63, then a.md and b.md tie at 1/61;
    the keyword leg's first comes before the dense leg's first."""
    q = axis(0) + 0.5 * axis(1)
    a = ask(legs, Models(embed=embed_as(q)), query="vacation days paid", top_k=4)
    assert a.mode == "hybrid" and not a.reranked
    assert paths(a) == ["c.md", "d.md", "b.md", "a.md"]
    ranks = [(r.scores.dense_rank, r.scores.keyword_rank) for r in a.results]
    assert ranks == [(2, 2), (3, 3), (None, 1), (1, None)]
    expected = [2 / 62, 2 / 63, 1 / 61, 1 / 61]
    assert [r.scores.fused for r in a.results] == [pytest.approx(f, abs=1e-6) for f in expected]
    assert [r.score for r in a.results] == [r.scores.fused for r in a.results]
    assert a.results[3].scores.dense == pytest.approx(1 / np.sqrt(1.25), rel=1e-5)
    assert a.results[2].scores.dense is None and a.results[2].scores.keyword > 0


def test_hybrid_top_k_cuts_the_fused_order(legs):
    q = axis(0) + 0.5 * axis(1)
    a = ask(legs, Models(embed=embed_as(q)), query="vacation days paid", top_k=3)
    assert paths(a) == ["c.md", "d.md", "b.md"]


@pytest.fixture
def sixty(tmp_path):
    """Sixty chunks whose cosine with axis 0 falls with their number: the dense order is
    passage 00, 01, … 59."""
    index = new_index(tmp_path)
    for i in range(60):
        angle = i * np.pi / 2 / 60
        vector = (np.cos(angle) * axis(0) + np.sin(angle) * axis(1)).astype(np.float32)
        index.put_document(record(f"p{i:02d}.md"), [chunk(f"passage {i:02d}")], np.stack([vector]))
    return index


@pytest.mark.parametrize(("top_k", "sent"), [(1, 20), (10, 30), (20, 50)])
def test_the_reranker_reads_the_best_fused_candidates_in_order(sixty, top_k, sent):
    """3 × top_k candidates, at least 20, at most 50, best fused first; the results are then
    the reranker's top_k, taken from all it read (here it prefers the last it was sent)."""
    received: list[list[str]] = []

    async def prefers_the_last(query: str, passages: list[str]) -> list[float]:
        received.append(passages)
        return [float(i) for i in range(len(passages))]

    models = Models(embed=embed_as(axis(0)), rerank=prefers_the_last)
    a = ask(sixty, models, query="anything", mode="dense", top_k=top_k)
    assert received == [[f"passage {i:02d}" for i in range(sent)]]
    assert a.reranked and len(a.results) == top_k
    assert paths(a) == [f"p{i:02d}.md" for i in range(sent - 1, sent - 1 - top_k, -1)]
    assert [r.scores.rerank for r in a.results] == [float(sent - 1 - i) for i in range(top_k)]
    assert a.results[0].score == a.results[0].scores.rerank


@pytest.mark.parametrize(("length", "top_k"), [(4000, 1), (4000, 50), (1, 5)])
def test_a_search_at_each_bound_is_answered(index, length, top_k):
    a = ask(index, query="v" * length, top_k=top_k, mode="keyword")
    assert a.results == [] and a.warnings == []
    a = ask(index, Models(embed=embed_as(axis(0))), query="v" * length, top_k=top_k)
    assert len(a.results) == min(top_k, 5)


@pytest.mark.parametrize("filters", [None, {"sources": ["odd"]}])
def test_the_legs_run_side_by_side_with_the_answers_of_one_after_the_other(tmp_path, filters):
    """rank runs the keyword leg on another thread while the dense leg runs: the same rows,
    scores and ranks as each leg asked alone, and each leg's time."""
    rng = np.random.default_rng(5)
    words = ["vacation", "days", "gpu", "bus", "leave", "note", "manual", "paid", "sick"]
    index = new_index(tmp_path, dim=32, vectors="int8")
    for i in range(300):
        text = " ".join(rng.choice(words, 6))
        index.put_document(
            record(f"f{i}.md", source="odd" if i % 2 else "even"),
            [chunk(text)],
            rng.standard_normal((1, 32)).astype(np.float32),
        )
    req = parse_body(SearchRequest, json.dumps({"query": "paid sick days", "filters": filters}))
    for q in rng.standard_normal((5, 32)).astype(np.float32):
        q /= np.linalg.norm(q)
        ranked = rank(index, req, q)
        allowed = index.allowed(where(req.filters))
        k = leg_size(req.top_k)
        dense = index.dense(q, allowed, k)
        keyword = index.by_words(["paid", "sick", "days"], None if filters is None else allowed, k)
        assert len(dense) == k and len(keyword) == k
        assert ranked.dense == {r: (s, i) for i, (r, s) in enumerate(dense, start=1)}
        assert ranked.keyword == {r: (s, i) for i, (r, s) in enumerate(keyword, start=1)}
        assert ranked.took.dense > 0 and ranked.took.keyword > 0


def test_an_answer_names_the_words_that_tell_passages_apart(tmp_path):
    """Issue 28: snippet marks skip words too common to mean anything, by how many of the
    base's chunks hold them (at most a quarter, 3 at least), not by a stop-word list."""
    index = new_index(tmp_path)
    texts = [f"the note {i} of the handbook" for i in range(6)]
    texts += ["Xid 79: the GPU fell off the bus.", "Reseat the GPU after Xid 48."]
    for i, text in enumerate(texts):
        index.put_document(record(f"doc{i}.md"), [chunk(text)], np.stack([axis(i % DIM)]))
    a = ask(index, query="The GPU fell off, what now? handbook", mode="keyword")
    assert a.words == ["gpu", "fell", "off"]  # "the" in 8 of 8, "handbook" 6: too common
    assert ask(index, query="nothing known", mode="keyword").words == []
    assert (
        asyncio.run(
            search(new_index(tmp_path / "empty"), SearchRequest(query="gpu"), Models(), EMPTY)
        ).words
        == []
    )
