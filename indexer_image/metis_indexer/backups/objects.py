"""The object store a base's backups are kept in, over boto3: the client made from the
configuration at each use (the key pair read from its Secret's files then, so a rotated
Secret is picked up), path-style addressing, and every failure as one `StoreError` whose
message names the step and the key. The objects' checksums are the caller's to verify
(`manifest.mismatch`): what the server says of them is not trusted."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import botocore.config
import botocore.exceptions
from boto3.s3.transfer import TransferConfig

from metis_indexer.backups import manifest
from metis_indexer.config import ObjectStoreConfig

ACCESS_KEY = "accesskey"
SECRET_KEY = "secretkey"
"""The files of the Secret's folder holding the key pair (a Flux Bucket's key names)."""
SECONDS = 30
"""Seconds to connect, and to wait for an answer, per request (boto3 retries 3 times)."""
PART_BYTES = 64 * 1024 * 1024
"""An upload larger than this goes in parts of it (S3 takes 5 GB at most in one PUT)."""


class StoreError(Exception):
    """The object store refused or did not answer; the message says what was asked."""


class NoSuchObject(StoreError):
    """The key asked for is not in the bucket."""


class ObjectStore:
    """One bucket and prefix of an S3-compatible store."""

    def __init__(self, config: ObjectStoreConfig) -> None:
        self.config = config

    def _client(self) -> Any:
        folder = self.config.secret_dir
        try:
            access = (folder / ACCESS_KEY).read_text(encoding="utf-8").strip()
            secret = (folder / SECRET_KEY).read_text(encoding="utf-8").strip()
        except OSError as e:
            raise StoreError(
                f"cannot read the object store's key pair from {folder} "
                f"({ACCESS_KEY}, {SECRET_KEY}): {e.strerror}"
            ) from None
        return boto3.client(
            "s3",
            endpoint_url=self.config.endpoint,
            region_name=self.config.region,
            aws_access_key_id=access,
            aws_secret_access_key=secret,
            config=botocore.config.Config(
                s3={"addressing_style": "path"},
                connect_timeout=SECONDS,
                read_timeout=SECONDS,
                retries={"max_attempts": 3, "mode": "standard"},
                # Checksums are ours (the manifest's SHA-256): not every S3-compatible
                # server takes the newer CRC headers.
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            ),
        )

    def _where(self, key: str) -> str:
        return f"s3://{self.config.bucket}/{key} at {self.config.endpoint}"

    def upload(self, path: Path, key: str) -> None:
        transfer = TransferConfig(multipart_threshold=PART_BYTES, multipart_chunksize=PART_BYTES)
        with _said(f"uploading {self._where(key)}"):
            self._client().upload_file(str(path), self.config.bucket, key, Config=transfer)

    def download(self, key: str, path: Path) -> None:
        with _said(f"downloading {self._where(key)}"):
            self._client().download_file(self.config.bucket, key, str(path))

    def read(self, key: str) -> bytes:
        with _said(f"reading {self._where(key)}"):
            body = self._client().get_object(Bucket=self.config.bucket, Key=key)["Body"]
            data: bytes = body.read()
            return data

    def write(self, key: str, data: bytes) -> None:
        with _said(f"writing {self._where(key)}"):
            self._client().put_object(Bucket=self.config.bucket, Key=key, Body=data)

    def exists(self, key: str) -> bool:
        try:
            with _said(f"looking for {self._where(key)}"):
                self._client().head_object(Bucket=self.config.bucket, Key=key)
        except NoSuchObject:
            return False
        return True

    def names(self, *objs: str) -> dict[str, list[str]]:
        """For each of `objs` (`manifest.json`: the completed backups; `state.json`: those
        running or failed), the names of the backups under the prefix that hold it."""
        start = manifest.folder(self.config.prefix, "")
        names: dict[str, list[str]] = {obj: [] for obj in objs}
        with _said(f"listing {self._where(start)}"):
            pages = self._client().get_paginator("list_objects_v2")
            for page in pages.paginate(Bucket=self.config.bucket, Prefix=start):
                for found in page.get("Contents", []):
                    for obj in objs:
                        name = manifest.named(self.config.prefix, found["Key"], obj)
                        if name is not None:
                            names[obj].append(name)
        return {obj: sorted(found) for obj, found in names.items()}

    def remove(self, key: str) -> None:
        """One object (none there is no error: S3 answers a delete of no key the same)."""
        with _said(f"deleting {self._where(key)}"):
            self._client().delete_object(Bucket=self.config.bucket, Key=key)

    def delete(self, name: str) -> None:
        """A backup's objects, its manifest first: a backup half deleted is no backup."""
        folder = manifest.folder(self.config.prefix, name)
        client = self._client()
        with _said(f"deleting {self._where(folder)}"):
            client.delete_object(Bucket=self.config.bucket, Key=folder + manifest.MANIFEST)
            pages = client.get_paginator("list_objects_v2")
            for page in pages.paginate(Bucket=self.config.bucket, Prefix=folder):
                for found in page.get("Contents", []):
                    client.delete_object(Bucket=self.config.bucket, Key=found["Key"])


@contextlib.contextmanager
def _said(what: str) -> Iterator[None]:
    """Turns what boto3 raises into a StoreError naming `what` was done."""
    try:
        yield
    except StoreError:
        raise
    except botocore.exceptions.ClientError as e:
        error = e.response.get("Error", {})
        code = str(error.get("Code", ""))
        if code in ("404", "NoSuchKey", "NotFound"):
            raise NoSuchObject(f"{what}: no such object") from None
        raise StoreError(f"{what}: {code} {error.get('Message', '')}".strip()) from None
    except (botocore.exceptions.BotoCoreError, boto3.exceptions.Boto3Error, OSError) as e:
        raise StoreError(f"{what}: {e}") from None
