"""Certificates and keys of the local control plane, made with the `cryptography` package.

One self-signed CA signs every serving and client certificate. Kubernetes takes a client
certificate's CN as the user name and its O entries as groups. EC P-256 keys throughout: fast to
generate, and accepted by kube-apiserver for TLS and for service-account token signing (ES256).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Long enough for any session; the processes themselves live at most a few hours.
VALIDITY = datetime.timedelta(days=30)
# Tolerates a clock that is a little behind the one that signed.
BACKDATE = datetime.timedelta(hours=1)


@dataclass(frozen=True)
class CertPair:
    """PEM files of a certificate and its private key."""

    cert: Path
    key: Path


def _write_private(path: Path, data: bytes) -> None:
    # Private keys are created 0600 from the start rather than chmod-ed after being written.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _load_key(path: Path) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{path}: expected an EC private key")
    return key


def _builder(subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey, *,
             ca: bool) -> x509.CertificateBuilder:
    """What every certificate here has: the validity window, basic constraints and key usage (a CA's signs
    certificates and CRLs, the others' only digital signatures)."""
    now = datetime.datetime.now(datetime.UTC)
    usage = x509.KeyUsage(
        digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
        key_agreement=False, key_cert_sign=ca, crl_sign=ca, encipher_only=False, decipher_only=False,
    )
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(usage, critical=True)
    )


def _write(pair: CertPair, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> CertPair:
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_private(pair.key, _key_pem(key))
    return pair


def make_ca(directory: Path, common_name: str = "neuron-dra-local-ca") -> CertPair:
    """A self-signed CA in `directory/ca.{crt,key}`."""
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        _builder(name, name, key, ca=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return _write(CertPair(directory / "ca.crt", directory / "ca.key"), cert, key)


def issue(
    ca: CertPair,
    directory: Path,
    name: str,
    *,
    common_name: str,
    organizations: Sequence[str] = (),
    client: bool = False,
    server: bool = False,
    dns_names: Sequence[str] = (),
    ip_addresses: Sequence[str] = (),
) -> CertPair:
    """A certificate signed by `ca` in `directory/<name>.{crt,key}`, for client and/or server auth."""
    if not (client or server):
        raise ValueError(f"certificate {name!r}: ask for client and/or server usage")
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = _load_key(ca.key)
    ca_cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    usages = ([ExtendedKeyUsageOID.CLIENT_AUTH] if client else []) + (
        [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
    )
    builder = (
        _builder(x509.Name(attrs), ca_cert.subject, key, ca=False)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return _write(CertPair(directory / f"{name}.crt", directory / f"{name}.key"), cert, key)


def make_signing_key(directory: Path, name: str = "sa") -> CertPair:
    """A key pair for signing service-account tokens: `<name>.key` (private) and `<name>.pub`."""
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    pair = CertPair(directory / f"{name}.pub", directory / f"{name}.key")
    pair.cert.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    _write_private(pair.key, _key_pem(key))
    return pair
