"""Test certificates made on the spot with `cryptography`: a CA, a server certificate for
127.0.0.1/localhost, a client certificate, and a second ("rogue") CA with its own client.

    pki = make_pki(tmp_path)
    SecurityConfig(tls_cert=pki.server_cert, tls_key=pki.server_key, tls_client_ca=pki.ca_cert)
    Client(address, ca=pki.ca_cert, cert=pki.client_cert, key=pki.client_key)
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


@dataclass(frozen=True)
class Pki:
    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    rogue_ca_cert: Path  # another CA: nothing of the server trusts it
    rogue_client_cert: Path  # signed by the rogue CA
    rogue_client_key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())  # fast to make, and every TLS stack takes it


def _certificate(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None,
    *,
    ca: bool = False,
    server: bool = False,
    client: bool = False,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    issuer_name = issuer[0].subject if issuer else _name(subject)
    signing_key = issuer[1] if issuer else key
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    if issuer:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer[1].public_key()),
            critical=False,
        )
    if ca:
        builder = builder.add_extension(
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
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        ).add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    if client:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
    return builder.sign(signing_key, hashes.SHA256())


def _write(
    directory: Path, name: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> tuple[Path, Path]:
    cert_path, key_path = directory / f"{name}.pem", directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_path.chmod(0o600)
    return cert_path, key_path


def make_pki(directory: Path) -> Pki:
    """Write every certificate and key as PEM files under `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, rogue_key = _key(), _key()
    ca = _certificate("textserve test CA", ca_key, None, ca=True)
    rogue = _certificate("rogue CA", rogue_key, None, ca=True)
    server_key, client_key, rogue_client_key = _key(), _key(), _key()
    server = _certificate("127.0.0.1", server_key, (ca, ca_key), server=True)
    client = _certificate("test client", client_key, (ca, ca_key), client=True)
    rogue_client = _certificate("rogue client", rogue_client_key, (rogue, rogue_key), client=True)
    ca_path, _ = _write(directory, "ca", ca, ca_key)
    rogue_ca_path, _ = _write(directory, "rogue-ca", rogue, rogue_key)
    server_cert, server_key_path = _write(directory, "server", server, server_key)
    client_cert, client_key_path = _write(directory, "client", client, client_key)
    rogue_cert, rogue_key_path = _write(directory, "rogue-client", rogue_client, rogue_client_key)
    return Pki(
        ca_cert=ca_path,
        server_cert=server_cert,
        server_key=server_key_path,
        client_cert=client_cert,
        client_key=client_key_path,
        rogue_ca_cert=rogue_ca_path,
        rogue_client_cert=rogue_cert,
        rogue_client_key=rogue_key_path,
    )


@dataclass(frozen=True)
class ChainPki:
    """A root CA, an intermediate CA under it, and leaves signed by the intermediate; the
    *_chain files hold the leaf then the intermediate, as a CA delivers them."""

    root_cert: Path  # the only certificate either side trusts
    server_chain: Path
    server_leaf: Path  # the server's certificate alone: unverifiable without the intermediate
    server_key: Path
    client_chain: Path
    client_key: Path


def make_chain_pki(directory: Path) -> ChainPki:
    """Write a root -> intermediate -> leaf PKI as PEM files under `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    root_key, intermediate_key = _key(), _key()
    root = _certificate("textserve test root CA", root_key, None, ca=True)
    intermediate = _certificate(
        "textserve test intermediate CA", intermediate_key, (root, root_key), ca=True
    )
    root_path, _ = _write(directory, "root-ca", root, root_key)
    pem = serialization.Encoding.PEM
    leaves = {}
    for name, options in (("server", {"server": True}), ("client", {"client": True})):
        key = _key()
        leaf = _certificate(f"chain {name}", key, (intermediate, intermediate_key), **options)
        leaf_path, key_path = _write(directory, f"{name}-leaf", leaf, key)
        chain_path = directory / f"{name}-chain.pem"
        chain_path.write_bytes(leaf.public_bytes(pem) + intermediate.public_bytes(pem))
        leaves[name] = (leaf_path, chain_path, key_path)
    return ChainPki(
        root_cert=root_path,
        server_chain=leaves["server"][1],
        server_leaf=leaves["server"][0],
        server_key=leaves["server"][2],
        client_chain=leaves["client"][1],
        client_key=leaves["client"][2],
    )
