"""The indexer's Prometheus metrics, in one registry per service (tests run several)."""

from __future__ import annotations

import dataclasses

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

PHASES = ("loading", "scanning", "indexing", "ready", "waiting", "standby")
STEPS = ("embed", "dense", "keyword", "fuse", "rerank", "total")
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


@dataclasses.dataclass
class Metrics:
    registry: CollectorRegistry
    search_seconds: Histogram
    searches: Counter
    documents: Gauge
    chunks: Gauge
    failed: Gauge
    phase: Gauge
    pass_total: Gauge
    pass_done: Gauge
    pass_seconds: Histogram
    embed_seconds: Histogram
    embed_failures: Counter
    index_rebuilds: Counter
    index_damage: Counter
    requests: Counter
    staged_chunks: Counter
    vectors_from_peers: Counter
    vectors_from_model: Counter
    vectors_kept: Counter
    peer_vectors_checked: Counter
    peer_answers_refused: Counter
    drive_used: Gauge
    drive_size: Gauge
    backups: Counter
    backup_last_completed: Gauge
    backup_bytes: Gauge

    @classmethod
    def create(cls) -> Metrics:
        r = CollectorRegistry()
        return cls(
            registry=r,
            search_seconds=Histogram(
                "metis_search_step_seconds",
                "Time of each search step, by mode.",
                ["step", "mode"],
                registry=r,
                buckets=_LATENCY_BUCKETS,
            ),
            searches=Counter(
                "metis_searches_total",
                "Searches by mode asked and outcome (ok; degraded: answered without a model; "
                "error: refused; failed: the indexer broke).",
                ["mode", "outcome"],
                registry=r,
            ),
            documents=Gauge("metis_documents", "Documents indexed.", registry=r),
            chunks=Gauge("metis_chunks", "Chunks indexed.", registry=r),
            failed=Gauge("metis_documents_failed", "Documents that could not be read.", registry=r),
            phase=Gauge(
                "metis_phase",
                "1 for the index's current phase, 0 for the others.",
                ["phase"],
                registry=r,
            ),
            pass_total=Gauge(
                "metis_pass_documents", "Documents the current pass reads.", registry=r
            ),
            pass_done=Gauge(
                "metis_pass_documents_done", "Documents the current pass has read.", registry=r
            ),
            pass_seconds=Histogram(
                "metis_pass_seconds",
                "Duration of finished passes.",
                registry=r,
                buckets=(0.1, 1, 5, 15, 60, 300, 900, 3600, 14400),
            ),
            drive_used=Gauge(
                "metis_index_drive_used_bytes",
                "Bytes in use on the index drive (read when scraped).",
                registry=r,
            ),
            drive_size=Gauge(
                "metis_index_drive_size_bytes",
                "The index drive's size in bytes (read when scraped).",
                registry=r,
            ),
            index_rebuilds=Counter(
                "metis_index_rebuilds_total",
                "Times a damaged index was moved aside and rebuilt from the sources.",
                registry=r,
            ),
            index_damage=Counter(
                "metis_index_damage_found_total",
                "Times damage to the index file was met, by what met it (start, pass, search, "
                "check: the integrity check that reads a few pages a minute).",
                ["found_by"],
                registry=r,
            ),
            requests=Counter(
                "metis_http_requests_total",
                "HTTP requests answered, by route (none: refused before any route) and status.",
                ["route", "code"],
                registry=r,
            ),
            embed_seconds=Histogram(
                "metis_embedding_request_seconds",
                "Latency of embedding requests for passages.",
                registry=r,
                buckets=_LATENCY_BUCKETS,
            ),
            embed_failures=Counter(
                "metis_embedding_failures_total",
                "Embedding requests that failed after their retries.",
                registry=r,
            ),
            staged_chunks=Counter(
                "metis_embedding_staged_chunks_total",
                "Chunks given a new embedding model's vectors beside the ones that answer "
                "(the model changed: they take the old ones' place once every chunk has one).",
                registry=r,
            ),
            vectors_from_peers=Counter(
                "metis_vectors_from_peers_total",
                "Passages whose vectors the base's other replicas gave (not sent to the model).",
                registry=r,
            ),
            vectors_from_model=Counter(
                "metis_vectors_from_model_total",
                "Passages the passes sent to the embedding model.",
                registry=r,
            ),
            vectors_kept=Counter(
                "metis_vectors_kept_total",
                "Passages of a new chunking's index whose vectors the index it replaces held "
                "(cut the same: not sent to the model).",
                registry=r,
            ),
            peer_vectors_checked=Counter(
                "metis_peer_vectors_checked_total",
                "Vectors a peer gave that the embedding model embedded too, to compare (all of "
                "a peer's first ones, then a sample).",
                registry=r,
            ),
            peer_answers_refused=Counter(
                "metis_peer_answers_refused_total",
                "Peers' answers not used, by reason (unlike_model: a vector checked is not the "
                "model's; malformed; too_large; too_slow): the peer is not asked for a while.",
                ["reason"],
                registry=r,
            ),
            backups=Counter(
                "metis_backups_total",
                "Backups of the index and notes to the object store, by outcome (completed, "
                "failed).",
                ["outcome"],
                registry=r,
            ),
            backup_last_completed=Gauge(
                "metis_backup_last_completed_timestamp_seconds",
                "When the last backup of this indexer completed (Unix seconds; 0: none yet).",
                registry=r,
            ),
            backup_bytes=Gauge(
                "metis_backup_bytes",
                "Bytes of the objects of the last backup this indexer completed.",
                registry=r,
            ),
        )

    def set_phase(self, phase: str) -> None:
        for p in PHASES:
            self.phase.labels(phase=p).set(1 if p == phase else 0)
