"""Health probes for the components: plain HTTPS GETs against their /readyz, /healthz, /health."""

from __future__ import annotations

import http.client
import ssl
import urllib.request
from pathlib import Path

from strata.cluster.certs import CertPair

PROBE_TIMEOUT_S = 2.0


def tls_context(ca_cert: Path, client: CertPair | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca_cert))
    if client is not None:
        context.load_cert_chain(str(client.cert), str(client.key))
    return context


def is_healthy(url: str, context: ssl.SSLContext | None = None) -> bool:
    """True when ``url`` answers 200; connection errors and non-200 answers are both 'not yet'."""
    try:
        with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT_S, context=context) as response:
            return int(response.status) == 200
    except (OSError, http.client.HTTPException):  # URLError, resets, timeouts and TLS errors are OSErrors
        return False
