"""Retrieval quality as a cluster signal, on the real control plane with a real indexer and
the real local model: a base evaluated once, then re-chunked twice. The operator evaluates
it again after each pass the change asked for: when its figures hold, `QualityRegressed`
is False and no Warning is posted; when its recall falls, the condition is True and a
Warning Event gives both figures; the figures reach the operator's metrics. (One base in
two steps: the test kubelet runs every indexer on one loopback port, one at a time.)

The corpus is made for it: each question names two things that one story mentions about
300 characters apart and two short notes mention one each. Chunks of 1,200 characters keep
each story whole, so the story answers first (recall@1 1.0); chunks of 200 split it and a
note answers first for half the questions (recall@1 0.5, measured with the local model).
Chunks of 1,000 characters still keep every story whole.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from metis_dev.kubelet import Kubelet
from metis_dev.plane import ControlPlane
from metis_dev.process import wait_for
from tests.kube.operator_support import (
    Operator,
    get_kb,
    kb,
    make_drive,
    model_service,
    state_events,
    wait_state,
)
from tests.support.model_server import ModelServer

PAIRS = (
    ("pelican", "umbrella"),
    ("glacier", "violin"),
    ("lantern", "cactus"),
    ("walrus", "telescope"),
    ("volcano", "harmonica"),
    ("octopus", "bicycle"),
)
FILLER = (
    "The weekly meeting moves to the second floor room next to the kitchen, and the "
    "printer there needs new paper every Monday morning before nine. "
)


def write_corpus(folder: Path, drive: str) -> None:
    """Six stories, twelve notes and the evaluation set of drive `drive` (module doc)."""
    folder.mkdir()
    cases = []
    for i, (a, b) in enumerate(PAIRS):
        (folder / f"story-{i}.md").write_text(
            f"# Story {i}\n\nOn Tuesday the {a} arrived at the office.\n\n{FILLER * 2}\n\n"
            f"Everyone agreed that the {b} belongs to it.\n"
        )
        for thing in (a, b):
            (folder / f"{thing}.md").write_text(
                f"# Note on {thing}s\n\nThe {thing} and another {thing}.\n\n{FILLER[:120]}\n"
            )
        cases.append(
            {"question": f"Whose {b} is it, the {a}'s?", "expected": [f"{drive}/story-{i}.md"]}
        )
    (folder / ".metis").mkdir()
    (folder / ".metis" / "evals.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cases))


@pytest.fixture
def kubelet(kube: ControlPlane, namespace: str, tmp_path: Path) -> Iterator[Kubelet]:
    with Kubelet(kube, namespace, tmp_path / "kubelet") as k:
        yield k


def condition(status: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions") or [] if c["type"] == kind), None)


def evaluated_under(settings: str) -> Any:
    return lambda s: (s.get("evaluation") or {}).get("retrieval") == settings


def gauge(operator: Operator, name: str, namespace: str, base: str) -> float:
    for family in text_string_to_metric_families(operator.metrics()):
        for sample in family.samples:
            if sample.name == name and sample.labels == {
                "namespace": namespace,
                "knowledgebase": base,
            }:
                return float(sample.value)
    raise AssertionError(f"no {name} for {namespace}/{base}")


def test_a_chunking_change_that_lowers_recall_sets_quality_regressed(
    kube: ControlPlane,
    operator: Operator,
    kubelet: Kubelet,
    namespace: str,
    models: ModelServer,
    tmp_path: Path,
) -> None:
    ns, alive = namespace, operator.check_alive
    kube.add_node(f"cpu-{ns}")
    model_service(kube, ns, "minilm", int(models.base_url.rsplit(":", 1)[1]))
    write_corpus(tmp_path / "docs", "docs")
    make_drive(kube, ns, "docs", tmp_path / "docs")
    spec = {
        "sources": [{"drive": "docs"}],
        "embedding": {"deployment": "minilm"},
        "rescan_seconds": 0,
    }
    kube.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(kb("stories", spec)))
    # Its first figures, as a user asks for them (a base never evaluated is not judged).
    s = wait_state(kube, ns, "stories", "Ready", alive=alive, timeout=180)
    assert "evaluation" not in s  # Ready alone evaluates nothing
    kube.kubectl("annotate", "kb", "stories", "-n", ns, "metis.astraeus.io/evaluate=k=1 first")
    s = wait_state(
        kube,
        ns,
        "stories",
        "Ready",
        alive=alive,
        timeout=120,
        check=evaluated_under("embedding minilm, chunks 1200/200"),
    )
    first = s["evaluation"]
    assert (first["k"], first["cases"], first["recall_at_k"], first["mrr"]) == (1, 6, 1.0, 1.0)
    assert condition(s, "QualityRegressed") is None

    # Chunks of 1,000 keep every story whole: the figures hold.
    rechunk(kube, ns, 1000, 100)
    s = wait_state(
        kube,
        ns,
        "stories",
        "Ready",
        alive=alive,
        timeout=180,
        check=evaluated_under("embedding minilm, chunks 1000/100"),
    )
    held = condition(s, "QualityRegressed")
    assert held is not None and (held["status"], held["reason"]) == ("False", "Held")
    assert s["evaluation"]["recall_at_k"] == 1.0
    assert held["message"] == (
        "evaluation held: recall@1 1.000, MRR 1.000 over 6 questions (embedding minilm, "
        "chunks 1000/100), was recall@1 1.000, MRR 1.000 (embedding minilm, chunks 1200/200)"
    )
    # The operator posts its Events after it writes the status: polled.
    wait_for(
        lambda: ("Evaluated", held["message"]) in state_events(kube, ns, "stories"),
        timeout=30,
        what="the Evaluated event",
        alive=alive,
    )
    assert not _warnings(kube, ns, "stories")
    assert gauge(operator, "metis_evaluation_recall_at_k", ns, "stories") == 1.0

    # Chunks of 200 split them: recall falls, the condition and a Warning say so.
    rechunk(kube, ns, 200, 50)
    s = wait_state(
        kube,
        ns,
        "stories",
        "Ready",
        alive=alive,
        timeout=180,
        check=evaluated_under("embedding minilm, chunks 200/50"),
    )
    after = s["evaluation"]
    assert (after["k"], after["cases"]) == (1, 6) and after["recall_at_k"] < 0.95
    regressed = condition(s, "QualityRegressed")
    assert regressed is not None
    assert (regressed["status"], regressed["reason"]) == ("True", "Regressed")
    message = (
        "evaluation fell from recall@1 1.000, MRR 1.000 (embedding minilm, chunks 1000/100) "
        f"to recall@1 {after['recall_at_k']:.3f}, MRR {after['mrr']:.3f} over 6 questions "
        "(embedding minilm, chunks 200/50); tolerance 0.05"
    )
    assert regressed["message"] == message
    wait_for(lambda: _warnings(kube, ns, "stories"), timeout=30, what="the Warning", alive=alive)
    assert _warnings(kube, ns, "stories") == [("QualityRegressed", message)]

    # The figures reach the metrics; the condition outlives the next reconciliations.
    assert gauge(operator, "metis_evaluation_recall_at_k", ns, "stories") == after["recall_at_k"]
    assert gauge(operator, "metis_evaluation_mrr", ns, "stories") == after["mrr"]
    kube.kubectl("annotate", "kb", "stories", "-n", ns, "metis.astraeus.io/reindex=again")
    wait_for(
        lambda: ("Reindex", "a pass started") in state_events(kube, ns, "stories"),
        timeout=60,
        what="the reindex",
        alive=alive,
    )
    s = wait_state(kube, ns, "stories", "Ready", alive=alive)
    assert condition(s, "QualityRegressed") == regressed
    assert get_kb(kube, ns, "stories")["status"]["evaluation"] == after
    kubelet.check()


def rechunk(kube: ControlPlane, namespace: str, size: int, overlap: int) -> None:
    patch = {"spec": {"chunking": {"size": size, "overlap": overlap}}}
    kube.kubectl("patch", "kb", "stories", "-n", namespace, "--type=merge", "-p", json.dumps(patch))


def _warnings(kube: ControlPlane, namespace: str, name: str) -> list[tuple[str, str]]:
    items = kube.rest().get(
        f"/api/v1/namespaces/{namespace}/events?fieldSelector=involvedObject.name={name}"
    )["items"]
    return [(e["reason"], e.get("message", "")) for e in items if e["type"] == "Warning"]
