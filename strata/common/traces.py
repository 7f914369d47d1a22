"""Where the public Mooncake request traces are on this machine (tests, benchmarks, the demo and
the simulator read them; the project does not carry a copy)."""

from __future__ import annotations

import configparser
import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def traces_dir() -> Path:
    """The shared Mooncake traces: ``STRATA_TRACES_DIR``; else ../shared/data/traces beside the
    checkout, or beside the checkout this one was cloned from (a clean clone made elsewhere, as
    under /tmp, to check that a fresh checkout passes)."""
    if "STRATA_TRACES_DIR" in os.environ:
        return Path(os.environ["STRATA_TRACES_DIR"])
    candidates = [root / ".." / "shared" / "data" / "traces" for root in (REPO_ROOT, *cloned_from(REPO_ROOT))]
    return next((path for path in candidates if path.is_dir()), candidates[0])


def cloned_from(checkout: Path) -> list[Path]:
    """The local checkout ``checkout`` was cloned from (its ``origin`` remote, when that is a
    directory on this machine); none for a remote on another machine or no git metadata."""
    config = configparser.ConfigParser(strict=False, interpolation=None)
    try:
        config.read(checkout / ".git" / "config")
        url = config.get('remote "origin"', "url", fallback="")
    except configparser.Error:
        return []
    path = Path(url.removeprefix("file://"))
    return [path] if path.is_absolute() and path.is_dir() else []
