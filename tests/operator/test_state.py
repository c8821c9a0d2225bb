"""The state table, row by row and in its priority order, as named cases of
the pure `derive`."""

from __future__ import annotations

import dataclasses

import pytest

from metis_indexer.schema import StatusAnswer
from metis_operator.api.spec import Placement
from metis_operator.state import (
    ROUTING_GRACE_SECONDS,
    Model,
    ModelCheck,
    Observation,
    PodView,
    State,
    derive,
    unschedulable,
)
from tests.operator.answers import indexer_status

EMBEDDING = ModelCheck("embedding model", "bge-m3", Model.AVAILABLE, "serves BAAI/bge-m3")
RUNNING = PodView("metis-hb-1", node="node-a", running=True, ready=True)


def ix(phase: str, **kw: object) -> StatusAnswer:
    """The indexer's status; by default it runs and has indexed generation 2."""
    return indexer_status(**{"phase": phase, "generation": 2, "indexed_generation": 2, **kw})


HEALTHY = Observation(
    embedding=EMBEDDING,
    index_drive="metis-hb",
    index_drive_bound=True,
    pod=RUNNING,
    indexer=ix("ready", passes=1),
    generation=2,
    served=True,
)


def given(**changes: object) -> Observation:
    return dataclasses.replace(HEALTHY, **changes)  # type: ignore[arg-type]


SLOW = "embedding model bge-m3 did not answer (no answer within 10 s): results by keywords only"
BUT = "but 12 of 40 searches in the last minute were answered by words only: " + SLOW


def searches(
    answered: int = 0,
    by_words_only: int = 0,
    without_reranker: int = 0,
    failed: int = 0,
    reason: str | None = None,
) -> dict[str, object]:
    """The indexer's account of the last minute's searches."""
    return {
        "seconds": 60,
        "answered": answered,
        "by_words_only": by_words_only,
        "without_reranker": without_reranker,
        "failed": failed,
        "reason": reason,
    }


