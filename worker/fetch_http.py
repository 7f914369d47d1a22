"""Model files over HTTP(S): plain web directories and public S3/GCS buckets.

Resumable and parallel: each file streams into ``name.part`` and is renamed when complete, so a
final name always means a whole file and is never fetched again; a ``.part`` left by a killed
init container is continued with a ``Range`` request. Files come down ``workers`` at a time.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from http.client import HTTPResponse
from pathlib import Path

from strata.worker.fetch_progress import Progress

CHUNK_BYTES = 1 * 2**20
TIMEOUT_S = 60


class FetchError(RuntimeError):
    """The source cannot be fetched; the message names the source and the reason."""


@dataclass(frozen=True)
class HttpSource:
    uri: str
    base_url: str  # ends with "/"
    headers: tuple[tuple[str, str], ...] = ()


def resolve_http(uri: str, env: dict[str, str] | None = None) -> HttpSource:
    """Map a model URI onto the HTTP directory it is read from (pure; ``env`` for endpoints)."""
    env = dict(os.environ) if env is None else env
    scheme, _, rest = uri.partition("://")
    rest = rest.strip("/")
    if not rest:
        raise FetchError(f"source {uri!r}: empty location after {scheme}://")
    if scheme in ("http", "https"):
        return HttpSource(uri, f"{scheme}://{rest}/")
    if scheme == "s3":
        bucket, _, prefix = rest.partition("/")
        s3_endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
        if s3_endpoint:  # path-style, as MinIO and other S3-compatible stores expect
            return HttpSource(uri, f"{s3_endpoint.rstrip('/')}/{bucket}/{_dir(prefix)}")
        return HttpSource(uri, f"https://{bucket}.s3.amazonaws.com/{_dir(prefix)}")
    if scheme == "gs":
        bucket, _, prefix = rest.partition("/")
        endpoint = env.get("STORAGE_EMULATOR_HOST", "https://storage.googleapis.com").rstrip("/")
        return HttpSource(uri, f"{endpoint}/{bucket}/{_dir(prefix)}")
    raise FetchError(f"source {uri!r}: unsupported scheme {scheme!r} (builtin, http, https, hf, s3, gs)")


def _dir(prefix: str) -> str:
    return f"{prefix.strip('/')}/" if prefix.strip("/") else ""


def _open(source: HttpSource, name: str, offset: int) -> HTTPResponse | None:
    """The response for ``name`` from ``offset`` on; None when the part file is already whole."""
    headers = dict(source.headers)
    if offset:
        headers["Range"] = f"bytes={offset}-"
    request = urllib.request.Request(source.base_url + urllib.parse.quote(name), headers=headers)
    try:
        response: HTTPResponse = urllib.request.urlopen(request, timeout=TIMEOUT_S)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and offset:  # nothing past the end: the killed run had it all
            return None
        raise
    return response


def _expected_size(response: HTTPResponse, offset: int) -> int | None:
    length = response.headers.get("Content-Length")
    return None if length is None else offset + int(length)


def _stream(response: HTTPResponse, part: Path, offset: int, progress: Progress) -> int:
    with response, part.open("ab" if offset else "wb") as sink:
        while chunk := response.read1(CHUNK_BYTES):
            sink.write(chunk)
            progress.add(len(chunk))
            offset += len(chunk)
    return offset


def download(source: HttpSource, name: str, out: Path, progress: Progress, *, required: bool) -> bool:
    """Fetch ``name`` into ``out`` unless it is there whole; False if absent and not required."""
    if "/" in name or name.startswith("."):
        raise FetchError(f"source {source.uri!r}: refusing file name {name!r}")
    final, part = out / name, out / f"{name}.part"
    if final.is_file():
        progress.kept(final.stat().st_size, whole_file=True)
        return True
    offset = part.stat().st_size if part.is_file() else 0
    try:
        response = _open(source, name, offset)
        if response is not None:
            if response.status != 206:  # the server ignored the range: start again
                offset = 0
            progress.kept(offset)
            expected = _expected_size(response, offset)
            size = _stream(response, part, offset, progress)
            if expected is not None and size != expected:
                raise FetchError(f"source {source.uri!r}: GET {name} ended at {size} of {expected} bytes")
    except urllib.error.HTTPError as exc:
        if exc.code == 404 and not required:
            return False
        raise FetchError(f"source {source.uri!r}: GET {name} answered HTTP {exc.code} {exc.reason}") from exc
    except (urllib.error.URLError, OSError) as exc:  # the .part stays: the next run continues it
        raise FetchError(f"source {source.uri!r}: GET {name} failed: {exc}") from exc
    part.replace(final)
    progress.file_done(name)
    return True
