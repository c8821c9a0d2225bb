"""A note is one unit on the drive, against a real `metis serve` (keyword-only: what is
under test is the notes' files, not the model): an overwrite killed between its writes,
a full drive, a record that cannot be read, a chain of replacements past its bound.
GET and search must always agree, and whatever search finds can be removed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from metis_indexer import notes
from tests.indexer.service.test_faults import mount_tmpfs
from tests.support.processes import Process, indexer, running, wait_ready

ROOT = Path(__file__).resolve().parents[3]
HANDBOOK = ROOT / "examples" / "handbook"
OLD = "The staging cluster is named heron and runs in the Frankfurt region."
NEW = "The staging cluster is named kestrel and runs in the Dublin region."

KILLED_AT = """
import os, signal, sys
from metis_indexer import notes
from metis_indexer.config import IndexerConfig
from metis_indexer.configured import Configured
from metis_indexer.service.notebook import Notebook

index_dir, kill_at, text = sys.argv[1], int(sys.argv[2]), sys.argv[3]
renames, rename = [0], os.replace

def killed_at_one(src, dst):
    if renames[0] == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    renames[0] += 1
    rename(src, dst)

os.replace = killed_at_one
config = IndexerConfig.model_validate(
    {"name": "team", "sources": [{"drive": "d", "root": "/d"}], "index_dir": index_dir}
)
book = Notebook(Configured(config), None, None)
book.load()
held = book.notes["fact"]
book._keep(notes.Note("fact", text, notes.written_now([held.written_at])))
"""
"""The notebook's own write of a note's files, in a process SIGKILLed at the rename
numbered `kill_at` (before it): a kill between any two renames of an overwrite."""


def base(tmp_path: Path, index: Path) -> Process:
    drive = tmp_path / "handbook"
    if not drive.exists():
        shutil.copytree(HANDBOOK, drive)
    return indexer({"handbook": drive}, index, None, extra=("--name", "team"))


def write(p: Process, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{p.base_url}/v1/notes", json=body, timeout=30)


def found(p: Process, words: str) -> list[str]:
    """The notes' documents a keyword search of `words` finds."""
    answer = p.post("/v1/search", {"query": words, "mode": "keyword", "top_k": 10}).json()
    return [
        r["citation"]["document"]
        for r in answer["results"]
        if r["citation"]["source"] == notes.source("team")
    ]


def assert_agree(p: Process) -> str:
    """GET's text of the note is the one search finds, and only that one."""
    text = p.get("/v1/notes/fact").json()["text"]
    assert text in (OLD, NEW)
    assert found(p, "heron Frankfurt") == (["fact.md"] if text == OLD else [])
    assert found(p, "kestrel Dublin") == (["fact.md"] if text == NEW else [])
    return text


def test_an_overwrite_killed_between_its_writes_leaves_one_note_everywhere(
    tmp_path: Path,
) -> None:
    """A real SIGKILL of a process writing the note's files with the notebook's own code,
    before each of its renames in turn (and one not killed), then the real indexer
    started on what it left: GET, search, a full reindex and a forget agree."""
    first = tmp_path / "first"
    with running(base(tmp_path, first)) as p:
        wait_ready(p)
        assert write(p, {"text": OLD, "id": "fact"}).status_code == 201
    texts = set()
    for kill_at in range(5):
        index = tmp_path / f"killed-{kill_at}"
        shutil.copytree(first, index)
        run = subprocess.run(
            [sys.executable, "-c", KILLED_AT, str(index), str(kill_at), NEW],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode in (0, -9), run.stderr
        with running(base(tmp_path, index)) as p:
            wait_ready(p)
            text = assert_agree(p)
            texts.add(text)
            passes = p.status()["passes"]
            assert p.post("/v1/reindex", {"full": True}).status_code == 202
            p.wait_status(
                "a full pass",
                lambda s, before=passes: s["passes"] > before and s["phase"] == "ready",
            )
            assert assert_agree(p) == text
            assert httpx.delete(f"{p.base_url}/v1/notes/fact", timeout=30).status_code == 200
            assert found(p, "heron Frankfurt") == found(p, "kestrel Dublin") == []
        left = sorted(q.name for q in (index / "notes").rglob("*") if q.is_file())
        assert left == [], left
        if run.returncode == 0:
            break
    assert texts == {OLD, NEW}, "some kills left the old note, the last write the new one"


def test_a_full_drive_refuses_a_note_with_507_and_leaves_nothing_behind(
    tmp_path: Path,
) -> None:
    """The index drive a tmpfs of 16 MB filled to its last page: a note is refused in the
    API's shape, no staged file is left, the note it would overwrite holds; with room
    again the same write goes through."""
    index = tmp_path / "index"
    index.mkdir()
    try:
        mount_tmpfs(index, "16m")
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"cannot mount a tmpfs here: {e}")
    try:
        with running(base(tmp_path, index)) as p:
            wait_ready(p)
            assert write(p, {"text": OLD, "id": "fact"}).status_code == 201
            fill(index / "filler")
            for body in ({"text": NEW, "id": "fact"}, {"text": NEW, "id": "other"}):
                refused = write(p, body)
                assert refused.status_code == 507, refused.text
                error = refused.json()["error"]
                assert error["code"] == "NOTES_DRIVE_FULL" and "no room" in error["message"]
            staged = [q.name for q in (index / "notes").rglob(".*") if q.is_file()]
            assert staged == []
            assert p.get("/v1/notes/other").status_code == 404
            assert assert_agree(p) == OLD
            (index / "filler").unlink()
            assert write(p, {"text": NEW, "id": "fact"}).status_code == 200
            assert assert_agree(p) == NEW
    finally:
        subprocess.run(["umount", "-l", str(index)], check=False)


