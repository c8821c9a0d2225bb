"""A KnowledgeBase's spec as the operator reads it, and the indexer configuration it
turns into.

The limits are the indexer's (`metis_indexer.limits`, one home for both). The CRD is
generated from these models (`metis_operator.api.crd`), so the API server enforces the
same limits; they are checked again here because the operator never trusts a CRD it did
not install: an older or edited CRD must not make it write a Deployment or a
configuration that cannot run. Errors name the field as a user wrote it
(`spec.sources[1].path`).

Each field carries the description `kubectl explain` shows; what only the CRD says (its
CEL rules, a bound pydantic checks in a validator instead) sits beside the field in
`json_schema_extra`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from metis_indexer import limits
from metis_indexer.config import IndexerConfig

NAME_MAX = 40
NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
"""A base's name: lowercase letters, digits and -, not at either end (it names the
base's children, `metis-<name>` and `metis-<name>-replica-<i>`, with room to spare)."""
REPLICAS_MIN, REPLICAS_DEFAULT, REPLICAS_MAX = 1, 1, 10
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
LABELS_MAX = 32
"""Node labels a placement may ask for (the CRD's bound; the operator takes any number)."""
LABEL_KEY_RE = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
LABEL_VALUE_RE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
LABEL_VALUE_MAX = 63
LABEL_KEY_MAX = DRIVE_MAX + 1 + LABEL_VALUE_MAX
"""A prefix (a DNS subdomain), a /, and a name."""
TOLERATIONS_MAX = 32
TERMS_MAX = 8
"""Node affinity terms (any one matches) and the expressions of each (all match)."""
EXPRESSIONS_MAX = 16
VALUES_MAX = 64
ANNOTATIONS_MAX = 32
ANNOTATION_VALUE_MAX = 4096
INDEX_SIZE_MAX = 65_536
"""GiB: 64 TiB, past any drive a base's memory could fill."""
OWN_PREFIX = "metis.astraeus.io/"
OWN_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/component",
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/managed-by",
)
"""The labels the operator puts on an indexer pod (`children.labels`): its Deployment's
selector, its Service and its NetworkPolicy pick the pods by them, so a pod label of the
spec may not set them, nor any label or annotation under the operator's group."""

DRIVES_ROOT = "/drives"
INDEX_DIR = "/index"
ARTIFACTS_FOLDER = "artifacts"
BACKUP_SECRET_DIR = "/etc/metis-stores/backup"
"""Where the indexer pods mount the Secret of spec.backup's object store."""
RESTORE_SECRET_DIR = "/etc/metis-stores/restore"
"""Where the indexer pods mount the Secret of spec.restore's object store."""
"""Of the index drive: where the indexer unpacks the artifacts of Flux sources."""


def cel_regex(pattern: str) -> str:
    """`pattern` as a CEL string literal may hold it: `\\.` is no escape CEL knows, `[.]`
    matches the same."""
    return pattern.replace("\\.", "[.]")


class SpecError(ValueError):
    """The spec cannot run; the message names each offending field."""


class _Model(BaseModel):
    """A part of the spec. A field it does not know is ignored, not refused: the API server
    refuses unknown fields under this operator's CRD, so one reaches it only from a newer
    CRD, whose fields are additive and default to what an older operator does
    (`unknown_fields` says which, in the base's warnings). Refusing it would fail a base
    that runs."""

    model_config = ConfigDict(extra="ignore", frozen=True)


FluxKind = Literal["GitRepository", "Bucket", "OCIRepository"]
FLUX_KINDS: tuple[FluxKind, ...] = get_args(FluxKind)


class FluxSource(_Model):
    model_config = ConfigDict(
        json_schema_extra={
            "description": "A Flux source object of the base's namespace, read at the revision "
            "of its artifact."
        }
    )

    kind: FluxKind = Field(
        description="GitRepository, Bucket or OCIRepository (source.toolkit.fluxcd.io/v1)."
    )
    name: str = Field(
        pattern=DRIVE_RE,
        max_length=DRIVE_MAX,
        description="Its name. No such object makes the base Failed; one without an "
        "artifact yet keeps it Pending. Its documents are cited under this name.",
    )

    @property
    def said(self) -> str:
        """As reasons and Events name it: "GitRepository docs"."""
        return f"{self.kind} {self.name}"


