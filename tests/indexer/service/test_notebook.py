"""The notes as the drive holds them: what a kill left half written is dropped, a record
that cannot be read is left out, and a drive where the notes' folder cannot be made still
lets the index load."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from metis_indexer.config import IndexerConfig
from metis_indexer.configured import Configured
from metis_indexer.index.memory import Totals
from metis_indexer.metrics import Metrics
from metis_indexer.service.notebook import RECORDS, Notebook
from metis_indexer.service.progress import Progress


def notebook(index_dir: Path) -> Notebook:
    config = IndexerConfig.model_validate(
        {"name": "team", "sources": [{"drive": "d", "root": "/d"}], "index_dir": str(index_dir)}
    )
    progress = Progress(Metrics.create(), lambda: Totals(0, 0, 0), None)
    passes: Any = None  # loading reads the drive only
    return Notebook(Configured(config), passes, progress)


def record(folder: Path, note_id: str, **fields: Any) -> None:
    (folder / RECORDS).mkdir(parents=True, exist_ok=True)
    (folder / RECORDS / f"{note_id}.json").write_text(json.dumps(fields))


def test_a_note_is_read_whole_and_what_a_kill_left_is_dropped(tmp_path: Path) -> None:
    book = notebook(tmp_path)
    folder = tmp_path / "notes"
    record(folder, "old", text="a", written_at="2026-09-01T00:00:00Z", title="T")
    record(folder, "new", text="b", written_at="2026-10-01T00:00:00Z", replaces=["old"])
    (folder / "old.md").write_text("# T\n\na\n")
    (folder / "new.md").write_text("b\n")
    record(folder, "cut", text="c", written_at="2026-10-02T00:00:00Z")  # no Markdown: cut short
    record(folder, "bad", written_at="2026-10-03T00:00:00Z")  # no text
    (folder / "bad.md").write_text("?\n")
    record(folder, "when", text="d", written_at="yesterday")
    (folder / "when.md").write_text("d\n")
    record(folder, "newest", text="e", written_at="2026-10-01T00:00:00.500Z")
    (folder / "newest.md").write_text("e\n")
    book.load()
    assert sorted(book.notes) == ["new", "newest", "old"]
    assert book.notes["old"].title == "T" and book.notes["new"].replaces == ("old",)
    assert book.replaced["old"].by == "new"
    assert not (folder / RECORDS / "cut.json").exists()
    assert [n.id for n in book.listed()] == ["newest", "new", "old"]


def test_a_drive_where_the_folder_cannot_be_made_holds_no_notes(tmp_path: Path) -> None:
    (tmp_path / "notes").write_text("a file where the folder would be")
    book = notebook(tmp_path)
    book.load()
    assert book.notes == {}


def test_the_record_is_the_note_and_the_markdown_is_made_from_it(tmp_path: Path) -> None:
    """An overwrite killed between its renames left the new record beside the old
    Markdown: the Markdown is written again from the record; what was staged and never
    renamed is removed; a Markdown without a readable record is held as removable."""
    book = notebook(tmp_path)
    folder = tmp_path / "notes"
    record(folder, "fact", text="new words", written_at="2026-10-01T00:00:00Z", title="T")
    (folder / "fact.md").write_text("# T\n\nold words\n")
    (folder / ".fact.md.new").write_text("")
    (folder / RECORDS / ".fact.json.new").write_text("")
    (folder / "orphan.md").write_text("words of a note whose record is gone\n")
    record(folder, "cut", written_at="2026-10-01T00:00:00Z")
    (folder / "cut.md").write_text("words\n")
    book.load()
    assert (folder / "fact.md").read_text() == "# T\n\nnew words\n"
    assert sorted(q.name for q in folder.rglob(".*.new")) == []
    assert sorted(book.notes) == ["fact"]
    assert sorted(book.unreadable) == ["cut", "orphan"]
