"""``strata router serve``: the cache-aware OpenAI-compatible proxy in front of one service."""

from __future__ import annotations

import argparse
import os
import sys

from pydantic import ValidationError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="strata router", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="route requests to the service's workers")
    serve.add_argument("--config", default="/etc/strata/router.yaml", help="router config file (YAML)")
    serve.add_argument(
        "--kubeconfig",
        help="for local runs: watch Pods with this kubeconfig instead of the in-cluster account",
    )
    serve.add_argument("--host", help="listen address (overrides the config's; in a pod: its IP)")
    serve.add_argument("--port", type=int, help="listen port (overrides the config's)")
    serve.add_argument("--log-level", default="INFO")
    return parser


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    from strata.common import logs
    from strata.router import kube
    from strata.router.config import RouterConfig

    logs.setup(args.log_level)
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    try:
        config = RouterConfig.load(args.config)
        config = RouterConfig.model_validate({**config.model_dump(), **overrides})
    except (OSError, ValidationError, ValueError) as exc:
        print(f"strata router: bad config {args.config}: {exc}", file=sys.stderr)
        return 2
    creds = None
    if not config.workers.static:
        try:
            creds = kube.from_kubeconfig(args.kubeconfig) if args.kubeconfig else kube.in_cluster()
        except (OSError, kube.KubeError) as exc:
            print(f"strata router: no Kubernetes credentials: {exc}", file=sys.stderr)
            return 2
    from strata.common.openai.auth import api_key_from
    from strata.router.main import serve

    try:
        api_key = api_key_from(os.environ)
    except ValueError as exc:
        print(f"strata router: {exc}", file=sys.stderr)
        return 2
    serve(config, creds, api_key)
    return 0
