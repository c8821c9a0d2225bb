"""A steady search load against a base while something changes under it: every answer
recorded, so a test can say how many failed, how many fell back to words, and how many
lost the known answer from the top five.

Plain threads and httpx, so a test or a benchmark can reuse it:

    with SteadyLoad(url, QUESTIONS) as load:
        ...  # change the base
    assert load.report().failed == []
"""

from __future__ import annotations

import dataclasses
import itertools
import secrets
import string
import threading
import time
from collections.abc import Sequence
from types import TracebackType

import httpx

TIMEOUT_SECONDS = 5.0
"""A search that takes longer has failed: the person asking has gone."""


@dataclasses.dataclass(frozen=True)
class Question:
    query: str
    expected: str
    """The end of the document's path that must be in the top five."""


@dataclasses.dataclass(frozen=True)
class Answer:
    at: float
    """Seconds since the load started."""
    question: Question
    status: int | None
    """The HTTP status; None when the search did not answer (refused, reset, timed out)."""
    error: str = ""
    mode: str = ""
    documents: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    seconds: float = 0.0


@dataclasses.dataclass(frozen=True)
class Report:
    answers: Sequence[Answer]

    @property
    def failed(self) -> list[Answer]:
        return [a for a in self.answers if a.status != 200]

    @property
    def degraded(self) -> list[Answer]:
        """Answered, but not by meaning as well as by words."""
        return [a for a in self.answers if a.status == 200 and a.mode != "hybrid"]

    @property
    def missed(self) -> list[Answer]:
        """Answered without the known document in the top five."""
        return [
            a
            for a in self.answers
            if a.status == 200 and not any(d.endswith(a.question.expected) for d in a.documents)
        ]

    def longest_dark(self) -> float:
        """The longest run of seconds between two searches that answered."""
        times = [0.0, *(a.at for a in self.answers if a.status == 200)]
        end = self.answers[-1].at if self.answers else 0.0
        return max(b - a for a, b in itertools.pairwise([*times, end]))

    def dark_spans(self) -> list[str]:
        """Each run of failed searches: when it began and ended, how many, the first error."""
        spans: list[list[Answer]] = []
        for a in self.answers:
            if a.status == 200:
                if spans and spans[-1]:
                    spans.append([])
                continue
            if not spans:
                spans.append([])
            spans[-1].append(a)
        said = []
        for run in filter(None, spans):
            first = run[0].error or run[0].status
            said.append(f"{run[0].at:.1f}-{run[-1].at:.1f} s: {len(run)} failed ({first})")
        return said

    def summary(self) -> str:
        ok = [a.seconds for a in self.answers if a.status == 200]
        p50 = sorted(ok)[len(ok) // 2] * 1000 if ok else float("nan")
        return (
            f"{len(self.answers)} searches, {len(self.failed)} failed, "
            f"{len(self.degraded)} by words only, {len(self.missed)} without the known "
            f"answer in the top 5, longest dark {self.longest_dark():.1f} s, p50 {p50:.0f} ms"
            + "".join(f"\n  dark {span}" for span in self.dark_spans())
        )


class SteadyLoad:
    """`rate` searches a second against `url` (a base's address), the questions in turn,
    from a thread of its own until the block ends."""

    def __init__(self, url: str, questions: Sequence[Question], rate: float = 5.0) -> None:
        self._url = f"{url.rstrip('/')}/v1/search"
        self._questions = questions
        self._every = 1.0 / rate
        self._answers: list[Answer] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="steady-load", daemon=True)
        self._started = 0.0

    def __enter__(self) -> SteadyLoad:
        self._started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=TIMEOUT_SECONDS * 2)

    def report(self) -> Report:
        return Report(tuple(self._answers))

    @property
    def count(self) -> int:
        """Searches made so far."""
        return len(self._answers)

    def _run(self) -> None:
        # A new connection for each search, as separate clients make them: a kept-alive
        # one would stay with a pod the Service no longer routes new ones to.
        for question in itertools.cycle(self._questions):
            due = time.monotonic() + self._every
            self._answers.append(self._ask(question))
            if self._stop.wait(max(0.0, due - time.monotonic())):
                return

    def _ask(self, question: Question) -> Answer:
        started = time.monotonic()
        at = started - self._started
        try:
            r = httpx.post(
                self._url,
                json={"query": question.query, "top_k": 5},
                timeout=TIMEOUT_SECONDS,
            )
        except httpx.HTTPError as e:
            return Answer(at, question, None, error=f"{type(e).__name__}: {e}")
        took = time.monotonic() - started
        if r.status_code != 200:
            return Answer(at, question, r.status_code, error=r.text[:300], seconds=took)
        body = r.json()
        return Answer(
            at,
            question,
            200,
            mode=str(body.get("mode", "")),
            documents=tuple(str(x["citation"]["document"]) for x in body.get("results", [])),
            warnings=tuple(str(w) for w in body.get("warnings") or ()),
            seconds=took,
        )


