"""Operator scale benchmark on the local control plane (metis_dev), with the API
server's audit log on the operator's service account.

N bases (default 100) are created at once in one namespace, each with a real
indexer (a local `metis serve`, started by the test kubelet) reading a few
documents and embedding them with a real local model server. It measures the time
until every base is Ready; then, for the idle minutes, the API requests a minute
per base (from the audit log, the operator's user only), the model calls a minute
per model Service (counted at a routing proxy that stands in for cluster DNS), and
the operator's CPU and RSS. Targets: idle ≤ 3 API requests/min per base,
≤ 1 model call/min per model Service.

    .venv/bin/python bench/operator_scale.py --bases 20 --idle-minutes 1
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import http.server
import json
import os
import platform
import secrets
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from metis_dev.build import ensure_binaries  # noqa: E402
from metis_dev.kubelet import Kubelet, _Pod  # noqa: E402
from metis_dev.plane import ControlPlane  # noqa: E402
from metis_dev.process import free_port, wait_for  # noqa: E402
from tests.kube.operator_support import (  # noqa: E402
    OPERATOR_USER,
    Operator,
    install,
    kb,
    make_drive,
    model_service,
)
from tests.support.model_server import start_model_server  # noqa: E402
from tests.support.processes import Process, metis  # noqa: E402

AUDIT_POLICY = f"""apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    users: ["{OPERATOR_USER}"]
  - level: None
"""


class Router:
    """Cluster DNS for processes on one loopback: `/r/<namespace>/<service>/<port>/...`
    goes to the local port registered for that Service; every request is counted."""

    def __init__(self) -> None:
        self.routes: dict[tuple[str, str], int] = {}
        self.calls: list[tuple[float, str, str]] = []
        self.lock = threading.Lock()
        router = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _forward(self) -> None:
                _, _, ns, name, _, *rest = self.path.split("/")
                target = router.routes.get((ns, name))
                with router.lock:
                    router.calls.append((time.monotonic(), name, self.command))
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else None
                if target is None:
                    self.send_response(503)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                try:
                    answer = httpx.request(
                        self.command,
                        f"http://127.0.0.1:{target}/{'/'.join(rest)}",
                        content=body,
                        timeout=60,
                        headers={
                            k: v
                            for k, v in self.headers.items()
                            if k.lower() in ("content-type", "authorization")
                        },
                    )
                except httpx.HTTPError:
                    self.send_response(502)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                try:
                    self.send_response(answer.status_code)
                    self.send_header(
                        "content-type", answer.headers.get("content-type", "text/plain")
                    )
                    self.send_header("content-length", str(len(answer.content)))
                    self.end_headers()
                    self.wfile.write(answer.content)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the caller gave up waiting (a timeout on a loaded machine)

            do_GET = do_POST = _forward

        self.port = free_port()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def template(self) -> str:
        return f"http://127.0.0.1:{self.port}/r/{{namespace}}/{{name}}/{{port}}"

    def count(self, name: str, since: float, until: float) -> int:
        with self.lock:
            return sum(1 for t, n, _ in self.calls if n == name and since <= t < until)


class RoutedKubelet(Kubelet):
    """The test kubelet, each indexer on a port of its own behind the router."""

    def __init__(self, router: Router, *args: Any) -> None:
        super().__init__(*args)
        self.router = router

    def _start(self, pod: dict[str, Any]) -> _Pod:
        name = pod["metadata"]["name"]
        configmap = next(v["configMap"]["name"] for v in pod["spec"]["volumes"] if "configMap" in v)
        mounts = self._host_paths(pod)
        text = self._configmap_text(configmap)
        folder = self.workdir / "pods" / name
        folder.mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.router.routes[(self.namespace, configmap)] = port
        config_path = folder / "config.json"
        config_path.write_text(self._local(text, mounts, port))
        process = Process(
            f"http://127.0.0.1:{port}",
            metis("serve", "--config", str(config_path)),
            folder / "indexer.log",
        ).start()
        return _Pod(name, process, config_path, configmap, mounts, text)

    def _local(self, text: str, mounts: dict[str, Path], port: int) -> str:
        config = json.loads(self._localised(text, mounts))
        config["port"] = port
        return json.dumps(config)

    def _follow_config(self, pod: _Pod) -> None:
        text = self._configmap_text(pod.configmap)
        if text != pod.config_text:
            port = self.router.routes[(self.namespace, pod.configmap)]
            pod.config_path.write_text(self._local(text, pod.mounts, port))
            pod.config_text = text


def operator_usage(pid: int) -> tuple[float, int]:
    """(CPU seconds, RSS bytes) of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    rss = next(
        int(line.split()[1]) * 1024
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith("VmRSS:")
    )
    return cpu, rss


