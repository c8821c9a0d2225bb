"""What every writer of the drives needs of the file system beyond Python's own."""

from __future__ import annotations

import os
from pathlib import Path


def sync_folder(folder: Path) -> None:
    """Make a rename or an unlink in `folder` durable: a folder's entries are synced
    through the folder itself, so a kill after this finds them as they were left."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
