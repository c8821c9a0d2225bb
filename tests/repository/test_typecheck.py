"""tools/typecheck.py, the baseline that may only shrink: its comparison of mypy's errors with
the list, and the list itself well formed. mypy itself runs in `make lint`, not here."""

import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[2] / "tools"
sys.path.insert(0, str(TOOLS))

import typecheck  # noqa: E402


def error(message: str, file: str = "metis_operator/kube.py", code: str = "arg-type") -> str:
    return typecheck.normalized(
        {"file": file, "line": 7, "message": message, "code": code, "severity": "error"}
    )


def test_a_line_leaves_out_where_the_error_is() -> None:
    assert error('Name "x" already defined on line 12', code="no-redef") == (
        'metis_operator/kube.py: [no-redef] Name "x" already defined on line N'
    )


def test_the_same_errors_pass() -> None:
    found = [error("a"), error("a"), error("b", file="metis_dev/node.py")]
    assert typecheck.compare(found, list(reversed(found))) == ([], [])


def test_a_new_error_fails_even_when_the_same_one_is_listed_once() -> None:
    assert typecheck.compare([error("a"), error("a")], [error("a")]) == ([error("a")], [])


def test_a_fixed_error_still_listed_fails() -> None:
    assert typecheck.compare([error("a")], [error("a"), error("b")]) == ([], [error("b")])


def test_the_baseline_is_sorted_and_holds_only_errors() -> None:
    text = typecheck.BASELINE.read_text()
    assert text.startswith(typecheck.HEADER)
    lines = typecheck.read_baseline(text)
    assert lines == sorted(lines)
    for line in lines:
        path, _, rest = line.partition(": [")
        assert (typecheck.ROOT / path).is_file(), line
        assert "] " in rest, line
