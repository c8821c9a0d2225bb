"""Evaluation (`metis_indexer.search.evaluation`): recall@k counts each document once, MRR
looks at the first ten documents, a set holds at most 500 questions and an evaluation stops
at 60 s."""

import asyncio

import pytest

from metis_indexer.config import SourceConfig
from metis_indexer.errors import BadRequest
from metis_indexer.schema import Citation, Result, Scores, SearchAnswer, Took
from metis_indexer.search.evaluation import (
    MAX_CASES,
    MRR_DEPTH,
    TIME_LIMIT,
    Case,
    Way,
    evaluate,
    parse_cases,
    ranked_documents,
    read_cases,
    recall,
    reciprocal_rank,
    ways,
)
from metis_indexer.service.answers import evaluation_places


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
    cases = parse_cases(
        [
            (
                "d/.metis/evals.jsonl",
                '# comment\n{"question": "q", "expected": '
                '["d/a.md"]}\n{"question": "r", "expected": ["d/b.md"], "id": "r1"}',
            )
        ]
    )
    assert [c.id for c in cases] == ["d/.metis/evals.jsonl:2", "r1"]


def test_every_way_is_scored_and_the_last_is_the_headline():
    cases = parse_cases(
        [
            (
                "e",
                '{"question": "q1", "expected": ["d/a.md"]}\n'
                '{"question": "q2", "expected": ["d/b.md", "d/c.md"]}',
            )
        ]
    )
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
        ("e:1", "keyword"),
        ("e:2", "keyword"),
        ("e:2", "hybrid"),
    }


def test_ways_follow_the_models_a_base_has():
    """Plain searches rerank when a base has a reranker: that way is last, the headline."""
    assert ways(True, True) == [
        Way("keyword", "keyword", False),
        Way("dense", "dense", False),
        Way("hybrid", "hybrid", False),
        Way("hybrid+rerank", "hybrid", True),
    ]
    assert ways(True, False) == [
        Way("keyword", "keyword", False),
        Way("dense", "dense", False),
        Way("hybrid", "hybrid", False),
    ]
    assert ways(False, True) == [
        Way("keyword", "keyword", False),
        Way("hybrid+rerank", "hybrid", True),
    ]
    assert ways(False, False) == [Way("keyword", "keyword", False)]


def test_a_first_hit_at_rank_ten_counts_and_at_rank_eleven_does_not():
    """Ranks count from 1: the tenth document is `ranked[9]`."""
    ranked = [f"d/{i}.md" for i in range(1, 13)]
    assert MRR_DEPTH == 10
    assert reciprocal_rank(["d/10.md"], ranked) == pytest.approx(0.1)
    assert reciprocal_rank(["d/11.md"], ranked) == 0.0
    assert reciprocal_rank(["d/1.md"], ranked) == 1.0
    assert reciprocal_rank(["d/11.md"], ranked, depth=11) == pytest.approx(1 / 11)


def test_recall_divides_by_distinct_expected_documents():
    """A document listed twice in `expected` is still one document to find."""
    ranked = ["d/a.md", "d/x.md"]
    assert recall(["d/a.md", "d/a.md", "d/b.md"], ranked, k=2) == 0.5
    assert recall(["d/a.md", "d/a.md"], ranked, k=2) == 1.0
    assert recall(["d/x.md", "d/a.md"], ranked, k=1) == 0.5
    assert recall(["d/x.md", "d/a.md"], ranked, k=2) == 1.0


def test_an_evaluation_counts_a_duplicate_expected_document_once():
    cases = [Case(question="q", expected=["d/a.md", "d/a.md", "d/b.md"], id="dup")]

    async def ask(question: str, way: Way) -> SearchAnswer:
        return answer("d/a.md", "d/c.md")

    result = asyncio.run(evaluate(cases, 2, ask, [Way("hybrid", "hybrid", False)], lambda: "T"))
    assert (result.recall_at_k, result.mrr) == (0.5, 1.0)
    assert [(m.case, m.missing, m.found) for m in result.misses] == [
        ("dup", ["d/b.md"], ["d/a.md", "d/c.md"])
    ]


class Clock:
    """Seconds that pass only when a question is asked, so the limit is met without waiting."""

    def __init__(self, per_question: float) -> None:
        self.now = 1000.0
        self.per_question = per_question
        self.asked: list[str] = []

    def __call__(self) -> float:
        return self.now

    async def ask(self, question: str, way: Way) -> SearchAnswer:
        self.asked.append(question)
        self.now += self.per_question
        return answer("d/a.md")


def four_cases() -> list[Case]:
    return [Case(question=f"q{i}", expected=["d/a.md"], id=f"c{i}") for i in range(1, 5)]


