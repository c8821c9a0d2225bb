"""The docs site (mkdocs.yml, docs/) builds in strict mode, and README.md stays a front page.

Strict mode turns mkdocs.yml's `validation` warnings into errors: a link to a page or an
anchor that does not exist, or a page of docs/ left out of the nav, fails the build. The
alert rules' `runbook_url`s point at anchors of docs/runbooks.md, so the built page must
hold one for each alert. README.md is at most 200 lines and begins with the two commands.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
RULES = ROOT / "manifests" / "monitoring" / "component" / "rules.yaml"


def test_the_site_builds_in_strict_mode(tmp_path: Path) -> None:
    site = tmp_path / "site"
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert built.returncode == 0, f"mkdocs build --strict failed:\n{built.stdout}\n{built.stderr}"
    assert (site / "index.html").is_file()
    # Every alert's runbook_url (docs/runbooks.md#<alert, lower case>) names an anchor of
    # the built page.
    runbooks = (site / "runbooks" / "index.html").read_text()
    rules = yaml.safe_load(RULES.read_text())
    alerts = [r["alert"] for g in rules["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert alerts
    for alert in alerts:
        assert f'id="{alert.lower()}"' in runbooks, alert


def test_the_readme_is_a_front_page() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: move the rest to docs/"
    first = "\n".join(lines[:30])
    assert "make demo" in first
    assert "make test" in first
    assert first.index("make demo") < first.index("make test")


def test_the_readme_links_to_pages_that_exist() -> None:
    """README's links into docs/ (read on GitHub, outside the site) name files that exist."""
    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#[^)\s]*)?\)", README.read_text())
    assert links
    missing = [link for link in links if not (ROOT / link).is_file()]
    assert not missing, missing
