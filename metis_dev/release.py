"""`make release`: a release a team installs without cloning the repository.

    python -m metis_dev.release --registry HOST[:PORT]/PATH [--version V] [--plain-http]

Into the registry the user names: both images (`images.build`, cached by their inputs),
tagged with the version (default: pyproject's), their digests recorded; the chart, its
version and appVersion the release's and its image repositories the registry's, as an OCI
artifact at oci://REGISTRY/charts/metis. Beside them, in build/release/VERSION/: the
chart's archive, `metis.yaml` (one file to `kubectl apply -f`) and `digests.json`.

`metis.yaml` is `helm template` of that very archive with each image pinned to the digest
just pushed (the operator's and, through METIS_INDEXER_IMAGE, every base's indexer) and its
namespace rendered, so `helm install oci://…` and `kubectl apply -f metis.yaml` install the
same objects from one source; the chart renders what `kubectl kustomize manifests/` renders
(tests/repository/test_chart.py), so nothing of manifests/ is lost by rendering the chart,
and no patch of the operator's environment has to be kept in step with manifests/.

Credentials, never on a command line: METIS_REGISTRY_USERNAME and METIS_REGISTRY_PASSWORD
(an auth file of the run's own, mode 0600, handed to podman and helm), or podman's
REGISTRY_AUTH_FILE (a docker config.json), or else whatever `podman login` and `helm
registry login` left. `--plain-http` is for a registry without TLS (one on loopback).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict

from metis_dev import images

REPO = images.REPO
CHART = REPO / "charts" / "metis"
HELM_BUILD = REPO / "tools" / "helm" / "build.sh"
OUT = REPO / "build" / "release"
NAMESPACE = "metis-system"
"""The namespace `metis.yaml` installs into (manifests/'s)."""
UPSTREAM = "ghcr.io/astraeus"
"""Where the chart's default image repositories live: a release points them at its registry."""
RELEASED = {"operator": images.OPERATOR, "indexer": images.INDEXER}
"""The images a release pushes, by the chart's name for each."""
CHART_VALUE = {"operator": "image", "indexer": "indexerImage"}
"""Each image's key in the chart's values."""
REQUIRED_COMMANDS = ("podman", "debootstrap")

SEMVER = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(-(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(\.(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*)?"
)
"""SemVer 2.0 without build metadata: helm wants SemVer, and a `+` is no image tag."""
REGISTRY = re.compile(r"[a-z0-9.-]+(:\d+)?(/[a-z0-9]+([._-][a-z0-9]+)*)+")
"""host[:port]/path, lower case (an image's repository may be nothing else)."""


class ReleaseError(RuntimeError):
    """A release cannot be made as asked; the message says why."""


class Pushed(BaseModel):
    """One artifact in the registry: its reference by tag and the digest pushed there."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ref: str
    digest: str

    @property
    def pinned(self) -> str:
        return f"{self.ref}@{self.digest}"


class Release(BaseModel):
    """digests.json: what a release pushed and wrote."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: str
    registry: str
    images: dict[str, Pushed]
    chart: Pushed
    chart_url: str
    """What `helm install` takes, with `--version`."""
    manifest: str
    """metis.yaml, beside digests.json."""


class Progress:
    """One line per step, with the seconds since the release began: a cold image build or
    a push to a distant registry takes minutes."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def __call__(self, message: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f} s] {message}", flush=True)


# --------------------------------------------------------------------------- pure parts


def project_version(pyproject: Path = REPO / "pyproject.toml") -> str:
    return str(tomllib.loads(pyproject.read_text())["project"]["version"])


def check_version(version: str) -> str:
    if not SEMVER.fullmatch(version):
        raise ReleaseError(f"version {version!r} is not SemVer (x.y.z[-pre], no +build)")
    return version


def check_registry(registry: str) -> str:
    """`registry` without a trailing slash; refused unless host[:port]/path in lower case."""
    registry = registry.rstrip("/")
    if not REGISTRY.fullmatch(registry):
        raise ReleaseError(
            f"registry {registry!r} is not host[:port]/path in lower case "
            "(e.g. ghcr.io/my-team or 127.0.0.1:5000/metis)"
        )
    return registry


def registry_host(registry: str) -> str:
    return registry.split("/", 1)[0]


def image_ref(registry: str, name: str, version: str) -> str:
    """Where image `name` (localhost/metis-indexer) goes: REGISTRY/metis-indexer:VERSION."""
    return f"{registry}/{name.rsplit('/', 1)[-1]}:{version}"


def auth_config(host: str, username: str, password: str) -> dict[str, Any]:
    """A docker config.json, the format podman's --authfile and helm's --registry-config
    share."""
    token = base64.b64encode(f"{username}:{password}".encode()).decode()
    return {"auths": {host: {"auth": token}}}


def point_chart(folder: Path, registry: str) -> None:
    """The chart copy in `folder` with the registry's image repositories as its defaults
    (values.yaml, and the README's table that states them); comments kept."""
    values = folder / "values.yaml"
    for image in RELEASED.values():
        name = image.name.rsplit("/", 1)[-1]
        old, new = f"{UPSTREAM}/{name}", f"{registry}/{name}"
        if f"repository: {old}\n" not in values.read_text():
            raise ReleaseError(f"{values} no longer says `repository: {old}`")
        for path in (values, folder / "README.md"):
            path.write_text(path.read_text().replace(old, new))


def manifest_values(pushed: dict[str, Pushed]) -> dict[str, Any]:
    """The values metis.yaml is rendered with: each image pinned to its digest (`tag:
    0.1.0@sha256:...`), and the namespace rendered, as `kubectl apply -k manifests/` makes
    it (the chart leaves it to `helm install` by default)."""
    pinned = {
        CHART_VALUE[what]: {"tag": f"{p.ref.rsplit(':', 1)[1]}@{p.digest}"}
        for what, p in pushed.items()
    }
    return {**pinned, "namespace": {"create": True}}


def container_images(objects: Iterable[dict[str, Any]]) -> list[str]:
    """Every image the objects name: their containers' and any METIS_INDEXER_IMAGE."""
    found: list[str] = []
    for o in objects:
        spec = o.get("spec", {}).get("template", {}).get("spec", {})
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            found.append(c["image"])
            found += [e["value"] for e in c.get("env", []) if e["name"] == "METIS_INDEXER_IMAGE"]
    return found


# --------------------------------------------------------------------------- tools


def _run(argv: Sequence[str | Path]) -> str:
    """A command whose failure stops the release with its output (which never holds a
    credential: none is ever on a command line)."""
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-4000:]
        raise ReleaseError(f"{' '.join(map(str, argv))} exited {done.returncode}:\n{tail}")
    return done.stdout + done.stderr


def helm_binary() -> Path:
    """helm from tools/helm/build.sh (built once a machine: minutes; its progress shown)."""
    done = subprocess.run(["bash", str(HELM_BUILD)], stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise ReleaseError("tools/helm/build.sh failed (its output above)")
    return Path(done.stdout.strip())


@contextlib.contextmanager
def credentials(host: str) -> Iterator[Path | None]:
    """The auth file podman and helm read: one of this run's own from
    METIS_REGISTRY_USERNAME/PASSWORD, else REGISTRY_AUTH_FILE, else None (their own
    logins)."""
    user = os.environ.get("METIS_REGISTRY_USERNAME")
    password = os.environ.get("METIS_REGISTRY_PASSWORD")
    if user and password:
        with tempfile.TemporaryDirectory(prefix="metis-release-") as tmp:
            path = Path(tmp) / "auth.json"
            path.touch(mode=0o600)
            path.write_text(json.dumps(auth_config(host, user, password)))
            yield path
        return
    if user or password:
        raise ReleaseError("set both METIS_REGISTRY_USERNAME and METIS_REGISTRY_PASSWORD")
    given = os.environ.get("REGISTRY_AUTH_FILE")
    yield Path(given) if given else None


# --------------------------------------------------------------------------- steps


def push_images(
    built: images.Built,
    registry: str,
    version: str,
    *,
    plain_http: bool,
    auth: Path | None,
    work: Path,
    say: Progress,
) -> dict[str, Pushed]:
    podman = images.Podman()
    pushed: dict[str, Pushed] = {}
    for what, image in RELEASED.items():
        source, dest = built.refs[image.name], image_ref(registry, image.name, version)
        digest_file = work / f"{what}.digest"
        size = built.sizes[image.name] / 1e6
        say(f"pushing {source} ({size:.0f} MB) to {dest}")
        t = time.monotonic()
        podman(
            "push",
            *(["--tls-verify=false"] if plain_http else []),
            *(["--authfile", str(auth)] if auth else []),
            "--digestfile",
            str(digest_file),
            source,
            f"docker://{dest}",
        )
        pushed[what] = Pushed(ref=dest, digest=digest_file.read_text().strip())
        say(f"pushed {pushed[what].pinned} in {time.monotonic() - t:.1f} s")
    return pushed


def package_chart(helm: Path, registry: str, version: str, out: Path) -> Path:
    """The chart's archive, out/metis-VERSION.tgz, from a copy pointed at `registry`
    (charts/metis itself is not touched)."""
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        copy = Path(tmp) / CHART.name
        shutil.copytree(CHART, copy)
        point_chart(copy, registry)
        argv: list[str | Path] = [helm, "package", copy, "--destination", out]
        _run([*argv, "--version", version, "--app-version", version])
    return out / f"{CHART.name}-{version}.tgz"


def push_chart(
    helm: Path, archive: Path, registry: str, version: str, *, plain_http: bool, auth: Path | None
) -> Pushed:
    argv: list[str | Path] = [helm, "push", archive, f"oci://{registry}/charts"]
    if plain_http:
        argv.append("--plain-http")
    if auth:
        argv += ["--registry-config", auth]
    output = _run(argv)
    found = re.search(r"^Digest: (sha256:[0-9a-f]{64})$", output, re.MULTILINE)
    if found is None:
        raise ReleaseError(f"helm push said no digest:\n{output}")
    return Pushed(ref=f"{registry}/charts/{CHART.name}:{version}", digest=found[1])


def render_manifest(
    helm: Path, archive: Path, version: str, pushed: dict[str, Pushed], out: Path
) -> Path:
    """metis.yaml: what manifests/ holds (the CRD, the namespace, the RBAC, the operator),
    rendered from the chart, each image pinned by digest; refused when any is not."""
    argv: list[str | Path] = [helm, "template", "metis", archive, "--include-crds"]
    with tempfile.TemporaryDirectory() as tmp:
        values = Path(tmp) / "values.yaml"
        values.write_text(yaml.safe_dump(manifest_values(pushed)))
        rendered = _run([*argv, "--namespace", NAMESPACE, "--values", values])
    objects = [o for o in yaml.safe_load_all(rendered) if o]
    loose = [i for i in container_images(objects) if "@sha256:" not in i]
    if loose:
        raise ReleaseError(f"images left unpinned in the manifest: {loose}")
    manifest = out / "metis.yaml"
    manifest.write_text(
        f"# Metis {version}: `kubectl apply -f metis.yaml` (docs/release.md). What manifests/\n"
        f"# holds, rendered from the release's chart, each image pinned to the digest pushed.\n"
        f"{rendered}"
    )
    return manifest


def release(registry: str, version: str, out: Path, *, plain_http: bool, say: Progress) -> Release:
    registry, version = check_registry(registry), check_version(version)
    missing = [c for c in REQUIRED_COMMANDS if shutil.which(c) is None]
    if missing:
        raise ReleaseError(f"missing {', '.join(missing)}: as root, `make node-packages`")
    out.mkdir(parents=True, exist_ok=True)
    say(f"release {version} into {registry}; results in {out}")
    say("building both images (cached by their inputs; a cold build takes many minutes)")
    built = images.build()
    for image in RELEASED.values():
        how = "cached" if built.cached[image.name] else "built"
        say(f"{built.refs[image.name]}: {how} in {built.seconds[image.name]:.1f} s")
    helm = helm_binary()
    with credentials(registry_host(registry)) as auth, tempfile.TemporaryDirectory() as work:
        pushed = push_images(
            built, registry, version, plain_http=plain_http, auth=auth, work=Path(work), say=say
        )
        archive = package_chart(helm, registry, version, out)
        say(f"packaged the chart: {archive}")
        chart = push_chart(helm, archive, registry, version, plain_http=plain_http, auth=auth)
    chart_url = f"oci://{registry}/charts/{CHART.name}"
    say(f"pushed the chart {chart.pinned}")
    manifest = render_manifest(helm, archive, version, pushed, out)
    done = Release(
        version=version,
        registry=registry,
        images=pushed,
        chart=chart,
        chart_url=chart_url,
        manifest=manifest.name,
    )
    (out / "digests.json").write_text(done.model_dump_json(indent=2) + "\n")
    say(f"wrote {manifest} and {out / 'digests.json'}")
    say(f"install: helm install metis {chart_url} --version {version} (docs/release.md)")
    return done


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m metis_dev.release", description=__doc__)
    parser.add_argument("--registry", required=True, help="host[:port]/path")
    parser.add_argument("--version", default=project_version(), help="default: pyproject's")
    parser.add_argument("--plain-http", action="store_true", help="a registry without TLS")
    parser.add_argument("--out", type=Path, help="default: build/release/VERSION")
    args = parser.parse_args(argv)
    out = args.out or OUT / args.version
    try:
        release(args.registry, args.version, out, plain_http=args.plain_http, say=Progress())
    except (ReleaseError, images.ImageError) as e:
        sys.exit(f"release failed: {e}")


if __name__ == "__main__":
    main()
