"""TLS certificates and SuperNode keys for a Flower federation, made with ``cryptography``.

A deployment across machines serves TLS with certificates signed by a CA of the
federation's own (:func:`make_certificates`) and authenticates its SuperNodes, each holding
an ECDSA key pair whose public half the operator registered (:func:`make_node_key`); see
:mod:`fednovelty.runtime.flower.deploy` for the commands that use them. Files are written
once (an existing file is never overwritten) and private keys are created owner-only.
``cryptography`` is a dependency of ``flwr``; it is imported on first use.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

#: names the SuperLink's certificate is valid for in a loopback deployment.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost")


@dataclass(frozen=True)
class Certificates:
    """PEM files for the SuperLink's TLS: the CA certificate every client trusts
    (``--root-certificates``, ``root-certificates``), and the SuperLink's certificate and
    private key, signed by that CA (``--ssl-certfile``, ``--ssl-keyfile``)."""

    ca_certfile: Path
    certfile: Path
    keyfile: Path

    def superlink_args(self) -> list[str]:
        """The ``flower-superlink`` options that serve with these files."""
        return [
            "--ssl-ca-certfile",
            str(self.ca_certfile),
            "--ssl-certfile",
            str(self.certfile),
            "--ssl-keyfile",
            str(self.keyfile),
        ]


@dataclass(frozen=True)
class NodeKey:
    """A SuperNode's ECDSA key pair in OpenSSH format (as ``ssh-keygen -t ecdsa -b 384``):
    the node keeps ``private_key`` (``--auth-supernode-private-key``), the operator registers
    ``public_key`` (``flwr supernode register``)."""

    private_key: Path
    public_key: Path


def make_certificates(
    folder: str | os.PathLike,
    hosts: Sequence[str] = LOOPBACK_HOSTS,
    *,
    days: int = 30,
) -> Certificates:
    """A new CA and a SuperLink certificate it signs for ``hosts``, written to ``folder``.

    Writes ``ca.pem`` (CA certificate), ``ca.key``, ``server.pem`` and ``server.key``; the
    keys are ECDSA P-384, readable by the owner only. IP addresses in ``hosts`` become IP
    subject alternative names, other entries DNS names. For a deployment across machines
    list the names and addresses the nodes dial and ``127.0.0.1`` (the SuperLink's own
    ServerApp process connects there), and keep ``ca.key`` off the SuperLink.

    Raises:
        ValueError: ``hosts`` is empty or a single string, or ``days`` < 1.
        FileExistsError: one of the four files exists already (nothing is overwritten).
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if isinstance(hosts, str) or not hosts:
        raise ValueError(
            f"hosts: expected a list of the SuperLink's names and IP addresses, got {hosts!r}."
        )
    if days < 1:
        raise ValueError(f"days: expected a validity of at least 1 day, got {days}.")
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    _refuse_existing([out / f for f in ("ca.pem", "ca.key", "server.pem", "server.key")])
    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)

    def name(common_name: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])

    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(name("fednovelty federation CA"))
        .issuer_name(name("fednovelty federation CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .sign(ca_key, hashes.SHA384())
    )
    server_key = ec.generate_private_key(ec.SECP384R1())
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(name(hosts[0]))
        .issuer_name(ca_cert.subject)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(_alt_names(hosts)), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA384())
    )
    certificates = Certificates(out / "ca.pem", out / "server.pem", out / "server.key")
    _write_pem(certificates.ca_certfile, _cert_pem(ca_cert))
    _write_pem(out / "ca.key", _private_pem(ca_key, openssh=False), private=True)
    _write_pem(certificates.certfile, _cert_pem(server_cert))
    _write_pem(certificates.keyfile, _private_pem(server_key, openssh=False), private=True)
    return certificates


def make_node_key(folder: str | os.PathLike, name: str) -> NodeKey:
    """A SuperNode's ECDSA P-384 key pair, ``folder/name.key`` and ``folder/name.pub``.

    The same files as ``ssh-keygen -t ecdsa -b 384 -N "" -f folder/name`` (``.pub`` named
    ``name.pub``): OpenSSH private key (owner-only), OpenSSH public key line.

    Raises:
        FileExistsError: either file exists already (nothing is overwritten).
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    node_key = NodeKey(out / f"{name}.key", out / f"{name}.pub")
    _refuse_existing([node_key.private_key, node_key.public_key])
    _write_pem(node_key.private_key, _private_pem(key, openssh=True), private=True)
    _write_pem(node_key.public_key, public + b"\n")
    return node_key


def _key_usage(*, cert_sign: bool):
    from cryptography import x509

    return x509.KeyUsage(
        digital_signature=not cert_sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _alt_names(hosts: Sequence[str]) -> list:
    from cryptography import x509

    names = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def _cert_pem(cert) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return cert.public_bytes(serialization.Encoding.PEM)


def _private_pem(key, *, openssh: bool) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH if openssh else serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _refuse_existing(paths: Sequence[Path]) -> None:
    """``FileExistsError`` naming the first of ``paths`` that exists."""
    for path in paths:
        if path.exists():
            raise FileExistsError(
                f"{path} exists: certificates and keys are never overwritten; choose an "
                "empty folder or another name, or remove the old files."
            )


def _write_pem(path: Path, data: bytes, *, private: bool = False) -> None:
    """Write ``data`` to a new file (``FileExistsError`` if ``path`` exists); a private key
    is created owner-only (0600) before any byte lands."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as file:
        file.write(data)
