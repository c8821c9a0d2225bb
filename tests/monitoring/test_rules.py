"""The alert rules of manifests/monitoring/ with promtool, built from the Prometheus Go
module (tools/promtool/build.sh, cached like the control plane): the rules load, each alert
fires and stays silent on series written for it (rules_test.yaml), and each has a runbook.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import go_tools

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "manifests" / "monitoring" / "component" / "rules.yaml"
UNIT_TESTS = Path(__file__).with_name("rules_test.yaml")
RUNBOOKS = ROOT / "docs" / "runbooks.md"
SITE = re.search(r"^site_url: (\S+)$", (ROOT / "mkdocs.yml").read_text(), re.MULTILINE)[1]  # type: ignore[index]
"""Where the docs are published: each alert's runbook_url is its section there."""


def alerts() -> list[dict[str, Any]]:
    rule = yaml.safe_load(RULES.read_text())
    return [r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]


@pytest.fixture(scope="module")
def promtool() -> Path:
    """promtool, built the first time on a machine (minutes), then taken from the cache."""
    return go_tools.built("promtool")


@pytest.fixture
def rules_dir(tmp_path: Path) -> Path:
    """The PrometheusRule's groups as a plain rules file, with the unit tests beside it."""
    spec = yaml.safe_load(RULES.read_text())["spec"]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": spec["groups"]}))
    shutil.copy(UNIT_TESTS, tmp_path / "rules_test.yaml")
    return tmp_path


def run(promtool: Path, *args: str, cwd: Path) -> str:
    proc = subprocess.run(
        [str(promtool), *args], capture_output=True, text=True, timeout=120, cwd=cwd, check=False
    )
    assert proc.returncode == 0, f"promtool {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout + proc.stderr


def test_the_rules_load(promtool: Path, rules_dir: Path) -> None:
    out = run(promtool, "check", "rules", "rules.yaml", cwd=rules_dir)
    assert f"SUCCESS: {len(alerts())} rules found" in out


def test_each_alert_fires_and_stays_silent_on_its_series(promtool: Path, rules_dir: Path) -> None:
    out = run(promtool, "test", "rules", "rules_test.yaml", cwd=rules_dir)
    assert "SUCCESS" in out
    cases = [
        c for t in yaml.safe_load(UNIT_TESTS.read_text())["tests"] for c in t["alert_rule_test"]
    ]
    for alert in alerts():
        mine = [c for c in cases if c["alertname"] == alert["alert"]]
        assert any(c["exp_alerts"] for c in mine), f"{alert['alert']} is never seen firing"
        assert any(not c["exp_alerts"] for c in mine), f"{alert['alert']} is never seen silent"


def test_a_broken_unit_test_fails(promtool: Path, rules_dir: Path) -> None:
    """promtool compares what fires with what a test expects (it is not only a syntax check)."""
    text = (rules_dir / "rules_test.yaml").read_text()
    (rules_dir / "rules_test.yaml").write_text(text.replace("search p95 2.425s", "p95 9s"))
    proc = subprocess.run(
        [str(promtool), "test", "rules", "rules_test.yaml"],
        cwd=rules_dir,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1 and "MetisSearchLatencyHigh" in proc.stdout + proc.stderr


def test_each_alert_has_a_runbook_section() -> None:
    headings = re.findall(r"^## (\S+)", RUNBOOKS.read_text(), re.MULTILINE)
    names = [a["alert"] for a in alerts()]
    assert sorted(headings) == sorted(names)
    for alert in alerts():
        anchor = alert["annotations"]["runbook_url"]
        assert anchor == f"{SITE}runbooks/#{alert['alert'].lower()}"
