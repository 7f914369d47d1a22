#!/usr/bin/env bash
# prometheus and promtool for the tests and the demo, built from the Go module proxy into bin/,
# pinned by this folder's go.mod and go.sum (Prometheus 3.10.0, module v0.310.0). Only the
# Kubernetes service discovery is compiled in (Prometheus' remove_all_sd/enable_kubernetes_sd
# build tags), which keeps the cloud providers' SDKs out of the build. Debian's prometheus
# package was the cheaper install but is built without kubernetes_sd (client-go is not packaged
# in Debian), which the tests need. Skipped when bin/.prometheus-stamp matches this folder.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$(cd "$here/../.." && pwd)/bin}
VERSION=3.10.0
BINARIES="prometheus promtool"
if [ -n "${STRATA_PROMETHEUS_DIR:-}" ]; then
  echo "prometheus: using STRATA_PROMETHEUS_DIR=$STRATA_PROMETHEUS_DIR"
  exit 0
fi
mkdir -p "$out"
stamp=$(cat "$here/install.sh" "$here/go.mod" "$here/go.sum" "$here/tools.go" | sha256sum | cut -d' ' -f1)
if [ -f "$out/.prometheus-stamp" ] && [ "$(cat "$out/.prometheus-stamp")" = "$stamp" ] \
    && [ -x "$out/prometheus" ] && [ -x "$out/promtool" ]; then
  echo "prometheus: $out is current (Prometheus $VERSION)"
  exit 0
fi
export GOFLAGS="${GOFLAGS:--buildvcs=false} -p=${GO_BUILD_JOBS:-2}"
ldflags="-s -w -X github.com/prometheus/common/version.Version=$VERSION -X github.com/prometheus/common/version.Branch=module"
cd "$here"
start=$(date +%s)
for cmd in $BINARIES; do
  echo "prometheus: building $cmd $VERSION ($(( $(date +%s) - start ))s)"
  go build -trimpath -ldflags "$ldflags" -tags remove_all_sd,enable_kubernetes_sd \
    -o "$out/$cmd" "github.com/prometheus/prometheus/cmd/$cmd"
done
echo "$stamp" > "$out/.prometheus-stamp"
echo "prometheus: built in $(( $(date +%s) - start ))s into $out"
