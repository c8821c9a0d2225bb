"""mypy over the packages ([tool.mypy] in pyproject.toml), held to tools/mypy-baseline.txt: the
errors found when the check came in, which may only shrink. `make lint` runs it.

It fails on an error the baseline does not list (a new one: fix it), and on a baseline line
that no longer occurs (an error fixed: remove the line, or run `python tools/typecheck.py --prune`),
so the baseline never holds more than the code has. A line is `path: [code] message`, without
the line number, so that moving code about does not touch it; an error that occurs twice in a
file is listed twice.

mypy-baseline (PyPI) does the same, with a line number kept by default and more besides
(a sync command, per-code statistics); these few lines need no more pins in the lock."""

import json
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / "tools" / "mypy-baseline.txt"
HEADER = (
    "# mypy's errors when `make lint` began checking the annotations (tools/typecheck.py):\n"
    "# this list may only shrink. Fix an error, then remove its line.\n"
)
_LINE = re.compile(r"\bline \d+\b")


def normalized(error: dict[str, object]) -> str:
    """One error as a baseline line: its file, code and message; any line number in the
    message ("defined on line 12") is left out too."""
    message = _LINE.sub("line N", str(error["message"]))
    return f"{error['file']}: [{error['code']}] {message}"


def run_mypy() -> list[str]:
    """Every error mypy finds, normalized; notes are left out."""
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--output", "json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode not in (0, 1):  # 2: mypy itself failed (a bad configuration, a crash)
        raise SystemExit(f"mypy failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}")
    errors = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return [normalized(e) for e in errors if e["severity"] == "error"]


def read_baseline(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


def compare(found: Iterable[str], baseline: Iterable[str]) -> tuple[list[str], list[str]]:
    """(new errors, baseline lines that no longer occur), each line as often as it is over."""
    have, allowed = Counter(found), Counter(baseline)
    return sorted((have - allowed).elements()), sorted((allowed - have).elements())


def main(argv: list[str]) -> int:
    prune = "--prune" in argv
    found = run_mypy()
    baseline = read_baseline(BASELINE.read_text()) if BASELINE.exists() else []
    new, gone = compare(found, baseline)
    if gone and prune:
        kept = Counter(baseline) - Counter(gone)
        BASELINE.write_text(HEADER + "".join(f"{line}\n" for line in sorted(kept.elements())))
        print(f"typecheck: {len(gone)} fixed error(s) removed from {BASELINE.relative_to(ROOT)}")
        gone = []
    for line in new:
        print(f"new: {line}")
    for line in gone:
        print(f"fixed: {line}")
    if new:
        print(
            f"typecheck: {len(new)} new mypy error(s): fix them (the baseline only shrinks); "
            f"`{sys.executable} -m mypy` shows where"
        )
    if gone:
        print(
            f"typecheck: {len(gone)} error(s) of {BASELINE.relative_to(ROOT)} no longer occur: "
            "remove their lines (or run `python tools/typecheck.py --prune`)"
        )
    if new or gone:
        return 1
    print(f"typecheck: no new mypy errors ({len(found)} left in the baseline)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
