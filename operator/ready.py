"""``strata operator ready --url URL``: wait until the operator answers its liveness endpoint.

The chart's ``helm test`` pod runs it against the operator's Service. kopf answers /healthz only
after the operator's start-up handlers ran (settings, metrics server), so a 200 means an operator
replica is up; a standby replica answers too, and takes over without a restart."""

from __future__ import annotations

import argparse
import sys
import time
import urllib.error
import urllib.request

POLL_S = 2.0
PROBE_TIMEOUT_S = 5.0


def probe(url: str, timeout_s: float) -> str | None:
    """None when ``url`` answers 200, else why not."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return None if resp.status == 200 else f"HTTP {resp.status}"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        return str(getattr(exc, "reason", exc))


def wait_ready(url: str, timeout_s: float) -> str | None:
    """Poll until ready or ``timeout_s`` passed; None when ready, else the last reason."""
    deadline = time.monotonic() + timeout_s
    while True:
        reason = probe(url, PROBE_TIMEOUT_S)
        if reason is None or time.monotonic() >= deadline:
            return reason
        time.sleep(POLL_S)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="strata operator ready", description=__doc__)
    p.add_argument("--url", required=True, help="the operator's liveness URL (…/healthz)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait (default 120)")
    args = p.parse_args(argv)
    reason = wait_ready(args.url, args.timeout)
    if reason is None:
        print(f"operator ready: {args.url} answered 200")
        return 0
    print(f"operator not ready after {args.timeout:g} s: {args.url}: {reason}", file=sys.stderr)
    return 1
