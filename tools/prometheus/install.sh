#!/usr/bin/env bash
# prometheus and promtool for the tests and the demo, built from the Go module proxy into bin/,
# pinned by this folder's go.mod and go.sum (Prometheus 3.10.0, module v0.310.0). Only the
# Kubernetes service discovery is compiled in (Prometheus' remove_all_sd/enable_kubernetes_sd
# build tags), which keeps the cloud providers' SDKs out of the build. Debian's prometheus
# package was the cheaper install but is built without kubernetes_sd (client-go is not packaged
# in Debian), which the tests need. Both are one `go build` (they share most packages). It stays
# apart from tools/clusterbins: Prometheus needs the v0.35 Kubernetes libraries, the control plane
# is v1.34. Skipped when bin/.prometheus-stamp matches this folder.
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
cd "$here"
stamp=$(cat install.sh ../progress.sh go.mod go.sum tools.go | sha256sum | cut -d' ' -f1)
if [ -f "$out/.prometheus-stamp" ] && [ "$(cat "$out/.prometheus-stamp")" = "$stamp" ] \
    && [ -x "$out/prometheus" ] && [ -x "$out/promtool" ]; then
  echo "prometheus: $out is current (Prometheus $VERSION)"
  exit 0
fi
label=prometheus
steps=3
# shellcheck source=../progress.sh
. "$here/../progress.sh"
export GOFLAGS="${GOFLAGS:--buildvcs=false} -p=${GO_BUILD_JOBS:-2}"
tags=remove_all_sd,enable_kubernetes_sd
packages="github.com/prometheus/prometheus/cmd/prometheus github.com/prometheus/prometheus/cmd/promtool"
step "downloading the Go modules they need"
# The package list goes to wc (the total for the progress count), the downloads to the log.
total=$({ go list -tags "$tags" -deps $packages 2>&1 1>&3 | downloads >&2; } 3>&1 | wc -l)
step "one build of prometheus and promtool $VERSION: $total packages"
ldflags="-s -w -X github.com/prometheus/common/version.Version=$VERSION -X github.com/prometheus/common/version.Branch=module"
go build -v -trimpath -ldflags "$ldflags" -tags "$tags" -o "$out/" $packages 2>&1 | progress "$total"
step checking the binaries
for name in $BINARIES; do [ -x "$out/$name" ] || { echo "prometheus: $out/$name was not built" >&2; exit 1; }; done
echo "$stamp" > "$out/.prometheus-stamp"
echo "prometheus: built in $(elapsed) into $out"