CASES = [
    # Failed: what cannot run as asked, before anything else.
    (
        "invalid-spec",
        given(invalid="spec.rescan_seconds: is 5"),
        State.FAILED,
        "the spec is invalid: spec.rescan_seconds: is 5",
    ),
    (
        "missing-drive",
        given(missing_drives=("docs",)),
        State.FAILED,
        "drive docs does not exist (no PersistentVolumeClaim docs in this namespace)",
    ),
    (
        "missing-model",
        given(embedding=ModelCheck("embedding model", "bge-m3", Model.NOT_FOUND)),
        State.FAILED,
        "embedding model bge-m3 does not exist (no Service bge-m3 in this namespace)",
    ),
    (
        "model-serves-else",
        given(
            embedding=ModelCheck(
                "embedding model",
                "web",
                Model.SERVES_ELSE,
                "serves reranker bge-reranker, not an embedding model",
            )
        ),
        State.FAILED,
        "embedding model Service web serves reranker bge-reranker, not an embedding model",
    ),
    (
        "reranker-missing",
        given(reranker=ModelCheck("reranker", "rr", Model.NOT_FOUND)),
        State.FAILED,
        "reranker rr does not exist (no Service rr in this namespace)",
    ),
    (
        "failures-add-up",
        given(missing_drives=("a", "b")),
        State.FAILED,
        "drive a does not exist (no PersistentVolumeClaim a in this namespace); "
        "drive b does not exist (no PersistentVolumeClaim b in this namespace)",
    ),
    ("failed-beats-pending", given(missing_drives=("docs",), pod=None), State.FAILED, None),
    (
        "missing-flux-source",
        given(missing_fluxes=("GitRepository wiki",)),
        State.FAILED,
        "GitRepository wiki does not exist (no GitRepository named wiki in this namespace; "
        "is Flux's source-controller installed?)",
    ),
    (
        "reranker-missing-with-no-embedding-check",
        given(embedding=None, reranker=ModelCheck("reranker", "rr", Model.NOT_FOUND)),
        State.FAILED,
        "reranker rr does not exist (no Service rr in this namespace)",
    ),
    # Pending: no machine, no volume, no listing yet.
    (
        "unlisted-data-source",
        given(unlisted_drives=("bucket",)),
        State.PENDING,
        "drive bucket waits for its data source's first listing",
    ),
    (
        "unlisted-flux-source",
        given(
            unlisted_drives=("bucket",),
            unlisted_fluxes=("GitRepository wiki: failed to checkout: authentication required",),
        ),
        State.PENDING,
        "drive bucket waits for its data source's first listing; waiting for the first "
        "listing of GitRepository wiki: failed to checkout: authentication required",
    ),
    (
        "unbound-drive",
        given(unbound_drives=("docs",)),
        State.PENDING,
        "drive docs is not bound to a volume yet",
    ),
    (
        "two-unlisted-data-sources",
        given(unlisted_drives=("a", "b")),
        State.PENDING,
        "drive a waits for its data source's first listing; "
        "drive b waits for its data source's first listing",
    ),
    (
        "two-unbound-drives",
        given(unbound_drives=("a", "b")),
        State.PENDING,
        "drive a is not bound to a volume yet; drive b is not bound to a volume yet",
    ),
    (
        "unbound-index-drive",
        given(index_drive_bound=False),
        State.PENDING,
        "its index drive metis-hb is not bound to a volume yet",
    ),
    (
        "a-child-refused",
        given(refused="Service metis-hb (Internal error occurred: failed to allocate a serviceIP)"),
        State.PENDING,
        "the API server refused Service metis-hb (Internal error occurred: failed to allocate a "
        "serviceIP); tried again at every turn",
    ),
    (
        "pod-cannot-be-created",
        given(pod=None, pod_failure="exceeded quota: mem"),
        State.PENDING,
        "its pod cannot be created: exceeded quota: mem",
    ),
    ("no-pod-yet", given(pod=None), State.PENDING, "its pod is not created yet"),
    # A first pod replaced (a changed placement) before it ever ran is no replacement.
    (
        "first-pod-replaced-before-it-ran",
        given(served=False, pod=None, replacing=True),
        State.PENDING,
        "its pod is not created yet",
    ),
    (
        "first-pod-going-before-it-ran",
        given(served=False, pod=PodView("p", terminating=True)),
        State.PENDING,
        "its pod is not created yet",
    ),
    (
        "unschedulable",
        given(
            placement=Placement(labels={"pool": "gpu"}),
            pod=PodView(
                "p",
                unschedulable="0/3 nodes are available: 3 node(s) didn't match "
                "Pod's node affinity/selector. preemption: 0/3 nodes are available",
            ),
        ),
        State.PENDING,
        "no machine matches placement labels pool=gpu (scheduler: 0/3 nodes are available: "
        "3 node(s) didn't match Pod's node affinity/selector.)",
    ),
    ("not-yet-scheduled", given(pod=PodView("p")), State.PENDING, "its pod waits for a machine"),
    (
        "pending-beats-starting",
        given(unbound_drives=("docs",), replacing=True),
        State.PENDING,
        None,
    ),
    (
        "unschedulable-replacement-is-pending",
        given(
            replacing=True,
            pod=PodView("p", unschedulable="0/1 nodes are available: 1 Insufficient memory."),
        ),
        State.PENDING,
        None,
    ),
    # Starting: the pod starts, the index loads, a replacement takes over (more below).
    (
        "between-two-pods",
        given(pod=None, replacing=True),
        State.STARTING,
        "its old pod has stopped after a change; the new one is not created yet",
    ),
    (
        "old-pod-going",
        given(pod=dataclasses.replace(RUNNING, terminating=True)),
        State.STARTING,
        "its pod metis-hb-1 is going away (deleted or evicted); a new one is not created yet",
    ),
    (
        "old-pod-going-its-node-gone",
        given(pod=PodView("p", terminating=True)),
        State.STARTING,
        "its pod p is going away (deleted or evicted); a new one is not created yet",
    ),
    (
        "new-template-rolling-out",
        given(replacing=True),
        State.STARTING,
        "a change is rolling out; searches are answered meanwhile",
    ),
    (
        "new-pod-of-a-first-rollout",
        given(served=False, replacing=True, pod=PodView("p", node="node-a")),
        State.STARTING,
        "its indexer is starting on machine node-a",
    ),
    (
        "container-not-started",
        given(pod=PodView("p", node="node-a")),
        State.STARTING,
        "its indexer is starting on machine node-a",
    ),
    (
        "image-pull",
        given(pod=PodView("p", node="node-a", waiting="ImagePullBackOff: not found")),
        State.STARTING,
        "its indexer container waits on machine node-a: ImagePullBackOff: not found",
    ),
    (
        "api-not-up-yet",
        given(
            pod=dataclasses.replace(RUNNING, ready=False),
            indexer=None,
            indexer_error="connection refused",
        ),
        State.STARTING,
        "its indexer does not answer yet: connection refused",
    ),
    ("loading", given(indexer=ix("loading")), State.STARTING, "loading its index"),
    (
        "standby",
        given(indexer=ix("standby")),
        State.STARTING,
        "a replacement has loaded the index and answers searches; it takes over when the old "
        "pod stops",
    ),
    # A spec change: not Ready until the indexer runs the new generation and indexed it.
    (
        "runs-the-old-generation",
        given(generation=3),
        State.STARTING,
        "applying generation 3: the indexer still runs generation 2",
    ),
    (
        "runs-no-generation",
        given(generation=3, indexer=ix("ready", generation=None)),
        State.STARTING,
        "applying generation 3: the indexer still runs a configuration of no generation",
    ),
    # A data source's new revision: written into the configuration at once, delivered to
    # the pod by its kubelet later; Ready only once a pass has read it.
    (
        "new-revision-not-delivered-yet",
        given(
            revisions={"docs": "r2"},
            indexer=ix(
                "ready", passes=3, revisions={"docs": "r1"}, indexed_revisions={"docs": "r1"}
            ),
        ),
        State.STARTING,
        "drive docs has revision r2: its indexer still reads revision r1",
    ),
    (
        "new-drive-revision-not-delivered-yet",
        given(
            revisions={"docs": "r1", "wiki": "w1"},
            indexer=ix(
                "ready", passes=3, revisions={"docs": "r1"}, indexed_revisions={"docs": "r1"}
            ),
        ),
        State.STARTING,
        "drive wiki has revision w1: its indexer still reads no revision",
    ),
    (
        "old-generation-beats-waiting",
        given(generation=3, embedding=dataclasses.replace(EMBEDDING, result=Model.NOT_ANSWERING)),
        State.STARTING,
        None,
    ),
    (
        "starting-beats-waiting",
        given(
            indexer=ix("loading"),
            embedding=dataclasses.replace(EMBEDDING, result=Model.NOT_ANSWERING),
        ),
        State.STARTING,
        None,
    ),
    # Waiting: for the embedding model most often.
    (
        "model-not-answering",
        given(
            embedding=dataclasses.replace(
                EMBEDDING, result=Model.NOT_ANSWERING, detail="connection refused"
            )
        ),
        State.WAITING,
        "waiting for embedding model bge-m3: connection refused",
    ),
    (
        "indexer-waits",
        given(indexer=ix("waiting", reason="waiting for embedding model x: 503")),
        State.WAITING,
        "waiting for embedding model x: 503",
    ),
    (
        "indexer-waits-without-a-reason",
        given(indexer=ix("waiting")),
        State.WAITING,
        "its index waits",
    ),
    (
        "ready-pod-unreachable",
        given(indexer=None, indexer_error="timed out"),
        State.WAITING,
        "the operator cannot reach its indexer: timed out",
    ),
    (
        "ready-pod-unreachable-past-the-routing-grace",
        given(
            indexer=None,
            indexer_error="timed out",
            pod=dataclasses.replace(RUNNING, ready_seconds=ROUTING_GRACE_SECONDS),
        ),
        State.WAITING,
        "the operator cannot reach its indexer: timed out",
    ),
    # Ready a moment ago: kube-proxy routes the Service a moment after the kubelet says so.
    (
        "just-ready-pod-not-routed-yet",
        given(
            indexer=None,
            indexer_error="connection refused",
            pod=dataclasses.replace(RUNNING, ready_seconds=ROUTING_GRACE_SECONDS - 0.5),
        ),
        State.STARTING,
        "its indexer is ready; its Service does not reach it yet: connection refused",
    ),
    (
        "waiting-beats-indexing",
        given(
            indexer=ix("indexing"),
            embedding=dataclasses.replace(EMBEDDING, result=Model.NOT_ANSWERING),
        ),
        State.WAITING,
        None,
    ),
    (
        "reranker-down-is-not-waiting",
        given(reranker=ModelCheck("reranker", "rr", Model.NOT_ANSWERING, "timed out")),
        State.READY,
        None,
    ),
    # Indexing, then Ready.
    (
        "indexing",
        given(indexer=ix("indexing", pass_total=9, pass_done=2)),
        State.INDEXING,
        "reading documents; searches are answered from what is indexed so far",
    ),
    ("first-scan", given(indexer=ix("scanning", passes=0)), State.INDEXING, None),
    (
        "new-model-made-beside",
        given(
            generation=3,
            indexer=ix(
                "indexing",
                generation=3,
                indexed_generation=2,
                embedding={"answering": "minilm", "next": "bge-m3", "done": 40, "total": 120},
            ),
        ),
        State.INDEXING,
        "making the vectors of embedding model bge-m3 beside those of minilm, which answer "
        "searches meanwhile (40 of 120 chunks)",
    ),
    (
        "new-chunking-built-beside",
        given(
            generation=3,
            indexer=ix(
                "indexing",
                generation=3,
                indexed_generation=2,
                chunking={
                    "answering": {"size": 1200, "overlap": 200},
                    "next": {"size": 800, "overlap": 100},
                    "done": 7,
                    "total": 18,
                },
                searches=searches(28, 12, reason=SLOW),
            ),
        ),
        State.INDEXING,
        "building the index of chunks of 800 characters (overlap 100) beside the one of "
        "chunks of 1200 (overlap 200), which answers searches meanwhile (7 of 18 documents); "
        f"{BUT}",
    ),
    (
        "new-generation-not-indexed-yet",
        given(generation=3, indexer=ix("ready", generation=3, indexed_generation=2, passes=4)),
        State.INDEXING,
        "indexing for generation 3: reading documents; searches are answered from what is "
        "indexed so far",
    ),
    (
        "new-revision-not-indexed-yet",
        given(
            revisions={"docs": "r2", "wiki": "w1"},
            indexer=ix(
                "scanning",
                passes=3,
                revisions={"docs": "r2", "wiki": "w1"},
                indexed_revisions={"docs": "r1", "wiki": "w1"},
            ),
        ),
        State.INDEXING,
        "indexing revision r2 of drive docs: reading documents; searches are "
        "answered from what is indexed so far",
    ),
    (
        "new-revision-indexed",
        given(
            revisions={"docs": "r2"},
            indexer=ix(
                "ready", passes=4, revisions={"docs": "r2"}, indexed_revisions={"docs": "r2"}
            ),
        ),
        State.READY,
        "everything is indexed; watching its sources",
    ),
    (
        "first-pass-not-finished",
        given(indexer=ix("scanning", passes=3, indexed_generation=None)),
        State.INDEXING,
        None,
    ),
    (
        "waiting-beats-new-generation-indexing",
        given(generation=3, indexer=ix("waiting", reason="waiting for x", generation=3)),
        State.WAITING,
        "waiting for x",
    ),
    ("rescan-after-a-pass-stays-ready", given(indexer=ix("scanning", passes=3)), State.READY, None),
    ("ready", HEALTHY, State.READY, "everything is indexed; watching its sources"),
    # Searches that fell back to words or failed: the state stays, its reason says so.
    (
        "ready-but-searches-by-words",
        given(indexer=ix("ready", passes=1, searches=searches(28, 12, reason=SLOW))),
        State.READY,
        f"everything is indexed; {BUT}",
    ),
    (
        "ready-a-fifth-failed",
        given(indexer=ix("ready", passes=1, searches=searches(4, failed=1, reason="it broke"))),
        State.READY,
        "everything is indexed; but 1 of 5 searches in the last minute failed: it broke",
    ),
    (
        "ready-too-few-searches-to-tell",
        given(indexer=ix("ready", passes=1, searches=searches(by_words_only=4, reason=SLOW))),
        State.READY,
        "everything is indexed; watching its sources",
    ),
    (
        "ready-under-a-fifth-fell-back",
        given(indexer=ix("ready", passes=1, searches=searches(33, 7, reason=SLOW))),
        State.READY,
        "everything is indexed; watching its sources",
    ),
    (
        "ready-without-the-reranker-is-still-by-meaning",
        given(indexer=ix("ready", passes=1, searches=searches(without_reranker=40, reason="rr"))),
        State.READY,
        "everything is indexed; watching its sources",
    ),
    (
        "ready-from-an-indexer-that-does-not-count",
        given(indexer=ix("ready", passes=1, searches=None)),
        State.READY,
        "everything is indexed; watching its sources",
    ),
    (
        "indexing-but-searches-by-words-and-failed",
        given(indexer=ix("indexing", searches=searches(18, 9, 0, 3, reason=SLOW))),
        State.INDEXING,
        "reading documents; but 12 of 30 searches in the last minute were answered by words "
        f"only (9) or failed (3): {SLOW}",
    ),
    (
        "new-generation-but-searches-by-words",
        given(
            generation=3,
            indexer=ix(
                "indexing",
                generation=3,
                indexed_generation=2,
                searches=searches(28, 12, reason=SLOW),
            ),
        ),
        State.INDEXING,
        f"indexing for generation 3: reading documents; {BUT}",
    ),
    (
        "new-model-made-beside-but-searches-by-words",
        given(
            generation=3,
            indexer=ix(
                "indexing",
                generation=3,
                indexed_generation=2,
                embedding={"answering": "minilm", "next": "bge-m3", "done": 40, "total": 120},
                searches=searches(28, 12, reason=SLOW),
            ),
        ),
        State.INDEXING,
        "making the vectors of embedding model bge-m3 beside those of minilm, which answer "
        f"searches meanwhile (40 of 120 chunks); {BUT}",
    ),
    (
        "by-words-without-their-words",
        given(indexer=ix("ready", passes=1, searches=searches(0, 5))),
        State.READY,
        "everything is indexed; but 5 of 5 searches in the last minute were answered by words only",
    ),
]


