#!/usr/bin/env bash
# Prometheus and promtool for the tests and the demo: Debian's package, pinned. Seconds, not the
# minutes a Go build of Prometheus from the module proxy would add to a cold `make test`; and
# Debian's build keeps its web UI (its assets in /usr/share/prometheus/web), which `go install`
# from the module proxy would not embed. A no-op when the pinned version is already installed.
set -euo pipefail

PROMETHEUS_DEB="2.42.0+ds-5+deb12u1"
PROMETHEUS_VERSION="2.42.0"   # what `prometheus --version` must say

current() {
  for tool in prometheus promtool; do
    command -v "$tool" >/dev/null 2>&1 || return 1
    "$tool" --version 2>&1 | head -1 | grep -q "version ${PROMETHEUS_VERSION}+ds" || return 1
  done
}

if current; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "Prometheus ${PROMETHEUS_VERSION} is missing; install Debian's package as root:" >&2
  echo "  apt-get install --no-install-recommends prometheus=${PROMETHEUS_DEB}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
if ! apt-cache show "prometheus=${PROMETHEUS_DEB}" >/dev/null 2>&1; then
  echo "prometheus ${PROMETHEUS_DEB} not in the package lists: apt-get update" >&2
  apt-get update -q
fi
echo "installing prometheus ${PROMETHEUS_DEB} (Debian package)" >&2
# --no-install-recommends: no node exporter. Where systemd runs, the package starts its own
# service on :9090; the tests and the demo never use it (they start their own on a free port).
apt-get install -y -q --no-install-recommends "prometheus=${PROMETHEUS_DEB}"
current || { echo "prometheus ${PROMETHEUS_VERSION} still not on the PATH after install" >&2; exit 1; }
