"""The indexer's configuration: what the operator writes into the base's ConfigMap,
and what `metis serve` builds from its flags. One JSON document, checked here."""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from metis_indexer import limits

PEERS_MAX = 16
"""Peers one indexer asks at most, each in turn: the operator names one (the base's
Service)."""


def peer_url_problem(url: str) -> str | None:
    """What keeps `url` from being a peer's base URL (http or https, a host, no query);
    None when it is one."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - a port out of range raises here
    except ValueError as e:
        return f"is not a URL: {e}"
    if parts.scheme not in ("http", "https"):
        return "is not an http:// or https:// URL"
    if not parts.hostname:
        return "names no host"
    if parts.query or parts.fragment:
        return "must be a base URL, without a query or fragment"
    return None


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ArtifactConfig(_Model):
    """A source's revision as an artifact (a Flux source object's tarball): fetched,
    checked against its digest and unpacked under the source's root (`ingest.artifacts`)."""

    url: str = Field(pattern=r"^https?://")
    digest: str = Field(pattern=r"^[a-z0-9]+:[0-9a-f]+$")
    revision: str = Field(min_length=1)
    origin: str = Field(min_length=1)
    """What reasons name it by: "GitRepository docs"."""


class SourceConfig(_Model):
    """One source: a drive mounted at `root`, and optionally one folder of it; or an
    artifact, unpacked into folders of `root` (the indexer's own, on its index drive)."""

    drive: str = Field(min_length=1)
    root: Path
    path: str | None = None
    artifact: ArtifactConfig | None = None

    @field_validator("path")
    @classmethod
    def _plain_path(cls, v: str | None) -> str | None:
        if v is None or v.strip("/") == "":
            return None
        problem = limits.path_problem(v)
        if problem is not None:
            raise ValueError(f"path {v!r} {problem}")
        return "/".join(PurePosixPath(v).parts)

    @property
    def folder(self) -> Path:
        return self.root / self.path if self.path else self.root


class EmbeddingConfig(_Model):
    url: str
    name: str = "the embedding model"
    query_prefix: str | None = None
    document_prefix: str | None = None


class RerankerConfig(_Model):
    url: str
    name: str = "the reranker"
    query_prefix: str = ""


class ChunkingConfig(_Model):
    size: int = Field(
        default=limits.CHUNK_SIZE_DEFAULT, ge=limits.CHUNK_SIZE_MIN, le=limits.CHUNK_SIZE_MAX
    )
    overlap: int = Field(default=limits.CHUNK_OVERLAP_DEFAULT, ge=0)

    @model_validator(mode="after")
    def _overlap_below_half(self) -> ChunkingConfig:
        if not limits.overlap_allowed(self.size, self.overlap):
            raise ValueError(
                f"chunking.overlap ({self.overlap}) must be less than half of chunking.size "
                f"({self.size})"
            )
        return self


class ObjectStoreConfig(_Model):
    """S3-compatible object storage a base's backups are kept in (`metis_indexer.backups`):
    a backup lives under `<prefix>/<backup name>/` of `bucket`."""

    endpoint: str = Field(pattern=r"^https?://")
    """The S3 API's URL, e.g. http://127.0.0.1:9000 (path-style addressing)."""
    bucket: str = Field(min_length=1)
    prefix: str = ""
    """The keys' prefix ("" → `<backup name>/`); a trailing "/" is not needed."""
    region: str = "us-east-1"
    secret_dir: Path
    """A folder holding the files `accesskey` and `secretkey` (a mounted Secret, with the
    key names of a Flux Bucket's): read at each use, so a rotated Secret is picked up."""

    @field_validator("prefix")
    @classmethod
    def _plain_prefix(cls, v: str) -> str:
        return v.strip("/")


class RestoreConfig(_Model):
    """The backup an empty index is restored from at start (`service.restoring`)."""

    store: ObjectStoreConfig
    backup: str = Field(pattern=limits.BACKUP_NAME)


