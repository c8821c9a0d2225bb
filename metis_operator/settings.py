"""The operator's settings: one tree of dataclasses, read once at start-up and then
passed explicitly (in kopf's memo) to whatever needs it; nothing reads them from
module globals.

Every field has a default, a unit and an environment variable; each variable is
also a flag (`METIS_POLL_SECONDS` → `--poll-seconds`), and a flag wins:

    metis-operator --url-template 'http://127.0.0.1:{port}' --poll-seconds 1
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import ipaddress
from collections.abc import Mapping, Sequence
from typing import Any

ACCESS_MODES = ("ReadWriteOnce", "ReadWriteOncePod", "ReadWriteMany")
LOG_FORMATS = ("text", "json")


VERSION = importlib.metadata.version("metis")
"""The release this operator is: its default indexer image is the same release's."""
IMAGE_REPOSITORY = "ghcr.io/astraeus/metis-indexer"


def _env(name: str, default: Any) -> Any:
    return dataclasses.field(default=default, metadata={"env": name})


@dataclasses.dataclass(frozen=True)
class IndexerSettings:
    """How each base's indexer runs."""

    image: str = _env("METIS_INDEXER_IMAGE", f"{IMAGE_REPOSITORY}:{VERSION}")
    """The indexer image every base runs (`metis serve --config /etc/metis/config.json`):
    by default the release's own (the operator's version); a release into a team's registry
    sets it (docs/release.md)."""

    image_pull_secrets: tuple[str, ...] = _env("METIS_INDEXER_IMAGE_PULL_SECRETS", ())
    """Secrets of the operator's namespace (type kubernetes.io/dockerconfigjson), comma-
    separated, that let a node pull the indexer image: the operator copies their
    credentials into each base's namespace (Secret `metis-<name>-pull`, owned by the base)
    and names it in the indexer pods' imagePullSecrets. Empty: none."""

    image_pull_policy: str = _env("METIS_INDEXER_IMAGE_PULL_POLICY", "IfNotPresent")
    """Kubernetes' imagePullPolicy of the indexer container."""

    port: int = _env("METIS_INDEXER_PORT", 7700)
    """TCP port of the indexer's API: in the pod, its Service and its configuration.
    7700 in a cluster; tests set a free port because every indexer they run shares
    one loopback."""

    index_storage: str = _env("METIS_INDEX_STORAGE", "10Gi")
    """The least each base's own drive (PVC `metis-<name>`) asks for, a Kubernetes
    quantity. A drive's size follows what the base's memory holds (`index_drive.size_gib`:
    2 GiB of float32 vectors, about 350,000 chunks, ask 10 GiB); a larger `memory_gb`
    expands the claim where its StorageClass allows it."""

    storage_class: str = _env("METIS_STORAGE_CLASS", "")
    """StorageClass of the index drives; empty: the cluster's default."""

    index_access_mode: str = _env("METIS_INDEX_ACCESS_MODE", "ReadWriteOnce")
    """Access mode of the index drives. A replacement indexer (after a change, or for a
    deleted or evicted pod) starts beside the old one, answers searches in standby once
    it has loaded the index, and takes over when the old one stops: with
    `ReadWriteOnce` on the old pod's machine (one machine mounts the drive), with
    `ReadWriteMany` anywhere. The old pod stops first only where two pods cannot mount
    the drive: always with `ReadWriteOncePod`, and with `ReadWriteOnce` for a placement
    that may exclude the machine it runs on (searches fail until the new pod is ready)."""


@dataclasses.dataclass(frozen=True)
class ReachSettings:
    """How the operator reaches indexers and model Services over HTTP."""

    url_template: str = _env("METIS_URL_TEMPLATE", "http://{name}.{namespace}.svc:{port}")
    """Base URL of a Service, from its name, namespace and port. Out of a cluster
    (tests, a laptop with port-forwards) point it elsewhere: `http://127.0.0.1:{port}`.
    The model URLs written into an indexer's configuration come from it too."""

    timeout_seconds: float = _env("METIS_HTTP_TIMEOUT_SECONDS", 5.0)
    """Seconds a status poll or a model probe may take: past it, it does not answer."""

    evaluate_timeout_seconds: float = _env("METIS_EVALUATE_TIMEOUT_SECONDS", 90.0)
    """Seconds an evaluation may take: the indexer stops its own at 60 s
    (tests/indexer/search/test_evaluation.py)."""