@pytest.mark.parametrize(("o", "state", "reason"), [pytest.param(*c[1:], id=c[0]) for c in CASES])
def test_the_state_table(o: Observation, state: State, reason: str | None) -> None:
    verdict = derive(o)
    assert verdict.state is state
    if reason is not None:
        assert verdict.reason == reason


@pytest.mark.parametrize(
    ("message", "placement", "starts"),
    [
        (
            "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector.",
            Placement(machines=["gpu-1", "gpu-2"]),
            "no machine matches placement machines gpu-1, gpu-2 (scheduler:",
        ),
        (
            "0/2 nodes are available: 2 Insufficient memory.",
            Placement(memory_gb=64),
            "no machine has 64 GiB of memory free (placement.memory_gb)",
        ),
        (
            "0/2 nodes are available: 2 Insufficient cpu.",
            Placement(cpu_cores=16),
            "no machine has 16 CPU cores free (placement.cpu_cores)",
        ),
        (
            "0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims.",
            Placement(),
            "its drives are not bound to volumes yet",
        ),
        (
            "no nodes available to schedule pods",
            Placement(),
            "the cluster has no machine to run it",
        ),
        (
            "0/3 nodes are available: 3 node(s) didn't match the requested node name.",
            Placement(labels={"zone": "b", "pool": "gpu"}, machines=["gpu-1"]),
            "no machine matches placement labels pool=gpu, zone=b and machines gpu-1 (scheduler:",
        ),
        (
            "0/1 nodes are available: 1 node(s) didn't match the requested node name.",
            Placement(),
            "no machine matches placement (none set) (scheduler:",
        ),
        (
            "0/2 nodes are available: 1 Insufficient cpu, 1 Insufficient memory.",
            Placement(memory_gb=8, cpu_cores=4),
            "no machine has 8 GiB of memory free "
            "(placement.memory_gb); no machine has 4 CPU cores free (placement.cpu_cores) (sch",
        ),
        (
            "0/1 nodes are available: 1 node(s) were unschedulable.",
            Placement(),
            "no machine can run it (scheduler: 0/1 nodes are available: 1 node(s) were unsch",
        ),
    ],
    ids=[
        "machines",
        "memory",
        "cpu",
        "volumes",
        "no-nodes",
        "node-name",
        "none-set",
        "memory-and-cpu",
        "other",
    ],
)
def test_the_schedulers_message_says_what_to_do(
    message: str, placement: Placement, starts: str
) -> None:
    said = unschedulable(message, placement)
    assert said.startswith(starts)
    assert message.split(" preemption:")[0] in said


