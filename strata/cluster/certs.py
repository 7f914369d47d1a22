"""A throwaway PKI for one test cluster: CA, apiserver serving cert, client certs, SA signing keys.

Real certificates, because RBAC decisions hang on the client certificate's subject (CN is the
user, O are the groups) and the operator must be tested as a real, non-admin identity.
EC P-256 keys keep generation in the milliseconds.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=30)
# The in-cluster names clients use for the apiserver, plus loopback for everything out of cluster.
APISERVER_DNS_NAMES = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)


FRONT_PROXY_CLIENT = "front-proxy-client"
# The API server's identity towards kubelets (kubeadm's name); the pod runtime serves it alone.
KUBELET_CLIENT = "kube-apiserver-kubelet-client"
KUBELET_SERVING = "kubelet"


@dataclass(frozen=True)
class CertPair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Pki:
    """Paths of every file the control plane reads; the CA key stays around to sign more clients."""

    ca: CertPair
    apiserver: CertPair
    service_account_key: Path
    service_account_pub: Path


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    path.write_bytes(pem)
    path.chmod(0o600)


def _write_cert(cert: x509.Certificate, path: Path) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _name(common_name: str, organizations: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    return x509.Name([*attrs, x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
    )


def create_ca(directory: Path, stem: str = "ca") -> CertPair:
    key = _new_key()
    name = _name(f"strata-test-{stem}")
    cert = (
        _builder(name, name, key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    pair = CertPair(directory / f"{stem}.crt", directory / f"{stem}.key")
    _write_cert(cert, pair.cert)
    _write_key(key, pair.key)
    return pair


def _load_ca(ca: CertPair) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise TypeError(f"{ca.key}: expected an EC private key, got {type(key).__name__}")
    return cert, key


def _issue(
    ca: CertPair,
    subject: x509.Name,
    usage: x509.ObjectIdentifier,
    sans: list[x509.GeneralName],
    out: CertPair,
) -> CertPair:
    ca_cert, ca_key = _load_ca(ca)
    key = _new_key()
    out.cert.parent.mkdir(parents=True, exist_ok=True)
    builder = (
        _builder(subject, ca_cert.subject, key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    _write_cert(builder.sign(ca_key, hashes.SHA256()), out.cert)
    _write_key(key, out.key)
    return out


def issue_serving_cert(ca: CertPair, directory: Path, name: str, service_ip: str) -> CertPair:
    """A server certificate valid for loopback, the in-cluster service names and the service IP."""
    sans: list[x509.GeneralName] = [x509.DNSName(dns) for dns in APISERVER_DNS_NAMES]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ("127.0.0.1", service_ip)]
    out = CertPair(directory / f"{name}.crt", directory / f"{name}.key")
    return _issue(ca, _name(name), ExtendedKeyUsageOID.SERVER_AUTH, sans, out)


def issue_client_cert(
    ca: CertPair, directory: Path, user: str, groups: tuple[str, ...] = (), stem: str | None = None
) -> CertPair:
    """A client certificate the apiserver maps to ``user`` in ``groups`` (CN and O)."""
    stem = stem or user.replace(":", "_").replace("/", "_")
    out = CertPair(directory / f"{stem}.crt", directory / f"{stem}.key")
    return _issue(ca, _name(user, groups), ExtendedKeyUsageOID.CLIENT_AUTH, [], out)


def create_service_account_keys(directory: Path) -> tuple[Path, Path]:
    """The key pair that signs and verifies ServiceAccount tokens (private, public)."""
    key = _new_key()
    private, public = directory / "sa.key", directory / "sa.pub"
    _write_key(key, private)
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return private, public


def create_pki(directory: Path, service_ip: str) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca = create_ca(directory)
    apiserver = issue_serving_cert(ca, directory, "apiserver", service_ip)
    sa_key, sa_pub = create_service_account_keys(directory)
    # The aggregation layer's own CA: the apiserver proves itself to extension apiservers with the
    # front-proxy client cert, and components trust X-Remote-User headers only from that CA.
    front_proxy_ca = create_ca(directory, "front-proxy-ca")
    issue_client_cert(front_proxy_ca, directory, FRONT_PROXY_CLIENT)
    # Node logs: the API server dials the pod runtime's kubelet endpoint at the node's loopback
    # InternalIP and checks its certificate for that IP; the runtime checks the API server's.
    issue_serving_cert(ca, directory, KUBELET_SERVING, "127.0.0.1")
    issue_client_cert(ca, directory, KUBELET_CLIENT, ("system:masters",))
    return Pki(ca=ca, apiserver=apiserver, service_account_key=sa_key, service_account_pub=sa_pub)