def audit_requests(log: Path, since: dt.datetime, until: dt.datetime) -> collections.Counter[str]:
    """The operator's requests received in [since, until), by verb and resource."""
    seen: dict[str, str] = {}
    for line in log.read_text().splitlines():
        event = json.loads(line)
        if event["user"]["username"] != OPERATOR_USER:
            continue
        at = dt.datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00"))
        if since <= at < until:
            ref = event.get("objectRef") or {}
            seen[event["auditID"]] = f"{event['verb']} {ref.get('resource', '?')}"
    return collections.Counter(seen.values())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bases", type=int, default=100)
    parser.add_argument("--idle-minutes", type=float, default=3.0)
    parser.add_argument("--documents", type=int, default=3, help="documents per base")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="metis-operator-scale-"))
    policy = work / "audit-policy.yaml"
    policy.write_text(AUDIT_POLICY)
    router = Router()
    models = start_model_server()
    with ControlPlane(ensure_binaries(), audit_policy=policy) as kube:
        os.environ["KUBECONFIG"] = str(kube.kubeconfig)
        install(kube)
        ns = f"scale-{secrets.token_hex(3)}"
        kube.rest().post("/api/v1/namespaces", {"metadata": {"name": ns}})
        wait_for(
            lambda: kube.rest().get(f"/api/v1/namespaces/{ns}/serviceaccounts/default"),
            timeout=60,
            what="the default service account",
        )
        # Each indexer asks 1 CPU and 2 GiB (the spec's defaults): room for all.
        kube.add_node(
            "bench-node",
            {"pool": "bench"},
            cpu=str(args.bases + 1),
            memory=f"{2 * args.bases + 2}Gi",
        )
        router.routes[(ns, "minilm")] = int(models.base_url.rsplit(":", 1)[1])
        model_service(kube, ns, "minilm", 80)
        (work / "op").mkdir()
        op = Operator(
            kube,
            work / "op",
            7700,
            poll_seconds=10,
            url_template=router.template,
            env={
                "METIS_PROBE_SECONDS": "60",
                "METIS_MODEL_GRACE_SECONDS": "20",
                "METIS_LOG_FORMAT": "json",
            },
        )
        with RoutedKubelet(router, kube, ns, work / "kubelet") as kubelet:
            op.start()
            try:
                for i in range(args.bases):
                    docs = work / "drives" / f"docs-{i}"
                    docs.mkdir(parents=True)
                    for d in range(args.documents):
                        (docs / f"page-{d}.md").write_text(
                            f"# Page {d} of base {i}\n\nHow team {i} handles topic {d}.\n"
                        )
                    make_drive(kube, ns, f"docs-{i}", docs)
                started, wall_start = time.monotonic(), dt.datetime.now(dt.UTC)
                for i in range(args.bases):
                    kube.kubectl(
                        "apply",
                        "-n",
                        ns,
                        "-f",
                        "-",
                        input=json.dumps(
                            kb(
                                f"kb-{i}",
                                {
                                    "sources": [{"drive": f"docs-{i}"}],
                                    "embedding": {"deployment": "minilm"},
                                    "placement": {"labels": {"pool": "bench"}},
                                    "rescan_seconds": 0,
                                },
                            )
                        ),
                    )

                def ready() -> bool:
                    kubelet.check()
                    items = kube.rest().get(
                        f"/apis/metis.astraeus.io/v1/namespaces/{ns}/knowledgebases"
                    )["items"]
                    states = collections.Counter(
                        (i.get("status") or {}).get("state") for i in items
                    )
                    print(f"  {time.monotonic() - started:6.1f} s {dict(states)}", flush=True)
                    return states.get("Ready", 0) == args.bases

                wait_for(
                    ready, timeout=3600, interval=10, what="every base Ready", alive=op.check_alive
                )
                to_ready = time.monotonic() - started
                assert op.proc is not None
                idle_s = args.idle_minutes * 60
                t0, wall0 = time.monotonic(), dt.datetime.now(dt.UTC)
                cpu0, _ = operator_usage(op.proc.pid)
                time.sleep(idle_s)  # the measurement window itself: nothing happens in it
                t1, wall1 = time.monotonic(), dt.datetime.now(dt.UTC)
                cpu1, rss = operator_usage(op.proc.pid)
            finally:
                op.stop()
        requests = audit_requests(kube.audit_log, wall0, wall1)
        creating = audit_requests(kube.audit_log, wall_start, wall0)
    models.stop()
    minutes = (t1 - t0) / 60
    total = sum(requests.values())
    model_calls = router.count("minilm", t0, t1)
    figures = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.node()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
        "bases": args.bases,
        "seconds_to_all_ready": round(to_ready, 1),
        "idle_minutes": round(minutes, 2),
        "api_requests_per_min_per_base": round(total / minutes / args.bases, 3),
        "api_requests_by_kind": dict(requests.most_common()),
        "api_requests_per_base_until_all_ready": round(sum(creating.values()) / args.bases, 1),
        "model_calls_per_min_per_service": round(model_calls / minutes, 2),
        "operator_cpu_percent_idle": round(100 * (cpu1 - cpu0) / (t1 - t0), 2),
        "operator_rss_mib": round(rss / 2**20, 1),
    }
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