class Source(_Model):
    model_config = ConfigDict(
        json_schema_extra={
            "description": "One drive, or one Flux source object, or one folder of either.",
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.drive) != has(self.flux)",
                    "message": "spec.sources[]: name either a drive or a flux source object",
                }
            ],
        }
    )

    drive: str | None = Field(
        default=None,
        pattern=DRIVE_RE,
        max_length=DRIVE_MAX,
        description="A drive of the namespace: a PersistentVolumeClaim, plain or filled by a "
        "data source (then annotated metis.astraeus.io/revision, and a new revision starts a "
        "pass). The indexer mounts it read-only at /drives/<drive>; a missing drive makes the "
        "base Failed.",
    )
    flux: FluxSource | None = Field(
        default=None,
        description="Instead of a drive: a Flux source object (GitRepository, Bucket, "
        "OCIRepository) of the namespace. The indexer fetches the artifact of its revision "
        "from the source-controller, checks its digest and unpacks it on its own drive; a new "
        "revision starts a pass that reads exactly that revision, and only the files it "
        "changed.",
    )
    path: str | None = Field(
        default=None,
        min_length=1,
        max_length=limits.PATH_MAX,
        description="Only the documents under this folder of the drive: relative, with no "
        "empty, . or .. parts. Not set: the whole drive.",
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.matches('^[^/]+(/[^/]+)*$') && "
                    "!self.matches('(^|/)[.][.]?(/|$)')",
                    "message": "spec.sources[].path must be a folder of the drive: relative, "
                    "with no leading or trailing /, and no empty, . or .. parts",
                }
            ]
        },
    )

    @field_validator("path")
    @classmethod
    def _plain_folder(cls, v: str | None) -> str | None:
        """The path rule, and no empty part (`a//b`, a trailing /) as the CRD says."""
        if v is not None and (limits.path_problem(v) or "" in v.split("/")):
            raise ValueError(
                "must be a folder of the drive: relative, without empty, . or .. parts"
            )
        return v

    @model_validator(mode="after")
    def _one_place(self) -> Source:
        if (self.drive is None) == (self.flux is None):
            raise ValueError("name either a drive or a flux source object")
        return self

    @property
    def name(self) -> str:
        """What its documents are cited under: the drive's name, or the Flux object's."""
        if self.flux is not None:
            return self.flux.name
        assert self.drive is not None
        return self.drive

    @property
    def said(self) -> str:
        """As reasons and Events name it: "drive docs", "GitRepository docs"."""
        return self.flux.said if self.flux is not None else f"drive {self.name}"

    def contains(self, other: Source) -> bool:
        """Whether one of the two sources holds the other (same name, nested paths)."""
        if self.name != other.name:
            return False
        if self.path is None or other.path is None:
            return True
        a, b = PurePosixPath(self.path).parts, PurePosixPath(other.path).parts
        n = min(len(a), len(b))
        return a[:n] == b[:n]


class Embedding(_Model):
    deployment: str = Field(
        pattern=SERVICE_RE,
        max_length=SERVICE_MAX,
        description="A Service of the namespace in front of an embedding model server (one "
        "that answers POST /v1/embeddings, as TEI, vLLM, Infinity and Ollama do). No such "
        "Service, or one that serves something else, makes the base Failed.",
    )
    query_prefix: str | None = Field(
        default=None,
        max_length=PREFIX_MAX,
        description="Put before each question when it is embedded. Not set: the prefix the "
        'model was trained with ("search_query: " for Nomic Embed Text, "query: " for E5, '
        '"Represent this sentence for searching relevant passages: " for BGE English, mxbai '
        'and Snowflake Arctic, an instruction for Qwen3 Embedding, "task: search result | '
        'query: " for EmbeddingGemma), none for other models (BGE-M3, MiniLM, Granite). '
        "Empty: none.",
    )
    document_prefix: str | None = Field(
        default=None,
        max_length=PREFIX_MAX,
        description="Put before each passage when it is embedded. Not set: the model's own "
        '("search_document: " for Nomic, "passage: " for E5, "title: none | text: " for '
        "EmbeddingGemma), none for other models. Empty: none.",
    )


class Reranker(_Model):
    deployment: str = Field(
        pattern=SERVICE_RE,
        max_length=SERVICE_MAX,
        description="A Service of the namespace in front of a reranker (one that answers "
        "POST /v1/rerank, or TEI's POST /rerank). No such Service, or one that serves "
        "something else, makes the base Failed.",
    )
    query_prefix: str | None = Field(
        default=None,
        max_length=PREFIX_MAX,
        description="Put before each question sent to the reranker. Not set, none.",
    )


_OVERLAP_RULE = (
    "spec.chunking.overlap ({overlap}) must be less than half of spec.chunking.size ({size}): "
    "set a smaller overlap or a larger size"
)
"""The overlap rule's message, the CRD's and the operator's."""