def fill(path: Path) -> None:
    """Write to `path` until the drive has no room left."""
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:
            pass
        try:
            while True:
                f.write(b"\0")
        except OSError:
            pass


@pytest.fixture
def unreadable(tmp_path: Path) -> Iterator[Process]:
    """A base whose note `fact` has a record that cannot be read (cut to half of it)."""
    index = tmp_path / "index"
    with running(base(tmp_path, index)) as p:
        wait_ready(p)
        assert write(p, {"text": OLD, "id": "fact"}).status_code == 201
    record = index / "notes" / ".records" / "fact.json"
    record.write_bytes(record.read_bytes()[:20])
    with running(base(tmp_path, index)) as p:
        wait_ready(p)
        yield p


def test_a_note_whose_record_cannot_be_read_can_still_be_removed(unreadable: Process) -> None:
    """Its Markdown is found by search, so GET says why it cannot show it and DELETE
    removes it from the drive and the index."""
    p = unreadable
    assert found(p, "heron Frankfurt") == ["fact.md"]
    shown = p.get("/v1/notes/fact")
    assert shown.status_code == 409 and shown.json()["error"]["code"] == "NOTE_UNREADABLE"
    assert "DELETE" in shown.json()["error"]["message"]
    gone = httpx.delete(f"{p.base_url}/v1/notes/fact", timeout=30)
    assert gone.status_code == 200, gone.text
    assert gone.json()["id"] == "fact" and gone.json()["text"] == OLD
    assert found(p, "heron Frankfurt") == []
    assert p.get("/v1/notes/fact").status_code == 404
    index = Path(p.args[p.args.index("--index") + 1])
    assert [q for q in (index / "notes").rglob("*") if q.is_file()] == []


def test_a_chain_of_replacements_past_its_bound_is_refused_by_its_code(tmp_path: Path) -> None:
    """A chain one note past `notes.REPLACES_DEPTH_MAX` on the drive (written as the notebook
    writes it), then one more replacement over HTTP: 409, not the 500 of a recursion."""
    index = tmp_path / "index"
    folder = notes.folder(index)
    (folder / ".records").mkdir(parents=True)
    for i in range(notes.REPLACES_DEPTH_MAX + 1):
        note = notes.Note(f"n{i}", f"version {i}", "2026-01-01T00:00:00.000Z")
        record = {"text": note.text, "written_at": note.written_at, "title": None}
        record["replaces"] = [f"n{i - 1}"] if i else []
        (folder / ".records" / f"n{i}.json").write_text(json.dumps(record))
        (folder / note.document).write_text(notes.markdown(note))
    with running(base(tmp_path, index)) as p:
        wait_ready(p)
        top = f"n{notes.REPLACES_DEPTH_MAX}"
        refused = write(p, {"text": "version next", "replaces": [top]})
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"]["code"] == "NOTE_REPLACES_TOO_DEEP"
        assert write(p, {"text": "a fact of its own", "replaces": ["n5"]}).status_code == 201
