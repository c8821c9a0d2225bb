"""The indexer's configuration: what the operator writes into the base's ConfigMap,
and what `metis serve` builds from its flags. One JSON document, checked here."""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

MAX_SOURCES = 16


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SourceConfig(_Model):
    """One source: a drive mounted at `root`, and optionally one folder of it."""

    drive: str = Field(min_length=1)
    root: Path
    path: str | None = None

    @field_validator("path")
    @classmethod
    def _plain_path(cls, v: str | None) -> str | None:
        if v is None or v.strip("/") == "":
            return None
        parts = PurePosixPath(v).parts
        if v.startswith("/") or any(p in (".", "..") for p in v.split("/")):
            raise ValueError(f"path {v!r} must be relative, without . or .. parts")
        return "/".join(parts)

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
    size: int = Field(default=1200, ge=200, le=4000)
    overlap: int = Field(default=200, ge=0)

    @model_validator(mode="after")
    def _overlap_below_half(self) -> ChunkingConfig:
        if self.overlap * 2 >= self.size:
            raise ValueError(
                f"chunking.overlap ({self.overlap}) must be less than half of chunking.size "
                f"({self.size})"
            )
        return self


class IndexerConfig(_Model):
    name: str = "metis"
    sources: list[SourceConfig] = Field(min_length=1, max_length=MAX_SOURCES)
    embedding: EmbeddingConfig | None = None
    reranker: RerankerConfig | None = None
    chunking: ChunkingConfig = ChunkingConfig()
    rescan_seconds: int = 60
    index_dir: Path
    host: str = "127.0.0.1"
    port: int = Field(default=7700, ge=0, le=65535)
    workers: int = Field(default=2, ge=1, le=64)
    embedding_batch: int = Field(default=64, ge=1, le=2048)
    """Passages per embeddings request, filled across documents: fewer for a server
    that limits its batches (TEI's --max-client-batch-size), more for a large GPU."""
    revisions: dict[str, str] = Field(default_factory=dict)
    generation: int | None = None
    """The base's metadata.generation this configuration was written for (by the operator):
    reported back so the operator knows when the indexer runs the current spec."""

    @field_validator("rescan_seconds")
    @classmethod
    def _rescan(cls, v: int) -> int:
        if v != 0 and not 10 <= v <= 86_400:
            raise ValueError(f"rescan_seconds is {v}; it must be 0 or 10 to 86400")
        return v

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
        raise ConfigError(f"configuration {path}: {describe(e)}") from None


def describe(e: ValidationError) -> str:
    """Pydantic's errors as one line a person can act on."""
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or 'config'}: {err['msg']}" for err in e.errors()
    )
