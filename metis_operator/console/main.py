"""`metis-console`: serve the console until interrupted.

metis-console [--kubeconfig PATH] [--namespace NS] [--host H] [--port P]
              [--url-template 'http://127.0.0.1:{port}']

Credentials as kubectl finds them: --kubeconfig, else $KUBECONFIG, else the pod's service
account (in a cluster), else ~/.kube/config.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from aiohttp import web

from metis_operator import kube
from metis_operator.console.app import Credentials, Settings, create_app

URL_TEMPLATE_ENV = "METIS_URL_TEMPLATE"


def credentials(
    kubeconfig: str | None, environ: Mapping[str, str], home: Path
) -> tuple[Credentials, ...]:
    """Where to read the credentials from, in kubectl's order: the flag, else $KUBECONFIG
    (a colon-separated list is merged, as kubectl merges it; empty counts as unset), else
    the pod's service account, else ~/.kube/config (a console run from a laptop)."""
    if kubeconfig:
        return (Credentials("--kubeconfig", kubeconfig),)
    if environ.get("KUBECONFIG"):
        return (Credentials("$KUBECONFIG", environ["KUBECONFIG"]),)
    return Credentials("in-cluster"), Credentials("~/.kube/config", str(home / ".kube" / "config"))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="metis-console", description="the web console: every base, search"
    )
    p.add_argument(
        "--kubeconfig",
        help="a kubeconfig file (default: $KUBECONFIG, else in-cluster, else ~/.kube/config)",
    )
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
        credentials=credentials(args.kubeconfig, os.environ, Path.home()),
        namespace=args.namespace,
        url_template=args.url_template,
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
    except kube.ConfigError as e:
        print(
            f"metis: console: no cluster to watch: {e} (give --kubeconfig or set $KUBECONFIG)",
            file=sys.stderr,
        )
        return 2
    except OSError as e:
        print(f"metis: console: cannot serve on {args.host}:{args.port}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
