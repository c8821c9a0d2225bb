"""A KnowledgeBase's status as the operator writes it: its state, what it observed of the
indexer and the drives, the last evaluation, and the conditions Kubernetes tools read.

The field order is the order the status is written in. A status read back keeps fields
this version does not know (a newer operator's), so writing it again drops none of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from metis_operator.api import conditions

StateName = Literal["Pending", "Starting", "Indexing", "Ready", "Waiting", "Failed"]
"""The values of `status.state` (metis_operator.state.State, by value)."""

DATE_TIME = {"format": "date-time"}
"""An RFC 3339 time, kept as the string the API server holds."""
INT64 = {"format": "int64"}


class _Status(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class Embedding(_Status):
    answering: str | None = Field(
        default=None, description="The embedding model whose vectors answer questions now."
    )
    next: str | None = Field(
        default=None,
        description="A new embedding model whose vectors are made beside those that answer "
        "(they take their place at once when complete); absent when none is.",
    )
    done: int | None = Field(default=None, description="Chunks that have the new model's vector.")
    total: int | None = Field(
        default=None, description="Chunks the new model's vectors are made for."
    )


class Chunks(_Status):
    size: int = Field(description="Characters a chunk holds at most.")
    overlap: int = Field(description="Characters each chunk repeats of the one before.")


class Chunking(_Status):
    answering: Chunks | None = Field(
        default=None, description="The chunking of the index that answers searches now."
    )
    next: Chunks | None = Field(
        default=None,
        description="A new chunking whose index is built beside the one that answers (it "
        "takes its place at once when complete); absent when none is.",
    )
    done: int | None = Field(default=None, description="Documents the new index holds.")
    total: int | None = Field(
        default=None,
        description="Documents the new index is built of (those it holds and those still to read).",
    )


class IndexTotals(_Status):
    phase: str | None = Field(
        default=None,
        description="The index's own phase: loading, scanning, indexing, ready, waiting, or "
        "standby (a replacement that has loaded the index answers searches until the pod it "
        "replaces stops, then takes over).",
    )
    documents: int | None = Field(
        default=None, description="Documents indexed: the sources' and the base's own notes."
    )
    notes: int | None = Field(
        default=None,
        description="Notes the base keeps on its own drive (source metis-<name>), written over "
        "its API or MCP; the count only, never a note's text.",
    )
    chunks: int | None = Field(default=None, description="Chunks indexed.")
    failed: int | None = Field(
        default=None,
        description="Documents that could not be read; the indexer's /v1/documents says why "
        "for each.",
    )
    pass_total: int | None = Field(default=None, description="Documents the current pass reads.")
    pass_done: int | None = Field(
        default=None, description="Documents the current pass has read so far."
    )
    last_indexed_at: str | None = Field(
        default=None,
        description="When its last pass that read or dropped a document finished (or its "
        "first pass since the indexer started): a rescan that finds nothing changed leaves it.",
        json_schema_extra=DATE_TIME,
    )
    dimensions: int | None = Field(default=None, description="The dimensions of its embeddings.")
    vectors: str | None = Field(
        default=None, description="How its index holds vectors in memory (float32 or int8)."
    )
    embedding: Embedding | None = Field(
        default=None,
        description="Which embedding model answers, and how far a new one's vectors are made.",
    )
    chunking: Chunking | None = Field(
        default=None,
        description="Which chunking's index answers, and how far the index of a new one is built.",
    )


class Replicas(_Status):
    wanted: int = Field(description="The replicas its spec asks for.")
    answering: int = Field(
        description="The replicas whose indexer answers searches (its pod ready: a replica "
        "with peers is ready only once its index is complete)."
    )


class Drive(_Status):
    size_gib: float | None = Field(
        default=None, description="The index drive's size, in GiB (one decimal)."
    )
    used_percent: int | None = Field(
        default=None,
        description="How much of it is in use, in whole percent (so the status is not "
        "rewritten for every few bytes written). From 80, the base warns (DriveFilling).",
    )


class Restored(_Status):
    backup: str | None = Field(default=None, description="The backup the base was made from.")
    phase: str | None = Field(
        default=None,
        description="Restoring (its index and notes are read from the object store), "
        "Restored, or Failed (the indexer tries again; the base is Failed meanwhile).",
    )
    chunks: int | None = Field(default=None, description="Chunks read from the backup.")
    notes: int | None = Field(default=None, description="Notes read from the backup.")
    reembedding: str | None = Field(
        default=None,
        description="What is embedded again because the base's model or chunking differ from "
        "the backup's; absent when nothing is.",
    )


class Observed(_Status):
    index: IndexTotals | None = Field(
        default=None, description="Its index, as the indexer reports it (GET /v1/status)."
    )
    machine: str | None = Field(default=None, description="The node its indexer pod runs on.")
    address: str | None = Field(
        default=None,
        description="Its address for the namespace's workloads, "
        "http://metis-<name>.<namespace>.svc:7700 (searches at /v1/search).",
    )
    revisions: dict[str, str] | None = Field(
        default=None,
        description="For each source drive from a data source, the revision it reads (the "
        "drive's metis.astraeus.io/revision annotation).",
    )
    indexed_revisions: dict[str, str] | None = Field(
        default=None,
        description="For each source drive from a data source, the revision a finished pass "
        "indexed.",
    )
    warnings: list[str] | None = Field(
        default=None,
        description="What you should know, such as a model Service whose workload scales to "
        "zero (a search would wait for it to wake).",
    )
    replicas: Replicas | None = Field(
        default=None, description="Its replicas: those asked for, and those answering."
    )
    drive: Drive | None = Field(
        default=None,
        description="Its index drive, as its indexer sees it (the first replica's); absent "
        "while no indexer answers.",
    )
    restore: Restored | None = Field(
        default=None,
        description="The backup it was made from (spec.restore), as its indexer said it "
        "restored it; kept once restored.",
    )


class Evaluation(_Status):
    k: int | None = Field(default=None, description="Results looked at for each question, 1 to 50.")
    cases: int | None = Field(default=None, description="Questions asked.")
    recall_at_k: float | None = Field(
        default=None,
        description="The mean share of each question's expected documents found in its first "
        "k results, 0 to 1.",
    )
    mrr: float | None = Field(
        default=None,
        description="The mean reciprocal rank of each question's first expected document (1 "
        "when it comes first, 1/2 second, 0 when missing).",
    )
    at: str | None = Field(
        default=None, description="When the evaluation ran.", json_schema_extra=DATE_TIME
    )
    retrieval: str | None = Field(
        default=None,
        description="The retrieval settings it was measured under (embedding model Service, "
        "chunk size/overlap). The operator evaluates a Ready base again when they change and "
        "sets QualityRegressed when the figures fall beyond METIS_QUALITY_TOLERANCE.",
    )


class Condition(_Status):
    model_config = ConfigDict(json_schema_extra={"description": "One condition."})

    type: str = Field(description=conditions.named())
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str | None = Field(
        default=None, description="One CamelCase word for why (for Ready, the state)."
    )
    message: str | None = Field(default=None, description="Why, in words.")
    observed_generation: int | None = Field(
        default=None,
        alias="observedGeneration",
        description="The generation of the spec the condition was set for.",
        json_schema_extra=INT64,
    )
    last_transition_time: str | None = Field(
        default=None,
        alias="lastTransitionTime",
        description="When its status or message last changed.",
        json_schema_extra=DATE_TIME,
    )


class KnowledgeBaseStatus(_Status):
    state: StateName | None = Field(
        default=None,
        description="Its state. Pending: waiting for a node that can mount its drives, or for "
        "a data source's first revision. Starting: its index is loading, or a replacement pod "
        "is taking over (after a change, or its pod was deleted or evicted); the reason says "
        "whether searches are answered meanwhile. Indexing: reading documents; searches are "
        "answered from what is indexed. Ready: everything indexed with the current spec; "
        "watching its sources. Waiting: its index waits, most often for its embedding model; "
        "the reason names what. Failed: it cannot run as asked (a drive or model Service that "
        "does not exist, one that serves something else, a spec the operator refuses).",
    )
    reason: str | None = Field(default=None, description="Why it is in its state, in words.")
    observed_generation: int | None = Field(
        default=None,
        alias="observedGeneration",
        description="The generation (metadata.generation) of the spec this status was derived "
        "from. Ready is True only once the indexer runs that generation's configuration and "
        "the pass it asked for has finished.",
        json_schema_extra=INT64,
    )
    observed: Observed | None = Field(
        default=None, description="What the operator saw of its indexer and its drives."
    )
    conditions: list[Condition] | None = Field(
        default=None,
        description="The conditions Kubernetes tools read (kubectl wait, Argo CD, Flux). "
        + conditions.described(),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    progress: str | None = Field(
        default=None,
        description="The current pass's documents read so far, as read/total, while a pass reads.",
    )
    replicas: str | None = Field(
        default=None,
        description="Replicas answering searches out of those asked for, as answering/wanted "
        "(kubectl get kb shows it). Ready needs every one answering from a current index.",
    )
    evaluation: Evaluation | None = Field(
        default=None,
        description="The last evaluation, asked for with the annotation "
        "metis.astraeus.io/evaluate: the questions of .metis/evals.jsonl on its source "
        "drives, each with the documents it should find.",
    )

    @classmethod
    def read(cls, raw: Mapping[str, Any] | None) -> KnowledgeBaseStatus:
        """A stored status, however it was written: a field this version cannot read (a
        state a newer operator added, a hand-edited value) is left out rather than
        refusing the whole status, so one odd base never breaks a page or a loop."""
        fields = dict(raw or {})
        try:
            return cls.model_validate(fields)
        except ValidationError as e:
            unreadable = {error["loc"][0] for error in e.errors() if error["loc"]}
            return cls.model_validate({k: v for k, v in fields.items() if k not in unreadable})

    def dump(self) -> dict[str, Any]:
        """The status as it is written: the API's names, fields not set left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)
