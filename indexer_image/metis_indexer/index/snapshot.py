"""What a load builds from the store, kept beside it so that the next load reads it.

A load of a million chunks from SQLite reads every row, encodes every vector and sorts
every posting (a minute and more); the arrays it ends with take seconds to read back.
They are saved as `.npy` files tagged with the database's id and generation
(`store.SCHEMA`), which triggers move with every change to a chunk in the same
transaction as the change: a snapshot is used only while both match, so a write after it
(or another database in the folder) sends the next load back to SQLite, never to stale
rows. SQLite stays the source of truth.

Files are written whole under a fresh name and published last by renaming the manifest
over the old one, so a kill at any moment leaves either the old snapshot or the new one.
Nothing is ever changed in place: a second indexer reading the folder (one stands by)
maps files that stay as they were; files of a replaced snapshot are unlinked, which
leaves them readable to whoever has them open or mapped.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from metis_indexer.files import sync_folder

log = logging.getLogger(__name__)

MANIFEST = "snapshot.json"
PREFIX = "snapshot-"

Tag = tuple[str, int]
"""The database's id and generation a snapshot was built at."""


def matches(manifest: Mapping[str, Any], tag: Tag) -> bool:
    """Whether a manifest is of this database at this generation."""
    return manifest.get("id") == tag[0] and manifest.get("generation") == tag[1]


def read(folder: Path, tag: Tag) -> tuple[dict[str, Any], dict[str, npt.NDArray[Any]]] | None:
    """The manifest and arrays (memory-mapped, read-only) of the folder's snapshot if it is
    of `tag` and whole; None otherwise (none, stale, or a file missing or cut short)."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or not matches(manifest, tag):
        return None
    arrays: dict[str, npt.NDArray[Any]] = {}
    try:
        for name, file in manifest["files"].items():
            arrays[name] = np.load(folder / file, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        log.warning("the index's snapshot cannot be read (%s): loading from the store", e)
        return None
    return manifest, arrays


def write(
    folder: Path, tag: Tag, rows: int, arrays: Mapping[str, npt.ArrayLike], extra: Mapping[str, Any]
) -> None:
    """Save `arrays` and `extra` (JSON) as the folder's snapshot at `tag`, each file synced
    before the manifest that names them is renamed into place; then unlink older files."""
    token = secrets.token_hex(8)
    files: dict[str, str] = {}
    staged = folder / f"{PREFIX}{token}.json"
    try:
        for name, array in arrays.items():
            path = folder / f"{PREFIX}{token}.{name}.npy"
            files[name] = path.name
            with path.open("wb") as f:
                np.save(f, np.asanyarray(array), allow_pickle=False)
                f.flush()
                os.fsync(f.fileno())
        manifest = {**extra, "id": tag[0], "generation": tag[1], "rows": rows, "files": files}
        with staged.open("w") as f:
            json.dump(manifest, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(staged, folder / MANIFEST)
    except BaseException:
        for name in [*files.values(), staged.name]:  # a full drive gets its space back
            (folder / name).unlink(missing_ok=True)
        raise
    _sync_folder(folder)
    for path in folder.glob(f"{PREFIX}*"):
        if path.name not in files.values():
            path.unlink(missing_ok=True)


def _sync_folder(folder: Path) -> None:
    """Make the rename itself durable; a folder that cannot be synced leaves the snapshot
    as good as unsynced (the next load checks it), never a failed write."""
    with contextlib.suppress(OSError):
        sync_folder(folder)