class Chunking(_Model):
    # The API server fills in the defaults before the rule runs, so an unset overlap is
    # the default. One format call a branch: it estimates string(int), and joining
    # formatted strings, as too costly.
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.overlap * 2 < self.size",
                    "fieldPath": ".overlap",
                    "message": "spec.chunking.overlap must be less than half of spec.chunking.size",
                    "messageExpression": f"self.overlap == {limits.CHUNK_OVERLAP_DEFAULT} ? '"
                    + _OVERLAP_RULE.format(
                        overlap=f"{limits.CHUNK_OVERLAP_DEFAULT}, its default when not set",
                        size="%d",
                    )
                    + "'.format([self.size]) : '"
                    + _OVERLAP_RULE.format(overlap="%d", size="%d")
                    + "'.format([self.overlap, self.size])",
                }
            ]
        }
    )

    size: int = Field(
        default=limits.CHUNK_SIZE_DEFAULT,
        ge=limits.CHUNK_SIZE_MIN,
        le=limits.CHUNK_SIZE_MAX,
        description=f"Characters per chunk, at most; {limits.CHUNK_SIZE_MIN} to "
        f"{limits.CHUNK_SIZE_MAX}. Not set, {limits.CHUNK_SIZE_DEFAULT}.",
    )
    overlap: int = Field(
        default=limits.CHUNK_OVERLAP_DEFAULT,
        ge=0,
        description="Characters each chunk repeats of the one before; less than half of "
        f"size. Not set, {limits.CHUNK_OVERLAP_DEFAULT}.",
        # Below half of the largest size; the model's rule (below half of this size)
        # says more than a bound would.
        json_schema_extra={"maximum": (limits.CHUNK_SIZE_MAX - 1) // 2},
    )

    @model_validator(mode="after")
    def _overlap_below_half(self) -> Chunking:
        if not limits.overlap_allowed(self.size, self.overlap):
            # Name the default when the user set none: they never wrote the 200.
            unset = "" if "overlap" in self.model_fields_set else ", its default when not set"
            raise ValueError(_OVERLAP_RULE.format(overlap=f"{self.overlap}{unset}", size=self.size))
        return self


def _label_key_problem(key: str) -> str | None:
    if len(key) > LABEL_KEY_MAX or not LABEL_KEY_RE.match(key):
        return f"{key!r} is not a label key"
    return None


def _label_problems(labels: Mapping[str, str]) -> list[str]:
    out = []
    for key, value in labels.items():
        if problem := _label_key_problem(key):
            out.append(problem)
        elif len(value) > LABEL_VALUE_MAX or not LABEL_VALUE_RE.match(value):
            out.append(f"{value!r} (of {key}) is not a label value")
    return out


_LABEL_KEYS_RULE = {
    "rule": f"self.all(k, size(k) <= {LABEL_KEY_MAX} && "
    f"k.matches('{cel_regex(LABEL_KEY_RE.pattern)}'))",
}


class Toleration(_Model):
    """A taint the pod tolerates, as in a pod's spec (Kubernetes' names and rules)."""

    model_config = ConfigDict(
        json_schema_extra={
            "description": "A taint the indexer pod tolerates, as in a pod's tolerations.",
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.operator) || self.operator != 'Exists' || "
                    "!has(self.value) || self.value == ''",
                    "message": "a toleration with operator Exists has no value",
                },
                {
                    "rule": "(has(self.key) && self.key != '') || "
                    "(has(self.operator) && self.operator == 'Exists')",
                    "message": "a toleration without a key must have operator Exists "
                    "(it tolerates every taint)",
                },
                {
                    "rule": "!has(self.tolerationSeconds) || "
                    "(has(self.effect) && self.effect == 'NoExecute')",
                    "message": "tolerationSeconds is for effect NoExecute only",
                },
            ],
        }
    )

    key: str | None = Field(
        default=None,
        max_length=LABEL_KEY_MAX,
        description="The taint's key. Not set, with operator Exists: every taint.",
    )
    operator: Literal["Equal", "Exists"] | None = Field(
        default=None,
        description="Equal: the taint's value must be value. Exists: any value. Not set, Equal.",
    )
    value: str | None = Field(
        default=None, max_length=LABEL_VALUE_MAX, description="The taint's value, for Equal."
    )
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="The taint's effect. Not set: every effect."
    )
    toleration_seconds: int | None = Field(
        default=None,
        alias="tolerationSeconds",
        ge=0,
        description="For NoExecute: how long the pod stays on a machine after the taint is "
        "added. Not set: for ever.",
    )

    @model_validator(mode="after")
    def _kubernetes_rules(self) -> Toleration:
        if self.key and (problem := _label_key_problem(self.key)):
            raise ValueError(problem)
        if self.operator == "Exists" and self.value:
            raise ValueError("a toleration with operator Exists has no value")
        if not self.key and self.operator != "Exists":
            raise ValueError(
                "a toleration without a key must have operator Exists (it tolerates every taint)"
            )
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds is for effect NoExecute only")
        return self

    def manifest(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class NodeRequirement(_Model):
    """One rule on a node's labels, as in a pod's node affinity."""

    model_config = ConfigDict(
        json_schema_extra={
            "description": "A rule on a node's labels, as in a node selector term.",
            "x-kubernetes-validations": [
                {
                    "rule": "self.operator in ['Exists', 'DoesNotExist'] ? "
                    "(!has(self.values) || size(self.values) == 0) : "
                    "self.operator in ['Gt', 'Lt'] ? "
                    "(has(self.values) && size(self.values) == 1) : "
                    "(has(self.values) && size(self.values) > 0)",
                    "message": "values: none for Exists and DoesNotExist, one number for Gt "
                    "and Lt, at least one for In and NotIn",
                }
            ],
        }
    )

    key: str = Field(max_length=LABEL_KEY_MAX, description="A node label's key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"] = Field(
        description="How the label's value is compared with values."
    )
    values: list[str] = Field(
        default_factory=list,
        max_length=VALUES_MAX,
        description="In and NotIn: one or more; Gt and Lt: one integer; none otherwise.",
        json_schema_extra={"items": {"maxLength": LABEL_VALUE_MAX}},
    )

    @model_validator(mode="after")
    def _kubernetes_rules(self) -> NodeRequirement:
        if problem := _label_key_problem(self.key):
            raise ValueError(problem)
        n = len(self.values)
        if self.operator in ("Exists", "DoesNotExist") and n:
            raise ValueError(f"operator {self.operator} takes no values")
        if self.operator in ("Gt", "Lt") and (n != 1 or not self.values[0].lstrip("-").isdigit()):
            raise ValueError(f"operator {self.operator} takes one integer value")
        if self.operator in ("In", "NotIn") and not n:
            raise ValueError(f"operator {self.operator} takes at least one value")
        return self


class NodeTerm(_Model):
    """Nodes matching every requirement; of several terms, a node matching any one."""

    model_config = ConfigDict(
        json_schema_extra={
            "description": "Nodes that match every one of matchExpressions (a node selector term)."
        }
    )

    match_expressions: list[NodeRequirement] = Field(
        alias="matchExpressions",
        min_length=1,
        max_length=EXPRESSIONS_MAX,
        description="Rules on the node's labels; all must match.",
    )

    def manifest(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class Pod(_Model):
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="Put on the indexer pods (cost allocation, a service mesh, policies). Not "
        "the app.kubernetes.io/ labels the operator sets, nor any under metis.astraeus.io/. "
        "A change replaces the pods, one at a time, searches answered meanwhile.",
        json_schema_extra={
            "maxProperties": LABELS_MAX,
            "x-kubernetes-validations": [
                {
                    **_LABEL_KEYS_RULE,
                    "message": "spec.pod.labels has a key that is not a label key",
                },
                {
                    "rule": "self.all(k, !(k in "
                    + "["
                    + ", ".join(f"'{k}'" for k in OWN_LABELS)
                    + "]) && "
                    f"!k.startsWith('{OWN_PREFIX}'))",
                    "message": "spec.pod.labels may not set the labels the operator picks its "
                    f"pods by ({', '.join(OWN_LABELS)}) nor any under {OWN_PREFIX}",
                },
            ],
            "additionalProperties": {
                "maxLength": LABEL_VALUE_MAX,
                "pattern": LABEL_VALUE_RE.pattern,
            },
        },
    )
    annotations: dict[str, str] = Field(
        default_factory=dict,
        description="Put on the indexer pods (a service mesh's, a backup tool's). None under "
        "metis.astraeus.io/. A change replaces the pods, one at a time.",
        json_schema_extra={
            "maxProperties": ANNOTATIONS_MAX,
            "x-kubernetes-validations": [
                {
                    **_LABEL_KEYS_RULE,
                    "message": "spec.pod.annotations has a key that is not an annotation key",
                },
                {
                    "rule": f"self.all(k, !k.startsWith('{OWN_PREFIX}'))",
                    "message": f"spec.pod.annotations may not set any under {OWN_PREFIX}",
                },
            ],
            "additionalProperties": {"maxLength": ANNOTATION_VALUE_MAX},
        },
    )

    priority_class: str | None = Field(
        default=None,
        pattern=DRIVE_RE,
        max_length=DRIVE_MAX,
        description="The PriorityClass of the indexer pods: which pods the scheduler evicts "
        "for them, or them for. Not set, the cluster's default.",
    )

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        if problems := _label_problems(v):
            raise ValueError(problems[0])
        own = [k for k in v if k in OWN_LABELS or k.startswith(OWN_PREFIX)]
        if own:
            raise ValueError(
                f"{own[0]} is a label the operator sets on its pods (it picks them by "
                f"{', '.join(OWN_LABELS)}); name another"
            )
        return v

    @field_validator("annotations")
    @classmethod
    def _annotations(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if problem := _label_key_problem(key):
                raise ValueError(problem.replace("label key", "annotation key"))
            if key.startswith(OWN_PREFIX):
                raise ValueError(f"{key} is under {OWN_PREFIX}, the operator's own; name another")
            if len(value) > ANNOTATION_VALUE_MAX:
                raise ValueError(f"the value of {key} is over {ANNOTATION_VALUE_MAX} characters")
        return v


class IndexDrive(_Model):
    storage_class: str | None = Field(
        default=None,
        pattern=DRIVE_RE,
        max_length=DRIVE_MAX,
        description="The StorageClass of the base's own drives (its index and notes, one per "
        "replica). Not set: the operator's (METIS_STORAGE_CLASS), else the cluster's default. "
        "A drive keeps the class it was made with: a change reaches new replicas only, and "
        "the base warns.",
    )
    size_gb: int | None = Field(
        default=None,
        ge=1,
        le=INDEX_SIZE_MAX,
        description="GiB each index drive asks at least. Not set: what placement.memory_gb "
        "holds, twice (a change is built beside), and at least the operator's "
        "METIS_INDEX_STORAGE. A larger size grows a bound drive where its StorageClass allows.",
    )


class Placement(_Model):
    machines: list[str] = Field(
        default_factory=list,
        max_length=MACHINES_MAX,
        description="Only on one of these nodes (by name, kubernetes.io/hostname). Not set, "
        "any node.",
        json_schema_extra={"items": {"maxLength": DRIVE_MAX, "pattern": DRIVE_RE}},
    )
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="Only on nodes with all these labels (a pool).",
        json_schema_extra={
            "maxProperties": LABELS_MAX,
            "x-kubernetes-validations": [
                {
                    **_LABEL_KEYS_RULE,
                    "message": "spec.placement.labels has a key that is not a label key",
                }
            ],
            "additionalProperties": {
                "maxLength": LABEL_VALUE_MAX,
                "pattern": LABEL_VALUE_RE.pattern,
            },
        },
    )
    tolerations: list[Toleration] = Field(
        default_factory=list,
        max_length=TOLERATIONS_MAX,
        description="Taints the indexer pods tolerate, as in a pod's tolerations: a tainted "
        "pool (GPU, dedicated search machines) runs a base only with one. Not set, none.",
    )
    node_affinity: list[NodeTerm] = Field(
        default_factory=list,
        max_length=TERMS_MAX,
        description="Only on nodes that match one of these terms (a pod's required node "
        "affinity, nodeSelectorTerms): zones, instance types, anything labels alone cannot say. "
        "With machines, both must hold. Not set, any node.",
    )
    cpu_cores: int = Field(
        default=CPU_DEFAULT,
        ge=CPU_MIN,
        le=CPU_MAX,
        description=f"CPU cores it is placed by (its request), {CPU_MIN} to {CPU_MAX}; it uses "
        f"the node's idle cores beyond them (no CPU limit). Not set, {CPU_DEFAULT}.",
    )
    memory_gb: int = Field(
        default=MEMORY_DEFAULT,
        ge=MEMORY_MIN,
        le=MEMORY_MAX,
        description=f"Memory in GiB, its request and its limit, {MEMORY_MIN} to {MEMORY_MAX}. "
        f"Not set, {MEMORY_DEFAULT}. The index is held in memory: about 5 KB a chunk at 1024 "
        "dimensions (2 KB with vectors: int8).",
    )

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
        if problems := _label_problems(v):
            raise ValueError(problems[0])
        return v


ENDPOINT_RE = r"^https?://[^/?# ]+(/[^?# ]*)?$"
"""An object store's endpoint: an http(s) URL, a host and perhaps a path."""
ENDPOINT_MAX = 2048
BUCKET_RE = r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$"
"""An S3 bucket's name: 3 to 63 lowercase letters, digits, . and -."""
OBJECT_PREFIX_MAX = 1024
REGION_RE = r"^[a-z0-9][-a-z0-9]*$"
REGION_MAX = 64
BACKUP_MAX = 253
"""A backup's name is its KnowledgeBaseBackup's (a DNS-1123 subdomain)."""
STORE_SECRET_KEYS = ("accesskey", "secretkey")
"""The keys of an object store's Secret: a Flux Bucket's key names."""


def _matches(pattern: str, value: str, said: str) -> str:
    if not re.match(pattern, value):
        raise ValueError(said)
    return value


class ObjectStore(_Model):
    model_config = ConfigDict(
        json_schema_extra={
            "description": "An S3-compatible object store: a bucket at an endpoint, a prefix "
            "of its keys, and a Secret of the base's namespace holding the key pair "
            "(accesskey, secretkey: a Flux Bucket's key names)."
        }
    )

    endpoint: str = Field(
        max_length=ENDPOINT_MAX,
        description="The S3 API's URL, http:// or https:// (path-style addressing), such "
        "as https://s3.eu-west-1.amazonaws.com or http://minio.storage.svc:9000.",
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": f"self.matches('{ENDPOINT_RE}')",
                    "message": "object_store.endpoint must be an http:// or https:// URL "
                    "(http://minio.storage.svc:9000)",
                }
            ]
        },
    )
    bucket: str = Field(
        description="The bucket: 3 to 63 lowercase letters, digits, . and -.",
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": f"self.matches('{BUCKET_RE}')",
                    "message": "object_store.bucket must be a bucket name: 3 to 63 lowercase "
                    "letters, digits, . and -, starting and ending with a letter or digit",
                }
            ]
        },
    )
    prefix: str = Field(
        default="",
        max_length=OBJECT_PREFIX_MAX,
        description="The prefix of the backups' keys: each backup lives under "
        "<prefix>/<backup name>/. Not set: none.",
    )
    region: str = Field(
        default="us-east-1",
        max_length=REGION_MAX,
        description="The region the requests are signed for. Not set, us-east-1.",
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": f"self.matches('{REGION_RE}')",
                    "message": "object_store.region must be lowercase letters, digits and -",
                }
            ]
        },
    )
    secret_name: str = Field(
        max_length=DRIVE_MAX,
        description="A Secret of the base's namespace with the keys accesskey and secretkey; "
        "the indexer pods mount it. A missing Secret keeps the pod from starting.",
        json_schema_extra={"pattern": DRIVE_RE},
    )

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str) -> str:
        return _matches(
            ENDPOINT_RE, v, f"{v!r} is not an http:// or https:// URL (http://minio:9000)"
        )

    @field_validator("bucket")
    @classmethod
    def _bucket(cls, v: str) -> str:
        return _matches(
            BUCKET_RE,
            v,
            f"{v!r} is not a bucket name: 3 to 63 lowercase letters, digits, . and -, "
            "starting and ending with a letter or digit",
        )

    @field_validator("region")
    @classmethod
    def _region(cls, v: str) -> str:
        return _matches(REGION_RE, v, f"{v!r} is not a region: lowercase letters, digits and -")

    @field_validator("secret_name")
    @classmethod
    def _secret(cls, v: str) -> str:
        return _matches(
            DRIVE_RE,
            v,
            f"{v!r} is not a Secret's name: lowercase letters, digits, - and . (DNS-1123)",
        )

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, v: str) -> str:
        if v and limits.path_problem(v.strip("/")):
            raise ValueError(f"{v!r} must be a plain key prefix, without . or .. parts")
        return v


