"""The console (`metis console`): every knowledge base the console may see, live, a
page per base, and the Search page of spec 002 (one or several bases, Compare).

    metis console [--kubeconfig PATH] [--namespace NS] [--host H] [--port P]
                  [--url-template 'http://127.0.0.1:{port}']

`metis serve` serves the same Search page for its one base (`add_search_page`).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

import yaml
from aiohttp import web
from kubernetes.config import ConfigException

from metis_indexer.console.app import Settings, add_search_page, create_app

__all__ = ["Settings", "add_arguments", "add_search_page", "create_app", "main"]

URL_TEMPLATE_ENV = "METIS_URL_TEMPLATE"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`metis console`'s options."""
    p.add_argument("--kubeconfig", help="a kubeconfig file (default: in-cluster)")
    p.add_argument("--namespace", help="only this namespace's bases (default: all)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--url-template", default=os.environ.get(URL_TEMPLATE_ENV) or None,
                   help="how to reach a base's Service, as the operator's "
                        f"{URL_TEMPLATE_ENV} (e.g. http://127.0.0.1:{{port}}); "
                        "default: its status' observed.address")


def main(args: argparse.Namespace) -> int:
    """Serve the console until interrupted."""
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    settings = Settings(kubeconfig=args.kubeconfig, namespace=args.namespace,
                        url_template=args.url_template)
    try:
        web.run_app(create_app(settings), host=args.host, port=args.port, access_log=None,
                    print=lambda _: print(f"metis: console on http://{args.host}:{args.port}",
                                          flush=True))
    except (ConfigException, OSError, yaml.YAMLError) as e:
        print(f"metis: console: no cluster to watch: {e} "
              "(outside a cluster, give a valid --kubeconfig)", file=sys.stderr)
        return 2
    return 0