def test_a_scheduler_that_says_nothing_is_not_quoted() -> None:
    assert unschedulable("", Placement()) == "no machine can run it"


# A served base's pod replaced: a rollout's surge (the old pod beside the new, on its
# machine), the old pod going away (deleted, evicted, or at a rollout's end), standby.
OLD = PodView("metis-hb-old", node="node-a", running=True, ready=True, template="h1")
NEW = PodView("metis-hb-new", node="node-a", template="h2")
AGAIN = dataclasses.replace(NEW, template="h1")
GOING = dataclasses.replace(OLD, terminating=True)
AFFINITY = (
    "0/3 nodes are available: 1 node(s) didn't match pod affinity rules, 2 node(s) didn't "
    "match Pod's node affinity/selector."
)
WAITS_FOR_ITS_MACHINE = (
    "it waits for the machine of the pod it replaces, where its index drive is mounted; no "
    "machine matches placement labels pool=gpu (scheduler: " + AFFINITY + ")"
)
ROLLING = given(replacing=True, change="indexer image ix:2", old=OLD)
ANSWERED = "searches are answered by the old pod meanwhile"
STANDBY = (
    "a replacement has loaded the index and answers searches; it takes over when the old pod stops"
)

REPLACEMENTS = [
    (
        "surge-new-pod-starting",
        dataclasses.replace(ROLLING, pod=NEW),
        State.STARTING,
        "a replacement pod is starting beside the old one after a change (indexer image "
        f"ix:2); {ANSWERED}",
    ),
    (
        "surge-new-pod-loading",
        dataclasses.replace(ROLLING, pod=dataclasses.replace(NEW, running=True)),
        State.STARTING,
        "a replacement pod is starting beside the old one after a change (indexer image "
        f"ix:2); {ANSWERED}",
    ),
    (
        "surge-change-not-observable",
        given(old=OLD, pod=NEW),
        State.STARTING,
        f"a replacement pod is starting beside the old one after a change; {ANSWERED}",
    ),
    (
        "surge-new-pod-image-pull",
        dataclasses.replace(ROLLING, pod=dataclasses.replace(NEW, waiting="ErrImagePull: no")),
        State.STARTING,
        "a replacement pod is starting beside the old one after a change (indexer image "
        f"ix:2); its indexer container waits on machine node-a: ErrImagePull: no; {ANSWERED}",
    ),
    (
        "surge-waits-for-the-old-pods-machine",
        dataclasses.replace(
            ROLLING,
            placement=Placement(labels={"pool": "gpu"}),
            pod=PodView("metis-hb-new", unschedulable=AFFINITY, template="h2"),
        ),
        State.PENDING,
        "a replacement pod after a change (indexer image ix:2) waits for a machine: "
        f"{WAITS_FOR_ITS_MACHINE}; {ANSWERED}",
    ),
    (
        "surge-old-pod-not-answering",
        dataclasses.replace(ROLLING, pod=NEW, old=dataclasses.replace(OLD, ready=False)),
        State.STARTING,
        "a replacement pod is starting beside the old one after a change (indexer image ix:2)",
    ),
    # Ready beside the old pod: loaded, it stands by (whichever pod the Service asked).
    (
        "surge-new-pod-ready",
        dataclasses.replace(ROLLING, pod=dataclasses.replace(NEW, running=True, ready=True)),
        State.STARTING,
        STANDBY,
    ),
    (
        "rollout-old-pod-going-new-not-ready",
        dataclasses.replace(ROLLING, pod=dataclasses.replace(NEW, running=True), old=GOING),
        State.STARTING,
        "a replacement pod is starting after a change (indexer image ix:2); the old one is "
        "going away",
    ),
    (
        "rollout-old-pod-going-new-in-standby",
        dataclasses.replace(
            ROLLING,
            pod=dataclasses.replace(NEW, running=True, ready=True),
            old=GOING,
            indexer=ix("standby"),
        ),
        State.STARTING,
        STANDBY,
    ),
    # Deleted or evicted, nothing changed: a pod of the same template is made again.
    (
        "deleted-new-pod-starting",
        given(pod=AGAIN, old=GOING),
        State.STARTING,
        "its pod metis-hb-old is going away (deleted or evicted); a new one starts on machine "
        "node-a",
    ),
    (
        "deleted-new-pod-image-pull",
        given(pod=dataclasses.replace(AGAIN, waiting="ErrImagePull: no"), old=GOING),
        State.STARTING,
        "its pod metis-hb-old is going away (deleted or evicted); a new one waits on machine "
        "node-a: ErrImagePull: no",
    ),
    (
        "deleted-new-pod-not-placed",
        given(pod=PodView("metis-hb-new", template="h1"), old=GOING),
        State.PENDING,
        "its pod metis-hb-old is going away (deleted or evicted); a new one waits for a machine",
    ),
    (
        "evicted-from-a-cordoned-machine",
        given(
            placement=Placement(labels={"pool": "gpu"}),
            pod=PodView("metis-hb-new", unschedulable=AFFINITY, template="h1"),
            old=GOING,
        ),
        State.PENDING,
        "its pod metis-hb-old is going away (deleted or evicted); a new one waits for a "
        f"machine: {WAITS_FOR_ITS_MACHINE}",
    ),
    (
        "deleted-new-pod-in-standby",
        given(
            pod=dataclasses.replace(AGAIN, running=True, ready=True),
            old=GOING,
            indexer=ix("standby"),
        ),
        State.STARTING,
        STANDBY,
    ),
    (
        "deleted-new-pod-took-over",
        given(pod=dataclasses.replace(AGAIN, running=True, ready=True), old=GOING),
        State.READY,
        "everything is indexed; watching its sources",
    ),
    # Where two pods cannot mount the drive, the old one stops first.
    (
        "recreated-old-pod-stopping",
        given(pod=GOING, replacing=True, change="drive wiki added"),
        State.STARTING,
        "its pod metis-hb-old stops after a change (drive wiki added); the new one starts "
        "once it has stopped",
    ),
    # A first pod that never served, replaced beside another: a first start.
    (
        "first-pod-replaced-beside-another",
        given(served=False, pod=NEW, old=dataclasses.replace(OLD, ready=False, running=False)),
        State.STARTING,
        "its indexer is starting on machine node-a",
    ),
]


