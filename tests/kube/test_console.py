"""The console (`metis-console`) against the real API server, in a real browser.

The console runs as its own service account with manifests/console/rbac.yaml (read
only: bases and Events). No operator runs: each test writes the bases' status
subresource itself, as the operator would, and watches the page follow it without a
reload. A base's `observed.address` names a Service; the console reaches it through
`--url-template http://127.0.0.1:{port}`, as the operator does out of a cluster.
"""

from __future__ import annotations

import copy
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By

from metis_dev.plane import ControlPlane
from tests.console.browser import chrome, fits, screenshot, wait
from tests.kube.operator_support import ROOT, install, kb, kb_path
from tests.support import processes
from tests.support.model_server import ModelServer, running_model_server
from tests.support.processes import Process, free_port

CONSOLE_USER = "system:serviceaccount:metis-system:metis-console"
SPEC: dict[str, Any] = {"sources": [{"drive": "docs"}], "embedding": {"deployment": "bge-m3"}}
INDEXING: dict[str, Any] = {
    "state": "Indexing",
    "reason": "indexing for generation 1: 3 of 8 documents read",
    "progress": "3/8",
    "observed": {
        "index": {
            "phase": "indexing",
            "documents": 3,
            "chunks": 11,
            "failed": 0,
            "pass_total": 8,
            "pass_done": 3,
        },
        "address": "http://metis-handbook.team-a.svc:7700",
    },
    "conditions": [
        {
            "type": "Ready",
            "status": "False",
            "reason": "Indexing",
            "message": "indexing for generation 1",
            "lastTransitionTime": "2026-11-30T21:00:00Z",
        }
    ],
}
READY: dict[str, Any] = {
    "state": "Ready",
    "reason": "",
    "progress": None,
    "observed": {
        "index": {
            "phase": "ready",
            "documents": 8,
            "chunks": 31,
            "failed": 1,
            "pass_total": 8,
            "pass_done": 8,
            "last_indexed_at": "2026-11-30T21:04:12Z",
        }
    },
    "evaluation": {
        "k": 10,
        "cases": 12,
        "recall_at_k": 0.92,
        "mrr": 0.81,
        "at": "2026-11-30T21:05:00Z",
    },
    "conditions": [
        {
            "type": "Ready",
            "status": "True",
            "reason": "Ready",
            "message": "8 documents indexed",
            "lastTransitionTime": "2026-11-30T21:04:12Z",
        }
    ],
}


@pytest.fixture(scope="module")
def installed(kube: ControlPlane) -> None:
    install(kube)
    console = ROOT / "manifests" / "console"
    kube.kubectl("apply", "-k", str(console), "--dry-run=server")
    kube.kubectl("apply", "-f", str(console / "rbac.yaml"))


def start_console(
    kube: ControlPlane, namespace: str, tmp_path: Path, user: str = CONSOLE_USER
) -> Process:
    """`metis-console` as `user` (by default its service account), watching `namespace`."""
    config = kube.write_kubeconfig(
        tmp_path / f"console-{free_port()}.kubeconfig",
        user,
        groups=("system:serviceaccounts", f"system:serviceaccounts:{user.split(':')[2]}"),
    )
    port = free_port()
    p = Process(
        f"http://127.0.0.1:{port}",
        [
            str(Path(sys.executable).parent / "metis-console"),
            "--kubeconfig",
            str(config),
            "--namespace",
            namespace,
            "--port",
            str(port),
            "--url-template",
            "http://127.0.0.1:{port}",
        ],
        tmp_path / f"console-{port}.log",
    )
    p.start()
    p.wait_for("the console", lambda: p.get("/healthz").status_code == 200)
    return p


@pytest.fixture
def console(
    kube: ControlPlane, installed: None, namespace: str, tmp_path: Path
) -> Iterator[Process]:
    p = start_console(kube, namespace, tmp_path)
    yield p
    p.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    driver = chrome()
    yield driver
    driver.quit()


def make_base(
    kube: ControlPlane, namespace: str, name: str, status: dict[str, Any] | None = None
) -> None:
    kube.rest().post(kb_path(namespace), kb(name, SPEC))
    if status is not None:
        set_status(kube, namespace, name, status)


def set_status(kube: ControlPlane, namespace: str, name: str, status: dict[str, Any]) -> None:
    """Write the status subresource as the operator does (a merge patch)."""
    body = copy.deepcopy(status)
    address = body.get("observed", {}).get("address")
    if address:
        body["observed"]["address"] = address.replace("team-a", namespace)
    kube.rest().patch(kb_path(namespace, name) + "/status", {"status": body})


