"""Operator scale bench on kwok: 1,000 KnowledgeBases on the local control plane, their
pods on fake nodes, their indexers and model Services one stub process.

The control plane is metis_dev's (etcd, kube-apiserver with an audit log of the
operator's service account, controller-manager, scheduler). kwok (sigs.k8s.io/kwok,
built by tools/kwok/build.sh) runs as a controller against it: it keeps the fake Nodes
Ready and reports the pods bound to them Running, with no container behind them; if it
cannot be built or run, the bench marks the pods Running itself (the output says so).
Every base's indexer and the model Services are bench/stub_indexer.py, one aiohttp
process the operator reaches through `METIS_URL_TEMPLATE`
(`http://127.0.0.1:<stub>/r/{namespace}/{name}/{port}`: the path names the base).

Phases, each measured on its own:
1. apply: all bases at once; time until every base is Ready.
2. idle: API requests a minute (the audit log, the operator's user), HTTP requests a
   second to the stub (indexer status, model probes), the operator's CPU and RSS.
3. churn: rounds of 100 bases changed at once (a config-only spec change); from each
   change to `Reconciling=True`, and from the stub reporting the new generation indexed
   to `Ready=True`; CPU and RSS meanwhile.
4. failover (two operators, leader election): SIGKILL of the leader; the standby's first
   reconcile, and every base derived again (its own metrics); RSS of the new leader.
5. padding: 10,000 objects the operator must not hold (ConfigMaps, Secrets, pods of other
   apps in other namespaces); failover again, RSS of the new leader with the padding.

    .venv/bin/python bench/operator_kwok.py --bases 1000 [--namespaces 50]

The table goes to bench/results/operator-kwok.md (a section per bases/namespaces).
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import contextlib
import dataclasses
import datetime as dt
import functools
import json
import math
import os
import platform
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "bench" / "results" / "operator-kwok.md"
OPERATOR_USER = "system:serviceaccount:metis-system:metis-operator"
GROUP = "metis.astraeus.io"
AUDIT_POLICY = f"""apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    users: ["{OPERATOR_USER}"]
  - level: None
"""

GOALS = {
    "all_ready_s": ("all Ready after apply", 300.0, "s"),
    "idle_api_per_min_per_base": ("idle API requests a minute per base", 0.1, ""),
    "idle_cpu_percent": ("idle CPU, % of one core", 10.0, "%"),
    "rss_mib": ("RSS (largest seen)", 400.0, "MiB"),
    "padding_rss_percent": ("RSS added by the padding", 10.0, "%"),
    "change_p99_s": ("spec change to Reconciling=True, p99, while bases churn", 2.0, "s"),
    "failover_s": ("SIGKILL of the leader to the standby's first reconcile", 20.0, "s"),
    "rederived_s": ("first reconcile to every base derived again", 60.0, "s"),
    "failover_padded_s": ("the same failover with the padding", 20.0, "s"),
    "rederived_padded_s": ("every base derived again, with the padding", 60.0, "s"),
}


# --------------------------------------------------------------------------- pure helpers


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between closest ranks; nan
    for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def parse_time(stamp: str) -> dt.datetime:
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def request_kind(event: Mapping[str, Any]) -> str:
    """`verb resource[/subresource]` of an audit event (`get leases`, `patch
    knowledgebases/status`); non-resource requests by their path."""
    ref = event.get("objectRef")
    if not ref:
        return f"{event.get('verb', '?')} {event.get('requestURI', '?').split('?')[0]}"
    resource = ref.get("resource", "?")
    if ref.get("subresource"):
        resource += "/" + ref["subresource"]
    return f"{event.get('verb', '?')} {resource}"


def audit_counts(
    lines: Iterable[str], user: str, since: dt.datetime, until: dt.datetime
) -> collections.Counter[str]:
    """The requests `user` made that the API server received in [since, until), by
    `request_kind`; each request once (an audit log has a line per stage)."""
    seen: dict[str, str] = {}
    for line in lines:
        if not line.strip():
            continue
        event = json.loads(line)
        if (event.get("user") or {}).get("username") != user:
            continue
        at = parse_time(event["requestReceivedTimestamp"])
        if since <= at < until:
            seen[event["auditID"]] = request_kind(event)
    return collections.Counter(seen.values())


def audit_uris(lines: Iterable[str], user: str, verbs: set[str]) -> collections.Counter[str]:
    """The request URIs (query included) of `user`'s requests of `verbs`: which watches
    and lists ask the API server to filter by label."""
    seen: dict[str, str] = {}
    for line in lines:
        if not line.strip():
            continue
        event = json.loads(line)
        if (event.get("user") or {}).get("username") == user and event.get("verb") in verbs:
            uri = re.sub(r"resourceVersion=\d+", "resourceVersion=N", event["requestURI"])
            uri = re.sub(r"timeoutSeconds=\d+", "timeoutSeconds=N", uri)
            seen[event["auditID"]] = f"{event['verb']} {uri}"
    return collections.Counter(seen.values())


def proc_usage(stat: str, status: str, ticks: int) -> tuple[float, int]:
    """(CPU seconds, user and system, RSS bytes) from /proc/<pid>/stat and status."""
    fields = stat.rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    rss = next(
        int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmRSS:")
    )
    return cpu, rss


def metric_sum(text: str, name: str) -> float:
    """The sum of every sample of metric `name` (all labels) in Prometheus text."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def condition(status: Mapping[str, Any] | None, kind: str) -> tuple[bool, int]:
    """(is it True, its observedGeneration) of condition `kind` of a base's status."""
    for c in (status or {}).get("conditions") or []:
        if c.get("type") == kind:
            return c.get("status") == "True", int(c.get("observedGeneration") or 0)
    return False, 0


