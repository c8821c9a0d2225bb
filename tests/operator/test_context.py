"""What the operator keeps of the API server's answers, and for how long."""

from __future__ import annotations

from metis_operator.context import Recent


def test_an_answer_serves_until_its_time_is_over() -> None:
    kept: Recent[str, list[str]] = Recent(60)
    assert kept.get("pool=search") is None
    assert kept.put("pool=search", ["node-1"]) == ["node-1"]
    assert kept.get("pool=search") == ["node-1"]
    assert kept.get("pool=gpu") is None
    over: Recent[None, str] = Recent(0)
    over.put(None, "read")
    assert over.get(None) is None
