"""The watch cache: what is kept of an object, and which bases a change wakes."""

from __future__ import annotations

import base64
from typing import Any

from metis_operator import cache
from metis_operator.cache import Deps

HANDBOOK = Deps("team", frozenset({"docs"}), frozenset({"minilm"}), ({"app": "minilm"},))
BASES = cache.Dependents.of(
    {
        ("team", "handbook"): HANDBOOK,
        ("team", "wiki"): Deps("team", frozenset({"wiki"}), frozenset({"bge"})),
        ("other", "handbook"): Deps("other", frozenset({"docs"}), frozenset({"minilm"})),
    }
)


def obj(name: str, ns: str = "team", **meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns, **meta}}


def test_a_drive_or_model_service_wakes_the_bases_of_its_namespace_that_name_it() -> None:
    assert cache.affected(BASES, "persistentvolumeclaims", obj("docs")) == {("team", "handbook")}
    assert cache.affected(BASES, "services", obj("bge")) == {("team", "wiki")}
    assert cache.affected(BASES, "services", obj("minilm", "other")) == {("other", "handbook")}
    assert cache.affected(BASES, "services", obj("unrelated")) == set()


def test_a_flux_source_object_wakes_the_bases_that_read_it_and_not_a_namesake() -> None:
    reader = Deps("team", fluxes=frozenset({("gitrepositories", "wiki")}))
    bases = cache.Dependents.of({("team", "handbook"): HANDBOOK, ("team", "kb"): reader})
    assert cache.affected(bases, "gitrepositories", obj("wiki")) == {("team", "kb")}
    assert cache.affected(bases, "buckets", obj("wiki")) == set()
    assert cache.affected(bases, "persistentvolumeclaims", obj("wiki")) == set()
    bases.set(("team", "kb"), Deps("team"))
    assert cache.affected(bases, "gitrepositories", obj("wiki")) == set()


def test_a_workload_wakes_the_bases_whose_model_selects_it() -> None:
    model = {**obj("minilm"), "spec": {"template": {"metadata": {"labels": {"app": "minilm"}}}}}
    other = {**obj("web"), "spec": {"template": {"metadata": {"labels": {"app": "web"}}}}}
    assert cache.affected(BASES, "deployments", model) == {("team", "handbook")}
    assert cache.affected(BASES, "deployments", other) == set()


def test_a_child_or_pod_wakes_its_own_base_only_when_it_is_known() -> None:
    pod = obj(
        "metis-wiki-1",
        labels={"app.kubernetes.io/name": "metis-indexer", "app.kubernetes.io/instance": "wiki"},
    )
    assert cache.affected(BASES, "pods", pod) == {("team", "wiki")}
    ref = {"apiVersion": "metis.astraeus.io/v1", "kind": "KnowledgeBase"}
    child = obj("metis-wiki", ownerReferences=[{**ref, "name": "wiki"}])
    assert cache.affected(BASES, "configmaps", child) == {("team", "wiki")}
    gone = obj("metis-old", ownerReferences=[{**ref, "name": "old"}])
    assert cache.affected(BASES, "configmaps", gone) == set()


def test_a_workload_that_is_not_a_child_is_kept_slim() -> None:
    deployment = {
        **obj("minilm", managedFields=[{"manager": "kubectl"}], labels={"app": "minilm"}),
        "spec": {
            "replicas": 0,
            "template": {
                "metadata": {"labels": {"app": "minilm"}},
                "spec": {"containers": [{"name": "tei"}]},
            },
        },
        "status": {"replicas": 0},
    }
    assert cache.slim("deployments", deployment) == {
        "kind": "Deployment",
        "metadata": {"name": "minilm", "namespace": "team"},
        "spec": {"replicas": 0, "template": {"metadata": {"labels": {"app": "minilm"}}}},
    }
    store = cache.Cache()
    store.seen("deployments", deployment)
    assert store.workloads("team") == [cache.slim("deployments", deployment)]
    assert store.workloads("wiki") == []


def test_a_child_is_kept_whole_but_for_managed_fields() -> None:
    child = {
        **obj("metis-wiki", managedFields=[{}], labels=dict(cache.MANAGED)),
        "spec": {"replicas": 1},
        "status": {"readyReplicas": 1},
    }
    kept = cache.slim("deployments", child)
    assert "managedFields" not in kept["metadata"] and kept["status"] == {"readyReplicas": 1}
    assert kept["kind"] == "Deployment"