@dataclasses.dataclass(frozen=True)
class NetworkSettings:
    """Who besides the base's namespace and the operator's may reach an indexer (each
    base's NetworkPolicy)."""

    allow_namespaces: tuple[str, ...] = _env("METIS_NETWORK_ALLOW_NAMESPACES", ())
    """Namespaces whose pods may reach every indexer, comma-separated: a Prometheus that
    scrapes them, an ingress controller. Empty: none."""

    allow_cidrs: tuple[str, ...] = _env("METIS_NETWORK_ALLOW_CIDRS", ())
    """IP ranges (CIDR) that may reach every indexer, comma-separated: the control plane's
    nodes, for the API server's service proxy (`kubectl metis search`) on a network plugin
    that enforces policies (Calico, Cilium) — the API server is no pod of a namespace.
    Empty: none."""


@dataclasses.dataclass(frozen=True)
class PollSettings:
    """How often each base is looked at again."""

    interval_seconds: float = _env("METIS_POLL_SECONDS", 10.0)
    """Seconds between two looks at a base when nothing woke it: the indexer's
    `GET /v1/status` over HTTP, everything else from the watch cache (no API request).
    A change of the base or of anything it depends on wakes it at once besides."""

    resync_seconds: float = _env("METIS_RESYNC_SECONDS", 300.0)
    """Seconds between two checks that the cache holds what the API server holds of the
    operator's children (one LIST per kind for all bases, drift.py): a base whose
    children differ reads them from the API server itself at once, a repair of anything
    a watch may have missed."""

    full_resync_seconds: float = _env("METIS_FULL_RESYNC_SECONDS", 36000.0)
    """Seconds between two reads of each base's children and Secret by name from the API
    server, whatever the check found (the Secret is not listed); the bases' reads are
    spread over that time, not made together."""

    probe_seconds: float = _env("METIS_PROBE_SECONDS", 60.0)
    """Seconds between two cheap calls (`GET /v1/models`) to each model Service, one
    prober per Service whatever the number of bases naming it; every 2 s while it fails."""

    model_grace_seconds: float = _env("METIS_MODEL_GRACE_SECONDS", 20.0)
    """Seconds a model Service must keep failing before its bases count it as not
    answering: one slow answer never flips a base. The indexer's own `waiting` counts
    at once."""


@dataclasses.dataclass(frozen=True)
class RuntimeSettings:
    """The operator process itself."""

    namespaces: tuple[str, ...] = _env("METIS_NAMESPACES", ())
    """Namespaces to serve, comma-separated; empty: every namespace (cluster-wide)."""

    metrics_port: int = _env("METIS_METRICS_PORT", 9090)
    """Port of the Prometheus metrics (`/metrics`); 0: none."""

    health_port: int = _env("METIS_HEALTH_PORT", 8080)
    """Port of kopf's liveness endpoint (`/healthz`); 0: none."""

    operator_namespace: str = _env("POD_NAMESPACE", "metis-system")
    """The operator's own namespace (the downward API's metadata.namespace in the
    manifests): each base's NetworkPolicy lets it, and the console there, in."""

    field_manager: str = _env("METIS_FIELD_MANAGER", "metis-operator")
    """The field manager of every write: the children's fields and the status."""

    log_format: str = _env("METIS_LOG_FORMAT", "text")
    """`text`, or `json`: one JSON object a line, with the base it concerns."""

    leader_election: bool = _env("METIS_LEADER_ELECTION", True)
    """Run only while holding the Lease `metis-operator` (namespace POD_NAMESPACE,
    default metis-system): of several replicas, one acts; the process exits when it
    loses the Lease and its restart stands by."""

    max_rollouts: int = _env("METIS_MAX_ROLLOUTS", 2)
    """Bases whose indexer the operator replaces at once after a change of its own
    (a new indexer image or setting), each until it is Ready again. A user's change of
    a base is never held."""