@pytest.mark.parametrize(
    ("o", "state", "reason"), [pytest.param(*c[1:], id=c[0]) for c in REPLACEMENTS]
)
def test_a_replacement_says_what_happened_and_what_answers(
    o: Observation, state: State, reason: str
) -> None:
    verdict = derive(o)
    assert (verdict.state, verdict.reason) == (state, reason)
    # Searches are said to be answered only where a pod that answers (ready, not going
    # away) is there.
    answers = any(p is not None and p.ready and not p.terminating for p in (o.pod, o.old))
    if not answers:
        assert "answer" not in verdict.reason


@pytest.mark.parametrize(
    ("message", "starts"),
    [
        (
            "0/1 nodes are available: 1 node(s) didn't match pod affinity rules.",
            "it waits for the machine of the pod it replaces, where its index drive is mounted "
            "(scheduler:",
        ),
        (
            "0/1 nodes are available: 1 node has pod using PersistentVolumeClaim with the same "
            "name and ReadWriteOncePod access mode.",
            "its index drive is still mounted by the pod it replaces (scheduler:",
        ),
    ],
    ids=["pod-affinity", "read-write-once-pod"],
)
def test_a_replacement_held_by_its_drive_says_so(message: str, starts: str) -> None:
    said = unschedulable(message, Placement())
    assert said.startswith(starts)
    assert "no machine matches placement" not in said and "not bound" not in said
