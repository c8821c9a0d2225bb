"""`make demo`: Metis' main job on a local Kubernetes cluster.

`metis-dev cluster up` (etcd, kube-apiserver, kube-controller-manager, kube-scheduler and
a node: a real one, containerd, kubelet and kube-proxy running the project's images, where
the machine allows it; elsewhere a stand-in kubelet that runs indexer pods as local
processes), `kubectl apply -k manifests/`, the operator as a local process with the
cluster's kubeconfig, `metis models` behind the Services the handbook example names,
`kubectl apply -f` of the example; then each state of the base as it changes, an excerpt
of `kubectl describe kb`, three cited questions through the base's address and the
console's URL (`metis-console`). `DEMO_KEEP=1` keeps everything running until
Ctrl-C; `DEMO_NODE=real|stand-in` asks for a node (default: auto). Nothing leaves this
machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml
from kubernetes import client, config, watch

from metis_dev import node as real_node
from metis_dev.build import assets_dir
from metis_dev.cli import NodeInfo
from metis_dev.kubelet import drive, metis
from metis_dev.process import Process, free_port, wait_for

ROOT = Path(__file__).resolve().parents[1]
HANDBOOK = ROOT / "examples" / "handbook"
EXAMPLE = ROOT / "manifests" / "examples" / "handbook.yaml"
NAMESPACE = "demo"
BASE = "handbook"
QUESTIONS = [
    ("How many holidays do I get?", []),
    ("Xid 79", ["--mode", "keyword"]),
    ("How much can a hotel night cost?", ["--kind", "pdf"]),
]
BIN = Path(sys.executable).parent
LOOPBACK = "http://127.0.0.1:{port}"
"""How the operator and the console reach a Service with the stand-in kubelet: a Service is
a loopback port. On a real node they reach `<svc>.<ns>.svc` through the node's DNS."""


def say(line: str = "") -> None:
    print(line, flush=True)


def indent(text: str) -> str:
    return "\n".join(f"  {line}" for line in text.rstrip().splitlines())