WRITE_EVERY = 1.0
"""Seconds between two notes a `NoteWriter` writes."""
WRITE_SECONDS = 30.0
"""A note write that takes longer has failed: it waits 5 s at most for the model, then is
kept by its words (metis_indexer.service.notebook.EMBED_SECONDS)."""
REFUSED_FOR_NOW = {409: "STANDBY", 503: "KNOWLEDGE_BASE_NOT_READY"}
"""The answers that say to ask again in a moment (a replacement taking over, an index not
serving yet): the same note is written again, and it is no failure."""


@dataclasses.dataclass(frozen=True)
class Written:
    """A note acknowledged: its id, and a word no other document holds."""

    id: str
    word: str


class NoteWriter:
    """A note every `WRITE_EVERY` seconds to `url` (a base's address, with its token), each
    written again while the base says to ask again in a moment, from a thread of its own
    until the block ends; what was acknowledged, and every other answer, kept."""

    def __init__(self, url: str, token: str) -> None:
        self._url = url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"}
        self.written: list[Written] = []
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="note-writer", daemon=True)

    def __enter__(self) -> NoteWriter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=WRITE_SECONDS * 2)

    def _run(self) -> None:
        # Letters only (a word's digits are cut apart from its letters), and this writer's
        # own: a base keeps the notes of writers before it.
        own = "".join(secrets.choice(string.ascii_lowercase) for _ in range(8))
        for n in itertools.count():
            word = f"steadynote{own}{''.join(string.ascii_lowercase[int(d)] for d in str(n))}"
            while not self._write(word) and not self._stop.wait(WRITE_EVERY / 4):
                pass
            if self._stop.wait(WRITE_EVERY):
                return

    def _write(self, word: str) -> bool:
        """True once the note is acknowledged or refused for good (kept in `failed`)."""
        body = {"text": f"A note written beside the searches: {word}.", "title": word}
        try:
            r = httpx.post(
                f"{self._url}/v1/notes", json=body, headers=self._headers, timeout=WRITE_SECONDS
            )
        except httpx.HTTPError as e:
            # Not answered: written or not, the base cannot say, so it is not counted as
            # acknowledged; a connection refused while the Service has no pod is asked again.
            if isinstance(e, httpx.ConnectError):
                return False
            self.failed.append(f"{word}: {e!r}")
            return True
        if r.status_code in (200, 201):
            self.written.append(Written(r.json()["id"], word))
            return True
        if r.status_code in REFUSED_FOR_NOW and REFUSED_FOR_NOW[r.status_code] == (
            r.json().get("error", {}).get("code")
        ):
            return False
        self.failed.append(f"{word}: {r.status_code} {r.text[:300]}")
        return True

    def forget(self) -> None:
        """Every note it wrote forgotten: the base as it was before, for what is measured
        next (a new replica's chunks, say)."""
        for note in self.written:
            r = httpx.delete(
                f"{self._url}/v1/notes/{note.id}", headers=self._headers, timeout=WRITE_SECONDS
            )
            assert r.status_code == 200, r.text

    def lost(self) -> list[str]:
        """The notes acknowledged that the base does not give back, or does not find by their
        word: asked once the change is over."""
        out = []
        for note in self.written:
            got = httpx.get(f"{self._url}/v1/notes/{note.id}", timeout=TIMEOUT_SECONDS)
            found = httpx.post(
                f"{self._url}/v1/search",
                json={"query": note.word, "mode": "keyword", "top_k": 3},
                timeout=TIMEOUT_SECONDS,
            )
            documents = [r["citation"]["document"] for r in found.json().get("results", [])]
            if got.status_code != 200 or f"{note.id}.md" not in documents:
                out.append(f"{note.id} ({note.word}): GET {got.status_code}, found {documents}")
        return out
