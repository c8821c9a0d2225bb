"""The layers docs/development.md ("Layout") states, held by import-linter (`.importlinter`,
run by `make lint`): the tree keeps every contract, and a scratch copy of it with one
forbidden import added breaks the contract that names it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
PACKAGES = ("metis_operator", "metis_dev", "indexer_image/metis_indexer")


def lint(tree: Path) -> subprocess.CompletedProcess[str]:
    """lint-imports over the packages of `tree`, found before the installed ones."""
    env = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{tree / 'indexer_image'}"}
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(tree / ".importlinter"), "--no-cache"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tree = tmp_path_factory.mktemp("tree")
    shutil.copy(ROOT / ".importlinter", tree)
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package, tree / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    return tree


def test_the_tree_keeps_every_contract(scratch: Path) -> None:
    found = lint(scratch)
    assert found.returncode == 0, found.stdout + found.stderr
    assert "0 broken" in found.stdout, found.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        # The index reaching up into search.
        (
            "indexer_image/metis_indexer/index/__init__.py",
            "import metis_indexer.search.hybrid",
            "The indexer's layers",
        ),
        # The pass's progress reaching up into the pass loop.
        (
            "indexer_image/metis_indexer/service/progress.py",
            "import metis_indexer.service.passes",
            "The service's layers",
        ),
        # A change beside the index reaching into the service that runs it.
        (
            "indexer_image/metis_indexer/changes/vectors.py",
            "import metis_indexer.service.model_watch",
            "The changes know nothing of the service",
        ),
        # The peers reaching up into the vectors that ask them.
        (
            "indexer_image/metis_indexer/changes/peers.py",
            "import metis_indexer.changes.vectors",
            "The changes' layers",
        ),
        # The resource's types reaching up into the handlers.
        (
            "metis_operator/api/spec.py",
            "import metis_operator.handlers",
            "The operator's layers",
        ),
        # A reconciliation climbing back into the loop that runs it.
        (
            "metis_operator/reconcile.py",
            "import metis_operator.runner",
            "The operator's layers",
        ),
        # The status composed from what a step says of it.
        (
            "metis_operator/status/compose.py",
            "import metis_operator.status.announce",
            "The status's layers",
        ),
        # The indexer importing the operator.
        (
            "indexer_image/metis_indexer/schema.py",
            "import metis_operator.handlers",
            "The indexer knows nothing of the operator",
        ),
        # The operator reaching into the indexer's insides.
        (
            "metis_operator/children.py",
            "import metis_indexer.index.memory",
            "The operator reads only the indexer's contract",
        ),
        # Shipped code importing the development tools.
        ("metis_operator/main.py", "import metis_dev.plane", "Nothing shipped imports metis_dev"),
    ],
)
def test_a_forbidden_import_breaks_its_contract(
    scratch: Path, tmp_path: Path, module: str, line: str, contract: str
) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(scratch, tree)
    target = tree / module
    target.write_text(target.read_text() + f"\n{line}  # noqa\n")
    found = lint(tree)
    assert found.returncode != 0, found.stdout
    broken = found.stdout.split("Broken contracts")[-1]
    assert contract in broken, found.stdout