def verdict(value: float, goal: float) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "not measured"
    return "met" if value <= goal else "**not met**"


# --------------------------------------------------------------------------- processes


def usage(pid: int) -> tuple[float, int]:
    return proc_usage(
        Path(f"/proc/{pid}/stat").read_text(),
        Path(f"/proc/{pid}/status").read_text(),
        os.sysconf("SC_CLK_TCK"),
    )


class Sampler:
    """The operator's RSS every second, its largest value per phase."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.peak: dict[str, int] = collections.defaultdict(int)
        self.phase = "setup"
        self._stop = threading.Event()
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while not self._stop.wait(1.0):
            if self.pid is None:
                continue
            with contextlib.suppress(OSError, StopIteration):
                _, rss = usage(self.pid)
                self.peak[self.phase] = max(self.peak[self.phase], rss)

    def stop(self) -> None:
        self._stop.set()


class Window:
    """CPU of some processes, the stub's counts and wall time over one window."""

    def __init__(self, bench: Bench, pids: Mapping[str, int]) -> None:
        self.bench, self.pids = bench, dict(pids)
        self.t0, self.wall0 = time.monotonic(), dt.datetime.now(dt.UTC)
        self.cpu0 = {k: usage(p)[0] for k, p in self.pids.items()}
        self.stub0 = bench.stub_counts()

    def close(self) -> dict[str, Any]:
        t1, wall1 = time.monotonic(), dt.datetime.now(dt.UTC)
        seconds = t1 - self.t0
        cpu = {
            k: round(100 * (usage(p)[0] - self.cpu0[k]) / seconds, 1) for k, p in self.pids.items()
        }
        stub1 = self.bench.stub_counts()
        stub = {
            k: round((stub1.get(k, 0) - self.stub0.get(k, 0)) / seconds, 2)
            for k in ("status", "models", "embeddings", "other")
        }
        return {"seconds": seconds, "since": self.wall0, "until": wall1, "cpu": cpu, "stub": stub}


# --------------------------------------------------------------------------- the cluster


class Api:
    """A pooled JSON client of the API server as its admin (httpx, keep-alive)."""

    def __init__(self, server: str, ctx: Any) -> None:
        import httpx

        self.httpx = httpx
        self.client = httpx.Client(
            base_url=server,
            verify=ctx,
            timeout=60,
            limits=httpx.Limits(max_connections=32, max_keepalive_connections=32),
        )

    def request(self, method: str, path: str, body: Any = None, merge: bool = False) -> Any:
        headers = {"content-type": "application/merge-patch+json"} if merge else {}
        for attempt in range(5):
            answer = self.client.request(
                method, path, content=None if body is None else json.dumps(body), headers=headers
            )
            if answer.status_code in (429, 500, 503, 504) and attempt < 4:
                time.sleep(0.5 * (attempt + 1))
                continue
            if answer.status_code == 409 and method == "POST":
                return None  # already there (a retried create)
            answer.raise_for_status()
            return answer.json()
        return None

    def bulk(self, method: str, items: Sequence[tuple[str, Any]], workers: int = 8) -> float:
        """Send every (path, body) at once from `workers` threads; the seconds it took."""
        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            merge = method == "PATCH"
            list(pool.map(lambda item: self.request(method, item[0], item[1], merge), items))
        return time.monotonic() - t0