def test_an_evaluation_stops_at_its_time_limit_and_says_how_far_it_got():
    """Questions start while the limit has not passed: at 0, 25 and 50 s of 60, not at 75."""
    clock = Clock(per_question=25)
    modes = [Way("hybrid", "hybrid", False)]
    result = asyncio.run(
        evaluate(four_cases(), 1, clock.ask, modes, lambda: "T", time_limit=60, clock=clock)
    )
    assert clock.asked == ["q1", "q2", "q3"]
    assert result.cases == 3 and result.recall_at_k == 1.0 and result.mrr == 1.0
    assert result.warnings == ["stopped after 60 s: 3 of 4 questions asked"]


def test_a_question_may_start_at_the_limit_itself():
    clock = Clock(per_question=30)
    modes = [Way("hybrid", "hybrid", False)]
    result = asyncio.run(
        evaluate(four_cases(), 1, clock.ask, modes, lambda: "T", time_limit=60, clock=clock)
    )
    assert clock.asked == ["q1", "q2", "q3"] and result.cases == 3


def test_the_default_limit_is_sixty_seconds():
    assert TIME_LIMIT == 60.0
    clock = Clock(per_question=59)
    modes = [Way("hybrid", "hybrid", False)]
    result = asyncio.run(evaluate(four_cases(), 1, clock.ask, modes, lambda: "T", clock=clock))
    assert clock.asked == ["q1", "q2"]
    assert result.warnings == ["stopped after 60 s: 2 of 4 questions asked"]


def test_an_evaluation_within_its_limit_has_no_warning():
    clock = Clock(per_question=1)
    modes = [Way("hybrid", "hybrid", False)]
    result = asyncio.run(evaluate(four_cases(), 1, clock.ask, modes, lambda: "T", clock=clock))
    assert result.cases == 4 and result.warnings == []


def test_a_set_of_exactly_500_questions_is_taken_and_501_refused():
    line = '{"question": "q", "expected": ["d/a.md"]}\n'
    assert MAX_CASES == 500
    assert len(parse_cases([("e", line * 500)])) == 500
    with pytest.raises(BadRequest) as e:
        parse_cases([("e", line * 250), ("f", line * 251)])
    assert e.value.code == "EVAL_TOO_LARGE"
    assert e.value.message == "501 questions; an evaluation takes at most 500"


@pytest.mark.parametrize("k", [1, 50])
def test_k_is_taken_at_its_bounds(k):
    async def ask(question: str, way: Way) -> SearchAnswer:
        return answer(*(f"d/{i}.md" for i in range(60)))

    cases = [Case(question="q", expected=["d/49.md"], id="c")]
    result = asyncio.run(evaluate(cases, k, ask, [Way("keyword", "keyword", False)], lambda: "T"))
    assert result.k == k and result.recall_at_k == (1.0 if k == 50 else 0.0)


@pytest.mark.parametrize("k", [0, 51])
def test_k_out_of_range_is_refused_before_any_question(k):
    async def ask(question: str, way: Way) -> SearchAnswer:
        raise AssertionError("no question is asked")

    cases = [Case(question="q", expected=["d/a.md"], id="c")]
    with pytest.raises(BadRequest) as e:
        asyncio.run(evaluate(cases, k, ask, [Way("keyword", "keyword", False)], lambda: "T"))
    assert e.value.code == "TOP_K_OUT_OF_RANGE"
    assert e.value.message == f"k is {k}; it must be between 1 and 50"


def test_the_headline_is_the_last_way_of_three_and_one_case_divides_by_one():
    cases = [Case(question="q", expected=["d/a.md"], id="c")]
    found = {
        "keyword": answer("d/x.md"),
        "dense": answer("d/x.md", "d/a.md"),
        "hybrid": answer("d/a.md"),
    }

    async def ask(question: str, way: Way) -> SearchAnswer:
        return found[way.name]

    modes = ways(True, False)
    result = asyncio.run(evaluate(cases, 1, ask, modes, lambda: "T"))
    assert (result.recall_at_k, result.mrr) == (1.0, 1.0)
    assert result.modes["dense"].model_dump() == {"recall_at_k": 0.0, "mrr": 0.5}
    assert result.modes["keyword"].model_dump() == {"recall_at_k": 0.0, "mrr": 0.0}


def test_blank_and_comment_lines_are_skipped_even_when_indented():
    text = '  # a note\n\n   \n{"question": "q", "expected": ["d/a.md"]}\n\t# another'
    cases = parse_cases([("e", text)])
    assert [(c.question, c.id) for c in cases] == [("q", "e:4")]


def test_a_case_without_a_question_is_named_by_its_field():
    with pytest.raises(BadRequest) as e:
        parse_cases([("e", '{"expected": ["d/a.md"]}')])
    assert e.value.message == (
        'e line 1: question: Field required (each case needs "question" and at least one '
        '"expected" document)'
    )
    with pytest.raises(BadRequest) as e:
        parse_cases([("e", '{"question": "q", "expected": [1]}')])
    assert e.value.message.startswith("e line 1: expected.0: Input should be a valid string")
    with pytest.raises(BadRequest) as e:
        parse_cases([("e", "[]")])
    assert e.value.code == "EVAL_CASE_INVALID" and e.value.message.startswith("e line 1: case: ")


