"""Where `metis-console` reads its credentials from, in kubectl's order (--kubeconfig, else
$KUBECONFIG, else in-cluster, else ~/.kube/config), and an error that names each place
it tried. The choice is pure; loading is tried on kubeconfig files under tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from metis_operator import kube
from metis_operator.console import main as console_main
from metis_operator.console.app import Credentials, Settings, connect

HOME = Path("/home/ana")


def test_the_flag_comes_first() -> None:
    chosen = console_main.credentials("/etc/k.yaml", {"KUBECONFIG": "/x"}, HOME)
    assert chosen == (Credentials("--kubeconfig", "/etc/k.yaml"),)


def test_then_kubeconfig_from_the_environment_with_its_list_whole() -> None:
    chosen = console_main.credentials(None, {"KUBECONFIG": "/a.yaml:/b.yaml"}, HOME)
    assert chosen == (Credentials("$KUBECONFIG", "/a.yaml:/b.yaml"),)


@pytest.mark.parametrize("environ", [{}, {"KUBECONFIG": ""}], ids=["unset", "empty"])
def test_then_in_cluster_else_the_home_kubeconfig(environ: dict[str, str]) -> None:
    assert console_main.credentials(None, environ, HOME) == (
        Credentials("in-cluster"),
        Credentials("~/.kube/config", "/home/ana/.kube/config"),
    )


def kubeconfig(path: Path) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


def test_the_first_source_that_loads_is_used(tmp_path: Path) -> None:
    good = kubeconfig(tmp_path / "config")
    settings = Settings(
        credentials=(
            Credentials("$KUBECONFIG", str(tmp_path / "absent")),
            Credentials("~/.kube/config", str(good)),
        )
    )
    assert isinstance(connect(settings), kube.Cluster)


def test_the_error_names_every_source_tried(tmp_path: Path) -> None:
    absent = tmp_path / "absent"
    settings = Settings(
        credentials=(
            Credentials("$KUBECONFIG", f"{absent}:{absent}-too"),
            Credentials("~/.kube/config", str(tmp_path / "home")),
        )
    )
    with pytest.raises(kube.ConfigError) as caught:
        connect(settings)
    said = str(caught.value)
    assert said.startswith(f"tried $KUBECONFIG ({absent}:{absent}-too): ")
    assert f"; ~/.kube/config ({tmp_path / 'home'}): " in said


def test_the_console_follows_kubeconfig_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Run as a user runs it: it used to ignore $KUBECONFIG and try in-cluster credentials."""
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    assert console_main.main(["--port", "0"]) == 2
    err = capsys.readouterr().err
    assert f"metis: console: no cluster to watch: tried $KUBECONFIG ({tmp_path / 'missing'})" in err
    assert "in-cluster" not in err
