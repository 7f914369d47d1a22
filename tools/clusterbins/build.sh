#!/usr/bin/env bash
# Builds the test control plane into bin/ from the Go module proxy, with progress.
#
# One `go build` makes kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, etcd and
# helm: they are main packages of one module graph (go.mod here), so every package they share (the
# Kubernetes libraries above all) is compiled once, and the build runs as one parallel job graph.
# kwok is the one binary outside it: v0.8.0 needs Kubernetes 1.36 libraries, and v0.7.0 does not
# compile against 1.34's either, so it builds in its own graph. Nothing else is built: each binary
# is one the harness, the tests or the demo runs.
#
# Skips the build when bin/.stamp matches the pinned versions (this file + go.mod + go.sum) and every
# binary is there, or when KUBEBUILDER_ASSETS or STRATA_BIN_DIR already holds every binary the
# test harness needs (the same lookup as strata/cluster/binaries.py).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$(cd "$here/../.." && pwd)/bin}
KUBE_VERSION=v1.34.4
KWOK_VERSION=v0.8.0
BINARIES="etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok"
PACKAGES="k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager
  k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl ./etcd helm.sh/helm/v3/cmd/helm"
has_all() {
  local dir=$1 name
  for name in $BINARIES; do [ -x "$dir/$name" ] || return 1; done
}
for var in KUBEBUILDER_ASSETS STRATA_BIN_DIR; do
  dir=${!var:-}
  if [ -n "$dir" ] && has_all "$dir"; then
    echo "cluster-bins: using $var=$dir"
    exit 0
  elif [ -n "$dir" ]; then
    echo "cluster-bins: $var=$dir lacks some of: $BINARIES; building into $out"
  fi
done
mkdir -p "$out"
cd "$here"
stamp=$(cat build.sh ../progress.sh go.mod go.sum tools.go etcd/main.go | sha256sum | cut -d' ' -f1)
version() { go list -m -f '{{.Version}}' "$1"; }
if [ -f "$out/.stamp" ] && [ "$(cat "$out/.stamp")" = "$stamp" ] && has_all "$out" && [ -x "$out/helm" ]; then
  echo "cluster-bins: $out is current (Kubernetes $KUBE_VERSION, etcd $(version go.etcd.io/etcd/server/v3), kwok $KWOK_VERSION, helm $(version helm.sh/helm/v3))"
  exit 0
fi
label=cluster-bins
steps=4
# shellcheck source=../progress.sh
. "$here/../progress.sh"
# Parallel compile jobs cost ~1.5 GB each at the linker; keep it bounded on small machines.
jobs=${GO_BUILD_JOBS:-2}
export GOFLAGS="${GOFLAGS:--buildvcs=false} -p=$jobs"

step downloading Go modules
# -x names each module fetched; errors ("go: ...") pass through.
go mod download -x 2>&1 | awk '/\.zip: 200 OK/ {n++; if (n % 50 == 0) {printf "cluster-bins:   %d modules downloaded\n", n; fflush()}}
  /^go: / {print; fflush()}
  END {printf "cluster-bins:   %d modules downloaded\n", n}'

total=$(go list -deps $PACKAGES | wc -l)
step "one build of kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, etcd and helm: $total packages, $jobs jobs"
major=${KUBE_VERSION#v}; major=${major%%.*}
minor=${KUBE_VERSION#v*.}; minor=${minor%%.*}
pkg=k8s.io/component-base/version
ldflags="-s -w -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
ldflags="$ldflags -X k8s.io/client-go/pkg/version.gitVersion=$KUBE_VERSION -X k8s.io/client-go/pkg/version.gitMajor=$major -X k8s.io/client-go/pkg/version.gitMinor=$minor"
# helm renders charts for the Kubernetes version its build names (chartutil's default capabilities,
# and lint's deprecation checks): the control plane's, so `helm template` needs no --kube-version.
ldflags="$ldflags -X helm.sh/helm/v3/internal/version.version=$(version helm.sh/helm/v3)"
for helm_pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
  ldflags="$ldflags -X $helm_pkg.k8sVersionMajor=$major -X $helm_pkg.k8sVersionMinor=$minor"
done
go build -v -trimpath -ldflags "$ldflags" -o "$out/" $PACKAGES 2>&1 | progress "$total"

step "kwok $KWOK_VERSION, in its own module graph"
GOBIN="$out" go install -v -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" 2>&1 | progress ""

step checking the binaries
for name in $BINARIES helm; do [ -x "$out/$name" ] || { echo "cluster-bins: $out/$name was not built" >&2; exit 1; }; done
echo "$stamp" > "$out/.stamp"
echo "cluster-bins: built in $(elapsed) into $out"
