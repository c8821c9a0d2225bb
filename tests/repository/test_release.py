"""metis_dev/release.py without a registry: what it accepts as a version and a registry,
the credentials it hands podman and helm, the chart it packages and the manifest it
renders from that chart (tests/node/test_release.py pushes a release into a real registry)."""

from __future__ import annotations

import base64
import importlib.metadata
import json
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from metis_dev import release
from tests.support import go_tools

REGISTRY = "registry.example:5000/team"
DIGESTS = {"operator": "sha256:" + "a" * 64, "indexer": "sha256:" + "b" * 64}


def pushed(version: str) -> dict[str, release.Pushed]:
    return {
        "operator": release.Pushed(
            ref=f"{REGISTRY}/metis-operator:{version}", digest=DIGESTS["operator"]
        ),
        "indexer": release.Pushed(
            ref=f"{REGISTRY}/metis-indexer:{version}", digest=DIGESTS["indexer"]
        ),
    }


@pytest.mark.parametrize("version", ["0.1.0", "1.22.333", "2.0.0-rc.1", "1.0.0-alpha-2.x"])
def test_a_semver_version_is_taken(version: str) -> None:
    assert release.check_version(version) == version


@pytest.mark.parametrize("version", ["v0.1.0", "0.1", "01.2.3", "1.0.0+build.5", "1.0.0-"])
def test_anything_else_is_refused_before_anything_is_pushed(version: str) -> None:
    with pytest.raises(release.ReleaseError, match="is not SemVer"):
        release.check_version(version)


def test_the_default_version_is_the_packages_own() -> None:
    """pyproject's: the version the images' package reports, and so the operator's default
    indexer image (metis_operator/settings.py)."""
    assert release.project_version() == importlib.metadata.version("metis")


@pytest.mark.parametrize(
    ("given", "taken"),
    [
        ("ghcr.io/my-team", "ghcr.io/my-team"),
        ("127.0.0.1:5000/metis/", "127.0.0.1:5000/metis"),
        ("registry.example/a/b_c", "registry.example/a/b_c"),
    ],
)
def test_a_registry_is_host_port_and_path(given: str, taken: str) -> None:
    assert release.check_registry(given) == taken
    assert release.registry_host(taken) == taken.split("/")[0]


@pytest.mark.parametrize(
    "given", ["ghcr.io", "ghcr.io/My-Team", "oci://ghcr.io/team", "https://ghcr.io/team"]
)
def test_a_registry_without_a_path_or_in_capitals_is_refused(given: str) -> None:
    with pytest.raises(release.ReleaseError, match="lower case"):
        release.check_registry(given)


def test_the_auth_file_is_a_docker_config() -> None:
    config = release.auth_config("127.0.0.1:5000", "me", "pa:ss")
    assert base64.b64decode(config["auths"]["127.0.0.1:5000"]["auth"]) == b"me:pa:ss"


def test_credentials_from_the_environment_go_to_a_private_file_of_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("METIS_REGISTRY_USERNAME", "me")
    monkeypatch.setenv("METIS_REGISTRY_PASSWORD", "secret")
    with release.credentials("ghcr.io") as auth:
        assert auth is not None
        assert stat.S_IMODE(auth.stat().st_mode) == 0o600
        assert json.loads(auth.read_text()) == release.auth_config("ghcr.io", "me", "secret")
    assert not auth.exists()


def test_half_the_credentials_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("METIS_REGISTRY_USERNAME", "me")
    monkeypatch.delenv("METIS_REGISTRY_PASSWORD", raising=False)
    with pytest.raises(release.ReleaseError, match="set both"), release.credentials("ghcr.io"):
        pass


def test_without_credentials_podmans_auth_file_or_the_tools_own_logins(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("METIS_REGISTRY_USERNAME", raising=False)
    monkeypatch.delenv("METIS_REGISTRY_PASSWORD", raising=False)
    monkeypatch.setenv("REGISTRY_AUTH_FILE", str(tmp_path / "auth.json"))
    with release.credentials("ghcr.io") as auth:
        assert auth == tmp_path / "auth.json"
    monkeypatch.delenv("REGISTRY_AUTH_FILE")
    with release.credentials("ghcr.io") as auth:
        assert auth is None


def test_the_chart_copy_defaults_to_the_registrys_images_and_nothing_else_changes(
    tmp_path: Path,
) -> None:
    copy = tmp_path / "metis"
    shutil.copytree(release.CHART, copy)
    release.point_chart(copy, REGISTRY)
    before = yaml.safe_load((release.CHART / "values.yaml").read_text())
    after = yaml.safe_load((copy / "values.yaml").read_text())
    assert after["image"]["repository"] == f"{REGISTRY}/metis-operator"
    assert after["indexerImage"]["repository"] == f"{REGISTRY}/metis-indexer"
    for key in ("image", "indexerImage"):
        before[key]["repository"] = after[key]["repository"]
    assert after == before
    assert f"`{REGISTRY}/metis-indexer`" in (copy / "README.md").read_text()
    assert (copy / "values.yaml").read_text().count("#") == (
        (release.CHART / "values.yaml").read_text().count("#")
    )


def test_a_chart_whose_defaults_moved_is_not_released_half_pointed(tmp_path: Path) -> None:
    copy = tmp_path / "metis"
    shutil.copytree(release.CHART, copy)
    values = copy / "values.yaml"
    values.write_text(values.read_text().replace("astraeus/metis-indexer", "elsewhere/indexer"))
    with pytest.raises(release.ReleaseError, match="metis-indexer"):
        release.point_chart(copy, REGISTRY)


def test_the_manifest_pins_each_image_by_its_tag_and_digest_and_makes_its_namespace() -> None:
    assert release.manifest_values(pushed("1.2.3-rc.1")) == {
        "image": {"tag": f"1.2.3-rc.1@{DIGESTS['operator']}"},
        "indexerImage": {"tag": f"1.2.3-rc.1@{DIGESTS['indexer']}"},
        "namespace": {"create": True},
    }


def documents(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def test_the_manifest_is_the_charts_default_render_with_every_image_pinned(
    tmp_path: Path,
) -> None:
    """Packaged and rendered as a release does: the chart's render with its namespace (what
    `kubectl kustomize manifests/` renders, tests/repository/test_chart.py), the operator's
    image and METIS_INDEXER_IMAGE the registry's, by digest."""
    helm = go_tools.built("helm")
    version = "1.2.3-rc.1"
    archive = release.package_chart(helm, REGISTRY, version, tmp_path)
    assert archive == tmp_path / f"metis-{version}.tgz" and archive.exists()
    manifest = release.render_manifest(helm, archive, version, pushed(version), tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [archive.name, "metis.yaml"]
    ours = documents(manifest.read_text())
    assert release.container_images(ours) == [p.pinned for p in pushed(version).values()]
    argv = [helm, "template", "metis", release.CHART, "-n", "metis-system", "--include-crds"]
    default = subprocess.run(
        [*argv, "--set", "namespace.create=true"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    # Put the upstream images back: then nothing differs from the chart's default render.
    upstream = yaml.safe_load((release.CHART / "Chart.yaml").read_text())["appVersion"]
    text = manifest.read_text()
    for p in pushed(version).values():
        name = p.ref.rsplit("/", 1)[1].split(":")[0]
        text = text.replace(p.pinned, f"{release.UPSTREAM}/{name}:{upstream}")
    assert documents(text) == documents(default)
    assert "Namespace" in {o["kind"] for o in ours}
