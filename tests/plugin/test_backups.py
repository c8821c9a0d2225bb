"""`kubectl metis backup`, `backups` and `restore` without a cluster: the objects they
make, what they refuse and why, the table they print (tests/kube/test_backups.py runs
them against the real API server, operator and object store)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from metis_operator import kubectl_plugin as plugin
from metis_operator import plugin_backups
from metis_operator.api.backup import BackupStatus

NOW = dt.datetime(2026, 12, 7, 22, 30, 5, tzinfo=dt.UTC)
STORE = {
    "endpoint": "https://s3.example.com",
    "bucket": "metis-backups",
    "prefix": "team-a",
    "secret_name": "backup-keys",
}
SPEC = {"sources": [{"drive": "docs"}], "embedding": {"deployment": "minilm"}}


def base(name: str = "handbook", **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "team-a"}, "spec": {**SPEC, **spec}}


def backup(name: str = "handbook-1", of: str = "handbook", **status: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "creationTimestamp": status.pop("at", ""),
        },
        "spec": {"knowledge_base": of, "method": "object_store"},
        "status": status,
    }


def test_a_backup_is_a_knowledgebasebackup_of_the_base_named_for_it_and_the_time() -> None:
    name = plugin.stamped("handbook", NOW)
    assert name == "handbook-20261207223005"
    made = plugin_backups.backup_object(base(backup={"object_store": STORE}), name)
    assert made == {
        "apiVersion": "metis.astraeus.io/v1",
        "kind": "KnowledgeBaseBackup",
        "metadata": {"name": name, "namespace": "team-a"},
        "spec": {"knowledge_base": "handbook", "method": "object_store"},
    }


def test_a_base_without_an_object_store_is_not_backed_up() -> None:
    with pytest.raises(plugin_backups.BackupRefused, match=r"handbook has no spec\.backup"):
        plugin_backups.backup_object(base(), "handbook-1")


def test_a_backup_is_finished_once_completed_or_failed_and_said_in_one_line() -> None:
    assert plugin_backups.finished(backup(phase="Running")) is None
    assert plugin_backups.finished(backup()) is None
    done = plugin_backups.finished(
        backup(
            phase="Completed",
            chunks=12345,
            notes=3,
            size="4.1 MiB",
            model="minilm",
            chunking="1200/200",
        )
    )
    assert done is not None
    assert plugin_backups.said("handbook-1", done) == (
        "backup handbook-1 completed: 12,345 chunks, 3 notes, 4.1 MiB (minilm, chunking 1200/200)"
    )
    failed = BackupStatus(phase="Failed", message="uploading index.sqlite3: connection refused")
    assert plugin_backups.said("handbook-1", failed) == (
        "backup handbook-1 failed: uploading index.sqlite3: connection refused"
    )


def test_a_restore_is_a_new_base_with_the_backed_up_bases_spec_and_its_store() -> None:
    source = base(backup={"object_store": STORE})
    made = plugin_backups.restored_base("restored", "team-a", backup(), source, None)
    assert made["kind"] == "KnowledgeBase"
    assert made["metadata"] == {"name": "restored", "namespace": "team-a"}
    assert made["spec"] == {
        **SPEC,
        "backup": {"object_store": STORE},
        "restore": {"object_store": STORE, "backup": "handbook-1"},
    }
    assert "restore" not in source["spec"], "the source's spec is left as it is"


def test_a_restore_takes_a_spec_given_and_the_store_of_the_base_backed_up() -> None:
    spec = {"sources": [{"drive": "other"}], "embedding": {"deployment": "e5"}}
    given = {"kind": "KnowledgeBase", "spec": spec}
    source = base(backup={"object_store": STORE})
    made = plugin_backups.restored_base("copy", "team-a", backup(), source, given)
    assert made["spec"] == {**spec, "restore": {"object_store": STORE, "backup": "handbook-1"}}


def test_with_the_base_gone_a_restore_needs_a_spec_and_finds_the_store_in_it() -> None:
    with pytest.raises(plugin_backups.BackupRefused, match=r"no longer exists: give .* -f FILE"):
        plugin_backups.restored_base("restored", "team-a", backup(), None, None)
    given = base("whatever", backup={"object_store": STORE})
    made = plugin_backups.restored_base("restored", "team-a", backup(), None, given)
    assert made["spec"]["restore"] == {"object_store": STORE, "backup": "handbook-1"}
    with pytest.raises(plugin_backups.BackupRefused, match="no object store to restore"):
        plugin_backups.restored_base("restored", "team-a", backup(), None, base())


def test_a_restore_whose_spec_the_api_would_refuse_says_where() -> None:
    bad = base(backup={"object_store": {**STORE, "endpoint": "ftp://x"}})
    with pytest.raises(plugin_backups.BackupRefused, match=r"refused: .*endpoint"):
        plugin_backups.restored_base("restored", "team-a", backup(), bad, None)


def test_backups_are_listed_newest_first_with_why_one_failed() -> None:
    assert plugin.render_backups([], NOW) == "No backups found."
    out = plugin.render_backups(
        [
            backup(
                "handbook-1",
                at="2026-12-07T20:00:00Z",
                phase="Completed",
                chunks=9,
                notes=1,
                size="1.0 KiB",
            ),
            backup("handbook-2", at="2026-12-07T22:00:00Z", phase="Failed", message="store down"),
        ],
        NOW,
    ).splitlines()
    assert out[0].split() == ["NAME", "BASE", "PHASE", "CHUNKS", "NOTES", "SIZE", "AGE", "MESSAGE"]
    assert out[1].split() == [
        "handbook-2",
        "handbook",
        "Failed",
        "-",
        "-",
        "-",
        "30m",
        "store",
        "down",
    ]
    assert out[2].split() == ["handbook-1", "handbook", "Completed", "9", "1", "1.0", "KiB", "2h"]


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["backup", "handbook", "--wait", "-n", "team-a"], "backup"),
        (["-n", "team-a", "backups"], "backups"),
        (["restore", "restored", "--from", "handbook-1", "--dry-run", "-f", "kb.yaml"], "restore"),
    ],
)
def test_the_backup_commands_parse(argv: list[str], command: str) -> None:
    args = plugin.build_parser().parse_args(argv)
    assert args.command == command
    with pytest.raises(SystemExit):
        plugin.build_parser().parse_args(["restore", "restored"])  # --from is required
