"""``strata worker``: serve a model, fetch or make a model directory, or check the GPU path."""

from __future__ import annotations

import argparse
import json
import os
import sys

from pydantic import ValidationError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="strata worker", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the configured model over the OpenAI API")
    serve.add_argument("--config", default="/etc/strata/worker.yaml", help="worker config file (YAML)")
    serve.add_argument(
        "--host", default=None, help="address to listen on, overriding server.host (a pod passes its pod IP)"
    )
    serve.add_argument("--log-level", default="INFO")
    make = sub.add_parser("make-model", help="write a seeded, deterministic test model directory")
    make.add_argument("--preset", default="tiny", help="tiny, small, hf-tiny or hf-medium")
    make.add_argument("--out", required=True)
    make.add_argument("--seed", type=int, default=0)
    fetch = sub.add_parser(
        "fetch-model", help="fill a model directory from builtin://, http(s)://, hf://, s3://, gs://"
    )
    fetch.add_argument("--source", required=True, help="model URI (builtin://tiny, hf://org/name@rev, ...)")
    fetch.add_argument("--dest", required=True, help="directory to fill (the engine's model.path)")
    fetch.add_argument(
        "--include",
        action="append",
        default=[],
        help="also fetch these files (hf: glob patterns); repeatable",
    )
    fetch.add_argument(
        "--exclude", action="append", default=[], help="never fetch files matching; repeatable"
    )
    fetch.add_argument("--workers", type=int, default=8, help="files downloaded at once")
    gpu = sub.add_parser("gpu-check", help="prove the CUDA path and print throughput and TTFT as JSON")
    gpu.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    gpu.add_argument("--preset", choices=["tiny", "small"], default="small")
    gpu.add_argument("--prompt-tokens", type=int, default=4096)
    gpu.add_argument("--batch", type=int, default=16)
    gpu.add_argument("--decode-tokens", type=int, default=64)
    gpu.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    return parser


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.command == "make-model":
        from strata.worker.models.presets import write_model

        try:
            print(write_model(args.out, args.preset, args.seed))
        except ValueError as err:
            print(f"strata worker make-model: {err}", file=sys.stderr)
            return 2
        return 0
    if args.command == "fetch-model":
        return _fetch(args)
    if args.command == "gpu-check":
        from strata.worker import gpu_check

        result = gpu_check.run(
            args.device, args.preset, args.prompt_tokens, args.batch, args.decode_tokens, args.dtype
        )
        print(json.dumps(result, indent=2))
        return 0 if result["paged_matches_reference"] else 1
    return _serve(args.config, args.log_level, args.host)


def _fetch(args: argparse.Namespace) -> int:
    from strata.common import logs
    from strata.worker.fetch import FetchOptions, fetch_model
    from strata.worker.fetch_http import FetchError

    logs.setup("INFO")
    options = FetchOptions(tuple(args.include), tuple(args.exclude), max(1, args.workers))
    try:
        print(fetch_model(args.source, args.dest, options))
    except FetchError as exc:
        print(f"strata worker fetch-model: {exc}", file=sys.stderr)
        return 2
    return 0


def _serve(path: str, level: str, host: str | None = None) -> int:
    from strata.common import logs
    from strata.worker.config import WorkerConfig
    from strata.worker.models.errors import ModelLoadError

    logs.setup(level)
    try:
        config = WorkerConfig.load(path)
    except (OSError, ValidationError, ValueError) as exc:
        print(f"strata worker: bad config {path}: {exc}", file=sys.stderr)
        return 2
    if host:
        config = config.model_copy(update={"server": config.server.model_copy(update={"host": host})})
    from strata.common.openai.auth import api_key_from

    try:
        api_key_from(os.environ)
    except ValueError as exc:
        print(f"strata worker: {exc}", file=sys.stderr)
        return 2
    from strata.worker.server.main import serve

    try:
        serve(config)
    except ModelLoadError as exc:
        print(f"strata worker: {exc}", file=sys.stderr)
        return 2
    return 0
