"""The operator reads the indexer's status with the indexer's own model: a field a newer
indexer adds is left out, a phase the model does not know is refused (and the base
then waits: the operator cannot read its indexer)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from metis_indexer.schema import StatusAnswer
from tests.operator.answers import STARTED


def test_a_field_the_operator_does_not_know_is_left_out() -> None:
    read = StatusAnswer.read({**STARTED, "phase": "ready", "shards": 3})
    assert read.phase == "ready"
    assert "shards" not in read.model_dump()


@pytest.mark.parametrize("answer", [{**STARTED, "phase": "dreaming"}, [STARTED], "ready"])
def test_an_answer_that_is_not_a_status_is_refused(answer: object) -> None:
    with pytest.raises(ValidationError):
        StatusAnswer.read(answer)