class Backup(_Model):
    object_store: ObjectStore = Field(
        description="Where its backups are written: each KnowledgeBaseBackup of the base "
        "makes one, named after the object, under <prefix>/<name>/ of the bucket."
    )


class Restore(_Model):
    object_store: ObjectStore = Field(
        description="The object store holding the backup; any base's, of any namespace or "
        "cluster (its Secret must be in this base's namespace)."
    )
    backup: str = Field(
        max_length=BACKUP_MAX,
        description="The backup's name (its KnowledgeBaseBackup's).",
        json_schema_extra={"pattern": DRIVE_RE},
    )

    @field_validator("backup")
    @classmethod
    def _backup(cls, v: str) -> str:
        return _matches(
            DRIVE_RE, v, f"{v!r} is not a backup's name: lowercase letters, digits, - and ."
        )


class KnowledgeBaseSpec(_Model):
    sources: list[Source] = Field(
        min_length=limits.SOURCES_MIN,
        max_length=limits.SOURCES_MAX,
        description=f"What it reads: {limits.SOURCES_MIN} to {limits.SOURCES_MAX} sources. "
        "Two sources of one drive may not overlap (handbook and handbook/hr).",
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.all(a, self.filter(b, (has(b.drive) ? b.drive : b.flux.name) == "
                    "(has(a.drive) ? a.drive : a.flux.name) && (!has(a.path) || "
                    "!has(b.path) || a.path == b.path || b.path.startsWith(a.path + '/') || "
                    "a.path.startsWith(b.path + '/'))).size() == 1)",
                    "message": "spec.sources: two sources of one name may not overlap (one "
                    "may not contain the other, as handbook and handbook/hr)",
                }
            ]
        },
    )
    embedding: Embedding = Field(
        description="The embedding model that turns passages and questions into vectors for "
        "search by meaning."
    )
    reranker: Reranker | None = Field(
        default=None,
        description="A reranker that orders the best candidates again. Without one, results "
        "come in the fused order of the word and meaning searches.",
    )
    # A default is validated as written, without the defaults inside it: the CRD's default
    # of an object names each of its fields' defaults.
    chunking: Chunking = Field(
        default=Chunking(),
        description="How documents are cut into chunks, the pieces that are embedded and that "
        "searches return. A change reads every document again.",
    )
    placement: Placement = Field(
        default=Placement(),
        description="Where its indexer pod runs, and the cores and memory it is given.",
    )
    pod: Pod | None = Field(
        default=None,
        description="What the indexer pods carry besides the operator's own: labels, "
        "annotations, a priority class.",
    )
    index_drive: IndexDrive | None = Field(
        default=None,
        description="The base's own drives: their StorageClass and least size.",
    )
    replicas: int = Field(
        default=REPLICAS_DEFAULT,
        ge=REPLICAS_MIN,
        le=REPLICAS_MAX,
        description=f"Indexer pods answering its searches: {REPLICAS_MIN} to {REPLICAS_MAX}. "
        "Each has an index drive of its own and is kept on a machine of its own where the "
        "cluster has enough; a new one takes the vectors its peers hold rather than asking "
        "the embedding model again. With two or more, a drain or an eviction takes one at a "
        f"time. Not set, {REPLICAS_DEFAULT}.",
    )
    rescan_seconds: int = Field(
        default=limits.RESCAN_DEFAULT,
        description="Seconds between two looks for changed documents: 0 (only when asked, or "
        f"when a data source's drive has a new revision) or {limits.RESCAN_MIN} to "
        f"{limits.RESCAN_MAX}. Not set, {limits.RESCAN_DEFAULT}.",
        json_schema_extra={
            "minimum": 0,
            "maximum": limits.RESCAN_MAX,
            "x-kubernetes-validations": [
                {
                    "rule": f"self == 0 || self >= {limits.RESCAN_MIN}",
                    "message": "spec.rescan_seconds must be 0 (only when asked) or "
                    f"{limits.RESCAN_MIN} to {limits.RESCAN_MAX}",
                }
            ],
        },
    )
    backup: Backup | None = Field(
        default=None,
        description="Where the base's backups go: an object store. A KnowledgeBaseBackup "
        "of the base makes one (docs/backups.md).",
    )
    restore: Restore | None = Field(
        default=None,
        description="A backup the base is made from when it is created: its index and notes "
        "are read from the object store before the first pass, and nothing is embedded "
        "again when the model and chunking match. Read only into an empty index: set on "
        "or changed for a base that has one, it does nothing but warn.",
    )
    vectors: limits.VectorKind = Field(
        default=limits.VECTORS_DEFAULT,
        description="How the index holds its vectors in memory. float32: as they are. int8: "
        "scaled int8 codes scanned for candidates, the best few hundred rescored exactly from "
        "float32 vectors on the index drive; about a quarter of the vectors' memory, the same "
        f"answers. Not set, {limits.VECTORS_DEFAULT}.",
    )

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
                if a.flux != b.flux and a.name == b.name:
                    raise ValueError(
                        f"spec.sources[{i}] and spec.sources[{j}] are both named {a.name}: "
                        "its documents are cited under the name, so one name is one drive or "
                        "one flux source object"
                    )
                if a.contains(b):
                    raise ValueError(
                        f"spec.sources[{i}] and spec.sources[{j}] overlap: two sources of "
                        f"{a.name} may not contain each other"
                    )
        return self

    @property
    def drives(self) -> list[str]:
        """The source drives, each once, sorted."""
        return sorted({s.drive for s in self.sources if s.drive is not None})

    def sources_said(
        self, revisions: Mapping[str, str] | None, indexed: Mapping[str, str] | None
    ) -> list[str]:
        """Each source once, as the plugin and the console show it: a drive by its name, a
        Flux object by its kind too; the revision each is read at (`revisions`), and the
        one `indexed` where that is not it yet."""
        shown: dict[str, str] = {}
        for source in self.sources:
            kind = [source.flux.kind] if source.flux is not None else []
            revision = (revisions or {}).get(source.name)
            done = (indexed or {}).get(source.name)
            said = " ".join([*kind, *([f"at {revision}"] if revision else [])])
            if revision and done != revision:
                said += f"; indexed {done or 'none yet'}"
            shown.setdefault(source.name, source.name + (f" ({said})" if said else ""))
        return list(shown.values())

    @property
    def fluxes(self) -> list[FluxSource]:
        """The Flux source objects read, each once, sorted by name."""
        return sorted({s.flux for s in self.sources if s.flux is not None}, key=lambda f: f.name)