@dataclasses.dataclass(frozen=True)
class QualitySettings:
    """Retrieval quality as a signal (status/quality.py)."""

    tolerance: float = _env("METIS_QUALITY_TOLERANCE", 0.05)
    """How much recall@k or MRR (0 to 1) the evaluation after a change of embedding model
    or chunking may lose against the one before without QualityRegressed: 0.05 is one
    question in twenty found less well, about the noise of a small evaluation set."""


@dataclasses.dataclass(frozen=True)
class Settings:
    """The whole tree."""

    indexer: IndexerSettings = dataclasses.field(default_factory=IndexerSettings)
    reach: ReachSettings = dataclasses.field(default_factory=ReachSettings)
    network: NetworkSettings = dataclasses.field(default_factory=NetworkSettings)
    poll: PollSettings = dataclasses.field(default_factory=PollSettings)
    runtime: RuntimeSettings = dataclasses.field(default_factory=RuntimeSettings)
    quality: QualitySettings = dataclasses.field(default_factory=QualitySettings)

    def url(self, name: str, namespace: str, port: int) -> str:
        """The base URL of Service `name` on `port`, by the template."""
        return self.reach.url_template.format(name=name, namespace=namespace, port=port)


def _flag(env: str) -> str:
    return "--" + env.removeprefix("METIS_").lower().replace("_", "-")


def _convert(raw: str, default: Any, env: str) -> Any:
    try:
        if isinstance(default, tuple):
            return tuple(p.strip() for p in raw.split(",") if p.strip())
        if isinstance(default, bool):
            return raw.lower() in ("1", "true", "yes")
        return type(default)(raw)
    except ValueError:
        raise ValueError(f"{env}={raw!r}: expected {type(default).__name__}") from None


def load(environ: Mapping[str, str], argv: Sequence[str] | None = None) -> Settings:
    """Settings from the environment, then flags; a bad value raises ValueError naming it."""
    groups = {
        f.name: f.default_factory()
        for f in dataclasses.fields(Settings)
        if callable(f.default_factory)  # every group has one
    }
    parser = argparse.ArgumentParser(
        prog="metis-operator", description="Reconciles Metis KnowledgeBase resources."
    )
    for group in groups.values():
        for f in dataclasses.fields(group):
            env = f.metadata["env"]
            help_ = f"env {env}, default {f.default!r}"
            parser.add_argument(_flag(env), dest=env, metavar="VALUE", help=help_)
    flags = vars(parser.parse_args(argv or []))
    values: dict[str, Any] = {}
    for name, group in groups.items():
        changes = {}
        for f in dataclasses.fields(group):
            env = f.metadata["env"]
            raw = flags.get(env) if flags.get(env) is not None else environ.get(env)
            if raw is not None:
                changes[f.name] = _convert(raw, f.default, env)
        values[name] = dataclasses.replace(group, **changes)
    settings = Settings(**values)
    if settings.runtime.log_format not in LOG_FORMATS:
        raise ValueError(
            f"METIS_LOG_FORMAT={settings.runtime.log_format!r}: expected one of "
            f"{', '.join(LOG_FORMATS)}"
        )
    if settings.indexer.index_access_mode not in ACCESS_MODES:
        raise ValueError(
            f"METIS_INDEX_ACCESS_MODE={settings.indexer.index_access_mode!r}: expected one of "
            f"{', '.join(ACCESS_MODES)}"
        )
    for cidr in settings.network.allow_cidrs:
        try:
            ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            raise ValueError(
                f"METIS_NETWORK_ALLOW_CIDRS: {cidr!r} is not an IP range (10.0.0.0/16, fd00::/64)"
            ) from None
    try:
        settings.url("probe", "default", 1)
    except (KeyError, IndexError, ValueError) as e:
        raise ValueError(
            f"METIS_URL_TEMPLATE={settings.reach.url_template!r} is not a template of "
            f"{{name}}, {{namespace}} and {{port}}: {e!r}"
        ) from None
    return settings
