"""The decisions over a base's notes: what a write may be, what replaces what, and the
order of results in a memory."""

from __future__ import annotations

import pytest

from metis_indexer import notes
from metis_indexer.errors import Refusal


def note(note_id: str, at: str, *replaces: str) -> notes.Note:
    return notes.Note(note_id, f"fact {note_id}", at, None, replaces)


HELD = {
    "a": note("a", "2026-09-01T00:00:00Z"),
    "b": note("b", "2026-10-01T00:00:00Z", "a"),
    "c": note("c", "2026-11-01T00:00:00Z", "b"),
}


@pytest.mark.parametrize(
    ("text", "title", "replaces", "note_id", "code"),
    [
        ("", None, [], "x", "NOTE_EMPTY"),
        (" \n\t ", None, [], "x", "NOTE_EMPTY"),
        ("x" * (notes.TEXT_MAX + 1), None, [], "x", "NOTE_TOO_LONG"),
        ("fact", "t" * (notes.TITLE_MAX + 1), [], "x", "NOTE_TOO_LONG"),
        ("fact", None, ["zzz"], "x", "NOTE_REPLACES_UNKNOWN"),
        ("fact", None, ["x"], "x", "NOTE_REPLACES_ITSELF"),
        ("fact", None, ["c"], "a", "NOTE_REPLACES_CYCLE"),
        ("fact", None, ["b"], "a", "NOTE_REPLACES_CYCLE"),
        (
            "fact",
            None,
            [f"n{i}" for i in range(notes.REPLACES_MAX + 1)],
            "x",
            "NOTE_REPLACES_TOO_MANY",
        ),
        ("fact", None, [], "Upper", "NOTE_ID_INVALID"),
        ("fact", None, [], "-dash", "NOTE_ID_INVALID"),
        ("fact", None, [], "a" * 64, "NOTE_ID_INVALID"),
    ],
)
def test_a_bad_note_is_refused_with_its_code(
    text: str, title: str | None, replaces: list[str], note_id: str, code: str
) -> None:
    with pytest.raises(Refusal) as refused:
        notes.check_write(text, title, replaces, note_id, HELD)
    assert refused.value.code == code


def test_a_cycle_is_named_by_its_chain() -> None:
    with pytest.raises(Refusal) as refused:
        notes.check_write("fact", None, ["c"], "a", HELD)
    assert "a → c → b → a" in refused.value.message
    assert refused.value.status == 409


def test_a_good_note_is_kept_trimmed_and_its_replacements_once() -> None:
    text, title, replaces = notes.check_write(
        "  fact \n", "  Ana's\n role ", ["a", "b", "a"], "d", HELD
    )
    assert (text, title, replaces) == ("fact", "Ana's role", ("a", "b"))
    assert notes.check_write("fact", "   ", [], "d", HELD)[1] is None
    assert notes.check_write("fact", None, ["a"], "c", HELD)[2] == ("a",)  # a rewrite of c


def test_the_newest_replacement_is_the_one_cited() -> None:
    held = [*HELD.values(), note("d", "2026-12-01T00:00:00Z", "a")]
    found = notes.replaced(held)
    assert found == {
        "a": notes.Replaced("d", "2026-12-01T00:00:00Z"),
        "b": notes.Replaced("c", "2026-11-01T00:00:00Z"),
    }
    assert "c" not in found and "d" not in found


@pytest.mark.parametrize(
    ("kinds", "order"),
    [
        ([], []),
        ([None, None], [0, 1]),
        ([True, False], [1, 0]),
        ([None, True, None, False], [0, 3, 2, 1]),
        ([True, True, False, None, False], [2, 4, 0, 3, 1]),
        ([False, True, False], [0, 2, 1]),
    ],
)
def test_notes_that_hold_come_first_in_the_notes_places(
    kinds: list[bool | None], order: list[int]
) -> None:
    assert notes.holding_first(kinds) == order


def test_a_note_is_markdown_named_by_its_id() -> None:
    titled = notes.Note("ana", "She leads payments.", "t", "Ana's role")
    assert notes.markdown(titled) == "# Ana's role\n\nShe leads payments.\n"
    assert notes.markdown(notes.Note("x", "fact", "t")) == "fact\n"
    assert titled.document == "ana.md"
    assert notes.of_document("ana.md") == "ana"
    assert notes.of_document("handbook/leave.md") is None
    assert notes.of_document("ana.txt") is None
    assert notes.source("team") == "metis-team"
    assert len(notes.new_id()) == 12 and notes.check_id(notes.new_id())


def test_a_note_is_written_after_every_note_held() -> None:
    first = notes.written_now()
    assert first.endswith("Z") and len(first) == len("2026-12-05T13:22:01.123Z")
    ahead = "2999-01-01T00:00:00.000Z"
    assert notes.written_now([first, ahead]) == "2999-01-01T00:00:00.001Z"
    second = notes.written_now([first])
    assert second > first


def chain(links: int) -> dict[str, notes.Note]:
    """`links` notes, each replacing the one before: n0 ← n1 ← … (a fact revised daily)."""
    held = {"n0": note("n0", "2026-01-01T00:00:00Z")}
    for i in range(1, links):
        held[f"n{i}"] = note(f"n{i}", "2026-01-01T00:00:00Z", f"n{i - 1}")
    return held


def test_a_chain_of_2000_links_is_refused_by_its_length_not_by_a_crash() -> None:
    """A write at link 981 and beyond answered 500: the check recursed once per link."""
    held = chain(2000)
    with pytest.raises(Refusal) as refused:
        notes.check_write("fact", None, ["n1999"], "next", held)
    assert (refused.value.code, refused.value.status) == ("NOTE_REPLACES_TOO_DEEP", 409)
    assert f"at most {notes.REPLACES_DEPTH_MAX}" in refused.value.message
    assert "2000 replaced notes" in refused.value.message


def test_a_cycle_through_2000_links_is_named_by_its_ends() -> None:
    with pytest.raises(Refusal) as refused:
        notes.check_write("fact", None, ["n1999"], "n0", chain(2000))
    assert refused.value.code == "NOTE_REPLACES_CYCLE"
    assert "n0 → n1999 → n1998" in refused.value.message and "n1 → n0" in refused.value.message
    assert len(refused.value.message) < 300


def test_a_chain_up_to_the_bound_is_kept() -> None:
    held = chain(notes.REPLACES_DEPTH_MAX)
    top = f"n{notes.REPLACES_DEPTH_MAX - 1}"
    assert notes.check_write("fact", None, [top], "next", held)[2] == (top,)
    held["next"] = note("next", "2026-01-02T00:00:00Z", top)
    with pytest.raises(Refusal) as refused:
        notes.check_write("fact", None, ["next"], "after", held)
    assert refused.value.code == "NOTE_REPLACES_TOO_DEEP"
    # The longest of several lines counts: a short branch beside a long one does not hide it.
    assert notes.check_write("fact", None, ["n3", "n1"], "side", held)[2] == ("n3", "n1")