class Demo:
    """The demo's folder, its kubectl, and the processes it started."""

    def __init__(self, work: Path, stack: contextlib.ExitStack) -> None:
        self.work = work
        self.stack = stack
        self.kubeconfig = work / "cluster" / "kubeconfig"
        self.kubectl_path = assets_dir() / "kubectl"
        self.node = NodeInfo(kind="stand-in", name="")
        """Which node `cluster up` runs (its DIR/node.json), once it is up."""

    @property
    def real(self) -> bool:
        return self.node.kind == "real"

    def on_host(self, argv: list[str]) -> list[str]:
        """`argv` as a process of this machine that reaches Services as the cluster's
        pods do: by the real node's DNS, or as it is with the stand-in."""
        if self.real and self.node.resolv_conf:
            return real_node.host_command(Path(self.node.resolv_conf), argv)
        return argv

    def start(self, process: Process, grace: float = 10.0, sig: int = signal.SIGTERM) -> Process:
        """Start `process`; it is stopped when the demo ends, last started first."""
        self.stack.callback(process.stop, grace, sig)
        return process.start()

    def kubectl(self, *args: str, show: bool = True, note: str = "") -> str:
        """Run kubectl against the local cluster; print the command and its output."""
        if show:
            shown = " ".join(args).replace(f"{ROOT}/", "")
            say(f"$ kubectl {shown}" + (f"   # {note}" if note else ""))
        out = subprocess.run(
            [str(self.kubectl_path), f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if out.returncode != 0:
            raise SystemExit(f"kubectl {' '.join(args)} failed:\n{out.stderr}")
        if show and out.stdout.strip():
            say(indent(out.stdout))
        return out.stdout

    def apply(self, name: str, objects: list[dict[str, Any]], note: str) -> None:
        path = self.work / name
        path.write_text(yaml.safe_dump_all(objects, sort_keys=False))
        self.kubectl("apply", "-f", str(path), note=note)


def follow(log: Path, offset: int) -> int:
    """Print what `log` gained since `offset`, indented; the new offset."""
    with contextlib.suppress(OSError), log.open("rb") as f:
        f.seek(offset)
        data = f.read()
        complete = data[: data.rfind(b"\n") + 1]
        for line in complete.decode(errors="replace").splitlines():
            if not line.startswith("$ "):
                say(f"  {line}")
        return offset + len(complete)
    return offset


def cluster_up(demo: Demo, requested: str) -> Process:
    say(f"$ metis-dev cluster up --dir {demo.work / 'cluster'} --node {requested}")
    say(
        "  (the first run on a machine builds the Kubernetes binaries from Go modules, and "
        "for a real node kubelet, kube-proxy and the images: minutes; later runs reuse them)"
    )
    log = demo.work / "cluster-up.log"
    cluster = demo.start(
        Process(
            "metis-dev",
            [
                str(BIN / "metis-dev"),
                "cluster",
                "up",
                "--dir",
                str(demo.work / "cluster"),
                "--node",
                requested,
            ],
            log,
        ),
        grace=60,
        sig=signal.SIGINT,
    )
    offset = 0

    def up() -> bool:
        nonlocal offset
        offset = follow(log, offset)
        return demo.kubeconfig.exists()

    wait_for(up, timeout=3600, what="metis-dev cluster up", alive=cluster.check_alive)
    follow(log, offset)
    demo.node = NodeInfo.model_validate_json((demo.work / "cluster" / "node.json").read_text())
    return cluster


def install(demo: Demo) -> None:
    demo.kubectl("apply", "-k", f"{ROOT}/manifests/")
    demo.kubectl(
        "-n",
        "metis-system",
        "scale",
        "deployment",
        "metis-operator",
        "--replicas=0",
        note="the operator runs below as a local process, not as this Deployment",
    )
    demo.kubectl(
        "wait",
        "--for=condition=Established",
        "crd/knowledgebases.metis.astraeus.io",
        "--timeout=60s",
    )


def model_services(demo: Demo) -> None:
    """`metis models` on this machine behind both model Services: on a real node it
    listens on the pods' bridge and each Service (no selector) has an EndpointSlice
    naming that address; with the stand-in a Service is its loopback port."""
    port = free_port()
    host = real_node.GATEWAY if demo.real else "127.0.0.1"
    say(
        f"$ metis models --host {host} --port {port}   # all-MiniLM-L6-v2 on this machine, "
        "for both model Services"
    )
    models = demo.start(
        Process(
            "metis models",
            metis("models", "--host", host, "--port", str(port)),
            demo.work / "models.log",
        )
    )
    wait_for(
        lambda: httpx.get(f"http://{host}:{port}/health").status_code == 200,
        timeout=120,
        what="metis models",
        alive=models.check_alive,
    )
    names = ("bge-m3", "bge-reranker")
    if demo.real:
        objects = [o for name in names for o in real_node.model_service(NAMESPACE, name, port)]
        note = f"Services bge-m3 and bge-reranker without selector, endpoints {host}:{port}"
    else:
        objects = [
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": name, "namespace": NAMESPACE},
                "spec": {"ports": [{"name": "http", "port": port}]},
            }
            for name in names
        ]
        note = f"Services bge-m3 and bge-reranker: {host}:{port} here"
    demo.apply("services.yaml", objects, note)


def example_evals(text: str) -> str:
    """The handbook's questions with their documents named as the example base names them:
    `docs/handbook/...` (drive docs, folder handbook), `runbooks/...` (drive runbooks)."""
    out = []
    for line in text.splitlines():
        case = json.loads(line)
        case["expected"] = [
            d.replace("handbook/runbooks/", "runbooks/", 1)
            if d.startswith("handbook/runbooks/")
            else f"docs/{d}"
            for d in case["expected"]
        ]
        out.append(json.dumps(case))
    return "\n".join(out) + "\n"


def drives(demo: Demo) -> None:
    """The example's two drives as hostPath volumes: `docs` holding `handbook/` and its
    evaluation set (where the example's evaluation reads it), and `runbooks`."""
    docs, runbooks = demo.work / "drives" / "docs", demo.work / "drives" / "runbooks"
    shutil.copytree(
        HANDBOOK, docs / "handbook", ignore=shutil.ignore_patterns("runbooks", ".metis")
    )
    shutil.copytree(HANDBOOK / "runbooks", runbooks)
    evals = docs / "handbook" / ".metis" / "evals.jsonl"
    evals.parent.mkdir()
    evals.write_text(example_evals((HANDBOOK / ".metis" / "evals.jsonl").read_text()))
    objects = drive(NAMESPACE, "docs", docs) + drive(NAMESPACE, "runbooks", runbooks)
    demo.apply("drives.yaml", objects, f"PVCs docs and runbooks on folders under {docs.parent}")


def operator(demo: Demo) -> None:
    """On a real node the operator writes the indexer image it was built with and
    reaches Services by their names; with the stand-in, each indexer on its own loopback
    port."""
    env = {"KUBECONFIG": str(demo.kubeconfig)}
    if demo.real:
        env["METIS_INDEXER_IMAGE"] = demo.node.indexer_image or ""
    else:
        env |= {"METIS_URL_TEMPLATE": LOOPBACK, "METIS_INDEXER_PORT": str(free_port())}
    env |= {
        "METIS_POLL_SECONDS": "1",
        "METIS_LEADER_ELECTION": "false",
        "METIS_METRICS_PORT": str(free_port()),
        "METIS_HEALTH_PORT": str(free_port()),
    }
    shown = " ".join(f"{k}={v}" for k, v in env.items() if k != "KUBECONFIG")
    dns = "   # resolving <svc>.<ns>.svc by the node's DNS" if demo.real else ""
    say(f"$ KUBECONFIG={demo.kubeconfig} {shown} metis-operator{dns}")
    op = demo.start(
        Process(
            "metis-operator",
            demo.on_host([str(BIN / "metis-operator")]),
            demo.work / "operator.log",
            env=env,
        )
    )
    health = f"http://127.0.0.1:{env['METIS_HEALTH_PORT']}/healthz"
    wait_for(
        lambda: httpx.get(health).status_code == 200,
        timeout=60,
        what="the operator's /healthz",
        alive=op.check_alive,
    )


def bases_listed(demo: Demo) -> str:
    """The resourceVersion of the namespace's bases as listed now: a watch from it, begun
    after the example is applied, still sees every state the operator writes after this
    (a watch begun after the apply alone missed Pending on a loaded machine)."""
    api = client.CustomObjectsApi(config.new_client_from_config(str(demo.kubeconfig)))
    listed = api.list_namespaced_custom_object(
        "metis.astraeus.io", "v1", NAMESPACE, "knowledgebases"
    )
    return str(listed["metadata"]["resourceVersion"])


def watch_states(demo: Demo, since: str, timeout: float = 300) -> None:
    """One line each time the base's state changes, until Ready (the kubernetes
    client's watch sees every status the operator writes from `since` on)."""
    say(f"$ kubectl get kb -n {NAMESPACE} --watch   # a line each time the state changes")
    row = "{:<10} {:<10} {:>9} {:>6}  {:<10} {}"
    say(indent(row.format("NAME", "STATE", "DOCUMENTS", "CHUNKS", "PROGRESS", "REASON")))
    started, last = time.monotonic(), None
    api = client.CustomObjectsApi(config.new_client_from_config(str(demo.kubeconfig)))
    stream = watch.Watch().stream(
        api.list_namespaced_custom_object,
        "metis.astraeus.io",
        "v1",
        NAMESPACE,
        "knowledgebases",
        field_selector=f"metadata.name={BASE}",
        resource_version=since,
        timeout_seconds=int(timeout),
    )
    for event in stream:
        status = event["object"].get("status") or {}
        state = status.get("state")
        if state and state != last:
            index = (status.get("observed") or {}).get("index") or {}
            say(
                indent(
                    row.format(
                        BASE,
                        state,
                        index.get("documents", ""),
                        index.get("chunks", ""),
                        status.get("progress", ""),
                        status.get("reason", ""),
                    )
                    + f"   +{time.monotonic() - started:.1f} s"
                )
            )
            last = state
        if state == "Ready":
            return
    raise SystemExit(f"kb/{BASE} not Ready after {timeout:.0f} s (last state: {last})")


def excerpt(text: str) -> list[str]:
    """Of `kubectl describe`: the name, the status without its conditions (the Events
    say the same in order), and the Events."""
    keep, skip_below, lines = False, -1, []
    for line in text.splitlines():
        depth = len(line) - len(line.lstrip())
        if depth == 0:
            keep = line.startswith(("Name:", "Namespace:", "Status:", "Events:"))
        if 0 <= skip_below < depth:
            continue
        skip_below = depth if line.strip() == "Conditions:" else -1
        if keep and skip_below < 0:
            lines.append(line)
    return lines


def describe(demo: Demo) -> None:
    text = demo.kubectl("describe", "kb", BASE, "-n", NAMESPACE, show=False)
    say(f"$ kubectl describe kb {BASE} -n {NAMESPACE}   # excerpt: no conditions, no spec")
    say(indent("\n".join(excerpt(text))))


def ask(demo: Demo) -> None:
    address = demo.kubectl(
        "get", "kb", BASE, "-n", NAMESPACE, "-o", "jsonpath={.status.observed.address}", show=False
    )
    if demo.real:
        url = address
        say(
            f"the base's address is {address}: its Service, by kube-proxy (asked from this "
            "machine resolving by the node's DNS)"
        )
    else:
        url = f"http://127.0.0.1:{urlsplit(address).port}"
        say(f"the base's address is {address}; here a Service is a loopback port: {url}")
    for question, flags in QUESTIONS:
        say(f"$ metis search {question!r} --url {url} --top-k 2 {' '.join(flags)}".rstrip())
        argv = demo.on_host(metis("search", question, "--url", url, "--top-k", "2", *flags))
        out = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)
        say(indent(out.stdout))