def unknown_fields(
    raw: Mapping[str, Any], model: type[BaseModel] | None = None, where: str = "spec"
) -> list[str]:
    """The fields of `raw` (a spec as stored) that the models do not know, as a user would
    name them (`spec.sources[0].exclude`)."""
    out: list[str] = []
    fields = {
        info.alias or name: info for name, info in (model or KnowledgeBaseSpec).model_fields.items()
    }
    for key, value in raw.items():
        field = fields.get(key)
        if field is None:
            out.append(f"{where}.{key}")
            continue
        inner = _model_of(field.annotation)
        if inner is None:
            continue
        items = enumerate(value) if isinstance(value, list) else [(None, value)]
        for i, item in items:
            if isinstance(item, Mapping):
                out += unknown_fields(
                    item, inner, f"{where}.{key}" + ("" if i is None else f"[{i}]")
                )
    return out


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds (alone, in a list, or optional); None for plain values."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        if (found := _model_of(arg)) is not None:
            return found
    return None


def _where(loc: tuple[int | str, ...]) -> str:
    out = "spec"
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def check_name(name: str) -> None:
    """Raise SpecError unless `name` is a valid base name (metadata.name)."""
    if len(name) > NAME_MAX or not NAME_RE.match(name):
        raise SpecError(
            f"metadata.name {name!r} must be lowercase letters, digits and -, not starting "
            f"or ending with -, at most {NAME_MAX} characters"
        )


