import asyncio

import pytest

from metis_indexer.errors import BadRequest
from metis_indexer.evaluation import (
    Way,
    evaluate,
    parse_cases,
    ranked_documents,
    recall,
    reciprocal_rank,
    ways,
)
from metis_indexer.schema import Citation, Result, Scores, SearchAnswer, Took


def answer(*docs: str) -> SearchAnswer:
    results = []
    for d in docs:
        source, _, path = d.partition("/")
        citation = Citation(source=source, document=path, kind="md", snippet="")
        results.append(Result(score=1.0, text="", citation=citation, scores=Scores()))
    return SearchAnswer(results=results, mode="hybrid", reranked=False, warnings=[], took=Took())


def test_a_document_counts_once_however_many_chunks_came_back():
    a = answer("d/a.md", "d/a.md", "d/b.md", "d/a.md", "d/c.md")
    assert ranked_documents(a) == ["d/a.md", "d/b.md", "d/c.md"]
    assert recall(["d/c.md", "d/x.md"], ranked_documents(a), k=3) == 0.5
    assert recall(["d/c.md"], ranked_documents(a), k=2) == 0.0


def test_mrr_looks_at_the_first_ten_documents():
    ranked = [f"d/{i}.md" for i in range(12)]
    assert reciprocal_rank(["d/3.md", "d/9.md"], ranked) == pytest.approx(1 / 4)
    assert reciprocal_rank(["d/10.md"], ranked) == 0.0


@pytest.mark.parametrize(
    ("text", "code", "words"),
    [
        ("", "EVAL_EMPTY", "no questions"),
        ('{"question": "q"', "EVAL_FILE", "line 1 is not JSON"),
        ('{"question": "q", "expected": []}', "EVAL_CASE_INVALID", "line 1: expected"),
        ('\n{"question": "q"}', "EVAL_CASE_INVALID", "line 2: expected"),
        ('{"question": "q", "expected": ["d/a"]}\n' * 501, "EVAL_TOO_LARGE", "501 questions"),
    ],
)
def test_bad_sets_get_the_spec_codes(text, code, words):
    with pytest.raises(BadRequest) as e:
        parse_cases([("docs/.metis/evals.jsonl", text)])
    assert e.value.code == code and words in e.value.message


def test_cases_are_named_by_file_and_line_unless_they_have_an_id():
    cases = parse_cases([("d/.metis/evals.jsonl", '# comment\n{"question": "q", "expected": '
                          '["d/a.md"]}\n{"question": "r", "expected": ["d/b.md"], "id": "r1"}')])
    assert [c.id for c in cases] == ["d/.metis/evals.jsonl:2", "r1"]


def test_every_way_is_scored_and_the_last_is_the_headline():
    cases = parse_cases([("e", '{"question": "q1", "expected": ["d/a.md"]}\n'
                               '{"question": "q2", "expected": ["d/b.md", "d/c.md"]}')])
    found = {
        ("q1", "keyword"): answer("d/x.md", "d/a.md"),
        ("q2", "keyword"): answer("d/b.md"),
        ("q1", "hybrid"): answer("d/a.md"),
        ("q2", "hybrid"): answer("d/c.md", "d/b.md"),
    }

    async def ask(question: str, way: Way) -> SearchAnswer:
        return found[(question, way.name)]

    modes = [Way("keyword", "keyword", False), Way("hybrid", "hybrid", False)]
    result = asyncio.run(evaluate(cases, 1, ask, modes, now=lambda: "T"))
    assert result.cases == 2 and result.k == 1 and result.at == "T"
    assert result.modes["keyword"].recall_at_k == 0.25  # (0 + 1/2) / 2
    assert result.modes["keyword"].mrr == 0.75  # (1/2 + 1) / 2
    assert (result.recall_at_k, result.mrr) == (0.75, 1.0)  # hybrid: (1 + 1/2) / 2
    assert {(m.case, m.mode) for m in result.misses} == {
        ("e:1", "keyword"), ("e:2", "keyword"), ("e:2", "hybrid"),
    }


def test_ways_follow_the_models_a_base_has():
    assert [w.name for w in ways(True, True)] == ["keyword", "dense", "hybrid", "hybrid+rerank"]
    assert [w.name for w in ways(False, False)] == ["keyword"]
