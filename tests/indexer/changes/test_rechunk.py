"""The decisions of a chunking change built beside the index that answers, and the folders
of the index drive it is built in, over plain data and a temporary folder."""

from __future__ import annotations

from pathlib import Path

from metis_indexer.changes import chunking_change
from metis_indexer.index import folders
from metis_indexer.index.memory import IndexSettings

OLD = IndexSettings("model", 384, 1200, 200)


def test_a_chunking_change_of_an_index_with_chunks_is_built_beside():
    assert chunking_change.needs_building(OLD, IndexSettings("model", 384, 800, 100), 10)
    assert chunking_change.needs_building(OLD, IndexSettings("model", 384, 1200, 100), 10)
    assert chunking_change.needs_building(
        IndexSettings("", 0, 1200, 200), IndexSettings("", 0, 800, 0), 3
    )
    assert not chunking_change.needs_building(OLD, OLD, 10)
    assert not chunking_change.needs_building(OLD, IndexSettings("model", 384, 800, 100), 0), (
        "empty"
    )
    assert not chunking_change.needs_building(None, OLD, 10)
    assert not chunking_change.needs_building(OLD, IndexSettings("other", 384, 800, 100), 10), (
        "a new model's vectors are made first (model_change)"
    )
    assert not chunking_change.needs_building(
        OLD, IndexSettings("model", 384, 1200, 200, "w0"), 10
    ), "words counted anew are counted in place"


def test_what_a_build_costs_on_the_drive_scales_with_chunks_or_text():
    # 1200/200 → 600/100: twice the chunks (steps of 1000 → 500)
    assert chunking_change.megabytes(100_000_000, 0, OLD, IndexSettings("m", 384, 600, 100)) == 200
    # 1200/200 → 1500/500: as many chunks, but each repeats more text (1.5 / 1.2)
    assert chunking_change.megabytes(90_000_000, 0, OLD, IndexSettings("m", 384, 1500, 500)) == 113
    # fewer chunks and less text: never less than the index that answers
    assert chunking_change.megabytes(90_000_000, 0, OLD, IndexSettings("m", 384, 2000, 200)) == 90
    # a build resumed: what is built already is not counted again
    assert (
        chunking_change.megabytes(90_000_000, 60_000_000, OLD, IndexSettings("m", 384, 2000, 200))
        == 30
    )
    assert chunking_change.megabytes(90_000_000, 95_000_000, OLD, OLD) == 0


def test_a_build_that_does_not_fit_waits_and_says_what_it_needs():
    new = IndexSettings("m", 384, 600, 100)
    assert chunking_change.no_room(100, 100 + chunking_change.LOG_MEGABYTES, OLD, new) is None
    why = chunking_change.no_room(100, 150, OLD, new)
    assert why == (
        "the index of chunks of 600 characters (overlap 100) needs about 100 MB more beside "
        "the one that answers and 150 MB are free on the index drive: the index of chunks of "
        "1200 characters (overlap 200) goes on answering until there is room"
    )


def test_a_new_index_is_built_in_the_folder_numbered_next_or_the_one_a_build_left():
    assert folders.next_name(None, []) == "index-1"
    assert folders.next_name("index-1", ["index-1"]) == "index-2"
    assert folders.next_name("index-9", ["index-9", "index-10"]) == "index-10", "a build left"
    assert folders.next_name(None, ["index-3", "index-2", "notes", "index-x"]) == "index-2"
    assert folders.next_name("index-2", ["index-2", "lost+found"]) == "index-3"


def test_the_pointer_names_the_index_that_answers(tmp_path: Path):
    assert folders.live(tmp_path) == tmp_path, "no pointer: the drive's own folder"
    (tmp_path / "index-4").mkdir()
    folders.publish(tmp_path, tmp_path / "index-4")
    assert folders.live(tmp_path) == tmp_path / "index-4"
    assert not list(tmp_path.glob(".*")), "nothing staged is left"
    folders.publish(tmp_path, tmp_path)
    assert folders.live(tmp_path) == tmp_path
    for damaged in ("../elsewhere", "/etc", "index-", "\x00\xff"):
        (tmp_path / folders.POINTER).write_text(damaged, errors="surrogateescape")
        assert folders.live(tmp_path) == tmp_path, damaged


def test_what_a_switch_or_a_kill_leaves_is_found_and_removed(tmp_path: Path):
    for name in ("index.sqlite3", "index.sqlite3-wal", "snapshot.json", "snapshot-ab.rows.npy"):
        (tmp_path / name).write_text("old")
    for kept in ("writer.lock", "index.sqlite3.damaged", folders.POINTER):
        (tmp_path / kept).write_text("kept")
    for folder in ("index-1", "index-2", "index-3"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "index.sqlite3").write_text(folder)
    answering, building = tmp_path / "index-2", tmp_path / "index-3"
    assert folders.size(tmp_path, tmp_path) == 3 * 4
    assert folders.size(tmp_path, answering) == len("index-2")

    left = folders.left_over(tmp_path, answering, building)
    assert sorted(left) == [tmp_path, tmp_path / "index-1"]
    for folder in left:
        folders.remove(tmp_path, folder)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "index-2",
        "index-3",
        "index.sqlite3.damaged",
        folders.POINTER,
        "writer.lock",
    ]
    assert folders.left_over(tmp_path, answering, building) == []
    assert folders.left_over(tmp_path, tmp_path) == [answering, building]
