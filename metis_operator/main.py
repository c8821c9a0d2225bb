"""`metis-operator`: runs the kopf operator with the handlers of handlers.py.

Settings come from METIS_* environment variables or the matching flags
(settings.py); `metis-operator --help` lists them. With leader election on (the
default), it first waits for the Lease `metis-operator` (namespace POD_NAMESPACE,
default metis-system; identity POD_NAME, else the host name): of several replicas
only the holder runs, and it exits when it loses the Lease (leader.py).
"""

from __future__ import annotations

import os
import signal
import sys

import kopf

from metis_operator import handlers, kube, leader, report
from metis_operator.settings import load


def _stop_standing_by(signum: int, frame: object) -> None:
    raise SystemExit(0)


def _stand_by(elector: leader.Elector) -> None:
    """Wait for the Lease, and stop at SIGTERM while waiting: as a pod's first process a
    standby has no default action for it, so a drain, a rollout or an uninstall waited
    out the whole grace period, and a standby being deleted could still take the Lease
    and be killed holding it. A Lease taken as the signal came is given back."""
    before = signal.signal(signal.SIGTERM, _stop_standing_by)
    try:
        elector.acquire()
    except SystemExit:
        elector.release()
        raise
    finally:
        signal.signal(signal.SIGTERM, before)


def main(argv: list[str] | None = None) -> int:
    try:
        settings = load(os.environ, sys.argv[1:] if argv is None else argv)
    except ValueError as e:
        print(f"metis-operator: {e}", file=sys.stderr)
        return 2
    report.configure_logging(settings.runtime.log_format)
    runtime = settings.runtime
    elector = None
    if runtime.leader_election:
        namespace = os.environ.get("POD_NAMESPACE") or "metis-system"
        elector = leader.Elector(
            kube.Cluster.connect(runtime.field_manager), namespace, report.instance()
        )
        health_while_standing_by = (
            leader.StandbyHealth(runtime.health_port) if runtime.health_port else None
        )
        try:
            _stand_by(elector)
        finally:
            if health_while_standing_by is not None:
                health_while_standing_by.close()
    registry = kopf.OperatorRegistry()
    handlers.register(registry, settings)
    health = f"http://0.0.0.0:{runtime.health_port}/healthz" if runtime.health_port else None
    try:
        kopf.run(
            registry=registry,
            standalone=True,
            clusterwide=not runtime.namespaces,
            namespaces=runtime.namespaces,
            liveness_endpoint=health,
            memo=kopf.Memo(config=settings),
        )
    finally:
        if elector is not None:
            elector.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
