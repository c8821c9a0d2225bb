"""A KnowledgeBase's spec as the operator reads it, and the indexer configuration it
turns into.

The limits are the indexer's (`metis_indexer.limits`, one home for both); the CRD
enforces them too (crds/knowledgebase.yaml), and they are checked again
here because the operator never trusts a CRD it did not install: an older or
edited CRD must not make it write a Deployment or a configuration that cannot run.
Errors name the field as a user wrote it (`spec.sources[1].path`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from metis_indexer import limits
from metis_indexer.config import IndexerConfig

NAME_MAX = 40
NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
"""A base's name: lowercase letters, digits and -, not at either end (spec 001)."""
DRIVE_RE = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
"""A PersistentVolumeClaim's name (a DNS-1123 subdomain)."""
DRIVE_MAX = 253
SERVICE_RE = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
"""A Service's name (a DNS-1035 label)."""
SERVICE_MAX = 63
PREFIX_MAX = 1000
CPU_MIN, CPU_MAX, CPU_DEFAULT = 1, 64, 1
MEMORY_MIN, MEMORY_MAX, MEMORY_DEFAULT = 1, 256, 2
MACHINES_MAX = 100
LABEL_KEY_RE = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
LABEL_VALUE_RE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
LABEL_VALUE_MAX = 63

DRIVES_ROOT = "/drives"
INDEX_DIR = "/index"