def console(demo: Demo) -> str | None:
    """`metis-console` as a local process; its URL, or None when it did not start."""
    port = free_port()
    args = ["--kubeconfig", str(demo.kubeconfig), "--host", "127.0.0.1", "--port", str(port)]
    if not demo.real:
        args += ["--url-template", LOOPBACK]
    say(f"$ metis-console {' '.join(args)}")
    argv = demo.on_host([str(BIN / "metis-console"), *args])
    proc = demo.start(Process("metis-console", argv, demo.work / "console.log"))
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_for(
            lambda: httpx.get(url).status_code == 200,
            timeout=60,
            what="the console",
            alive=proc.check_alive,
        )
    except Exception as e:  # the demo's main job is done; say why there is no console
        say(indent(f"the console did not start: {e}"))
        return None
    return url


def wait_for_interrupt() -> None:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: stop.set())
    stop.wait()


@contextlib.contextmanager
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="metis-demo-") as tmp:
        yield Path(tmp)


def main() -> None:
    started = time.monotonic()
    say("Metis' main job on a local Kubernetes cluster.\n")
    # SIGTERM ends the demo as Ctrl-C does: everything it started is stopped (a real
    # node's containers, bridge and iptables rules too).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    with workdir() as work, contextlib.ExitStack() as stack:
        demo = Demo(work, stack)
        cluster_up(demo, os.environ.get("DEMO_NODE", "auto"))
        say()
        if demo.real:
            say(
                f"On a real node ({demo.node.name}): the indexer runs in a container from "
                f"{demo.node.indexer_image}.\n"
            )
        else:
            say(
                "With the stand-in kubelet: pods run as local processes, there is no "
                "container runtime here.\n"
            )
        install(demo)
        demo.kubectl("create", "namespace", NAMESPACE)
        model_services(demo)
        drives(demo)
        operator(demo)
        since = bases_listed(demo)
        applied = time.monotonic()
        demo.kubectl("apply", "-n", NAMESPACE, "-f", str(EXAMPLE))
        watch_states(demo, since)
        ready = time.monotonic() - applied
        demo.kubectl("get", "kb", "-n", NAMESPACE)
        describe(demo)
        ask(demo)
        url = console(demo)
        if url:
            say(f"console: {url}")
        say(
            f"\nReady {ready:.1f} s after kubectl apply; {time.monotonic() - started:.1f} s "
            "since the start of the demo"
        )
        keep = os.environ.get("DEMO_KEEP") == "1"
        if keep:
            say(
                f"DEMO_KEEP=1: everything keeps running; export KUBECONFIG={demo.kubeconfig}, "
                f"kubectl is {demo.kubectl_path}. Ctrl-C stops it all."
            )
            wait_for_interrupt()
        say(
            "stopping " + ("the console, " if url else "") + "the operator, metis models "
            "and the cluster"
        )
    say("stopped" if keep else f"stopped; the whole demo took {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main()
