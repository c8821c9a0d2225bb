"""A source read from an artifact: the tarball a Flux GitRepository, Bucket or
OCIRepository makes of one revision, served by its source-controller.

The indexer fetches it, checks it against the digest the source object gives, and unpacks
it into a folder of its own on the index drive, named for the digest: a revision is read
from there, and the folder of the revision indexed before stays until a pass over the new
one is done (`prune`). Only a complete folder is ever read: an archive is unpacked beside,
under a dot name, and renamed into place once whole, so a kill at any moment leaves the
last complete revision and at most a dot folder that the next fetch clears.

An archive is refused whole, saying why, where it is not the digest's, is larger than
FETCH_BYTES_MAX, unpacks to more than UNPACKED_BYTES_MAX or FILES_MAX files, or holds a
name or a link that leaves its folder (tarfile's `data` filter decides those). What is
neither a file, a folder nor a link inside (a device, a pipe, a hard link) is skipped.

A pass compares a file by its size and modification time (`plan`); an unpacked file is
given a modification time made from its content's hash, so a file that did not change
between two revisions is left alone and one that did is read again, whatever times the
archive holds (Flux's are the commit's, or none).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
import tarfile
from collections.abc import Collection, Sequence
from pathlib import Path, PurePosixPath
from typing import IO

import httpx

from metis_indexer.config import SourceConfig
from metis_indexer.files import sync_folder
from metis_indexer.models.clients import describe

log = logging.getLogger(__name__)

FETCH_BYTES_MAX = 1 << 30
"""Bytes an artifact may have as fetched (compressed)."""
UNPACKED_BYTES_MAX = 8 << 30
"""Bytes its files may have once unpacked: an archive bomb stops here."""
FILES_MAX = 200_000
"""Entries an artifact may hold."""
DIGESTS = {"sha256": 64, "sha384": 96, "sha512": 128}
"""The digest algorithms Flux writes that Python hashes, and their length in hex."""
INFO = ".metis-artifact.json"
"""In an unpacked folder: what it was unpacked from (hidden: never read as a document)."""
CURRENT = "current"
"""In an artifact store: the name of the folder a finished pass read."""
CHUNK = 1 << 20
TIMEOUT = httpx.Timeout(60.0, connect=5.0)
"""How long the artifact server may be silent: a large artifact streams for longer."""
_MTIME_SPAN_NS = 30 * 365 * 86_400 * 10**9
_MTIME_FROM_NS = 946_684_800 * 10**9  # 2000-01-01: a time every file system keeps
_DIGEST = re.compile(r"^(?P<algorithm>[a-z0-9]+):(?P<hex>[0-9a-f]+)$")


class ArtifactError(Exception):
    """An artifact that cannot be read now; the message says why, for a reason or a log."""


@dataclasses.dataclass(frozen=True, slots=True)
class Unpacked:
    """A complete folder of one revision."""

    folder: Path
    revision: str
    digest: str
    files: int
    bytes: int


def check_digest(digest: str) -> tuple[str, str]:
    """(algorithm, hex) of a digest such as `sha256:ab…`; ArtifactError saying what is wrong."""
    found = _DIGEST.match(digest)
    if found is None:
        raise ArtifactError(f"digest {digest!r} is not of the form algorithm:hex")
    algorithm, hexed = found["algorithm"], found["hex"]
    if algorithm not in DIGESTS:
        known = ", ".join(DIGESTS)
        raise ArtifactError(
            f"digest algorithm {algorithm} is not one this indexer checks ({known})"
        )
    if len(hexed) != DIGESTS[algorithm]:
        raise ArtifactError(
            f"digest {digest!r} has {len(hexed)} hex digits, not {DIGESTS[algorithm]}"
        )
    return algorithm, hexed


def folder_name(digest: str) -> str:
    """The folder a revision is unpacked into: its digest, shortened (still unique enough:
    128 bits)."""
    algorithm, hexed = check_digest(digest)
    return f"{algorithm}-{hexed[:32]}"


def content_mtime_ns(sha256: bytes) -> int:
    """A modification time made from a content's hash: the same content, the same time."""
    return _MTIME_FROM_NS + int.from_bytes(sha256[:8], "big") % _MTIME_SPAN_NS


def complete(store: Path, digest: str) -> Unpacked | None:
    """The complete folder of `digest` in `store`, or None."""
    folder = store / folder_name(digest)
    return read_info(folder)