def row(driver: webdriver.Chrome, key: str) -> Any:
    found = driver.find_elements(By.CSS_SELECTOR, f'tr[data-base="{key}"]')
    return found[0] if found else None


def test_a_base_moving_from_indexing_to_ready_updates_the_bases_page_without_reload(
    kube: ControlPlane, namespace: str, console: Process, browser: webdriver.Chrome
) -> None:
    make_base(kube, namespace, "handbook", INDEXING)
    browser.set_window_size(1280, 900)
    browser.get(console.base_url + "/")
    key = f"{namespace}/handbook"
    wait(
        browser,
        "handbook Indexing",
        lambda d: row(d, key) is not None and row(d, key).get_attribute("data-state") == "Indexing",
    )
    bar = row(browser, key).find_element(By.TAG_NAME, "progress")
    assert (bar.get_attribute("value"), bar.get_attribute("max")) == ("3", "8")
    assert "3 of 8 documents read" in row(browser, key).text
    browser.execute_script("window.sameDocument = true")

    set_status(kube, namespace, "handbook", READY)
    wait(browser, "handbook Ready", lambda d: row(d, key).get_attribute("data-state") == "Ready")
    assert browser.execute_script("return window.sameDocument === true"), "the page reloaded"
    shown = row(browser, key)
    assert shown.find_element(By.CSS_SELECTOR, ".state").text == "Ready"
    assert not shown.find_elements(By.TAG_NAME, "progress")
    cells = {
        td.get_attribute("data-label"): td.text for td in shown.find_elements(By.TAG_NAME, "td")
    }
    assert (cells["Documents"], cells["Chunks"], cells["Failed"]) == ("8", "31", "1")
    assert cells["Evaluation"].startswith("recall@10 0.92 · MRR 0.81")
    assert cells["Last indexed"] == "2026-11-30 21:04 UTC"

    make_base(
        kube,
        namespace,
        "runbooks",
        {
            "state": "Waiting",
            "reason": "waiting for embedding model bge-m3: connection refused",
            "observed": {
                "index": {"phase": "waiting", "documents": 40, "chunks": 212, "failed": 0},
                "warnings": [
                    "embedding model bge-m3 scales to zero: the first search "
                    "after a quiet hour waits for it"
                ],
            },
        },
    )
    make_base(
        kube,
        namespace,
        "contracts",
        {"state": "Failed", "reason": "drive legal-docs does not exist in this namespace"},
    )
    make_base(
        kube,
        namespace,
        "notes",
        {
            **INDEXING,
            "reason": "indexing for generation 2: 126 of 400 documents read",
            "observed": {
                "index": {
                    "phase": "indexing",
                    "documents": 388,
                    "chunks": 2140,
                    "failed": 2,
                    "pass_total": 400,
                    "pass_done": 126,
                    "last_indexed_at": "2026-11-30T20:15:40Z",
                }
            },
        },
    )
    wait(
        browser, "four bases", lambda d: len(d.find_elements(By.CSS_SELECTOR, "tr[data-base]")) == 4
    )
    assert browser.execute_script("return window.sameDocument === true")
    assert fits(browser)
    screenshot(browser, "bases")
    browser.set_window_size(390, 844)
    assert fits(browser)


def test_a_base_page_shows_its_conditions_and_events_live(
    kube: ControlPlane, namespace: str, console: Process, browser: webdriver.Chrome
) -> None:
    make_base(kube, namespace, "handbook", INDEXING)
    key = f"{namespace}/handbook"
    browser.set_window_size(1280, 900)
    browser.get(f"{console.base_url}/bases/{key}")
    wait(
        browser,
        "its conditions",
        lambda d: "indexing for generation 1" in d.find_element(By.ID, "base").text,
    )
    # Its indexer does not run here: the page says so where its failed documents would be.
    assert "does not answer" in browser.find_element(By.CSS_SELECTOR, "[role=alert]").text
    kube.rest().post(
        f"/api/v1/namespaces/{namespace}/events",
        {
            "metadata": {"name": "handbook.ready"},
            "involvedObject": {
                "apiVersion": "metis.astraeus.io/v1",
                "kind": "KnowledgeBase",
                "name": "handbook",
                "namespace": namespace,
            },
            "type": "Normal",
            "reason": "Ready",
            "message": "handbook is Ready: 8 documents",
            "source": {"component": "metis-operator"},
            "count": 1,
            "firstTimestamp": "2026-11-30T21:04:12Z",
            "lastTimestamp": "2026-11-30T21:04:12Z",
        },
    )
    wait(
        browser,
        "the Event",
        lambda d: "handbook is Ready: 8 documents" in d.find_element(By.ID, "base").text,
    )
    set_status(kube, namespace, "handbook", READY)
    wait(
        browser,
        "state Ready",
        lambda d: d.find_element(By.CSS_SELECTOR, "#base .state").text == "Ready",
    )