def parse(name: str, spec: Mapping[str, Any]) -> KnowledgeBaseSpec:
    """The spec, checked; SpecError names every field that is wrong."""
    check_name(name)
    try:
        parsed = KnowledgeBaseSpec.model_validate(dict(spec))
    except ValidationError as e:
        problems = []
        for err in e.errors(include_url=False):
            message = err["msg"].removeprefix("Value error, ")
            where = _where(err["loc"])
            problems.append(message if message.startswith("spec.") else f"{where}: {message}")
        raise SpecError("; ".join(problems)) from None
    own = f"metis-{name}"
    for i, source in enumerate(parsed.sources):
        if source.name == own:
            field = "drive" if source.drive is not None else "flux.name"
            raise SpecError(
                f"spec.sources[{i}].{field}: {own} is the base's own drive (its index, and its "
                f"notes as source {own}); name a drive of your documents"
            )
    return parsed


def _source_config(s: Source, artifacts: Mapping[str, Mapping[str, str]]) -> dict[str, Any]:
    if s.flux is None:
        return {"drive": s.name, "root": f"{DRIVES_ROOT}/{s.name}", "path": s.path}
    artifact = {**artifacts[s.name], "origin": s.flux.said}
    root = f"{INDEX_DIR}/{ARTIFACTS_FOLDER}/{s.name}"
    return {"drive": s.name, "root": root, "path": s.path, "artifact": artifact}


