#!/usr/bin/env bash
# The Python packages the GPU machine's image lacks (pydantic for the worker's config,
# cryptography for the test plugins, pytest-asyncio for the suite's settings), as wheels for its
# Python 3.12 into .device/wheels: nothing can be fetched there, so they travel with the working
# tree (`carry: [".device"]`). Everything else the worker, its tests and its benchmark import
# (torch, numpy, aiohttp, prometheus-client, xxhash, safetensors, tokenizers, transformers,
# jinja2, pyyaml, pytest) is in that image (/work/.library/device/KINDS.md).
set -euo pipefail
PIP=${PIP:-.venv/bin/pip}
DEST=${1:-.device/wheels}
mkdir -p "$DEST"
"$PIP" download --quiet --disable-pip-version-check --only-binary=:all: \
  --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -d "$DEST" pydantic cryptography pytest-asyncio
echo "device-wheels: $(ls "$DEST" | wc -l) wheels, $(du -sh "$DEST" | cut -f1) in $DEST"
# xxhash.h, which the KV tiers' copy-and-checksum is built on, should the image lack it: beside
# the wheels, in include/ (check.sh puts it on the compiler's path).
HEADER=$(tools/native-deps.sh | sed -n 's/^native-deps: \(\/.*xxhash\.h\)$/\1/p' | tail -n 1)
if [ -n "$HEADER" ]; then mkdir -p "$DEST/../include" && cp "$HEADER" "$DEST/../include/"; fi
