"""The condition types a base's status carries, each said once: the operator sets them by
these names, and the CRD's descriptions (`kubectl explain`) are made from `MEANING`."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType


class ConditionType(enum.StrEnum):
    READY = "Ready"
    RECONCILING = "Reconciling"
    STALLED = "Stalled"
    PAUSED = "Paused"
    EMBEDDING_MODEL_AVAILABLE = "EmbeddingModelAvailable"
    RERANKER_AVAILABLE = "RerankerAvailable"
    QUALITY_REGRESSED = "QualityRegressed"
    DRIVE_FILLING = "DriveFilling"
    RESTORED = "Restored"


MEANING: Mapping[ConditionType, str] = MappingProxyType(
    {
        ConditionType.READY: "True only in state Ready, with the current generation indexed: "
        "what `kubectl wait --for=condition=Ready` and GitOps health checks read; its reason "
        "is the state, its message why.",
        ConditionType.RECONCILING: "True while the base is on its way to what its spec asks "
        "(Pending, Starting, Indexing, Waiting): kstatus' abnormal-true condition, which Flux "
        "and kstatus read as InProgress.",
        ConditionType.STALLED: "True while it is Failed: it will not progress until someone "
        "changes something.",
        ConditionType.PAUSED: 'True while the annotation metis.astraeus.io/paused is "true" '
        "(the base and its children are left untouched).",
        ConditionType.EMBEDDING_MODEL_AVAILABLE: "True when the embedding model's Service answers "
        "as an embedding model.",
        ConditionType.RERANKER_AVAILABLE: "True when the reranker's Service answers as a "
        "reranker; absent without one.",
        ConditionType.QUALITY_REGRESSED: "True when the evaluation after a change of embedding "
        "model or chunking fell beyond the tolerance; False when it held (or for a baseline).",
        ConditionType.DRIVE_FILLING: "True while the index drive is 80 % full or more; absent "
        "while no indexer has said.",
        ConditionType.RESTORED: "True once the base made from a backup (spec.restore) holds "
        "its index and notes; its message says what is embedded again when the base's model "
        "or chunking differ from the backup's. False while it restores (reason Restoring) or "
        "cannot (RestoreFailed); absent for a base not made from a backup.",
    }
)


def named() -> str:
    """The types as the CRD lists them: "Ready, Reconciling, … or DriveFilling"."""
    types = [t.value for t in ConditionType]
    return f"{', '.join(types[:-1])} or {types[-1]}."


def described() -> str:
    """Each type with its meaning, for the CRD's description of `status.conditions`."""
    return " ".join(f"{t.value}: {MEANING[t]}" for t in ConditionType)