def test_a_token_is_decoded_and_nothing_else_is_a_token() -> None:
    encoded = base64.b64encode(b"s3cret\n").decode()
    assert cache.token({"data": {"token": encoded}}) == "s3cret"
    assert cache.token({"data": {}}) is None
    assert cache.token({"data": {"token": "%%%"}}) is None


def test_a_bases_pods_are_read_by_the_base_not_by_a_scan_of_the_namespace() -> None:
    """At 1,000 bases, filtering the namespace's pods for each base was a tenth of the
    operator's work: pods are kept by (namespace, base) too."""
    labels = {**cache.INDEXER_PODS, cache.INSTANCE_LABEL: "wiki"}
    pod = obj("metis-wiki-7d9f-x", labels=labels)
    store = cache.Cache()
    store.seen("pods", pod)
    assert store.pods("team", "wiki") == [pod]
    assert store.pods("team", "handbook") == []
    moved = obj("metis-wiki-7d9f-x", labels={**labels, cache.INSTANCE_LABEL: "handbook"})
    store.seen("pods", moved)
    assert (store.pods("team", "wiki"), store.pods("team", "handbook")) == ([], [moved])
    store.seen("pods", moved, deleted=True)
    assert store.pods("team", "handbook") == []


def test_a_watch_event_wins_over_the_startup_list_and_what_no_event_confirms_goes() -> None:
    """The LISTs fill the cache before kopf's watches start; the watches' own listing
    then brings each object again, or newer, and sends no deletion for one deleted
    between the two."""
    kind = next(w for w in cache.WATCHED if w.plural == "persistentvolumeclaims")
    store = cache.Cache()
    store.prime(kind, [obj("wiki", resourceVersion="1"), obj("gone", resourceVersion="2")])
    wiki = store.claim("team", "wiki")
    assert wiki is not None and wiki["kind"] == "PersistentVolumeClaim", "a LIST's items lack it"
    store.seen("persistentvolumeclaims", obj("wiki", resourceVersion="3"))
    assert store.drop_unconfirmed() == 1
    assert store.claim("team", "gone") is None
    assert store.claim("team", "wiki") == obj("wiki", resourceVersion="3")
    assert store.drop_unconfirmed() == 0


def test_what_a_base_reads_now_wakes_it_not_what_it_read_before_nor_a_forgotten_base() -> None:
    bases = cache.Dependents.of({("team", "handbook"): HANDBOOK})
    model = {**obj("minilm"), "spec": {"template": {"metadata": {"labels": {"app": "minilm"}}}}}
    bases.set(("team", "handbook"), Deps("team", frozenset({"wiki"}), frozenset({"bge"})))
    assert cache.affected(bases, "persistentvolumeclaims", obj("docs")) == set()
    assert cache.affected(bases, "deployments", model) == set()
    assert cache.affected(bases, "persistentvolumeclaims", obj("wiki")) == {("team", "handbook")}
    bases.drop(("team", "handbook"))
    assert cache.affected(bases, "persistentvolumeclaims", obj("wiki")) == set()


def test_the_event_of_a_bases_own_apply_is_no_news_to_it_but_a_later_one_is() -> None:
    store = cache.Cache()
    base = ("team", "handbook")
    applied = obj("metis-handbook", resourceVersion="7")
    store.written("configmaps", applied, base)
    assert store.seen("configmaps", applied) == base
    assert store.seen("configmaps", obj("metis-handbook", resourceVersion="8")) is None
    # An apply whose answer comes after its own event: the next event is news.
    store.seen("configmaps", obj("metis-handbook", resourceVersion="9"))
    store.written("configmaps", obj("metis-handbook", resourceVersion="9"), base)
    assert store.seen("configmaps", obj("metis-handbook", resourceVersion="10")) is None
    gone = obj("metis-handbook", resourceVersion="11")
    store.written("configmaps", gone, base)
    assert store.seen("configmaps", gone, deleted=True) is None
    assert store.configmap("team", "metis-handbook") is None
