"""The pages as HTML, without I/O: every text escaped, whatever a document or a base holds."""

from __future__ import annotations

from metis_indexer.console import pages
from metis_indexer.console.html import el
from metis_indexer.console.views import SearchForm, merge
from metis_indexer.schema import ErrorBody, Result, SearchAnswer
from metis_operator.console.pages import bases_fragment
from metis_operator.console.views import base_view

EVIL = '<script>alert("x")</script>'


def test_text_and_attributes_are_escaped() -> None:
    html = el("a", EVIL, href='x" onclick="y')
    assert html == (
        '<a href="x&quot; onclick=&quot;y">&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;</a>'
    )


def test_a_result_holding_a_script_is_shown_as_text() -> None:
    result = Result.model_validate(
        {
            "score": 1.0,
            "text": EVIL,
            "citation": {
                "source": "docs",
                "document": f"{EVIL}.md",
                "kind": "md",
                "line": 1,
                "title": EVIL,
                "headings": [EVIL],
                "snippet": EVIL,
            },
            "scores": {"keyword": 1.0, "keyword_rank": 1, "fused": 0.016},
        }
    )
    answer = SearchAnswer(
        results=[result], mode="keyword", reranked=False, warnings=[EVIL], took={"total": 1.0}
    )
    form = SearchForm(q=EVIL, bases=("a/x",))
    html = pages.search_page(
        form, [], pages.results_section(form, merge({"a/x": [result]}, 5), {"a/x": answer})
    )
    assert "<script>alert" not in html
    assert "&lt;script&gt;" in html
    assert html.count("<script") == 1  # the console's own, from /static


def test_a_base_with_a_hostile_reason_is_shown_as_text() -> None:
    view = base_view(
        {
            "metadata": {"namespace": "n", "name": "b"},
            "status": {"state": "Failed", "reason": EVIL, "observed": {"warnings": [EVIL]}},
        }
    )
    html = bases_fragment([view], EVIL)
    assert "<script>" not in html
    assert 'data-base="n/b"' in html and "state-failed" in html


def test_an_error_shows_its_code_and_message() -> None:
    html = pages.error_box(ErrorBody(code="QUERY_EMPTY", message="the question is empty"), None)
    assert "QUERY_EMPTY" in html and "the question is empty" in html and 'role="alert"' in html


def test_the_form_keeps_the_search_it_shows() -> None:
    form = SearchForm(
        q="Xid 79",
        bases=("a/x",),
        mode="keyword",
        rerank=False,
        compare=True,
        kinds=("txt",),
        path_prefix="runbooks/",
    )
    html = pages.search_form(
        form, [base_view({"metadata": {"namespace": "a", "name": "x"}})], "/search"
    )
    assert 'value="Xid 79"' in html
    assert '<input type="checkbox" name="base" value="a/x" checked>' in html
    assert '<input type="radio" name="mode" value="keyword" checked>' in html
    assert '<input type="checkbox" name="rerank" value="1">' in html
    assert '<input type="checkbox" name="compare" value="1" checked>' in html
    assert '<input type="checkbox" name="kind" value="txt" checked>' in html


def test_a_note_says_when_it_was_written_and_what_replaced_it() -> None:
    def result(note_id: str, **note: str) -> Result:
        return Result.model_validate(
            {
                "score": 1.0,
                "text": f"fact {note_id}",
                "citation": {
                    "source": "metis-team",
                    "document": f"{note_id}.md",
                    "kind": "md",
                    "line": 1,
                    "snippet": f"fact {note_id}",
                    "note": {"id": note_id, "written_at": "2026-09-01T10:00:00Z", **note},
                },
                "scores": {"keyword": 1.0, "keyword_rank": 1, "fused": 0.016},
            }
        )

    results = [
        result("new"),
        result("old", replaced_by="new", replaced_at="2026-11-02T09:00:00Z"),
    ]
    answer = SearchAnswer(results=results, mode="keyword", reranked=False, warnings=[], took={})
    form = SearchForm(q="fact", bases=("a/x",))
    html = pages.results_section(form, merge({"a/x": results}, 5), {"a/x": answer})
    assert '<div class="note">note written 2026-09-01T10:00:00Z</div>' in html
    assert (
        '<div class="note replaced">note written 2026-09-01T10:00:00Z; replaced by new on '
        "2026-11-02T09:00:00Z</div>"
    ) in html
