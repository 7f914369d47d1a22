"""``strata operator``: run the InferenceService operator (kopf) with Strata's settings.

Flags override the ``STRATA_*`` environment variables the Helm chart sets; both end up in one
frozen :class:`OperatorSettings`."""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys

from strata.operator.settings import OperatorSettings, SettingsError, settings_from, settings_from_env


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="strata operator",
        description="Run the Strata InferenceService operator (`strata operator ready --url URL`: "
        "wait for its liveness endpoint).",
    )
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then $KUBECONFIG)")
    p.add_argument("-n", "--namespace", action="append", default=[], help="watch only these namespaces")
    p.add_argument("--peering", default="strata", help="ClusterKopfPeering name shared by the replicas")
    p.add_argument(
        "--priority",
        default="auto",
        help="peering priority, the highest live replica is active; `auto` draws a random one, since "
        "kopf pauses every replica when two share a priority",
    )
    p.add_argument("--standalone", action="store_true", help="no peering (a single replica)")
    p.add_argument("--liveness", default="http://0.0.0.0:8080/healthz", help="kopf liveness endpoint URL")
    p.add_argument("--metrics-port", help="Prometheus port (env STRATA_METRICS_PORT, default 9090)")
    p.add_argument("--worker-image", help="default worker image (env STRATA_WORKER_IMAGE)")
    p.add_argument("--vllm-image", help="default engine image of engine.kind vllm (env STRATA_VLLM_IMAGE)")
    p.add_argument("--nvme-volume", choices=["ephemeral", "hostPath"], help="local NVMe volume source")
    p.add_argument("--nvme-host-path", help="host directory for --nvme-volume hostPath")
    p.add_argument("--tolerations", help="JSON list of extra tolerations for worker pods")
    p.add_argument("--router-node-selector", help='JSON nodeSelector of the router pods, {"label": "value"}')
    p.add_argument("--router-resources", help='JSON resources of the routers, {"requests": {"cpu": "250m"}}')
    p.add_argument(
        "--image-pull-secrets", help='JSON list of worker image pull secrets, [{"name": "regcred"}]'
    )
    p.add_argument(
        "--autoscale-interval", help="seconds between autoscaler scrapes (env STRATA_AUTOSCALE_INTERVAL_S)"
    )
    p.add_argument("--log-format", choices=["json", "plain"], default="json")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def build_settings(args: argparse.Namespace) -> OperatorSettings:
    env = settings_from_env()
    flags = settings_from(
        {
            "metrics_port": args.metrics_port,
            "worker_image": args.worker_image,
            "vllm_image": args.vllm_image,
            "nvme_volume": args.nvme_volume,
            "nvme_host_path": args.nvme_host_path,
            "tolerations": args.tolerations,
            "router_node_selector": args.router_node_selector,
            "router_resources": args.router_resources,
            "image_pull_secrets": args.image_pull_secrets,
            "autoscale_interval_s": args.autoscale_interval,
        }
    )
    default = OperatorSettings()
    merged = {
        name: getattr(flags, name) if getattr(flags, name) != getattr(default, name) else getattr(env, name)
        for name in OperatorSettings.__dataclass_fields__
    }
    return OperatorSettings(**merged)


def peering_priority(value: str) -> int:
    if value == "auto":
        return random.SystemRandom().randint(1, 2**31 - 1)
    try:
        return int(value)
    except ValueError:
        raise SettingsError(f"--priority: {value!r} is neither an integer nor 'auto'") from None


def main(argv: list[str]) -> int:
    if argv[:1] == ["ready"]:  # the chart's helm test
        from strata.operator import ready

        return ready.main(argv[1:])
    args = parser().parse_args(argv)
    try:
        settings = build_settings(args)
        priority = peering_priority(args.priority)
    except SettingsError as exc:
        print(f"strata operator: {exc}", file=sys.stderr)
        return 2
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig  # read by kopf's login and by our client alike
    import kopf

    from strata.operator import handlers  # registers the handlers

    fmt = kopf.LogFormat.JSON if args.log_format == "json" else kopf.LogFormat.PLAIN
    kopf.configure(verbose=args.verbose, log_format=fmt)
    if not args.verbose:
        # kopf logs every handler run at INFO; ours are one per watch event, so keep INFO quiet.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # every liveness probe
    kopf.run(
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        standalone=args.standalone,
        priority=priority,
        peering_name=None if args.standalone else args.peering,
        liveness_endpoint=args.liveness or None,
        memo=kopf.Memo(strata_settings=settings),
        memories=handlers.EventMemories(),
    )
    return 0
