"""The operator's Prometheus metrics, in a registry of its own (tests start several):
reconciliations started and failed (by trigger), how long one takes, the timer polls
of Ready bases' indexers (by whether the answer changed), and
`metis_operator_knowledge_bases{state}`, the bases per state (every state listed,
0 too, so a dashboard's series never vanish), and `metis_knowledge_base_state{namespace,
knowledgebase, state}`, 1 for each base's state and 0 for the others (kube-state-metrics'
habit, as `kube_pod_status_phase`), so that an alert names the base and its `for:` times
that one base.

Backups: `metis_backup_last_completed_timestamp_seconds{namespace, knowledgebase}`, when
the newest completed KnowledgeBaseBackup of a base finished (from every backup object the
operator sees, so a restarted operator says it again from its first listing), and
`metis_backup_expected_since_timestamp_seconds{namespace, knowledgebase}` for each base
with spec.backup: since when a backup is expected (its creation). The alert
MetisBackupTooOld reads the two (charts/metis/templates/monitoring.yaml)."""

from __future__ import annotations

import contextlib
import dataclasses

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from metis_operator.state import State


@dataclasses.dataclass
class Metrics:
    registry: CollectorRegistry
    reconciliations: Counter
    polls: Counter
    errors: Counter
    seconds: Histogram
    bases: Gauge
    state: Gauge
    recall: Gauge
    mrr: Gauge
    backup_completed: Gauge
    backup_expected: Gauge
    states: dict[tuple[str, str], State] = dataclasses.field(default_factory=dict)
    """The last state of each base (namespace, name), which `bases` counts."""
    finished: dict[tuple[str, str], float] = dataclasses.field(default_factory=dict)
    """When the newest completed backup of each base finished."""

    @classmethod
    def create(cls) -> Metrics:
        r = CollectorRegistry()
        m = cls(
            registry=r,
            reconciliations=Counter(
                "metis_operator_reconciliations",
                "Reconciliations of a base",
                ["trigger"],
                registry=r,
            ),
            polls=Counter(
                "metis_operator_indexer_polls",
                "Timer polls of a Ready base's indexer; changed=false: the answer was the "
                "last turn's, and nothing else was done",
                ["changed"],
                registry=r,
            ),
            errors=Counter(
                "metis_operator_reconcile_errors",
                "Reconciliations that failed with an error",
                ["trigger"],
                registry=r,
            ),
            seconds=Histogram(
                "metis_operator_reconcile_seconds",
                "Seconds one reconciliation took",
                registry=r,
            ),
            bases=Gauge(
                "metis_operator_knowledge_bases", "Knowledge bases per state", ["state"], registry=r
            ),
            state=Gauge(
                "metis_knowledge_base_state",
                "1 for the state a base is in, else 0",
                ["namespace", "knowledgebase", "state"],
                registry=r,
            ),
            recall=Gauge(
                "metis_evaluation_recall_at_k",
                "A base's last evaluation: recall at k",
                ["namespace", "knowledgebase"],
                registry=r,
            ),
            mrr=Gauge(
                "metis_evaluation_mrr",
                "A base's last evaluation: mean reciprocal rank",
                ["namespace", "knowledgebase"],
                registry=r,
            ),
            backup_completed=Gauge(
                "metis_backup_last_completed_timestamp_seconds",
                "When the newest completed backup of a base finished (Unix seconds)",
                ["namespace", "knowledgebase"],
                registry=r,
            ),
            backup_expected=Gauge(
                "metis_backup_expected_since_timestamp_seconds",
                "For a base with spec.backup: since when a backup is expected, its creation "
                "(Unix seconds)",
                ["namespace", "knowledgebase"],
                registry=r,
            ),
        )
        m._count()
        return m

    def record(self, key: tuple[str, str], state: State) -> None:
        self.states[key] = state
        self._count()
        for s in State:
            self.state.labels(*key, s.value).set(1 if s is state else 0)

    def backup_finished(self, key: tuple[str, str], finished: float) -> None:
        """A completed backup of the base `key` that finished at `finished` (seconds): the
        gauge keeps the newest."""
        if finished > self.finished.get(key, 0.0):
            self.finished[key] = finished
            self.backup_completed.labels(*key).set(finished)

    def backups_expected(self, key: tuple[str, str], since: float | None) -> None:
        """The base `key` has spec.backup since `since` (its creation); None: it has none."""
        if since is None:
            with contextlib.suppress(KeyError):
                self.backup_expected.remove(*key)
        else:
            self.backup_expected.labels(*key).set(since)

    def forget(self, key: tuple[str, str]) -> None:
        self.states.pop(key, None)
        self.finished.pop(key, None)
        self._count()
        for gauge in (self.recall, self.mrr, self.backup_expected, self.backup_completed):
            with contextlib.suppress(KeyError):
                gauge.remove(*key)
        for s in State:
            with contextlib.suppress(KeyError):
                self.state.remove(*key, s.value)

    def evaluated(self, key: tuple[str, str], recall_at_k: float, mrr: float) -> None:
        self.recall.labels(*key).set(recall_at_k)
        self.mrr.labels(*key).set(mrr)

    def _count(self) -> None:
        for s in State:
            self.bases.labels(state=s.value).set(sum(1 for v in self.states.values() if v is s))

    def serve(self, port: int) -> None:
        """Expose `/metrics` on `port` (a daemon thread); 0: do not."""
        if port:
            start_http_server(port, registry=self.registry)