class KbWatch:
    """Every base's Ready and Reconciling conditions, from one watch of the bases (as the
    admin, outside the audit's user), with the time each change was seen."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.lock = threading.RLock()  # `wait`'s test counts under it
        self.changed = threading.Condition(self.lock)
        self.bases: dict[tuple[str, str], dict[str, Any]] = {}
        self.listeners: list[Callable[[tuple[str, str], float, dict[str, Any]], None]] = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _seen(self, obj: dict[str, Any], now: float) -> None:
        meta = obj["metadata"]
        key = (meta["namespace"], meta["name"])
        status = obj.get("status") or {}
        view = {
            "generation": int(meta.get("generation") or 0),
            "ready": condition(status, "Ready"),
            "reconciling": condition(status, "Reconciling"),
            "state": status.get("state"),
        }
        with self.lock:
            self.bases[key] = view
            self.changed.notify_all()
        for listen in list(self.listeners):
            listen(key, now, view)

    def _loop(self) -> None:
        path = f"/apis/{GROUP}/v1/knowledgebases"
        while not self._stop.is_set():
            try:
                listing = self.api.request("GET", path)
                now = time.monotonic()
                for obj in listing["items"]:
                    self._seen(obj, now)
                rv = listing["metadata"]["resourceVersion"]
                params = {"watch": "1", "resourceVersion": rv, "allowWatchBookmarks": "true"}
                timeout = self.api.httpx.Timeout(None, connect=10)
                with self.api.client.stream("GET", path, params=params, timeout=timeout) as s:
                    for line in s.iter_lines():
                        if self._stop.is_set():
                            return
                        event = json.loads(line)
                        if event["type"] in ("ADDED", "MODIFIED"):
                            self._seen(event["object"], time.monotonic())
                        elif event["type"] == "ERROR":
                            break
            except Exception as e:  # relist after any failure
                if not self._stop.is_set():
                    print(f"  (watch of the bases restarts: {e!r})", flush=True)
                    time.sleep(1)

    def count(self, test: Callable[[dict[str, Any]], bool]) -> int:
        with self.lock:
            return sum(1 for v in self.bases.values() if test(v))

    def states(self) -> dict[str, int]:
        with self.lock:
            return dict(collections.Counter(str(v["state"]) for v in self.bases.values()))

    def wait(self, test: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self.lock:
            while not test():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(min(left, 1.0))
        return True

    def stop(self) -> None:
        self._stop.set()


def ready_now(view: Mapping[str, Any]) -> bool:
    ok, og = view["ready"]
    return ok and og == view["generation"]


# --------------------------------------------------------------------------- kwok


def build_kwok() -> Path | None:
    """kwok's binary (built once a machine), or None when it cannot be built."""
    try:
        out = subprocess.run(
            ["bash", str(ROOT / "tools" / "kwok" / "build.sh")],
            capture_output=True,
            text=True,
            check=True,
            timeout=1800,
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
        print(f"kwok cannot be built: {getattr(e, 'stderr', '') or e}", flush=True)
        return None
    return Path(out.stdout.strip().splitlines()[-1])


class MarkRunning:
    """The fallback without kwok: the bench reports each bound pod Running itself."""

    def __init__(self, kube: Any) -> None:
        self.kube = kube
        self.done: set[str] = set()
        self._stop = threading.Event()
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        api = self.kube.rest()
        while not self._stop.wait(1.0):
            with contextlib.suppress(Exception):
                for pod in api.get("/api/v1/pods")["items"]:
                    meta = pod["metadata"]
                    if meta["uid"] in self.done or not pod["spec"].get("nodeName"):
                        continue
                    if meta.get("deletionTimestamp"):
                        continue
                    self.kube.mark_pod_running(meta["namespace"], meta["name"])
                    self.done.add(meta["uid"])

    def stop(self) -> None:
        self._stop.set()


# --------------------------------------------------------------------------- the bench


@dataclasses.dataclass
class Bench:
    args: argparse.Namespace
    work: Path
    kube: Any = None
    api: Api | None = None
    stub_url: str = ""
    stub_proc: subprocess.Popen[bytes] | None = None
    kwok_proc: subprocess.Popen[bytes] | None = None
    fallback: MarkRunning | None = None
    mode: str = ""
    namespaces: list[str] = dataclasses.field(default_factory=list)
    keys: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    figures: dict[str, Any] = dataclasses.field(default_factory=dict)
    operators: list[Any] = dataclasses.field(default_factory=list)

    # -- the stub ---------------------------------------------------------------

    def start_stub(self) -> None:
        port_file = self.work / "stub.port"
        log = (self.work / "stub.log").open("ab")
        self.stub_proc = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "bench" / "stub_indexer.py"),
                "--port-file",
                str(port_file),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text():
            if time.monotonic() > deadline or self.stub_proc.poll() is not None:
                raise RuntimeError("the stub indexer did not start; see stub.log")
            time.sleep(0.1)
        self.stub_url = f"http://127.0.0.1:{port_file.read_text().strip()}"

    @functools.cached_property
    def stub(self) -> Any:
        """One pooled client of the stub: a client made per call cost the bench's own CPU
        (a TLS context each) while 100 bases changed."""
        import httpx

        return httpx.Client(base_url=self.stub_url, timeout=30)

    def stub_counts(self) -> dict[str, int]:
        return dict(self.stub.get("/control/counts").json())

    def stub_set(self, bases: Any, **script: Any) -> None:
        self.stub.post("/control/bases", json={"bases": bases, **script})

    # -- the cluster ------------------------------------------------------------

    def start_nodes(self, kwok: Path | None) -> None:
        kube = self.kube
        pods = self.args.bases * 2 + self.args.padding // 5 + 10
        count = max(2, math.ceil(pods / 400))
        for i in range(count):
            kube.add_node(f"kwok-{i}", {"pool": "bench"}, cpu="1000", memory="4000Gi", pods=500)
        kube.add_node("kwok-padding", {"pool": "padding"}, cpu="1000", memory="4000Gi", pods=5000)
        if kwok is not None:
            log = (self.work / "kwok.log").open("ab")
            self.kwok_proc = subprocess.Popen(
                [
                    str(kwok),
                    f"--kubeconfig={kube.kubeconfig}",
                    f"--config={ROOT / 'tools' / 'kwok' / 'stages.yaml'}",
                    "--manage-all-nodes=true",
                    "--cidr=10.128.0.0/10",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            time.sleep(3)
            if self.kwok_proc.poll() is not None:
                print("kwok exited at once; see kwok.log: the bench marks pods Running", flush=True)
                self.kwok_proc = None
        if self.kwok_proc is None:
            self.mode = "no kwok: the bench marks pods Running itself"
            self.fallback = MarkRunning(kube)
        else:
            self.mode = f"kwok {kwok.parent.name}"

    def prepare_namespaces(self) -> None:
        from metis_dev.kubelet import hostpath_volume
        from tests.kube.operator_support import make_drive, model_service

        api, args = self.api, self.args
        assert api is not None
        self.namespaces = [f"kb-{i:02d}" for i in range(args.namespaces)]
        self.made_namespaces(self.namespaces)
        for ns in self.namespaces:
            folder = self.work / "drives" / ns
            folder.mkdir(parents=True)
            make_drive(self.kube, ns, "docs", folder)
            model_service(self.kube, ns, "minilm", 80)
        self.keys = [(self.namespaces[i % args.namespaces], f"kb-{i}") for i in range(args.bases)]
        volumes = [
            (
                "/api/v1/persistentvolumes",
                hostpath_volume(f"{ns}-metis-{name}", self.work / "index", ns, f"metis-{name}"),
            )
            for ns, name in self.keys
        ]
        print(f"  {len(volumes)} index volumes in {api.bulk('POST', volumes):.1f} s", flush=True)

    def made_namespaces(self, names: Sequence[str]) -> None:
        """Namespaces made, each once its default service account exists (pods need it)."""
        api = self.api
        assert api is not None
        for ns in names:
            api.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
        for ns in names:
            deadline = time.monotonic() + 60
            while True:
                try:
                    api.request("GET", f"/api/v1/namespaces/{ns}/serviceaccounts/default")
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)

    def pad(self) -> float:
        """10,000 (--padding) objects of other apps in other namespaces."""
        api, n = self.api, self.args.padding
        assert api is not None
        spaces = [f"other-{i:02d}" for i in range(10)]
        self.made_namespaces(spaces)
        blob = "x" * 1024
        items: list[tuple[str, Any]] = []
        pods = n // 5
        maps = (n - pods) // 2
        for i in range(maps):
            ns = spaces[i % len(spaces)]
            items.append(
                (
                    f"/api/v1/namespaces/{ns}/configmaps",
                    {
                        "metadata": {"name": f"app-{i}", "labels": {"app": f"app-{i % 50}"}},
                        "data": {"settings": blob},
                    },
                )
            )
        for i in range(n - pods - maps):
            ns = spaces[i % len(spaces)]
            items.append(
                (
                    f"/api/v1/namespaces/{ns}/secrets",
                    {
                        "metadata": {"name": f"app-{i}", "labels": {"app": f"app-{i % 50}"}},
                        "stringData": {"key": blob},
                    },
                )
            )
        for i in range(pods):
            ns = spaces[i % len(spaces)]
            items.append(
                (
                    f"/api/v1/namespaces/{ns}/pods",
                    {
                        "metadata": {"name": f"app-{i}", "labels": {"app": f"app-{i % 50}"}},
                        "spec": {
                            "nodeName": "kwok-padding",
                            "containers": [{"name": "app", "image": "registry.invalid/app:1"}],
                        },
                    },
                )
            )
        return api.bulk("POST", items)

    # -- operators --------------------------------------------------------------

    def operator(self, identity: str, leader: bool) -> Any:
        from tests.kube.operator_support import Operator

        folder = self.work / identity
        folder.mkdir(exist_ok=True)
        op = Operator(
            self.kube,
            folder,
            7700,
            poll_seconds=self.args.poll_seconds,
            identity=identity,
            url_template=f"{self.stub_url}/r/{{namespace}}/{{name}}/{{port}}",
            env={
                "METIS_PROBE_SECONDS": "60",
                "METIS_MODEL_GRACE_SECONDS": "20",
                "METIS_HTTP_TIMEOUT_SECONDS": "5",
                "METIS_LOG_FORMAT": "json",
                "METIS_LEADER_ELECTION": "true" if leader else "false",
            },
        )
        op.start()
        self.operators.append(op)
        return op

    def metrics(self, op: Any) -> str | None:
        import httpx

        try:
            return httpx.get(f"http://127.0.0.1:{op.metrics_port}/metrics", timeout=5).text
        except httpx.HTTPError:
            return None

    # -- phases -----------------------------------------------------------------

    def apply_all(self, watch: KbWatch) -> float:
        spec = {
            "sources": [{"drive": "docs"}],
            "embedding": {"deployment": "minilm"},
            "placement": {"labels": {"pool": "bench"}},
            "rescan_seconds": 0,
        }
        items = [
            (
                f"/apis/{GROUP}/v1/namespaces/{ns}/knowledgebases",
                {
                    "apiVersion": f"{GROUP}/v1",
                    "kind": "KnowledgeBase",
                    "metadata": {"name": name},
                    "spec": spec,
                },
            )
            for ns, name in self.keys
        ]
        assert self.api is not None
        started = time.monotonic()
        took = self.api.bulk("POST", items)
        print(f"  {len(items)} bases created in {took:.1f} s", flush=True)
        n = len(self.keys)
        last = 0.0
        while not watch.wait(lambda: watch.count(ready_now) >= n, 10):
            elapsed = time.monotonic() - started
            print(f"  {elapsed:6.0f} s {watch.states()}", flush=True)
            for op in self.operators:
                op.check_alive()
            if elapsed > self.args.ready_timeout:
                return math.nan
            last = elapsed
        del last
        return time.monotonic() - started

    def churn(self, watch: KbWatch, rounds: int, size: int) -> dict[str, Any]:
        """`rounds` rounds of `size` bases changed at once; latencies in seconds."""
        assert self.api is not None
        to_reconciling: list[float] = []
        to_ready: list[float] = []
        missed = 0
        lock = threading.Lock()
        pending: dict[tuple[str, str], dict[str, Any]] = {}
        telling: queue.Queue[tuple[tuple[str, str], int] | None] = queue.Queue()

        def tell() -> None:
            """The stub told each new generation, off the watch's thread: told there, each
            call held back every event after it, and the times they were seen."""
            while (item := telling.get()) is not None:
                key, generation = item
                self.stub_set([[key[0], f"metis-{key[1]}"]], generation=generation)
                with lock:
                    p = pending.get(key)
                    if p is not None and p["generation"] == generation:
                        p["told"] = time.monotonic()

        teller = threading.Thread(target=tell, daemon=True)
        teller.start()

        def listen(key: tuple[str, str], now: float, view: dict[str, Any]) -> None:
            with lock:
                p = pending.get(key)
                if p is None:
                    return
                reconciling, og = view["reconciling"]
                if "reconciling" not in p and reconciling and og >= p["generation"]:
                    p["reconciling"] = now
                    # The indexer now runs and has indexed the new generation.
                    telling.put((key, p["generation"]))
                ready, rog = view["ready"]
                if "told" in p and "ready" not in p and ready and rog >= p["generation"]:
                    p["ready"] = now

        watch.listeners.append(listen)
        try:
            for r in range(rounds):
                chosen = [self.keys[(r * size + i) % len(self.keys)] for i in range(size)]
                with watch.lock:
                    gens = {k: watch.bases[k]["generation"] for k in chosen}
                with lock:
                    pending.clear()
                    for k in chosen:
                        pending[k] = {"generation": gens[k] + 1}
                prefix = f"churn {r}: "
                items = [
                    (
                        f"/apis/{GROUP}/v1/namespaces/{ns}/knowledgebases/{name}",
                        {"spec": {"embedding": {"query_prefix": prefix}}},
                    )
                    for ns, name in chosen
                ]

                def patch(item: tuple[str, Any], key: tuple[str, str]) -> None:
                    self.api.request("PATCH", item[0], item[1], merge=True)
                    with lock:
                        pending[key]["changed"] = time.monotonic()

                with concurrent.futures.ThreadPoolExecutor(8) as pool:
                    list(pool.map(patch, items, chosen))

                def settled() -> bool:
                    with lock:
                        return all("ready" in p for p in pending.values())

                deadline = time.monotonic() + 180
                while not settled() and time.monotonic() < deadline:
                    time.sleep(0.5)
                with lock:
                    for p in pending.values():
                        if "reconciling" in p:
                            to_reconciling.append(max(0.0, p["reconciling"] - p["changed"]))
                        if "ready" in p:
                            to_ready.append(max(0.0, p["ready"] - p["told"]))
                        else:
                            missed += 1
                print(
                    f"  round {r}: {len(to_reconciling)} changes seen, "
                    f"{len(to_ready)} Ready again, {missed} not",
                    flush=True,
                )
        finally:
            watch.listeners.remove(listen)
            telling.put(None)
            teller.join(30)
        return {
            "changes": len(to_reconciling),
            "change_p50_s": percentile(to_reconciling, 50),
            "change_p99_s": percentile(to_reconciling, 99),
            "ready_p50_s": percentile(to_ready, 50),
            "ready_p99_s": percentile(to_ready, 99),
            "not_ready_again": missed,
        }

    def failover(self, leader: Any, standby: Any) -> dict[str, Any]:
        """SIGKILL the leader; when the standby first reconciles, and derives every base."""
        time.sleep(3)  # the standby has read the Lease held
        assert leader.proc is not None
        killed = time.monotonic()
        os.kill(leader.proc.pid, signal.SIGKILL)
        leader.proc.wait()
        first = everyone = math.nan
        n = len(self.keys)
        while time.monotonic() - killed < 300:
            standby.check_alive()
            text = self.metrics(standby)
            if text is not None:
                now = time.monotonic() - killed
                if (
                    math.isnan(first)
                    and metric_sum(text, "metis_operator_reconciliations_total") > 0
                ):
                    first = now
                if metric_sum(text, "metis_operator_knowledge_bases") >= n:
                    everyone = now
                    break
            time.sleep(0.5)
        return {"failover_s": first, "rederived_s": everyone - first}


def audit_lines(kube: Any) -> list[str]:
    return Path(kube.audit_log).read_text().splitlines()


def idle(bench: Bench, op: Any, minutes: float, sampler: Sampler) -> dict[str, Any]:
    pids = {"operator": op.proc.pid, **bench.other_pids()}
    window = Window(bench, pids)
    time.sleep(minutes * 60)
    result = window.close()
    requests = audit_counts(
        audit_lines(bench.kube), OPERATOR_USER, result["since"], result["until"]
    )
    total = sum(requests.values())
    per_min = total / (result["seconds"] / 60)
    _, rss = usage(op.proc.pid)
    return {
        "minutes": round(result["seconds"] / 60, 2),
        "api_per_min": round(per_min, 1),
        "api_per_min_per_base": round(per_min / len(bench.keys), 3),
        "api_by_kind": dict(requests.most_common(12)),
        "stub_per_s": result["stub"],
        "cpu_percent": result["cpu"],
        "rss_mib": round(rss / 2**20, 1),
    }


def other_pids(self: Bench) -> dict[str, int]:
    """The API server's, etcd's, kwok's and the stub's process ids."""
    out = {}
    for name in ("kube-apiserver", "etcd"):
        proc = self.kube.procs.get(name)
        if proc is not None and proc.proc is not None:
            out[name] = proc.proc.pid
    if self.kwok_proc is not None:
        out["kwok"] = self.kwok_proc.pid
    if self.stub_proc is not None:
        out["stub"] = self.stub_proc.pid
    return out


Bench.other_pids = other_pids  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- report


def fmt(value: Any, unit: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, float):
        value = f"{value:.3f}" if abs(value) < 1 else f"{value:.1f}"
    return f"{value} {unit}".strip()


def section(f: Mapping[str, Any]) -> str:
    goals = f["goals"]
    rows = [
        "| Figure | Measured | Goal | |",
        "|---|---|---|---|",
    ]
    for key, (label, goal, unit) in GOALS.items():
        value = goals.get(key, math.nan)
        rows.append(
            f"| {label} | {fmt(value, unit)} | ≤ {fmt(goal, unit)} | {verdict(value, goal)} |"
        )
    idle_a = f["idle"]
    lines = [
        f"<!-- run: bases={f['bases']} namespaces={f['namespaces']} -->",
        f"## {f['bases']} bases in {f['namespaces']} namespace(s), {f['date']}",
        "",
        f"Machine: {f['machine']}. Pods: {f['mode']}. Beside CI: {f['beside_ci']}. "
        f"Poll {f['poll_seconds']} s, resync 300 s, probe 60 s. Command: `{f['command']}`.",
        "",
        *rows,
        "",
        "Other figures:",
        "",
        f"- idle ({idle_a['minutes']} min, no padding): {idle_a['api_per_min']} API requests a "
        f"minute in all; by kind: {idle_a['api_by_kind']}",
        f"- idle HTTP requests a second to the stub: {idle_a['stub_per_s']}",
        f"- idle CPU, % of one core: {idle_a['cpu_percent']}",
        f"- churn ({f['churn']['changes']} changes, rounds of {f['churn_size']}): change → "
        f"Reconciling p50 {fmt(f['churn']['change_p50_s'], 's')}, p99 "
        f"{fmt(f['churn']['change_p99_s'], 's')}; stub reports it indexed → Ready p50 "
        f"{fmt(f['churn']['ready_p50_s'], 's')}, p99 {fmt(f['churn']['ready_p99_s'], 's')}; "
        f"not Ready again within 180 s: {f['churn']['not_ready_again']}",
        f"- churn CPU, % of one core: {f['churn_window']['cpu']}; stub requests a second: "
        f"{f['churn_window']['stub']}; API requests during churn by kind: {f['churn_api']}",
        f"- RSS, MiB: {f['rss']}",
        f"- API requests per base until all Ready: {f['api_per_base_until_ready']} "
        f"({f['api_until_ready']})",
        f"- failover without padding: {f.get('failover')}; "
        f"with padding: {f.get('failover_padded')}",
        f"- padding: {f['padding']} objects created in {fmt(f.get('padding_s'), 's')}",
        f"- watches and lists (request URIs): {f.get('uris')}",
        "",
    ]
    return "\n".join(lines)


def write_results(f: Mapping[str, Any], path: Path = RESULTS) -> None:
    head = (
        "# Operator at scale on kwok\n\n"
        "`bench/operator_kwok.py` (see its docstring): the operator against the local control "
        "plane, its pods on kwok's fake nodes, every indexer and model Service one stub "
        "process. One section per bases/namespaces, the latest run of each.\n\n"
    )
    text = path.read_text() if path.exists() else head
    marker = f"<!-- run: bases={f['bases']} namespaces={f['namespaces']} -->"
    parts = re.split(r"(?=<!-- run: )", text)
    kept = [p for p in parts[1:] if not p.startswith(marker)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(parts[0] + "".join(kept) + section(f))


# --------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bases", type=int, default=1000)
    parser.add_argument("--namespaces", type=int, default=1)
    parser.add_argument("--padding", type=int, default=10000)
    parser.add_argument("--idle-minutes", type=float, default=5.5, help="past the 300 s resync")
    parser.add_argument("--churn-rounds", type=int, default=3)
    parser.add_argument("--churn-size", type=int, default=100)
    parser.add_argument("--poll-seconds", type=float, default=10.0)
    parser.add_argument("--ready-timeout", type=float, default=1800.0)
    parser.add_argument("--no-failover", action="store_true")
    parser.add_argument("--no-kwok", action="store_true", help="mark pods Running from the bench")
    parser.add_argument("--beside-ci", default="no", help="what else ran on the machine")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    # SIGTERM (a timeout) as an exception: the finally below stops the operators, the stub
    # and kwok, and the control plane stops with the interpreter.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    from metis_dev.build import ensure_binaries
    from metis_dev.plane import ControlPlane
    from tests.kube.operator_support import install

    work = Path(tempfile.mkdtemp(prefix="metis-operator-kwok-"))
    print(f"work folder {work}", flush=True)
    policy = work / "audit-policy.yaml"
    policy.write_text(AUDIT_POLICY)
    kwok = None if args.no_kwok else build_kwok()
    bench = Bench(args, work)
    sampler = Sampler()
    f: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "bases": args.bases,
        "namespaces": args.namespaces,
        "padding": args.padding,
        "poll_seconds": args.poll_seconds,
        "churn_size": args.churn_size,
        "beside_ci": args.beside_ci,
        "command": "python bench/operator_kwok.py " + " ".join(sys.argv[1:]),
    }
    rss: dict[str, float] = {}
    with ControlPlane(
        ensure_binaries(), audit_policy=policy, reap_terminating_pods=kwok is None
    ) as kube:
        bench.kube = kube
        bench.api = api = Api(kube.server, kube._client_ssl())
        os.environ["KUBECONFIG"] = str(kube.kubeconfig)
        install(kube)
        # The manifests' own operator Deployment would run on kwok's nodes: none here.
        kube.kubectl("scale", "-n", "metis-system", "deployment/metis-operator", "--replicas=0")
        bench.start_nodes(kwok)
        f["mode"] = bench.mode
        print(f"pods: {bench.mode}", flush=True)
        bench.start_stub()
        bench.prepare_namespaces()
        watch = KbWatch(api)
        try:
            op = bench.operator("metis-operator-0", leader=not args.no_failover)
            if not args.no_failover:
                op.wait_healthy(120)
            sampler.pid = op.proc.pid
            sampler.phase = "apply"
            wall0 = dt.datetime.now(dt.UTC)
            print(f"apply {args.bases} bases", flush=True)
            all_ready = bench.apply_all(watch)
            print(f"all Ready in {all_ready:.1f} s", flush=True)
            until_ready = audit_counts(
                audit_lines(kube), OPERATOR_USER, wall0, dt.datetime.now(dt.UTC)
            )
            f["api_until_ready"] = dict(until_ready.most_common(10))
            f["api_per_base_until_ready"] = round(sum(until_ready.values()) / args.bases, 1)

            sampler.phase = "idle"
            print(f"idle {args.idle_minutes} min", flush=True)
            f["idle"] = idle(bench, op, args.idle_minutes, sampler)
            print(json.dumps(f["idle"]), flush=True)
            rss["idle, first leader"] = f["idle"]["rss_mib"]

            sampler.phase = "churn"
            print(f"churn {args.churn_rounds} × {args.churn_size}", flush=True)
            window = Window(bench, {"operator": op.proc.pid, **bench.other_pids()})
            f["churn"] = bench.churn(watch, args.churn_rounds, args.churn_size)
            f["churn_window"] = window.close()
            f["churn_api"] = dict(
                audit_counts(
                    audit_lines(kube),
                    OPERATOR_USER,
                    f["churn_window"]["since"],
                    f["churn_window"]["until"],
                ).most_common(8)
            )
            print(json.dumps(f["churn"]), flush=True)
            rss["churn, peak"] = round(sampler.peak["churn"] / 2**20, 1)

            if not args.no_failover:
                print("failover without padding", flush=True)
                standby = bench.operator("metis-operator-1", leader=True)
                sampler.phase = "failover"
                f["failover"] = bench.failover(op, standby)
                sampler.pid = standby.proc.pid
                print(json.dumps(f["failover"]), flush=True)
                op = standby
                time.sleep(30)
                rss["new leader, no padding"] = round(usage(op.proc.pid)[1] / 2**20, 1)

            if args.padding:
                print(f"padding: {args.padding} objects", flush=True)
                f["padding_s"] = bench.pad()
                time.sleep(20)
                rss["same leader after padding"] = round(usage(op.proc.pid)[1] / 2**20, 1)
                if not args.no_failover:
                    print("failover with padding", flush=True)
                    standby = bench.operator("metis-operator-2", leader=True)
                    f["failover_padded"] = bench.failover(op, standby)
                    sampler.pid = standby.proc.pid
                    op = standby
                    print(json.dumps(f["failover_padded"]), flush=True)
                    time.sleep(30)
                    rss["new leader, padding"] = round(usage(op.proc.pid)[1] / 2**20, 1)
            f["uris"] = dict(
                audit_uris(audit_lines(kube), OPERATOR_USER, {"list", "watch"}).most_common(20)
            )
        finally:
            watch.stop()
            for o in bench.operators:
                o.stop()
            if bench.stub_proc is not None:
                bench.stub_proc.terminate()
            if bench.kwok_proc is not None:
                bench.kwok_proc.terminate()
            if bench.fallback is not None:
                bench.fallback.stop()
            sampler.stop()
    rss["apply, peak"] = round(sampler.peak["apply"] / 2**20, 1)
    f["rss"] = rss
    f["machine"] = (
        f"{platform.node()}, {os.cpu_count()} cores, {platform.python_implementation()} "
        f"{platform.python_version()}, load {os.getloadavg()[0]:.1f} at the end"
    )
    without = rss.get("new leader, no padding")
    with_pad = rss.get("new leader, padding")
    f["goals"] = {
        "all_ready_s": all_ready,
        "idle_api_per_min_per_base": f["idle"]["api_per_min_per_base"],
        "idle_cpu_percent": f["idle"]["cpu_percent"]["operator"],
        "rss_mib": max(rss.values()),
        "padding_rss_percent": (
            round(100 * (with_pad - without) / without, 1) if without and with_pad else math.nan
        ),
        "change_p99_s": f["churn"]["change_p99_s"],
        "failover_s": (f.get("failover") or {}).get("failover_s", math.nan),
        "rederived_s": (f.get("failover") or {}).get("rederived_s", math.nan),
        "failover_padded_s": (f.get("failover_padded") or {}).get("failover_s", math.nan),
        "rederived_padded_s": (f.get("failover_padded") or {}).get("rederived_s", math.nan),
    }
    f["churn_window"] = {
        k: v for k, v in f["churn_window"].items() if k in ("cpu", "stub", "seconds")
    }
    print(json.dumps(f, indent=2, default=str))
    if not args.no_write:
        write_results(f)
        print(f"written to {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
