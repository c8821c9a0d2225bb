"""`kubectl metis`'s pure parts: ages, tables, the annotations' values and the flags, with
no cluster (tests/kube/test_kubectl_plugin.py runs the whole plugin on one)."""

from __future__ import annotations

import datetime as dt

import pytest

from metis_indexer import schema
from metis_indexer.answer_text import notes_text
from metis_operator import kubectl_plugin as plugin

NOW = dt.datetime(2026, 11, 30, 12, 0, 0, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("stamp", "shown"),
    [
        (None, "-"),
        ("2026-11-30T11:59:18Z", "42s"),
        ("2026-11-30T11:53:00Z", "7m"),
        ("2026-11-30T09:00:00Z", "3h"),
        ("2026-11-28T11:00:00Z", "2d"),
        ("2026-11-30T12:00:05Z", "0s"),
    ],
    ids=["none", "seconds", "minutes", "hours", "days", "clock-skew"],
)
def test_age(stamp: str | None, shown: str) -> None:
    assert plugin.age(stamp, NOW) == shown


def test_a_table_pads_columns_like_kubectl() -> None:
    assert plugin.table([["NAME", "STATE"], ["handbook", "Ready"], ["x", "Failed"]]) == (
        "NAME       STATE\nhandbook   Ready\nx          Failed"
    )


def test_a_list_of_no_bases_says_so() -> None:
    assert plugin.render_list([], NOW, all_ns=True) == "No knowledge bases found."


def test_status_of_a_base_never_reconciled() -> None:
    base = {
        "metadata": {"namespace": "team-a", "name": "new", "generation": 1},
        "spec": {"sources": [{"drive": "docs"}], "embedding": {"deployment": "m"}},
    }
    out = plugin.render_status(base, [], NOW)
    assert "State:           unknown (not reconciled yet)" in out
    assert "none (kubectl metis evaluate new)" in out and out.endswith("Events\n  none")


def test_status_names_the_sources_it_reads_once_each() -> None:
    """Read through the typed spec: a key the spec never has printed "Sources: -" for every
    base."""
    spec = {
        "sources": [{"drive": "docs", "path": "handbook"}, {"drive": "runbooks"}],
        "embedding": {"deployment": "bge-m3"},
        "reranker": {"deployment": "bge-reranker"},
    }
    spec["sources"].append({"drive": "docs", "path": "policies"})
    base = {"metadata": {"namespace": "team-a", "name": "handbook", "generation": 1}, "spec": spec}
    out = plugin.render_status(base, [], NOW)
    assert "Sources:         docs, runbooks\n" in out
    assert "Embedding:       bge-m3 · reranker bge-reranker\n" in out
    refused = {**base, "spec": {"sources": "not a list"}}
    out = plugin.render_status(refused, [], NOW)
    assert "Sources:         -\n" in out and "Embedding:       -\n" in out


def test_status_says_the_revision_each_source_is_read_at_and_the_one_indexed() -> None:
    spec = {
        "sources": [
            {"flux": {"kind": "GitRepository", "name": "handbook"}, "path": "docs"},
            {"drive": "runbooks"},
            {"flux": {"kind": "OCIRepository", "name": "policies"}},
        ],
        "embedding": {"deployment": "bge-m3"},
    }
    observed = {
        "revisions": {"handbook": "main@sha1:b2", "runbooks": "r7", "policies": "v2@sha256:e1"},
        "indexed_revisions": {"handbook": "main@sha1:a1", "runbooks": "r7"},
    }
    base = {
        "metadata": {"namespace": "team-a", "name": "handbook", "generation": 1},
        "spec": spec,
        "status": {"observed": observed},
    }
    out = plugin.render_status(base, [], NOW)
    assert (
        "Sources:         handbook (GitRepository at main@sha1:b2; indexed main@sha1:a1), "
        "runbooks (at r7), policies (OCIRepository at v2@sha256:e1; indexed none yet)\n"
    ) in out


def test_documents_say_how_many_are_shown() -> None:
    doc = {
        "source": "docs",
        "document": "scan.pdf",
        "kind": "pdf",
        "title": None,
        "state": "failed",
        "chunks": 0,
        "size": 10,
        "reason": "scanned PDF without a text layer (no OCR)",
        "detail": "no text on 3 pages",
        "indexed_at": None,
    }
    page = schema.DocumentsPage.model_validate(
        {"documents": [doc], "page": 1, "page_size": 1, "total": 4}
    )
    lines = plugin.render_documents(page).splitlines()
    assert lines[1].split()[:4] == ["docs", "scan.pdf", "pdf", "failed"]
    assert lines[1].endswith("scanned PDF without a text layer (no OCR): no text on 3 pages")
    assert lines[-1] == "(1 of 4 shown)"


def test_each_request_is_a_new_annotation_value() -> None:
    assert plugin.reindex_value(True, 1764504000) == "full 1764504000"
    assert plugin.reindex_value(False, 1764504000) == "1764504000"
    assert plugin.evaluate_value(5, 1764504000) == "k=5 1764504000"


@pytest.mark.parametrize(
    "argv",
    [
        ["-n", "team-a", "status", "handbook"],
        ["status", "handbook", "-n", "team-a"],
        ["status", "--namespace=team-a", "handbook"],
    ],
    ids=["before", "after", "long-form"],
)
def test_the_namespace_flag_goes_before_or_after_the_command(argv: list[str]) -> None:
    args = plugin.build_parser().parse_args(argv)
    assert (args.namespace, args.base, args.all_namespaces) == ("team-a", "handbook", False)


def test_notes_say_when_they_were_written_and_what_replaced_them() -> None:
    def note(note_id: str, **extra: object) -> dict[str, object]:
        fields: dict[str, object] = {
            "id": note_id,
            "source": "metis-team",
            "document": f"{note_id}.md",
            "title": None,
            "text": f"fact {note_id}",
            "written_at": "2026-09-01T10:00:00Z",
            "replaces": [],
            "replaced_by": None,
            "replaced_at": None,
        }
        return fields | extra

    page = {
        "notes": [
            note("new", replaces=["old"], title="Ana", written_at="2026-11-02T09:00:00Z"),
            note("old", replaced_by="new", replaced_at="2026-11-02T09:00:00Z"),
        ],
        "page": 1,
        "page_size": 1000,
        "total": 2,
    }
    assert notes_text(page).splitlines() == [
        "note new, written 2026-11-02T09:00:00Z; replaces old",
        "    Ana: fact new",
        "note old, written 2026-09-01T10:00:00Z; replaced by new on 2026-11-02T09:00:00Z",
        "    fact old",
        "(2 notes)",
    ]
    assert notes_text({**page, "notes": [], "total": 0}) == "No notes."
    assert notes_text(note("one")).startswith("note one, written 2026-09-01T10:00:00Z\n")