class SpecError(ValueError):
    """The spec cannot run; the message names each offending field."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Source(_Model):
    drive: str = Field(pattern=DRIVE_RE, max_length=DRIVE_MAX)
    path: str | None = Field(default=None, min_length=1, max_length=limits.PATH_MAX)

    @field_validator("path")
    @classmethod
    def _plain_folder(cls, v: str | None) -> str | None:
        """The path rule, and no empty part (`a//b`, a trailing /) as the CRD says."""
        if v is not None and (limits.path_problem(v) or "" in v.split("/")):
            raise ValueError(
                "must be a folder of the drive: relative, without empty, . or .. parts"
            )
        return v

    def contains(self, other: Source) -> bool:
        """Whether one of the two sources holds the other (same drive, nested paths)."""
        if self.drive != other.drive:
            return False
        if self.path is None or other.path is None:
            return True
        a, b = PurePosixPath(self.path).parts, PurePosixPath(other.path).parts
        n = min(len(a), len(b))
        return a[:n] == b[:n]


class Embedding(_Model):
    deployment: str = Field(pattern=SERVICE_RE, max_length=SERVICE_MAX)
    query_prefix: str | None = Field(default=None, max_length=PREFIX_MAX)
    document_prefix: str | None = Field(default=None, max_length=PREFIX_MAX)


class Reranker(_Model):
    deployment: str = Field(pattern=SERVICE_RE, max_length=SERVICE_MAX)
    query_prefix: str | None = Field(default=None, max_length=PREFIX_MAX)


class Chunking(_Model):
    size: int = Field(
        default=limits.CHUNK_SIZE_DEFAULT, ge=limits.CHUNK_SIZE_MIN, le=limits.CHUNK_SIZE_MAX
    )
    overlap: int = Field(default=limits.CHUNK_OVERLAP_DEFAULT, ge=0)

    @model_validator(mode="after")
    def _overlap_below_half(self) -> Chunking:
        if not limits.overlap_allowed(self.size, self.overlap):
            # Name the default when the user set none: they never wrote the 200.
            unset = "" if "overlap" in self.model_fields_set else ", its default when not set"
            raise ValueError(
                f"spec.chunking.overlap ({self.overlap}{unset}) must be less than half of "
                f"spec.chunking.size ({self.size}): set a smaller overlap or a larger size"
            )
        return self


class Placement(_Model):
    machines: list[str] = Field(default_factory=list, max_length=MACHINES_MAX)
    labels: dict[str, str] = Field(default_factory=dict)
    cpu_cores: int = Field(default=CPU_DEFAULT, ge=CPU_MIN, le=CPU_MAX)
    memory_gb: int = Field(default=MEMORY_DEFAULT, ge=MEMORY_MIN, le=MEMORY_MAX)

    @field_validator("machines")
    @classmethod
    def _node_names(cls, v: list[str]) -> list[str]:
        bad = [m for m in v if not re.match(DRIVE_RE, m) or len(m) > DRIVE_MAX]
        if bad:
            raise ValueError(f"{bad[0]!r} is not a machine (node) name")
        return v

    @field_validator("labels")
    @classmethod
    def _label_syntax(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if len(key) > DRIVE_MAX + 1 + LABEL_VALUE_MAX or not LABEL_KEY_RE.match(key):
                raise ValueError(f"{key!r} is not a label key")
            if len(value) > LABEL_VALUE_MAX or not LABEL_VALUE_RE.match(value):
                raise ValueError(f"{value!r} (of {key}) is not a label value")
        return v


class KnowledgeBaseSpec(_Model):
    sources: list[Source] = Field(min_length=limits.SOURCES_MIN, max_length=limits.SOURCES_MAX)
    embedding: Embedding
    reranker: Reranker | None = None
    chunking: Chunking = Chunking()
    placement: Placement = Placement()
    rescan_seconds: int = limits.RESCAN_DEFAULT
    vectors: limits.VectorKind = limits.VECTORS_DEFAULT
    """float32, or int8 (a quarter of the vectors' memory, answers rescored exactly)."""

    @field_validator("rescan_seconds")
    @classmethod
    def _rescan(cls, v: int) -> int:
        if not limits.rescan_allowed(v):
            raise ValueError(
                f"is {v}; it must be 0 (only when asked) or {limits.RESCAN_MIN} to "
                f"{limits.RESCAN_MAX}"
            )
        return v

    @model_validator(mode="after")
    def _no_overlap(self) -> KnowledgeBaseSpec:
        for i, a in enumerate(self.sources):
            for j, b in enumerate(self.sources[i + 1 :], start=i + 1):
                if a.contains(b):
                    raise ValueError(
                        f"spec.sources[{i}] and spec.sources[{j}] overlap: two sources of "
                        f"drive {a.drive} may not contain each other"
                    )
        return self

    @property
    def drives(self) -> list[str]:
        """The source drives, each once, sorted."""
        return sorted({s.drive for s in self.sources})


def _where(loc: tuple[int | str, ...]) -> str:
    out = "spec"
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def check_name(name: str) -> None:
    """Raise SpecError unless `name` is a valid base name (spec 001, metadata.name)."""
    if len(name) > NAME_MAX or not NAME_RE.match(name):
        raise SpecError(
            f"metadata.name {name!r} must be lowercase letters, digits and -, not starting "
            f"or ending with -, at most {NAME_MAX} characters"
        )


def parse(name: str, spec: Mapping[str, Any]) -> KnowledgeBaseSpec:
    """The spec, checked; SpecError names every field that is wrong."""
    check_name(name)
    try:
        return KnowledgeBaseSpec.model_validate(dict(spec))
    except ValidationError as e:
        problems = []
        for err in e.errors(include_url=False):
            message = err["msg"].removeprefix("Value error, ")
            where = _where(err["loc"])
            problems.append(message if message.startswith("spec.") else f"{where}: {message}")
        raise SpecError("; ".join(problems)) from None


def to_indexer_config(
    name: str,
    spec: KnowledgeBaseSpec,
    *,
    port: int,
    embedding_url: str,
    reranker_url: str | None,
    revisions: Mapping[str, str],
) -> IndexerConfig:
    """The indexer's configuration for the pod: source drives mounted at
    /drives/<drive>, the index drive at /index, the models at their Services' URLs.

    Built with the indexer's own model, so a configuration it would refuse is
    never written; prefixes left unset are chosen by the indexer from the model.
    """
    e, r = spec.embedding, spec.reranker
    raw: dict[str, Any] = {
        "name": name,
        "sources": [
            {"drive": s.drive, "root": f"{DRIVES_ROOT}/{s.drive}", "path": s.path}
            for s in spec.sources
        ],
        "embedding": {
            "url": embedding_url,
            "name": e.deployment,
            "query_prefix": e.query_prefix,
            "document_prefix": e.document_prefix,
        },
        "chunking": {"size": spec.chunking.size, "overlap": spec.chunking.overlap},
        "rescan_seconds": spec.rescan_seconds,
        "vectors": spec.vectors,
        "index_dir": INDEX_DIR,
        "host": "0.0.0.0",
        "port": port,
        "workers": min(64, max(2, spec.placement.cpu_cores)),
        "revisions": {d: rev for d, rev in sorted(revisions.items()) if d in spec.drives},
    }
    if r is not None and reranker_url is not None:
        raw["reranker"] = {
            "url": reranker_url,
            "name": r.deployment,
            "query_prefix": r.query_prefix or "",
        }
    return IndexerConfig.model_validate(raw)