def _store_config(store: ObjectStore, secret_dir: str) -> dict[str, Any]:
    return {
        "endpoint": store.endpoint,
        "bucket": store.bucket,
        "prefix": store.prefix,
        "region": store.region,
        "secret_dir": secret_dir,
    }


def stores(spec: KnowledgeBaseSpec) -> dict[str, str]:
    """The Secrets of the object stores the spec names, by the folder the indexer pods
    mount each at."""
    out = {}
    if spec.backup is not None:
        out[BACKUP_SECRET_DIR] = spec.backup.object_store.secret_name
    if spec.restore is not None:
        out[RESTORE_SECRET_DIR] = spec.restore.object_store.secret_name
    return out


def to_indexer_config(
    name: str,
    spec: KnowledgeBaseSpec,
    *,
    port: int,
    embedding_url: str,
    reranker_url: str | None,
    revisions: Mapping[str, str],
    peers: Sequence[str] = (),
    artifacts: Mapping[str, Mapping[str, str]] | None = None,
) -> IndexerConfig:
    """The indexer's configuration for the pod: source drives mounted at
    /drives/<drive>, the index drive at /index, the models at their Services' URLs;
    with replicas, `peers` (the base's Service): where a replica's first pass takes
    vectors already made. `artifacts`: each Flux source's artifact by its name (url,
    digest, revision), unpacked by the indexer under /index/artifacts/<name>. The object
    stores of spec.backup and spec.restore with their Secrets' folders (`stores`); the
    indexer reads a restore only into an empty index, so it stays in the configuration.

    Built with the indexer's own model, so a configuration it would refuse is
    never written; prefixes left unset are chosen by the indexer from the model.
    """
    e, r = spec.embedding, spec.reranker
    raw: dict[str, Any] = {
        "name": name,
        "sources": [_source_config(s, artifacts or {}) for s in spec.sources],
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
    if peers:
        raw["peers"] = list(peers)
    if spec.backup is not None:
        raw["backup_store"] = _store_config(spec.backup.object_store, BACKUP_SECRET_DIR)
    if spec.restore is not None:
        store = _store_config(spec.restore.object_store, RESTORE_SECRET_DIR)
        raw["restore"] = {"store": store, "backup": spec.restore.backup}
    if r is not None and reranker_url is not None:
        raw["reranker"] = {
            "url": reranker_url,
            "name": r.deployment,
            "query_prefix": r.query_prefix or "",
        }
    return IndexerConfig.model_validate(raw)