def test_an_empty_set_names_every_file_it_read():
    with pytest.raises(BadRequest) as e:
        parse_cases([("a/.metis/evals.jsonl", "# none"), ("b/.metis/evals.jsonl", "")])
    assert e.value.message == "no questions in a/.metis/evals.jsonl, b/.metis/evals.jsonl"
    with pytest.raises(BadRequest) as e:
        parse_cases([])
    assert e.value.message == "no questions in the sources"


def test_cases_are_read_from_each_drive_s_metis_folder(tmp_path):
    """A drive without the file is passed over; a byte-order mark is no part of the JSON."""
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for root in (a, b, c):
        root.mkdir()
    (a / ".metis").mkdir()
    (a / ".metis" / "evals.jsonl").write_text(
        '{"question": "q1", "expected": ["a/x.md"]}', encoding="utf-8-sig"
    )
    (c / ".metis").mkdir()
    (c / ".metis" / "evals.jsonl").write_text('{"question": "q2", "expected": ["c/y.md"]}')
    cases = read_cases([("a", a), ("b", b), ("c", c)])
    assert [(c.question, c.id) for c in cases] == [
        ("q1", "a/.metis/evals.jsonl:1"),
        ("q2", "c/.metis/evals.jsonl:1"),
    ]


def test_no_evaluation_file_anywhere_is_an_empty_set_that_names_where_it_looked(tmp_path):
    with pytest.raises(BadRequest) as e:
        read_cases([("docs", tmp_path), ("docs/handbook", tmp_path / "handbook")])
    assert (e.value.code, e.value.message) == (
        "EVAL_EMPTY",
        "no evaluation set: looked in docs/.metis/evals.jsonl, docs/handbook/.metis/evals.jsonl",
    )


def test_the_set_beside_a_source_s_folder_is_read_as_well_as_the_drive_s(tmp_path):
    """The README's example keeps its questions in handbook/.metis/ of drive docs, which a
    source `{drive: docs, path: handbook}` reads; a drive read whole is looked in once."""
    docs, runbooks = tmp_path / "docs", tmp_path / "runbooks"
    (docs / "handbook" / ".metis").mkdir(parents=True)
    (docs / "handbook" / ".metis" / "evals.jsonl").write_text(
        '{"question": "q", "expected": ["docs/handbook/leave.md"]}'
    )
    runbooks.mkdir()
    sources = [
        SourceConfig(drive="docs", root=docs, path="handbook"),
        SourceConfig(drive="runbooks", root=runbooks),
        SourceConfig(drive="runbooks", root=runbooks, path="oncall"),
    ]
    places = evaluation_places(sources)
    assert places == [
        ("docs", docs),
        ("docs/handbook", docs / "handbook"),
        ("runbooks", runbooks),
        ("runbooks/oncall", runbooks / "oncall"),
    ]
    assert [c.id for c in read_cases(places)] == ["docs/handbook/.metis/evals.jsonl:1"]


def test_an_unreadable_evaluation_file_is_eval_file(tmp_path):
    (tmp_path / ".metis").mkdir()
    (tmp_path / ".metis" / "evals.jsonl").write_bytes(b"\xff\xfe\xfa not utf-8")
    with pytest.raises(BadRequest) as e:
        read_cases([("docs", tmp_path)])
    assert e.value.code == "EVAL_FILE"
    assert e.value.message.startswith("docs/.metis/evals.jsonl could not be read: ")


def test_figures_are_rounded_to_four_places():
    cases = [Case(question=f"q{i}", expected=["d/a.md"], id=f"c{i}") for i in range(3)]
    found = {"q0": answer("d/a.md"), "q1": answer("d/x.md"), "q2": answer("d/x.md")}

    async def ask(question: str, way: Way) -> SearchAnswer:
        return found[question]

    result = asyncio.run(evaluate(cases, 1, ask, [Way("hybrid", "hybrid", False)], lambda: "T"))
    assert (result.recall_at_k, result.mrr) == (0.3333, 0.3333)


def test_out_of_time_before_the_first_question_reports_zeros():
    """A clock that jumps past the limit between start and first question: nothing asked."""
    ticks = iter([0.0, 61.0])

    async def ask(question: str, way: Way) -> SearchAnswer:
        raise AssertionError("no question is asked")

    result = asyncio.run(
        evaluate(
            four_cases(),
            1,
            ask,
            [Way("hybrid", "hybrid", False)],
            lambda: "T",
            clock=lambda: next(ticks),
        )
    )
    assert (result.cases, result.recall_at_k, result.mrr) == (0, 0.0, 0.0)
    assert result.warnings == ["stopped after 60 s: 0 of 4 questions asked"]
