"""`metis-operator`: runs the kopf operator with the handlers of handlers.py.

Settings come from METIS_* environment variables or the matching flags
(settings.py); `metis-operator --help` lists them. It runs standalone (no kopf
peering): one replica at a time, which the Deployment's Recreate strategy ensures.
"""

from __future__ import annotations

import logging
import os
import sys

import kopf

from metis_operator import handlers
from metis_operator import settings as settings_mod


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # Every poll of every base would log "Timer 'poll' succeeded", every probe a request.
    for chatty in ("httpx", "kopf.objects", "aiohttp.access"):
        logging.getLogger(chatty).setLevel(logging.WARNING)
    try:
        settings = settings_mod.load(os.environ, sys.argv[1:] if argv is None else argv)
    except ValueError as e:
        print(f"metis-operator: {e}", file=sys.stderr)
        return 2
    registry = kopf.OperatorRegistry()
    handlers.register(registry, settings)
    runtime = settings.runtime
    health = f"http://0.0.0.0:{runtime.health_port}/healthz" if runtime.health_port else None
    kopf.run(
        registry=registry,
        standalone=True,
        clusterwide=not runtime.namespaces,
        namespaces=runtime.namespaces,
        liveness_endpoint=health,
        memo=kopf.Memo(config=settings),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
