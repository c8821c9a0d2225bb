"""A search answer as a terminal shows it (`metis search`, `kubectl metis search`), and
the score line under each result, which the console's Search page shows too."""

from __future__ import annotations

from metis_indexer.schema import Citation, Scores, SearchAnswer


def score_line(scores: Scores) -> str:
    """`meaning 0.830 (#1) · words 7.41 (#2) · fused 0.0328 · reranker 0.970`: each step
    that scored the passage."""
    parts = []
    if scores.dense is not None:
        parts.append(f"meaning {scores.dense:.3f} (#{scores.dense_rank})")
    if scores.keyword is not None:
        parts.append(f"words {scores.keyword:.2f} (#{scores.keyword_rank})")
    if scores.fused is not None:
        parts.append(f"fused {scores.fused:.4f}")
    if scores.rerank is not None:
        parts.append(f"reranker {scores.rerank:.3f}")
    return " · ".join(parts)


def _place(c: Citation) -> str:
    """The document's title and the headings above the passage (the title once)."""
    headings = c.headings[1:] if c.headings and c.headings[0] == c.title else c.headings
    return " › ".join(p for p in [c.title, *headings] if p)


def answer_text(answer: SearchAnswer) -> str:
    """The warnings, then each result: where it is, its headings, its snippet, its
    scores; then the mode and the time taken."""
    lines = [f"warning: {w}" for w in answer.warnings]
    for i, r in enumerate(answer.results, start=1):
        c = r.citation
        where = f"page {c.page}" if c.page else f"line {c.line}" if c.line else ""
        lines.append(f"{i}. {c.source}/{c.document}" + (f", {where}" if where else ""))
        if place := _place(c):
            lines.append(f"   {place}")
        lines += [f"   {c.snippet}", f"   {score_line(r.scores)}"]
    reranked = ", reranked" if answer.reranked else ""
    lines.append(f"({answer.mode}{reranked}; {answer.took.total:.1f} ms)")
    return "\n".join(lines)