def test_a_search_of_a_base_not_ready_shows_its_state_and_why(
    kube: ControlPlane, namespace: str, console: Process, browser: webdriver.Chrome
) -> None:
    make_base(
        kube,
        namespace,
        "pending",
        {"state": "Pending", "reason": "no machine matches placement labels pool=gpu"},
    )
    key = f"{namespace}/pending"
    browser.set_window_size(1280, 900)

    def shown(d: webdriver.Chrome) -> str:
        d.get(f"{console.base_url}/search?{urlencode({'q': 'vacation', 'base': key})}")
        found = d.find_elements(By.CSS_SELECTOR, "[role=alert]")
        return found[0].text if found and "Pending" in found[0].text else ""

    error = wait(browser, "the base's state in the error", shown)
    assert "KNOWLEDGE_BASE_NOT_READY" in error
    assert f"{key} answers no searches yet: it is Pending: no machine matches placement" in error
    # An address but no indexer of its own ever answered (on the stand-in, another base's
    # holds the port): what answers there is not asked in its name.
    waiting = "its pod waits: PortInUse: port 7700 is held by pod metis-alpha-1"
    make_base(kube, namespace, "starting", {"state": "Starting", "reason": waiting,
              "observed": {"address": console.base_url}})  # fmt: skip
    key = f"{namespace}/starting"

    def refused(d: webdriver.Chrome) -> str:
        d.get(f"{console.base_url}/search?{urlencode({'q': 'vacation', 'base': key})}")
        found = d.find_elements(By.CSS_SELECTOR, "[role=alert]")
        return found[0].text if found and "Starting" in found[0].text else ""

    error = wait(browser, "the starting base refused", refused)
    assert f"{key} answers no searches yet: it is Starting: {waiting}" in error


@pytest.fixture(scope="module")
def model() -> Iterator[ModelServer]:
    with running_model_server() as server:
        yield server


@pytest.fixture
def indexer(model: ModelServer, tmp_path: Path) -> Iterator[Process]:
    handbook = tmp_path / "handbook"
    shutil.copytree(ROOT / "examples" / "handbook", handbook)
    p = processes.indexer(
        {"handbook": handbook}, tmp_path / "index", model.base_url, model.base_url
    )
    with processes.running(p):
        processes.wait_ready(p)
        yield p


def test_a_search_of_two_bases_merges_them_each_result_labelled(
    kube: ControlPlane,
    namespace: str,
    console: Process,
    indexer: Process,
    browser: webdriver.Chrome,
) -> None:
    port = indexer.base_url.rsplit(":", 1)[1]
    for name in ("handbook", "policies"):
        make_base(
            kube,
            namespace,
            name,
            {
                **READY,
                "observed": {
                    **READY["observed"],
                    "address": f"http://metis-{name}.{namespace}.svc:{port}",
                },
            },
        )
    bases = [f"{namespace}/handbook", f"{namespace}/policies"]
    query = urlencode(
        [("q", "How many holidays do I get?"), *(("base", b) for b in bases), ("top_k", "4")]
    )
    browser.set_window_size(1280, 900)

    def results(d: webdriver.Chrome) -> list[Any]:
        d.get(f"{console.base_url}/search?{query}")
        return d.find_elements(By.CSS_SELECTOR, "li.result")

    found = wait(browser, "results of both bases", results)
    labels = [r.find_element(By.CSS_SELECTOR, ".label").text for r in found]
    assert labels == [bases[0], bases[1], bases[0], bases[1]]
    cites = [r.find_element(By.CSS_SELECTOR, ".doc").text for r in found]
    assert cites[0] == cites[1] and cites[0].startswith("handbook/")
    assert all(
        re.match(r"^meaning \d\.\d{3} \(#\d+\)", r.find_element(By.CSS_SELECTOR, ".scores").text)
        for r in found
    )
    assert "merged across bases by reciprocal rank" in browser.find_element(By.ID, "results").text


def test_a_console_that_may_not_read_the_bases_says_so(
    kube: ControlPlane, installed: None, namespace: str, tmp_path: Path, browser: webdriver.Chrome
) -> None:
    p = start_console(kube, namespace, tmp_path, user="system:serviceaccount:nobody:nobody")
    try:

        def problem(d: webdriver.Chrome) -> str:
            d.get(p.base_url + "/")
            found = d.find_elements(By.CSS_SELECTOR, "#bases [role=alert]")
            return found[0].text if found else ""

        said = wait(browser, "the watch's refusal", problem)
        assert "cannot watch knowledgebases: 403 Forbidden" in said
    finally:
        p.stop()
