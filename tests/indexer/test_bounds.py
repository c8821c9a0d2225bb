"""Every limit of a base's API in the pure layer: taken at its edge, refused one past it, each
with its own error code (what the HTTP layer answers is tested in tests/indexer/http)."""

import pytest

from metis_indexer.errors import BadRequest
from metis_indexer.schema import (
    PAGE_SIZE_MAX,
    QUERY_MAX,
    TOP_K_MAX,
    DocumentsQuery,
    SearchRequest,
    check_k,
    check_search,
    parse_query,
)


def refused(request: SearchRequest) -> BadRequest:
    with pytest.raises(BadRequest) as e:
        check_search(request)
    return e.value


def test_the_limits_are_the_spec_s():
    assert (QUERY_MAX, TOP_K_MAX, PAGE_SIZE_MAX) == (4000, 50, 1000)


@pytest.mark.parametrize("query", ["x", "x" * 4000, " x ", "é" * 4000])
def test_a_question_of_one_to_4000_characters_is_taken(query):
    assert check_search(SearchRequest(query=query)).query == query


def test_a_question_of_4001_characters_is_refused():
    e = refused(SearchRequest(query="x" * 4001))
    assert e.code == "QUERY_TOO_LONG"
    assert e.message == "the question has 4001 characters; at most 4000 are allowed"


@pytest.mark.parametrize("query", ["", " ", "\n\t "])
def test_an_empty_or_blank_question_is_refused(query):
    e = refused(SearchRequest(query=query))
    assert (e.code, e.message) == ("QUERY_EMPTY", "the question is empty")


@pytest.mark.parametrize("top_k", [1, 5, 50])
def test_top_k_from_1_to_50_is_taken(top_k):
    assert check_search(SearchRequest(query="q", top_k=top_k)).top_k == top_k


@pytest.mark.parametrize("top_k", [0, 51, -1])
def test_top_k_past_either_bound_is_refused(top_k):
    e = refused(SearchRequest(query="q", top_k=top_k))
    assert e.code == "TOP_K_OUT_OF_RANGE"
    assert e.message == f"top_k is {top_k}; it must be between 1 and 50"


def test_the_question_is_checked_before_top_k():
    assert refused(SearchRequest(query="", top_k=0)).code == "QUERY_EMPTY"


@pytest.mark.parametrize("k", [1, 50])
def test_k_at_its_bounds_is_taken(k):
    check_k("k", k)


@pytest.mark.parametrize("k", [0, 51])
def test_k_past_its_bounds_is_refused(k):
    with pytest.raises(BadRequest) as e:
        check_k("k", k)
    assert e.value.code == "TOP_K_OUT_OF_RANGE" and e.value.message.startswith(f"k is {k};")


@pytest.mark.parametrize("size", ["1", "100", "1000"])
def test_a_page_of_1_to_1000_documents_is_taken(size):
    assert parse_query(DocumentsQuery, {"page_size": size}).page_size == int(size)


def test_the_page_size_defaults_to_100_and_the_page_to_1():
    q = parse_query(DocumentsQuery, {})
    assert (q.page, q.page_size) == (1, 100)


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"page_size": "0"}, "page_size"),
        ({"page_size": "1001"}, "page_size"),
        ({"page": "0"}, "page"),
    ],
)
def test_a_page_past_its_bounds_is_refused(query, field):
    with pytest.raises(BadRequest) as e:
        parse_query(DocumentsQuery, query)
    assert e.value.code == "INVALID_BODY" and e.value.message.startswith(f"{field}: ")
