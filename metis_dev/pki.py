"""The throw-away PKI of a local control plane, made with `cryptography`: one CA, the
API server's serving certificate, client certificates (CN the user, O the groups), an RSA
service-account key pair, and kubeconfigs with the certificates inlined."""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CLUSTER_NAME = "metis-test"


@dataclass(frozen=True)
class Pki:
    """Paths of the PKI: one CA signs the serving and client certs."""

    ca_crt: Path
    ca_key: Path
    serving_crt: Path
    serving_key: Path
    sa_key: Path
    sa_pub: Path


def _pem_key(key: Any) -> bytes:
    return bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


def _pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def write(path: Path, data: bytes, mode: int = 0o600) -> Path:
    """Write `data` with `mode`, atomically: a reader never sees half a file (a
    kubeconfig is what `metis-dev cluster up` announces readiness with)."""
    part = path.with_name(f".{path.name}.part")
    part.write_bytes(data)
    part.chmod(mode)
    os.replace(part, path)
    return path


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


class CertAuthority:
    """A one-week CA, like envtest's TinyCA; EC P-256 keys are fast to make."""

    def __init__(self, common_name: str) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=7))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(_key_usage(ca=True), critical=True)
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False
            )
            .sign(self.key, hashes.SHA256())
        )

    def issue(
        self,
        common_name: str,
        *,
        groups: Sequence[str] = (),
        dns: Sequence[str] = (),
        ips: Sequence[str] = (),
        server: bool = False,
    ) -> tuple[bytes, bytes]:
        """A leaf cert (PEM cert, PEM key). Client certs carry the user as CN and
        the groups as O, which is how kube-apiserver's x509 authenticator reads them."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        usages = [ExtendedKeyUsageOID.SERVER_AUTH] if server else [ExtendedKeyUsageOID.CLIENT_AUTH]
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=7))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(ca=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
        )
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        return _pem_cert(cert), _pem_key(key)


def make_pki(folder: Path, service_ips: Sequence[str]) -> tuple[CertAuthority, Pki]:
    """A fresh CA, the API server's serving certificate (loopback and the
    `kubernetes` Service's names and `service_ips`) and the service-account keys."""
    folder.mkdir(parents=True, exist_ok=True)
    ca = CertAuthority("metis-test-ca")
    ca_crt = write(folder / "ca.crt", _pem_cert(ca.cert), 0o644)
    ca_key = write(folder / "ca.key", _pem_key(ca.key))
    crt, key = ca.issue(
        "kube-apiserver",
        dns=["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"],
        ips=["127.0.0.1", *service_ips],
        server=True,
    )
    serving_crt = write(folder / "apiserver.crt", crt, 0o644)
    serving_key = write(folder / "apiserver.key", key)
    # Service-account tokens: RSA, the algorithm every client expects (RS256).
    sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    sa_key = write(folder / "sa.key", _pem_key(sa))
    sa_pub = write(
        folder / "sa.pub",
        sa.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
        0o644,
    )
    return ca, Pki(ca_crt, ca_key, serving_crt, serving_key, sa_key, sa_pub)


def kubeconfig(server: str, ca_crt: bytes, user: str, crt: bytes, key: bytes) -> dict[str, Any]:
    """A kubeconfig for `user` with client-certificate auth, certificates inlined."""

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": CLUSTER_NAME,
                "cluster": {"server": server, "certificate-authority-data": b64(ca_crt)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {"client-certificate-data": b64(crt), "client-key-data": b64(key)},
            }
        ],
        "contexts": [{"name": CLUSTER_NAME, "context": {"cluster": CLUSTER_NAME, "user": user}}],
        "current-context": CLUSTER_NAME,
    }


def write_kubeconfig(path: Path, config: dict[str, Any]) -> Path:
    return write(path, yaml.safe_dump(config, sort_keys=False).encode())