def read_info(folder: Path) -> Unpacked | None:
    """What a complete folder was unpacked from; None where it is not one."""
    try:
        info = json.loads((folder / INFO).read_text())
        return Unpacked(
            folder,
            str(info["revision"]),
            str(info["digest"]),
            int(info["files"]),
            int(info["bytes"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def current(store: Path) -> Unpacked | None:
    """The revision a finished pass read last (kept while a newer one cannot be had)."""
    try:
        name = (store / CURRENT).read_text().strip()
    except OSError:
        return None
    if not name or "/" in name or name.startswith("."):
        return None
    return read_info(store / name)


def set_current(store: Path, unpacked: Unpacked) -> None:
    """Record `unpacked` as the revision a finished pass read (atomically)."""
    temporary = store / f".{CURRENT}.new"
    temporary.write_text(unpacked.folder.name + "\n")
    os.replace(temporary, store / CURRENT)


def prune(store: Path, keep: Collection[Path]) -> list[str]:
    """Remove every folder of `store` but `keep` (and what a killed fetch left): the names
    removed."""
    kept = {p.name for p in keep}
    removed = []
    for entry in sorted(store.iterdir()) if store.is_dir() else []:
        if entry.name == CURRENT or entry.name in kept:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry.name)
    return removed


async def fetch(
    client: httpx.AsyncClient, url: str, digest: str, revision: str, store: Path
) -> Unpacked:
    """The complete folder of the artifact at `url`: the one already unpacked for `digest`,
    else fetched, checked and unpacked now. ArtifactError saying why where it cannot be."""
    algorithm, hexed = check_digest(digest)
    if (done := complete(store, digest)) is not None:
        return done
    store.mkdir(parents=True, exist_ok=True)
    archive = store / f".fetching-{folder_name(digest)}"
    hasher = hashlib.new(algorithm)
    size = 0
    try:
        async with client.stream("GET", url) as response:
            if response.status_code != 200:
                raise ArtifactError(
                    f"the artifact server answered HTTP {response.status_code} for {url}"
                )
            with archive.open("wb") as out:
                async for part in response.aiter_bytes(CHUNK):
                    size += len(part)
                    if size > FETCH_BYTES_MAX:
                        raise ArtifactError(
                            f"the artifact at {url} is larger than {FETCH_BYTES_MAX >> 20} MiB"
                        )
                    hasher.update(part)
                    out.write(part)
    except httpx.HTTPError as e:
        archive.unlink(missing_ok=True)
        raise ArtifactError(f"cannot fetch the artifact at {url}: {describe(e)}") from None
    except ArtifactError:
        archive.unlink(missing_ok=True)
        raise
    if hasher.hexdigest() != hexed:
        archive.unlink(missing_ok=True)
        raise ArtifactError(
            f"the artifact at {url} is {algorithm}:{hasher.hexdigest()}, "
            f"not {digest} as its source says: refused"
        )
    try:
        return await asyncio.to_thread(unpack, archive, store, digest, revision)
    finally:
        archive.unlink(missing_ok=True)


def unpack(archive: Path, store: Path, digest: str, revision: str) -> Unpacked:
    """Unpack a checked archive into `store`'s folder for `digest`, beside first and then
    renamed into place; ArtifactError (and nothing left) where it is refused."""
    name = folder_name(digest)
    beside = store / f".unpacking-{name}"
    shutil.rmtree(beside, ignore_errors=True)
    beside.mkdir(parents=True)
    try:
        with archive.open("rb") as raw:
            files, total = _extract(raw, beside)
        info = {"revision": revision, "digest": digest, "files": files, "bytes": total}
        (beside / INFO).write_text(json.dumps(info))
        sync_folder(beside)
        final = store / name
        shutil.rmtree(final, ignore_errors=True)
        os.rename(beside, final)
        sync_folder(store)
    except BaseException:
        shutil.rmtree(beside, ignore_errors=True)
        raise
    return Unpacked(final, revision, digest, files, total)


def _extract(raw: IO[bytes], into: Path) -> tuple[int, int]:
    """Files and bytes unpacked into `into` from a tar (gzip or plain) read as a stream."""
    files = total = entries = 0
    try:
        with tarfile.open(fileobj=raw, mode="r|*") as tar:
            for member in tar:
                entries += 1
                if entries > FILES_MAX:
                    raise ArtifactError(f"the artifact holds more than {FILES_MAX} entries")
                if not (member.isfile() or member.isdir() or member.issym()):
                    continue
                try:
                    checked = tarfile.data_filter(member, str(into))
                except tarfile.FilterError as e:
                    raise ArtifactError(f"the artifact is refused: {_filtered(e)}") from None
                if member.isfile():
                    total += member.size
                    if total > UNPACKED_BYTES_MAX:
                        raise ArtifactError(
                            f"the artifact unpacks to more than {UNPACKED_BYTES_MAX >> 30} GiB"
                        )
                    _write(tar, checked, into)
                    files += 1
                else:
                    tar.extract(checked, into, set_attrs=False, filter="fully_trusted")
    except (tarfile.ReadError, tarfile.CompressionError, EOFError) as e:
        raise ArtifactError(f"the artifact is not a readable tar archive: {e}") from None
    return files, total


def _write(tar: tarfile.TarFile, member: tarfile.TarInfo, into: Path) -> None:
    """One file, its content hashed as written, given its content's modification time."""
    path = into / PurePosixPath(member.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    source = tar.extractfile(member)
    assert source is not None  # a regular file
    hasher = hashlib.sha256()
    with path.open("wb") as out:
        while part := source.read(CHUNK):
            hasher.update(part)
            out.write(part)
    path.chmod(0o644)
    mtime = content_mtime_ns(hasher.digest())
    os.utime(path, ns=(mtime, mtime))


def _filtered(e: tarfile.FilterError) -> str:
    """tarfile's reason, with the member's name."""
    name = e.tarinfo.name
    if isinstance(e, tarfile.OutsideDestinationError | tarfile.AbsolutePathError):
        return f"{name!r} leaves its folder"
    if isinstance(e, tarfile.LinkOutsideDestinationError | tarfile.AbsoluteLinkError):
        return f"{name!r} is a link out of its folder (to {e.tarinfo.linkname!r})"
    return f"{name!r}: {e}"


class Fetched:
    """The revision folder each artifact source reads in a pass: the configured revision,
    fetched where new; where that cannot be had, the one read before, with a problem that
    says why (the base keeps answering, and says which revision it read)."""

    def __init__(self) -> None:
        self._client = httpx.AsyncClient(timeout=TIMEOUT)
        self.folders: dict[str, Unpacked] = {}
        """By drive: the folder a pass reads."""
        self.problems: list[str] = []
        """Why a source is read at another revision than its configured one."""

    async def fetch(self, sources: Sequence[SourceConfig]) -> dict[str, str]:
        """The revision each artifact source is read at this pass, by drive; ArtifactError
        where one has no revision at all to read (its first cannot be had)."""
        self.problems = []
        read: dict[str, str] = {}
        for source in sources:
            a = source.artifact
            if a is None or source.drive in read:
                continue
            try:
                unpacked = await fetch(self._client, a.url, a.digest, a.revision, source.root)
            except (ArtifactError, OSError) as e:
                why = f"cannot read {a.origin} at {a.revision}: {e}"
                held = self.folders.get(source.drive) or await asyncio.to_thread(
                    current, source.root
                )
                if held is None:
                    raise ArtifactError(why) from None
                log.warning("%s; reading it at %s meanwhile", why, held.revision)
                self.problems.append(f"{why}; read at {held.revision} meanwhile")
                unpacked = held
            self.folders[source.drive] = unpacked
            read[source.drive] = unpacked.revision
        return read

    def resolved(self, source: SourceConfig) -> SourceConfig:
        """`source` as a pass lists it: an artifact source at its revision's folder."""
        if source.artifact is None:
            return source
        unpacked = self.folders.get(source.drive)
        if unpacked is None:  # added to the configuration during this pass
            raise ArtifactError(
                f"{source.artifact.origin} is not fetched yet: the next pass reads it"
            )
        return source.model_copy(update={"root": unpacked.folder})

    def readable(self, sources: Sequence[SourceConfig]) -> list[SourceConfig]:
        """The sources whose folders can be read now: an artifact source once fetched."""
        return [self.resolved(s) for s in sources if s.artifact is None or s.drive in self.folders]

    async def settle(self, sources: Sequence[SourceConfig]) -> None:
        """After a finished pass: each store keeps the folder it read, and no other."""
        for source in sources:
            unpacked = self.folders.get(source.drive)
            if source.artifact is not None and unpacked is not None:
                await asyncio.to_thread(set_current, source.root, unpacked)
                await asyncio.to_thread(prune, source.root, [unpacked.folder])

    async def close(self) -> None:
        await self._client.aclose()
