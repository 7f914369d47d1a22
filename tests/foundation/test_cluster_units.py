"""Unit tests for the harness's pure parts: binary lookup, node manifests, flags, certificates."""

from __future__ import annotations

import ipaddress
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from strata.cluster import binaries, certs, components, nodes, storage
from strata.cluster.cluster import ClusterConfig
from strata.cluster.pytest_plugin import namespace_name


def fill(directory: Path, names: tuple[str, ...]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        path = directory / name
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
    return directory


class TestBinaryLookup:
    def test_kubebuilder_assets_wins_when_complete(self, tmp_path: Path) -> None:
        envtest = fill(tmp_path / "envtest", binaries.REQUIRED)
        strata = fill(tmp_path / "strata", binaries.REQUIRED)
        env = {"KUBEBUILDER_ASSETS": str(envtest), "STRATA_BIN_DIR": str(strata)}
        assert binaries.find_bin_dir(env, repo_root=tmp_path) == envtest

    def test_incomplete_directory_falls_through_to_repo_bin(self, tmp_path: Path) -> None:
        # envtest ships etcd, kube-apiserver and kubectl only.
        envtest = fill(tmp_path / "envtest", ("etcd", "kube-apiserver", "kubectl"))
        repo_bin = fill(tmp_path / "bin", binaries.REQUIRED)
        assert binaries.find_bin_dir({"KUBEBUILDER_ASSETS": str(envtest)}, repo_root=tmp_path) == repo_bin

    def test_error_names_make_target_and_what_is_missing(self, tmp_path: Path) -> None:
        fill(tmp_path / "bin", ("etcd", "kubectl"))
        with pytest.raises(binaries.MissingBinariesError) as error:
            binaries.find_bin_dir({}, repo_root=tmp_path)
        message = str(error.value)
        assert "make cluster-bins" in message
        assert "KUBEBUILDER_ASSETS" in message
        assert "missing kube-apiserver, kube-controller-manager, kube-scheduler, kwok" in message

    def test_non_executable_file_counts_as_missing(self, tmp_path: Path) -> None:
        directory = fill(tmp_path / "bin", binaries.REQUIRED)
        (directory / "kwok").chmod(0o644)
        assert binaries.missing_in(directory) == ["kwok"]


CIDR = "127.64.1.0/24"


class TestGpuNodes:
    def test_default_node_is_an_8_gpu_h100_server_with_local_nvme(self) -> None:
        node = nodes.gpu_node_manifest("gpu-node-0", 0, nodes.GpuNodeShape(), CIDR)
        labels = node["metadata"]["labels"]
        assert node["metadata"]["annotations"] == {"kwok.x-k8s.io/node": "fake"}
        assert labels["kubernetes.io/hostname"] == "gpu-node-0"
        assert labels[nodes.GPU_PRODUCT_LABEL] == "NVIDIA-H100-80GB-HBM3"
        assert labels[nodes.LOCAL_NVME_LABEL] == "true"
        assert labels[nodes.LOCAL_NVME_GIB_LABEL] == "3500"
        assert node["status"]["capacity"][nodes.GPU_RESOURCE] == "8"
        assert node["status"]["allocatable"][nodes.GPU_RESOURCE] == "8"

    def test_allocatable_keeps_back_system_reserve(self) -> None:
        status = nodes.gpu_node_manifest("n-0", 0, nodes.GpuNodeShape(cpu=64, memory_gib=512), CIDR)["status"]
        assert (status["capacity"]["cpu"], status["allocatable"]["cpu"]) == ("64", "62")
        assert (status["capacity"]["memory"], status["allocatable"]["memory"]) == ("512Gi", "496Gi")

    def test_zones_round_robin_by_node_number(self) -> None:
        shape = nodes.GpuNodeShape(zones=("a", "b", "c"))
        items = [nodes.gpu_node_manifest(f"gpu-{i}", i, shape, CIDR) for i in (4, 5, 6)]
        assert [i["metadata"]["labels"][nodes.ZONE_LABEL] for i in items] == ["b", "c", "a"]

    def test_pods_of_a_node_get_addresses_from_its_own_loopback_range(self) -> None:
        node = nodes.gpu_node_manifest("gpu-0", 0, nodes.GpuNodeShape(), "127.64.7.0/24")
        assert node["spec"] == {"podCIDR": "127.64.7.0/24", "podCIDRs": ["127.64.7.0/24"]}

    def test_node_without_nvme_says_so(self) -> None:
        labels = nodes.gpu_node_manifest("n-0", 0, nodes.GpuNodeShape(local_nvme_gib=0), CIDR)["metadata"][
            "labels"
        ]
        assert labels[nodes.LOCAL_NVME_LABEL] == "false"

    @pytest.mark.parametrize(("field", "value"), [("gpus", -1), ("cpu", -2), ("local_nvme_gib", -5)])
    def test_negative_shape_is_rejected_naming_the_field(self, field: str, value: int) -> None:
        with pytest.raises(ValueError, match=f"GpuNodeShape.{field}"):
            nodes.GpuNodeShape(**{field: value})  # type: ignore[arg-type]

    def test_local_node_is_run_by_the_pod_runtime_not_kwok_and_is_tainted(self) -> None:
        node = nodes.local_node_manifest("local-0", 0, nodes.GpuNodeShape(), CIDR, cpu="1500m", memory="8Gi")
        assert "annotations" not in node["metadata"]
        assert node["metadata"]["labels"][nodes.POD_RUNTIME_LABEL] == nodes.POD_RUNTIME_LOCAL
        assert node["spec"]["taints"] == [nodes.LOCAL_TAINT]
        assert node["status"]["capacity"]["cpu"] == node["status"]["allocatable"]["cpu"] == "1500m"
        assert node["status"]["allocatable"]["memory"] == "8Gi"

    def test_the_machine_offers_at_least_one_cpu_and_some_memory(self) -> None:
        assert nodes.machine_cpus() >= 1
        assert nodes.machine_memory().endswith("Mi") and int(nodes.machine_memory()[:-2]) > 0


class TestClusterConfig:
    def test_rejects_bad_node_prefix(self) -> None:
        with pytest.raises(ValueError, match="node_prefix"):
            ClusterConfig(node_prefix="GPU_nodes")

    def test_rejects_negative_node_count(self) -> None:
        with pytest.raises(ValueError, match="gpu_nodes"):
            ClusterConfig(gpu_nodes=-1)


class TestComponentFlags:
    def setup_method(self) -> None:
        self.layout = components.Layout(Path("/c"))
        self.ports = components.Ports(1, 2, 3, 4, 5)
        self.networks = components.Networks()

    def test_kubernetes_service_ip_is_first_host_of_service_range(self) -> None:
        assert components.Networks().apiserver_service_ip == "127.96.0.1"
        assert components.Networks(service_cidr="127.20.8.0/22").apiserver_service_ip == "127.20.8.1"

    @pytest.mark.parametrize("field", ["service_cidr", "pod_cidr"])
    def test_ranges_outside_loopback_are_refused(self, field: str) -> None:
        with pytest.raises(ValueError, match=f"Networks.{field}: .* is outside 127.0.0.0/8"):
            components.Networks(**{field: "192.0.2.0/24"})  # type: ignore[arg-type]

    def test_node_ranges_are_handed_out_lowest_first_keeping_the_first_for_kwok(self) -> None:
        networks = components.Networks(pod_cidr="127.64.0.0/22")
        assert networks.unassigned_node_cidr == "127.64.0.0/24"
        assert networks.allocate_node_cidrs({"127.64.1.0/24"}, 2) == ["127.64.2.0/24", "127.64.3.0/24"]
        with pytest.raises(ValueError, match="holds no 4 more /24 node ranges"):
            networks.allocate_node_cidrs(set(), 4)

    def test_apiserver_has_rbac_real_certs_and_service_account_keys(self) -> None:
        argv = components.apiserver_argv(Path("/b"), self.layout, self.ports, self.networks)
        assert argv[0] == "/b/kube-apiserver"
        assert "--authorization-mode=Node,RBAC" in argv
        assert "--client-ca-file=/c/pki/ca.crt" in argv
        assert "--service-account-signing-key-file=/c/pki/sa.key" in argv
        assert "--etcd-servers=http://127.0.0.1:1" in argv
        assert "--bind-address=127.0.0.1" in argv

    def test_controller_manager_runs_all_default_controllers_without_leader_election(self) -> None:
        argv = components.controller_manager_argv(Path("/b"), self.layout, self.ports, self.networks)
        off = ("endpoints-controller", "endpointslice-controller", "endpointslice-mirroring-controller")
        assert f"--controllers=*,{','.join('-' + c for c in off)}" in argv
        assert "--leader-elect=false" in argv
        assert "--root-ca-file=/c/pki/ca.crt" in argv
        assert "--service-account-private-key-file=/c/pki/sa.key" in argv

    def test_every_component_binds_loopback_only(self) -> None:
        argvs = [
            components.controller_manager_argv(Path("/b"), self.layout, self.ports, self.networks),
            components.scheduler_argv(Path("/b"), self.layout, self.ports),
        ]
        for argv in argvs:
            assert "--bind-address=127.0.0.1" in argv

    def test_kwok_manages_only_annotated_nodes_with_the_shipped_stages(self) -> None:
        argv = components.kwok_argv(Path("/b"), self.layout, self.networks, Path("/s.yaml"))
        assert "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake" in argv
        assert "--config=/s.yaml" in argv
        assert "--cidr=127.64.0.0/24" in argv

    def test_shipped_kwok_stages_cover_node_and_pod_lifecycle(self) -> None:
        from strata.cluster.startup import KWOK_STAGES

        names = re.findall(r"^  name: (\S+)$", KWOK_STAGES.read_text(), re.MULTILINE)
        assert names == [
            "node-initialize",
            "node-heartbeat-with-lease",
            "pod-ready",
            "pod-complete",
            "pod-delete",
            "pvc-provision",
            "pv-bind",
            "pvc-delete",
            "pv-delete",
        ]

    def test_volume_stages_act_for_every_class_of_the_kwok_provisioner(self) -> None:
        from strata.cluster.startup import KWOK_STAGES

        text = KWOK_STAGES.read_text()
        assert "storageClassName == 'kwok-volume'" not in text
        assert text.count(f"== '{storage.PROVISIONER}'") == 4

    def test_storage_class_uses_the_kwok_provisioner(self) -> None:
        manifest = storage.storage_class_manifest("fast", default=True, binding_mode="WaitForFirstConsumer")
        assert manifest["provisioner"] == storage.PROVISIONER
        assert manifest["metadata"]["annotations"] == {"storageclass.kubernetes.io/is-default-class": "true"}
        assert manifest["volumeBindingMode"] == "WaitForFirstConsumer"
        assert storage.storage_class_manifest("slow")["metadata"]["annotations"] == {}


class TestCertificates:
    def test_client_certificate_carries_user_and_groups_and_is_signed_by_the_ca(self, tmp_path: Path) -> None:
        ca = certs.create_ca(tmp_path)
        pair = certs.issue_client_cert(ca, tmp_path / "clients", "alice", ("team-a", "team-b"))
        cert = x509.load_pem_x509_certificate(pair.cert.read_bytes())
        ca_cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
        assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "alice"
        orgs = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
        assert orgs == ["team-a", "team-b"]
        cert.verify_directly_issued_by(ca_cert)
        assert oct(pair.key.stat().st_mode & 0o777) == "0o600"

    def test_serving_certificate_names_loopback_and_in_cluster_service(self, tmp_path: Path) -> None:
        pki = certs.create_pki(tmp_path, service_ip="127.96.0.1")
        cert = x509.load_pem_x509_certificate(pki.apiserver.cert.read_bytes())
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert ipaddress.ip_address("127.0.0.1") in sans.get_values_for_type(x509.IPAddress)
        assert ipaddress.ip_address("127.96.0.1") in sans.get_values_for_type(x509.IPAddress)
        assert "kubernetes.default.svc" in sans.get_values_for_type(x509.DNSName)

    def test_service_account_keys_are_a_matching_pair(self, tmp_path: Path) -> None:
        from cryptography.hazmat.primitives import serialization

        private_path, public_path = certs.create_service_account_keys(tmp_path)
        private = serialization.load_pem_private_key(private_path.read_bytes(), password=None)
        public = serialization.load_pem_public_key(public_path.read_bytes())
        assert isinstance(private, ec.EllipticCurvePrivateKey)
        assert private.public_key().public_numbers() == public.public_numbers()  # type: ignore[union-attr]


class TestNamespaceName:
    @pytest.mark.parametrize(
        "test_name", ["test_x", "test_Case[param-1/2]", "a" * 200, "___", "test_ünïcode"]
    )
    def test_is_a_valid_dns_label(self, test_name: str) -> None:
        name = namespace_name(test_name)
        assert len(name) <= 63
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name), name

    def test_is_unique_per_call(self) -> None:
        assert namespace_name("test_x") != namespace_name("test_x")


CONFTEST_WITHOUT_BINARIES = """
from pathlib import Path
import strata.cluster.binaries

strata.cluster.binaries.REPO_ROOT = Path(__file__).parent  # a repo with no bin/
pytest_plugins = ["strata.cluster.pytest_plugin"]
"""


def test_cluster_fixture_fails_rather_than_skips_without_binaries(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST_WITHOUT_BINARIES)
    (tmp_path / "test_needs_cluster.py").write_text("def test_it(cluster):\n    pass\n")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("KUBEBUILDER_ASSETS", "STRATA_BIN_DIR", "STRATA_CLUSTER_DIR")
    }
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1, result.stdout
    assert "1 error" in result.stdout and "skipped" not in result.stdout
    assert "make cluster-bins" in result.stdout
