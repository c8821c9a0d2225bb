"""Notes written while the base is busy, against a real `metis serve` and a real model: a
note acknowledged is searchable in whichever index answers, across the switch to a new
chunking's index built beside; and a note written while a pass embeds in bulk is
embedded at once, ahead of the pass's batches, not kept by words only."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.indexer.changes.test_chunking_change import held_mid_build, new_index_answering
from tests.indexer.changes.test_model_change import allow
from tests.indexer.service.busy_model import pass_busy_at_the_model
from tests.support.model_server import ModelServer, start_model_server
from tests.support.processes import Process

ROOT = Path(__file__).resolve().parents[3]
HANDBOOK = ROOT / "examples" / "handbook"
NOTES = "metis-metis"
"""The notes' source of a base configured without a name (named `metis`)."""
NOTES_MAX = 400
"""Notes the writer writes at most while it waits for the switch."""


def word(i: int) -> str:
    """A word no document holds, one per note (letters only: numbers are cut apart)."""
    return "zq" + "".join(chr(ord("a") + int(d)) for d in str(i)) + "xv"


def indexed(p: Process, source: str) -> set[str]:
    """The documents of `source` the index that answers holds."""
    held: set[str] = set()
    page = 1
    while True:
        answer = p.get("/v1/documents", params={"page": page, "page_size": 1000}).json()
        held |= {d["document"] for d in answer["documents"] if d["source"] == source}
        if page * 1000 >= answer["total"]:
            return held
        page += 1


def test_notes_acknowledged_across_a_chunking_switch_are_all_searchable(
    tmp_path: Path,
) -> None:
    """A writer writes notes one after the other while the new chunking's index is built
    and switched to; notes acknowledged just before the switch (after the build's last
    round had listed the notes) were missing from the new index, and no pass was asked."""
    with held_mid_build(tmp_path) as c:
        p, written, stop = c.p, [], threading.Event()
        failed: list[str] = []

        def writer() -> None:
            with httpx.Client(base_url=p.base_url, timeout=60) as api:
                for i in range(NOTES_MAX):
                    if stop.is_set():
                        return
                    body = {"id": f"n{i}", "text": f"The rota code of week {word(i)}."}
                    answer = api.post("/v1/notes", json=body)
                    if answer.status_code != 201:
                        failed.append(answer.text)
                        return
                    written.append(f"n{i}.md")

        thread = threading.Thread(target=writer, name="note-writer")
        thread.start()
        try:
            p.wait_for("notes written while the build is held", lambda: len(written) >= 5)
            allow(c.model)
            new_index_answering(p)
            switched_at = len(written)
            p.wait_for("more notes", lambda: len(written) >= switched_at + 3, timeout=60)
        finally:
            stop.set()
            thread.join(120)
        assert not failed, failed[:3]
        held = indexed(p, NOTES)
        missing = [d for d in written if d not in held]
        assert not missing, f"{len(missing)} of {len(written)} notes missing: {missing[:10]}"
        for i in (0, len(written) // 2, len(written) - 1):
            found = search(p, word(i))
            assert f"n{i}.md" in found, (i, found)


def search(p: Process, query: str, **extra: Any) -> list[str]:
    answer = p.post("/v1/search", {"query": query, "mode": "keyword", "top_k": 5, **extra})
    return [r["citation"]["document"] for r in answer.json()["results"]]


@pytest.fixture(scope="module")
def models() -> Iterator[ModelServer]:
    server = start_model_server()
    yield server
    server.stop()


def test_a_note_written_while_a_pass_embeds_in_bulk_is_embedded_at_once(
    models: ModelServer, tmp_path: Path
) -> None:
    """While a pass embeds a document of thousands of chunks, a note's passages waited
    behind the pass's queue for the full EMBED_SECONDS and were kept by words only; they
    go to the model on the questions' slots and the note is found by meaning when the
    write returns."""
    with pass_busy_at_the_model(models, tmp_path) as (p, _, api):
        text = (
            "The team's offsite is in Lisbon in May: three days of planning, one of them "
            "spent walking along the river."
        )
        written = api.post("/v1/notes", json={"id": "offsite", "text": text})
        assert written.status_code == 201, written.text
        answer = api.post(
            "/v1/search", json={"query": "Where is the offsite?", "top_k": 5, "rerank": False}
        ).json()
        assert p.status()["phase"] == "indexing", "the huge document was still embedding"
        assert not [w for w in answer["warnings"] if "vector" in w], answer["warnings"]
        note = [r for r in answer["results"] if r["citation"]["document"] == "offsite.md"]
        assert note and note[0]["scores"].get("dense") is not None, "found by meaning"
