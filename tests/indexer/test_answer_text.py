"""An answer as the terminal shows it: where each result is, its headings below the title
(the title once), its snippet and the steps that scored it; then mode and time."""

from metis_indexer.answer_text import answer_text
from metis_indexer.schema import SearchAnswer


def test_an_answer_reads_as_the_terminal_shows_it() -> None:
    answer = SearchAnswer.model_validate(
        {
            "results": [
                {
                    "score": 0.03,
                    "text": "…",
                    "citation": {
                        "source": "docs",
                        "document": "handbook/leave.md",
                        "title": "Leave",
                        "kind": "md",
                        "line": 12,
                        "headings": ["Leave", "Vacation"],
                        "snippet": "30 days a year",
                    },
                    "scores": {
                        "dense": 0.8304,
                        "dense_rank": 1,
                        "keyword": 7.414,
                        "keyword_rank": 2,
                        "fused": 0.03279,
                        "rerank": 0.97,
                    },
                },
                {
                    "score": 0.01,
                    "text": "…",
                    "citation": {
                        "source": "docs",
                        "document": "travel.pdf",
                        "kind": "pdf",
                        "page": 2,
                        "snippet": "Book trains",
                    },
                    "scores": {"keyword": 1.5, "keyword_rank": 1, "fused": 0.0164},
                },
            ],
            "mode": "hybrid",
            "reranked": True,
            "warnings": ["the reranker is slow"],
            "took": {"total": 76.54},
        }
    )
    assert answer_text(answer).splitlines() == [
        "warning: the reranker is slow",
        "1. docs/handbook/leave.md, line 12",
        "   Leave › Vacation",
        "   30 days a year",
        "   meaning 0.830 (#1) · words 7.41 (#2) · fused 0.0328 · reranker 0.970",
        "2. docs/travel.pdf, page 2",
        "   Book trains",
        "   words 1.50 (#1) · fused 0.0164",
        "(hybrid, reranked; 76.5 ms)",
    ]
