"""The project's images, built on this machine without a registry.

No registry can be reached here, so the `python:3.11-slim` the Dockerfile starts FROM
is made locally: a Debian root filesystem by `debootstrap` (Python and pip from Debian)
turned into an image by `podman import`. Both images are then built by podman from
its Dockerfile, unchanged, and handed to the node's containerd by `ctr images import`.

Everything is cached by its inputs: the base by the suite, mirror and packages, each
image by its Dockerfile and the files it copies. A cached run only checks tags.

podman runs with its own storage and configuration under the cache folder
(`CONTAINERS_CONF`, `--root`, `--runroot`): the machine's global files are not touched.
It needs `runtime = "runc"` (crun refuses this machine's hybrid cgroups) and ulimits no
higher than the current hard limits (root here lacks CAP_SYS_RESOURCE).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import resource
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from metis_dev import progress

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("METIS_IMAGES_CACHE", Path.home() / ".cache" / "metis" / "images"))

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
BASE_PACKAGES = ("python3", "python3-venv", "python3-pip", "ca-certificates")
BASE_FROM = "docker.io/library/python:3.11-slim"
"""What the Dockerfile starts FROM: the local base is tagged so."""

CONTEXT = (
    "pyproject.toml",
    "requirements/image.txt",
    "metis_operator",
    "indexer_image/metis_indexer",
)
"""What the Dockerfile COPYs: the build context holds these and nothing else."""

HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
"""This machine's CA bundle: pip inside a build reaches PyPI through an egress proxy
whose CA only this bundle has. It is mounted into RUN steps, never copied into a layer."""


class ImageError(RuntimeError):
    """A tool of the image build failed; the message holds its command and output."""


@dataclasses.dataclass(frozen=True)
class Image:
    """One of the project's images: the name it goes by and its target in DOCKERFILE."""

    name: str
    target: str

    def tag(self, key: str) -> str:
        """The image's reference for one set of inputs (a new build never reuses it)."""
        return f"{self.name}:{key}"


DOCKERFILE = "indexer_image/Dockerfile"
"""One Dockerfile, a shared base stage and a target per image."""
INDEXER = Image("localhost/metis-indexer", "indexer")
OPERATOR = Image("localhost/metis-operator", "operator")


@dataclasses.dataclass(frozen=True)
class Built:
    """What `build` made or found: each image's reference, size and the seconds it took."""

    refs: dict[str, str]
    sizes: dict[str, int]
    seconds: dict[str, float]
    cached: dict[str, bool]


def digest(parts: Iterable[bytes]) -> str:
    """A short hash of `parts`, in order: the cache key of a build."""
    h = hashlib.sha256()
    for part in parts:
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()[:16]


def context_files(root: Path = REPO) -> list[Path]:
    """The files a Dockerfile may COPY, relative to `root`, sorted; no caches."""
    files: list[Path] = []
    for entry in CONTEXT:
        path = root / entry
        candidates = [path] if path.is_file() else sorted(path.rglob("*"))
        for f in candidates:
            rel = f.relative_to(root)
            if f.is_file() and "__pycache__" not in rel.parts and f.suffix != ".pyc":
                files.append(rel)
    return sorted(files)


def base_key() -> str:
    return digest([SUITE.encode(), MIRROR.encode(), " ".join(BASE_PACKAGES).encode()])


def image_key(image: Image, base: str, root: Path = REPO) -> str:
    """The inputs of one image: its base, its target, the Dockerfile and every file of the
    context."""
    parts = [base.encode(), image.target.encode(), (root / DOCKERFILE).read_bytes()]
    for rel in context_files(root):
        parts += [str(rel).encode(), (root / rel).read_bytes()]
    return digest(parts)


NPROC_CEILING = 4096
"""runc fails to set RLIMIT_NPROC at this machine's hard limit (96365) or at 65536
("error setting rlimit type 6: operation not permitted"); 4096 it sets."""


def ulimits() -> list[str]:
    """containers.conf `default_ulimits`: podman's own defaults are higher than this
    process's hard limits, and raising a limit needs CAP_SYS_RESOURCE."""
    _, nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
    _, nproc = resource.getrlimit(resource.RLIMIT_NPROC)
    nproc = NPROC_CEILING if nproc == resource.RLIM_INFINITY else min(nproc, NPROC_CEILING)
    nofile = 1 << 20 if nofile == resource.RLIM_INFINITY else nofile
    return [f"nproc={nproc}:{nproc}", f"nofile={nofile}:{nofile}"]


def containers_conf(limits: Sequence[str]) -> str:
    quoted = ", ".join(f'"{u}"' for u in limits)
    return (
        "[containers]\n"
        f"default_ulimits = [{quoted}]\n"
        "[engine]\n"
        'runtime = "runc"\n'
        'cgroup_manager = "cgroupfs"\n'
        'events_logger = "file"\n'
    )


def _run(cmd: Sequence[str], *, env: dict[str, str] | None = None, **kw: object) -> str:
    proc = subprocess.run(list(cmd), capture_output=True, text=True, env=env, **kw)  # type: ignore[call-overload]
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-4000:]
        raise ImageError(f"{' '.join(cmd)} exited {proc.returncode}:\n{tail}")
    return str(proc.stdout)


