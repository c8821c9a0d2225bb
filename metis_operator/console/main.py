"""`metis-console`: serve the console until interrupted.

metis-console [--kubeconfig PATH] [--namespace NS] [--host H] [--port P]
              [--url-template 'http://127.0.0.1:{port}']
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from aiohttp import web

from metis_operator import kube
from metis_operator.console.app import Settings, create_app

URL_TEMPLATE_ENV = "METIS_URL_TEMPLATE"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="metis-console", description="the web console: every base, search"
    )
    p.add_argument("--kubeconfig", help="a kubeconfig file (default: in-cluster)")
    p.add_argument("--namespace", help="only this namespace's bases (default: all)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument(
        "--url-template",
        default=os.environ.get(URL_TEMPLATE_ENV) or None,
        help="how to reach a base's Service, as the operator's "
        f"{URL_TEMPLATE_ENV} (e.g. http://127.0.0.1:{{port}}); "
        "default: its status' observed.address",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    settings = Settings(
        kubeconfig=args.kubeconfig, namespace=args.namespace, url_template=args.url_template
    )
    listening = f"metis: console on http://{args.host}:{args.port}"
    try:
        web.run_app(
            create_app(settings),
            host=args.host,
            port=args.port,
            access_log=None,
            print=lambda _: print(listening, flush=True),
        )
    except (kube.ConfigError, OSError) as e:
        print(
            f"metis: console: no cluster to watch: {e} "
            "(outside a cluster, give a valid --kubeconfig)",
            file=sys.stderr,
        )
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
