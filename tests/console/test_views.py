"""The console's decisions, without I/O: the search URL, merging bases by reciprocal rank,
Compare's rows and why-sentences, the score line, marked words, a base as shown."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metis_indexer.answer_text import score_line
from metis_indexer.console.views import (
    FormError,
    SearchForm,
    compare,
    marked,
    merge,
    parse_search,
    question_words,
    search_query,
    telling_words,
    why,
)
from metis_indexer.schema import FILTERS, ErrorBody, Result, Scores, SearchAnswer, Took
from metis_operator.console import pages
from metis_operator.console.views import backup_view, base_view, event_view, indexer_url, when


def result(doc: str, *, line: int = 1, **scores: Any) -> Result:
    return Result.model_validate(
        {
            "score": 0.5,
            "text": f"text of {doc}",
            "citation": {
                "source": "docs",
                "document": doc,
                "kind": "md",
                "line": line,
                "snippet": f"snippet of {doc}",
            },
            "scores": scores,
        }
    )


def answer(words: list[str] | None) -> SearchAnswer:
    return SearchAnswer(
        results=[], mode="hybrid", reranked=False, warnings=[], took=Took(), words=words
    )


def parsed(url_query: str, **kw: Any) -> SearchForm:
    return parse_search(parse_qs(url_query, keep_blank_values=True), **kw)


# --------------------------------------------------------------------------- the URL


def test_a_url_without_a_question_asks_nothing() -> None:
    form = parsed("base=team-a/handbook")
    assert form.q is None
    assert form.bases == ("team-a/handbook",)


def test_a_url_says_every_part_of_a_search() -> None:
    form = parsed(
        "q=Xid+79&base=a/x&base=b/y&mode=keyword&rerank=0&rerank=1&compare=1"
        "&top_k=7&prefix=runbooks/&kind=txt&kind=pdf&source=docs,+notes"
    )
    assert form == SearchForm(
        q="Xid 79",
        bases=("a/x", "b/y"),
        mode="keyword",
        rerank=True,
        compare=True,
        top_k=7,
        path_prefix="runbooks/",
        kinds=("txt", "pdf"),
        sources=("docs", "notes"),
    )
    req = form.request()
    assert req.mode == "keyword" and req.rerank is None and req.top_k == 7
    assert req.filters is not None and req.filters.kinds == ["txt", "pdf"]


def test_the_form_holds_each_search_filter_by_its_name_in_the_body() -> None:
    assert {f.field for f in FILTERS} <= set(SearchForm.model_fields)
    filters = parsed("q=x&base=a/x&prefix=p/&kind=md&source=s,t").request().filters
    assert filters is not None
    assert filters.model_dump(mode="json") == {
        "path_prefix": "p/",
        "kinds": ["md"],
        "sources": ["s", "t"],
    }


def test_a_cleared_rerank_box_sends_only_the_hidden_zero() -> None:
    form = parsed("q=x1&base=a/x&rerank=0")
    assert form.rerank is False
    assert form.request().rerank is False
    assert form.request("dense").mode == "dense"


@pytest.mark.parametrize(
    ("query", "code", "said"),
    [
        pytest.param("q=&base=a/x", "QUERY_EMPTY", "the question is empty", id="empty"),
        pytest.param("q=+++&base=a/x", "QUERY_EMPTY", "the question is empty", id="blank"),
        pytest.param(
            "q=" + "a" * 4001 + "&base=a/x",
            "QUERY_TOO_LONG",
            "the question has 4001 characters; at most 4000 are allowed",
            id="too-long",
        ),
        pytest.param(
            "q=x&base=a/x&top_k=0",
            "TOP_K_OUT_OF_RANGE",
            "top_k is 0; it must be between 1 and 50",
            id="top-k-0",
        ),
        pytest.param(
            "q=x&base=a/x&top_k=51",
            "TOP_K_OUT_OF_RANGE",
            "top_k is 51; it must be between 1 and 50",
            id="top-k-51",
        ),
        pytest.param("q=x&base=a/x&top_k=five", "INVALID_BODY", "top_k is 'five'", id="top-k-text"),
        pytest.param("q=x&base=a/x&mode=fuzzy", "INVALID_BODY", "mode is 'fuzzy'", id="mode"),
        pytest.param("q=x&base=a/x&kind=exe", "INVALID_BODY", "kind 'exe'", id="kind"),
        pytest.param("q=x", "INVALID_BODY", "no base is chosen", id="no-base"),
    ],
)
def test_a_search_the_indexer_would_refuse_is_refused_with_its_code(
    query: str, code: str, said: str
) -> None:
    with pytest.raises(FormError) as e:
        parsed(query)
    assert e.value.body.code == code
    assert said in e.value.body.message


def test_the_page_of_one_base_asks_that_base_whatever_the_url_says() -> None:
    assert parsed("q=x&base=other/y", base="local").bases == ("local",)


forms = st.builds(
    SearchForm,
    q=st.text(st.characters(blacklist_categories=["Cs", "Cc"]), min_size=1, max_size=40).filter(
        str.strip
    ),
    bases=st.lists(
        st.from_regex(r"[a-z]{1,5}/[a-z]{1,5}", fullmatch=True), min_size=1, max_size=3, unique=True
    ).map(tuple),
    mode=st.sampled_from(["hybrid", "dense", "keyword"]),
    rerank=st.booleans(),
    compare=st.booleans(),
    top_k=st.integers(1, 50),
    path_prefix=st.from_regex(r"[a-z/]{0,8}", fullmatch=True),
    kinds=st.lists(st.sampled_from(["md", "txt", "html", "pdf", "docx"]), unique=True).map(tuple),
    sources=st.lists(st.from_regex(r"[a-z]{1,6}", fullmatch=True), unique=True).map(tuple),
)


@given(forms)
def test_a_search_link_opens_the_same_search(form: SearchForm) -> None:
    assert parsed(search_query(form)) == form


# --------------------------------------------------------------------------- merging bases


def test_several_bases_merge_by_reciprocal_rank_each_hit_with_its_base() -> None:
    hits = merge({"a/x": [result("x1"), result("x2")], "b/y": [result("y1")]}, top_k=5)
    assert [(h.base, h.result.citation.document, h.rank) for h in hits] == [
        ("a/x", "x1", 1),
        ("b/y", "y1", 1),
        ("a/x", "x2", 2),
    ]
    assert hits[0].merged == pytest.approx(1 / 61)
    assert hits[2].merged == pytest.approx(1 / 62)


def test_merging_keeps_top_k() -> None:
    hits = merge(
        {"a/x": [result(f"x{i}") for i in range(5)], "b/y": [result(f"y{i}") for i in range(5)]},
        top_k=3,
    )
    assert [h.result.citation.document for h in hits] == ["x0", "y0", "x1"]


def test_one_base_keeps_its_own_order() -> None:
    docs = [f"d{i}" for i in range(6)]
    hits = merge({"a/x": [result(d) for d in docs]}, top_k=10)
    assert [h.result.citation.document for h in hits] == docs


# --------------------------------------------------------------------------- why and scores


def test_why_both_retrievers_found_it() -> None:
    assert why(2, 1, None) == "close in meaning (#2) and shares words (#1) — both agree"


def test_why_only_by_words() -> None:
    assert why(None, 1, None) == (
        "shares words (#1); not among the closest in meaning — "
        "it names a term of the question exactly"
    )


def test_why_only_by_meaning() -> None:
    assert why(1, None, None) == (
        "close in meaning (#1); its words do not match — it says the same thing in other words"
    )


def test_why_is_followed_by_the_rerankers_score() -> None:
    assert why(3, 4, 0.97) == (
        "close in meaning (#3) and shares words (#4) — both agree; the reranker scored it 0.970"
    )


def test_the_score_line_is_the_specs() -> None:
    scores = Scores(
        dense=0.83, dense_rank=1, keyword=7.41, keyword_rank=2, fused=0.0328, rerank=0.97
    )
    assert score_line(scores) == (
        "meaning 0.830 (#1) · words 7.41 (#2) · fused 0.0328 · reranker 0.970"
    )


def test_the_score_line_leaves_out_a_step_that_did_not_score() -> None:
    assert score_line(Scores(keyword=4.78, keyword_rank=1, fused=0.0164)) == (
        "words 4.78 (#1) · fused 0.0164"
    )


def test_compare_says_why_by_the_ranks_its_columns_show() -> None:
    """Issue 28: the sentence names the Meaning and Words columns' ranks, not the hybrid
    search's legs' (here p is the keyword leg's #7 but the by-words list's #1)."""
    both = merge(
        {"a/x": [result("p", dense_rank=2, keyword_rank=7, rerank=0.9), result("q", dense_rank=1)]},
        5,
    )
    meaning = merge(
        {"a/x": [result("q", dense_rank=1), result("p", dense_rank=2), result("r", dense_rank=3)]},
        5,
    )
    words = merge({"a/x": [result("p", keyword_rank=1), result("s", keyword_rank=2)]}, 5)
    rows = compare({"hybrid": both, "dense": meaning, "keyword": words})
    got = {r.hit.result.citation.document: (dict(r.ranks), r.why) for r in rows}
    assert [r.hit.result.citation.document for r in rows] == ["p", "q", "s", "r"]
    assert got["p"] == (
        {"hybrid": 1, "dense": 2, "keyword": 1},
        "close in meaning (#2) and shares words (#1) — both agree; the reranker scored it 0.900",
    )
    assert got["q"][1].startswith("close in meaning (#1); its words do not match")
    assert got["r"][0] == {"hybrid": None, "dense": 3, "keyword": None}
    assert got["r"][1].startswith("close in meaning (#3); its words do not match")
    assert got["s"][1].startswith("shares words (#2); not among the closest in meaning")


def test_compare_tells_apart_two_chunks_of_one_page() -> None:
    a, b = result("doc.pdf", line=0), result("doc.pdf", line=0)
    b = b.model_copy(update={"text": "another chunk of the page"})
    rows = compare({"hybrid": merge({"a/x": [a, b]}, 5)})
    assert len(rows) == 2


# --------------------------------------------------------------------------- marked words


def test_the_questions_words_are_marked_folded_and_whole() -> None:
    words = question_words("configuracao XID a 79 gpus")
    runs = marked("Configuração of Xid 79: a GPU error (xid).", words)
    assert [t for t, hit in runs if hit] == ["Configuração", "Xid", "79", "xid"]
    assert "".join(t for t, _ in runs) == "Configuração of Xid 79: a GPU error (xid)."


@given(st.text(max_size=60), st.text(max_size=20))
def test_marking_keeps_the_snippet_as_it_is(snippet: str, question: str) -> None:
    assert "".join(t for t, _ in marked(snippet, question_words(question))) == snippet


def test_each_base_marks_the_words_its_index_calls_telling() -> None:
    """Issue 28: "the" is in most passages of a base, so its answer leaves it out of
    `words`; an older indexer (no `words`) has every word of the question marked."""
    told = telling_words(
        "The backup of the VPN",
        [
            ("a/x", answer(words=["backup", "vpn"])),
            ("a/y", answer(words=None)),
            ("a/z", ErrorBody(code="INDEX_NOT_READY", message="loading")),
        ],
    )
    assert told == {"a/x": {"backup", "vpn"}, "a/y": {"the", "backup", "of", "vpn"}}
    runs = marked("Run the backup before the VPN is off.", told["a/x"])
    assert [t for t, hit in runs if hit] == ["backup", "VPN"]


# --------------------------------------------------------------------------- a base as shown


def kb(status: dict[str, Any] | None) -> dict[str, Any]:
    return {"metadata": {"namespace": "team-a", "name": "handbook"}, "status": status}


def test_a_base_indexing_shows_its_progress() -> None:
    view = base_view(
        kb(
            {
                "state": "Indexing",
                "reason": "indexing 3 of 8 documents",
                "observed": {
                    "index": {
                        "phase": "indexing",
                        "documents": 3,
                        "chunks": 9,
                        "failed": 1,
                        "pass_total": 8,
                        "pass_done": 3,
                    },
                    "address": "http://metis-handbook.team-a.svc:7700",
                    "warnings": ["reranker scales to zero"],
                },
                "evaluation": {"k": 10, "cases": 12, "recall_at_k": 0.9, "mrr": 0.75, "at": "t"},
                "conditions": [{"type": "Ready", "status": "False", "reason": "Indexing"}],
            }
        )
    )
    assert (view.key, view.state, view.progress) == ("team-a/handbook", "Indexing", (3, 8))
    assert view.evaluation is not None and view.evaluation.mrr == 0.75
    assert view.warnings == ["reranker scales to zero"]
    assert view.conditions[0].type == "Ready"


def test_a_ready_base_shows_no_progress_bar() -> None:
    view = base_view(
        kb(
            {
                "state": "Ready",
                "observed": {"index": {"phase": "ready", "pass_total": 8, "pass_done": 8}},
            }
        )
    )
    assert view.progress is None


def test_a_base_the_operator_has_not_seen_yet() -> None:
    view = base_view(kb(None))
    assert view.state == "Unknown"
    assert view.reason == "not looked at by the operator yet"
    assert not view.address


def test_a_status_this_version_cannot_read_in_part_shows_the_rest() -> None:
    """A state a newer operator wrote, and a hand-edited total: the base is shown, its
    state Unknown, with everything else it has."""
    view = base_view(
        kb(
            {
                "state": "Hibernating",
                "reason": "asleep until the first question",
                "observed": {"index": {"documents": 8, "chunks": 31}},
                "progress": ["not", "a", "string"],
            }
        )
    )
    assert (view.state, view.reason) == ("Unknown", "asleep until the first question")
    assert (view.index.documents, view.index.chunks) == (8, 31)


def test_an_event_is_shown_when_it_was_last_seen() -> None:
    e = event_view(
        {
            "metadata": {"creationTimestamp": "t0"},
            "type": "Warning",
            "reason": "Failed",
            "message": "no drive docs",
            "count": 3,
            "lastTimestamp": "t9",
        }
    )
    assert (e.type, e.reason, e.message, e.count, e.last) == (
        "Warning",
        "Failed",
        "no drive docs",
        3,
        "t9",
    )


def test_a_base_is_reached_at_its_address_or_through_the_template() -> None:
    address = "http://metis-handbook.team-a.svc:7700"
    assert indexer_url(address, None) == address
    assert indexer_url(address, "http://127.0.0.1:{port}") == "http://127.0.0.1:7700"
    assert indexer_url(address, "http://{name}.{namespace}:{port}/") == (
        "http://metis-handbook.team-a:7700"
    )


def test_a_timestamp_is_shown_to_the_minute_in_utc() -> None:
    assert when("2026-11-30T21:04:12Z") == "2026-11-30 21:04 UTC"
    assert when("2026-11-30T21:04:12.123456Z") == "2026-11-30 21:04 UTC"
    assert when(None) == "—"
    assert when("yesterday") == "yesterday"


def test_a_base_shows_each_source_with_its_revision_and_the_one_indexed() -> None:
    obj = {
        **kb({"state": "Indexing", "observed": {"revisions": {"wiki": "main@sha1:b2"}}}),
        "spec": {
            "sources": [
                {"flux": {"kind": "GitRepository", "name": "wiki"}, "path": "a"},
                {"drive": "docs"},
            ],
            "embedding": {"deployment": "m"},
        },
    }
    view = base_view(obj)
    assert view.sources == ["wiki (GitRepository at main@sha1:b2; indexed none yet)", "docs"]
    html = pages.base_fragment(view, [])
    assert "wiki (GitRepository at main@sha1:b2; indexed none yet), docs" in html
    assert base_view({**obj, "spec": {"sources": "refused"}}).sources == []


def test_a_bases_page_lists_its_backups_and_says_when_it_has_none() -> None:
    view = base_view(kb({"state": "Ready"}))
    assert "No backups." in pages.base_fragment(view, [])
    done = backup_view(
        {
            "metadata": {"name": "handbook-1", "creationTimestamp": "2026-12-07T20:00:00Z"},
            "spec": {"knowledge_base": "handbook", "method": "object_store"},
            "status": {
                "phase": "Completed",
                "finishedAt": "2026-12-07T20:01:02Z",
                "chunks": 12345,
                "notes": 3,
                "size": "4.1 MiB",
            },
        }
    )
    failed = backup_view(
        {
            "metadata": {"name": "handbook-2"},
            "spec": {"knowledge_base": "handbook"},
            "status": {"phase": "Failed", "message": "<b>store</b> down"},
        }
    )
    html = pages.base_fragment(view.model_copy(update={"backups": [failed, done]}), [])
    assert "No backups." not in html
    assert "2026-12-07 20:01 UTC" in html and "12,345" in html and "4.1 MiB" in html
    assert "&lt;b&gt;store&lt;/b&gt; down" in html and "<b>store" not in html
    assert html.index("handbook-2") < html.index("handbook-1")
    assert backup_view({"metadata": {"name": "x"}, "spec": "refused"}).base == ""
