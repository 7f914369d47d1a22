"""The binaries tools/clusterbins/build.sh makes agree on one Kubernetes version.

helm renders a chart for the Kubernetes version its build names (``.Capabilities.KubeVersion``,
a chart's ``kubeVersion`` constraint); build.sh sets it to the control plane's, so ``helm
template`` and ``helm install --dry-run`` need no ``--kube-version``. Upstream helm names the
version of its client-go (the default, v1.20, when built with plain ``go build``).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from strata.cluster.binaries import find_bin_dir


def minor_version(text: str) -> str:
    found = re.search(r"v(\d+)\.(\d+)", text)
    assert found, text
    return f"{found[1]}.{found[2]}"


def run(*argv: str | Path) -> str:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, check=True).stdout


def test_helm_renders_for_the_control_planes_kubernetes_version(tmp_path: Path) -> None:
    bin_dir = find_bin_dir()
    chart = tmp_path / "probe"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: probe\nversion: 0.1.0\n")
    template = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: probe\ndata:\n"
    template += "  kube: {{ .Capabilities.KubeVersion.Version | quote }}\n"
    (chart / "templates" / "probe.yaml").write_text(template)
    rendered = run(bin_dir / "helm", "template", "probe", chart)
    apiserver = run(bin_dir / "kube-apiserver", "--version")  # "Kubernetes v1.34.4"
    assert minor_version(rendered) == minor_version(apiserver), (rendered, apiserver)