class Podman:
    """podman with the project's own storage and configuration under `cache`."""

    def __init__(self, cache: Path = CACHE) -> None:
        self.cache = cache
        cache.mkdir(parents=True, exist_ok=True)
        self.conf = cache / "containers.conf"
        self.conf.write_text(containers_conf(ulimits()))

    def __call__(self, *args: str, **kw: object) -> str:
        env = {**os.environ, "CONTAINERS_CONF": str(self.conf)}
        root = ["--root", str(self.cache / "storage"), "--runroot", str(self.cache / "run")]
        return _run(["podman", *root, *args], env=env, **kw)

    def exists(self, ref: str) -> bool:
        try:
            self("image", "exists", ref)
        except ImageError:
            return False
        return True

    def size(self, ref: str) -> int:
        return int(self("image", "inspect", "--format", "{{.Size}}", ref).strip())


def make_base(podman: Podman) -> tuple[str, bool]:
    """The local stand-in for `python:3.11-slim`: Debian's minbase with Python and pip,
    tagged by its inputs and as BASE_FROM. Returns its reference and whether it was cached."""
    ref = f"localhost/metis-base:{base_key()}"
    if podman.exists(ref):
        podman("tag", ref, BASE_FROM)
        return ref, True
    with (
        progress.step(
            f"building the base image (debootstrap of Debian {SUITE}; once per machine)",
            done=f"tagged {ref}",
        ),
        tempfile.TemporaryDirectory(dir=podman.cache) as tmp,
    ):
        rootfs = Path(tmp) / "rootfs"
        _run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(BASE_PACKAGES)}",
                SUITE,
                str(rootfs),
                MIRROR,
            ]
        )
        # The image is a container's whole system, as python:3.11-slim's is: pip may
        # install into it (PEP 668's marker is for a machine's shared Python).
        for marker in rootfs.glob("usr/lib/python3*/EXTERNALLY-MANAGED"):
            marker.unlink()
        (rootfs / "usr/bin/python").symlink_to("python3")
        for cache_dir in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for f in (rootfs / cache_dir).glob("*"):
                if f.is_file():
                    f.unlink()
        tar = Path(tmp) / "rootfs.tar"
        _run(["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(tar), "."])
        podman("import", "--change", 'CMD ["python3"]', str(tar), ref)
    podman("tag", ref, BASE_FROM)
    return ref, False


def make_pause(podman: Podman, binary: Path, ref: str) -> None:
    """The pod sandbox image: one static binary (go/node-bin/pause), nothing else."""
    if podman.exists(ref):
        return
    with tempfile.TemporaryDirectory(dir=podman.cache) as tmp:
        tar = Path(tmp) / "pause.tar"
        shutil.copy2(binary, Path(tmp) / "pause")
        _run(["tar", "--owner=0", "--group=0", "-C", tmp, "-cf", str(tar), "pause"])
        podman("import", "--change", 'ENTRYPOINT ["/pause"]', str(tar), ref)


def _context(podman: Podman, root: Path) -> Path:
    """A build context of exactly CONTEXT plus the Dockerfile (not the whole tree:
    .venv alone is gigabytes)."""
    ctx = podman.cache / "context"
    shutil.rmtree(ctx, ignore_errors=True)
    for rel in [*context_files(root), Path(DOCKERFILE)]:
        (ctx / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, ctx / rel)
    return ctx


def build(images: Sequence[Image] = (INDEXER, OPERATOR), root: Path = REPO) -> Built:
    """Build (or find) the base and `images`; cached by their inputs."""
    podman = Podman()
    refs: dict[str, str] = {}
    sizes: dict[str, int] = {}
    seconds: dict[str, float] = {}
    cached: dict[str, bool] = {}
    t = time.monotonic()
    base, cached["base"] = make_base(podman)
    refs["base"], seconds["base"] = base, time.monotonic() - t
    sizes["base"] = podman.size(base)
    ctx: Path | None = None
    for image in images:
        t = time.monotonic()
        ref = image.tag(image_key(image, base, root))
        cached[image.name] = podman.exists(ref)
        if not cached[image.name]:
            ctx = ctx or _context(podman, root)
            with progress.step(
                f"building the {image.name} image (pip installs its packages: minutes)",
                done=f"tagged {ref}",
            ):
                podman(
                    "build",
                    "--pull=never",
                    "--network",
                    "host",
                    "--layers",
                    "--volume",
                    f"{HOST_CA_BUNDLE}:{HOST_CA_BUNDLE}:ro",
                    "-f",
                    str(ctx / DOCKERFILE),
                    "--target",
                    image.target,
                    "-t",
                    ref,
                    str(ctx),
                )
        refs[image.name], seconds[image.name] = ref, time.monotonic() - t
        sizes[image.name] = podman.size(ref)
    return Built(refs, sizes, seconds, cached)


def import_into(
    podman: Podman, ref: str, containerd_address: Path, namespace: str = "k8s.io"
) -> None:
    """Hand image `ref` to a containerd (where the kubelet finds it without a registry)."""
    ctr = ["ctr", "--address", str(containerd_address), "-n", namespace, "images"]
    listed = _run([*ctr, "ls", "-q", f"name=={ref}"])
    if ref in listed.split():
        return
    with tempfile.TemporaryDirectory(dir=podman.cache) as tmp:
        archive = Path(tmp) / "image.tar"
        podman("save", "--format", "docker-archive", "-o", str(archive), ref)
        _run([*ctr, "import", str(archive)])


def main() -> None:
    """`python -m metis_dev.images`: build or find both images; say what each took."""
    built = build()
    for what, ref in built.refs.items():
        how = "cached" if built.cached[what] else "built"
        print(f"{ref}: {how} in {built.seconds[what]:.1f} s, {built.sizes[what] / 1e6:.0f} MB")


if __name__ == "__main__":
    main()