class IndexerConfig(_Model):
    name: str = "metis"
    sources: list[SourceConfig] = Field(
        min_length=limits.SOURCES_MIN, max_length=limits.SOURCES_MAX
    )
    embedding: EmbeddingConfig | None = None
    reranker: RerankerConfig | None = None
    chunking: ChunkingConfig = ChunkingConfig()
    rescan_seconds: int = limits.RESCAN_DEFAULT
    index_dir: Path
    host: str = "127.0.0.1"
    port: int = Field(default=7700, ge=0, le=65535)
    workers: int = Field(default=2, ge=1, le=64)
    embedding_batch: int = Field(default=64, ge=1, le=2048)
    """The most passages per embeddings request, filled across documents: fewer for a
    server that limits its batches (TEI's --max-client-batch-size), more for a large GPU.
    Below it, requests are sized to the server's pace (`clients.batch_size`), so a slow
    server is sent small ones and a question never queues long behind them."""
    vectors: limits.VectorKind = limits.VECTORS_DEFAULT
    """How vectors are held in memory: float32, or int8 codes (a quarter of the memory)
    scanned for candidates that are rescored exactly from float32 vectors on disk."""
    check_seconds: float = Field(default=60.0, gt=0, le=86_400)
    """Seconds between looks of the integrity check (a few pages of the index file more
    each look: `Store.sweep`)."""
    drain_seconds: float = Field(default=15.0, ge=0, le=120)
    """Seconds a stopping indexer (SIGTERM) goes on answering reads, its writing already
    handed to its replacement, before it stops listening: the time Kubernetes takes to
    route new requests elsewhere, and for a pod deleted with nothing beside it, the time
    its replacement takes to start and load the index (measured on the real node: about
    6 s for the handbook on a busy machine; 5 s left a search failing). 0: it stops at
    once. Below the pod's termination grace period (40 s as the operator makes it), or it
    is killed first."""
    revisions: dict[str, str] = Field(default_factory=dict)
    generation: int | None = None
    """The base's metadata.generation this configuration was written for (by the operator):
    reported back so the operator knows when the indexer runs the current spec."""
    peers: list[str] = Field(default_factory=list, max_length=PEERS_MAX)
    """Base URLs of other indexers of the same base (the base's Service): asked for the
    vectors they hold before passages go to the model, so a replica that starts empty
    costs the model little. Non-empty: the indexer is ready only once its index has had
    one whole pass (the others answer meanwhile)."""

    backup_store: ObjectStoreConfig | None = None
    """Where `POST /v1/backups` writes this base's backups (None: it answers
    NO_BACKUP_STORE)."""
    restore: RestoreConfig | None = None
    """A backup this base's index is restored from when it starts empty (no chunks, no
    notes), before its first pass: nothing is embedded from scratch."""

    @field_validator("peers")
    @classmethod
    def _peer_urls(cls, v: list[str]) -> list[str]:
        for url in v:
            problem = peer_url_problem(url)
            if problem is not None:
                raise ValueError(f"peers: {url!r} {problem}")
        return [url.rstrip("/") for url in v]

    @field_validator("rescan_seconds")
    @classmethod
    def _rescan(cls, v: int) -> int:
        if not limits.rescan_allowed(v):
            raise ValueError(
                f"rescan_seconds is {v}; it must be 0 or {limits.RESCAN_MIN} to {limits.RESCAN_MAX}"
            )
        return v

    def all_revisions(self) -> dict[str, str]:
        """The revision each source drive is to be read at: a data source's (its claim's
        annotation), an artifact's."""
        artifacts = {s.drive: s.artifact.revision for s in self.sources if s.artifact}
        return dict(sorted({**self.revisions, **artifacts}.items()))

    @model_validator(mode="after")
    def _no_overlapping_sources(self) -> IndexerConfig:
        for i, a in enumerate(self.sources):
            for b in self.sources[i + 1 :]:
                if a.drive == b.drive and _contains(a.path, b.path):
                    raise ValueError(
                        f"sources {a.drive}:{a.path or '/'} and {b.drive}:{b.path or '/'} "
                        "overlap: two sources of one drive may not contain each other"
                    )
        return self

    @model_validator(mode="after")
    def _own_notes_apart(self) -> IndexerConfig:
        own = f"metis-{self.name}"
        if any(s.drive == own for s in self.sources):
            raise ValueError(
                f"source drive {own} is the base's own notes (source {own}); name another drive"
            )
        return self


def _contains(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return True
    pa, pb = PurePosixPath(a).parts, PurePosixPath(b).parts
    shorter = min(len(pa), len(pb))
    return pa[:shorter] == pb[:shorter]


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the field."""


def load(path: Path) -> IndexerConfig:
    try:
        return IndexerConfig.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except OSError as e:
        raise ConfigError(f"cannot read configuration {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"configuration {path} is not JSON: {e}") from None
    except ValidationError as e:
        raise ConfigError(f"configuration {path}: {explain(e)}") from None


def explain(e: ValidationError) -> str:
    """Pydantic's errors as one line a person can act on."""
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or 'config'}: {err['msg']}" for err in e.errors()
    )
