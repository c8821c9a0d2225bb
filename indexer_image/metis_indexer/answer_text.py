"""A search answer as a terminal shows it (`metis search`, `kubectl metis search`), the
score line under each result, which the console's Search page shows too, and the base's
notes (`metis note`, `kubectl metis note`)."""

from __future__ import annotations

from typing import Any

from metis_indexer.schema import Citation, NoteAnswer, NotesPage, Scores, SearchAnswer


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
        if c.note is not None:
            lines.append(
                f"   {noted(c.note.id, c.note.written_at, c.note.replaced_by, c.note.replaced_at)}"
            )
        lines += [f"   {c.snippet}", f"   {score_line(r.scores)}"]
    reranked = ", reranked" if answer.reranked else ""
    lines.append(f"({answer.mode}{reranked}; {answer.took.total:.1f} ms)")
    return "\n".join(lines)


def notes_text(answer: Any) -> str:
    """A note, or a page of them, as a person reads it: id, when, what replaced it."""
    if "notes" not in answer:
        return note_line(NoteAnswer.model_validate(answer))
    page = NotesPage.model_validate(answer)
    if not page.notes:
        return "No notes."
    return "\n".join(note_line(n) for n in page.notes) + f"\n({page.total} notes)"


def note_line(note: NoteAnswer) -> str:
    head = noted(note.id, note.written_at, note.replaced_by, note.replaced_at)
    if note.replaces:
        head += f"; replaces {', '.join(note.replaces)}"
    text = f"{note.title}: {note.text}" if note.title else note.text
    return f"{head}\n    {text}"


def noted(note_id: str, at: str, replaced_by: str | None, replaced_at: str | None) -> str:
    """`note ana, written 2026-09-01T10:00:00Z; replaced by 4f2a… on …`."""
    said = f"note {note_id}, written {at}"
    return said + (f"; replaced by {replaced_by} on {replaced_at}" if replaced_by else "")
