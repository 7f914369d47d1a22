# Images for the operator and the worker (engine + KV-tier sidecar), from one source tree:
#   docker build --target operator -t ghcr.io/strata-dev/strata-operator:0.1.0 .
#   docker build --target worker   -t ghcr.io/strata-dev/strata-worker:0.1.0 .
# Both run as the non-root uid the operator renders into pod security contexts (10001) and
# work with a read-only root filesystem: everything written goes to mounted volumes or /tmp.
FROM python:3.11-slim AS base
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 HOME=/tmp
WORKDIR /src
COPY pyproject.toml README.md ./
COPY strata ./strata
COPY operator ./operator
COPY worker ./worker
COPY router ./router

FROM base AS operator
# The operator extra never pulls torch (tests/foundation checks the import graph).
RUN pip install --no-compile '.[operator]' && rm -rf /src
USER 10001:10001
ENTRYPOINT ["strata"]
CMD ["operator"]

FROM base AS worker
# The KV tiers' copy-and-checksum (worker/kvtier/native) is compiled on first use, for the node's
# own CPU, into $HOME (/tmp): the image carries a C compiler (small next to torch) and xxhash's
# header. Without them the tiers take the slower Python path and log `native_fallback`.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev libxxhash-dev \
    && rm -rf /var/lib/apt/lists/* \
    && pip install --no-compile '.[worker]' && rm -rf /src
USER 10001:10001
ENTRYPOINT ["strata"]
CMD ["worker", "serve", "--config", "/etc/strata/worker.yaml"]
