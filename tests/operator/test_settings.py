"""One settings tree: defaults, the environment, flags over the environment."""

from __future__ import annotations

import pytest

from metis_operator.settings import load


def test_defaults() -> None:
    s = load({})
    assert s.indexer.port == 7700 and s.poll.interval_seconds == 10.0
    assert s.runtime.namespaces == ()
    assert s.url("bge-m3", "team-a", 80) == "http://bge-m3.team-a.svc:80"


def test_environment_then_flags() -> None:
    env = {
        "METIS_URL_TEMPLATE": "http://127.0.0.1:{port}",
        "METIS_INDEXER_PORT": "17700",
        "METIS_POLL_SECONDS": "0.5",
        "METIS_NAMESPACES": "team-a, team-b,",
    }
    s = load(env, ["--poll-seconds", "2", "--indexer-image", "img:2"])
    assert s.url("x", "y", 81) == "http://127.0.0.1:81"
    assert s.indexer.port == 17700 and s.indexer.image == "img:2"
    assert s.poll.interval_seconds == 2.0
    assert s.runtime.namespaces == ("team-a", "team-b")


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"METIS_INDEXER_PORT": "seventy"}, "METIS_INDEXER_PORT='seventy': expected int"),
        ({"METIS_URL_TEMPLATE": "http://{host}:{port}"}, "is not a template of"),
        ({"METIS_INDEX_ACCESS_MODE": "Shared"}, "expected one of ReadWriteOnce"),
        ({"METIS_LOG_FORMAT": "xml"}, "expected one of text, json"),
    ],
    ids=["not-a-number", "unknown-placeholder", "unknown-access-mode", "unknown-log-format"],
)
def test_a_bad_value_is_named(env: dict[str, str], words: str) -> None:
    with pytest.raises(ValueError, match="METIS_") as e:
        load(env)
    assert words in str(e.value)


def test_the_cluster_citizens_settings() -> None:
    s = load({})
    assert s.runtime.leader_election is True and s.runtime.max_rollouts == 2
    assert (s.poll.probe_seconds, s.poll.model_grace_seconds) == (60.0, 20.0)
    assert s.poll.resync_seconds == 300.0 and s.runtime.log_format == "text"
    s = load(
        {"METIS_LEADER_ELECTION": "false", "METIS_MAX_ROLLOUTS": "5"}, ["--log-format", "json"]
    )
    assert s.runtime.leader_election is False and s.runtime.max_rollouts == 5
    assert s.runtime.log_format == "json"
