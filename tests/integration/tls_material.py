"""Throwaway PEM key material for the TLS tests, made with the ``cryptography`` package.

``make_pki(directory)`` writes a CA, a broker certificate for ``localhost`` and
``127.0.0.1`` (and one for ``localhost`` only), and a client certificate,
each key in its own file and the broker's key and chain also together (the
``ssl.keystore.location`` form). EC P-256 keys: cheap to make.
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
    ca: Path  # CA certificate
    broker_keystore: Path  # broker key + certificate chain, SAN localhost and 127.0.0.1
    broker_cert: Path
    broker_key: Path
    localhost_keystore: Path  # broker key + chain whose certificate names only DNS:localhost
    client_cert: Path
    client_key: Path
    client_key_encrypted: Path  # the client key, encrypted with KEY_PASSWORD
    other_ca: Path  # a CA that signed nothing here


KEY_PASSWORD = "client-key-secret"


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _pem_key(key: ec.EllipticCurvePrivateKey, password: str | None = None) -> bytes:
    enc = (serialization.BestAvailableEncryption(password.encode()) if password
           else serialization.NoEncryption())
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc)


def _cert(subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name, issuer_key: ec.EllipticCurvePrivateKey,
          *, ca: bool = False, san: list[x509.GeneralName] | None = None, usage: list | None = None) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    b = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(issuer).public_key(key.public_key())
         .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
         .not_valid_after(now + datetime.timedelta(days=2))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        b = b.add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                          content_commitment=False, key_encipherment=False, data_encipherment=False,
                                          key_agreement=False, encipher_only=False, decipher_only=False),
                            critical=True)
        b = b.add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    else:
        b = b.add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False)
    if san:
        b = b.add_extension(x509.SubjectAlternativeName(san), critical=False)
    if usage:
        b = b.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    return b.sign(issuer_key, hashes.SHA256())


def make_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    curve = ec.SECP256R1()
    ca_key = ec.generate_private_key(curve)
    ca = _cert("oncelog test CA", ca_key, _name("oncelog test CA"), ca_key, ca=True)
    other_key = ec.generate_private_key(curve)
    other = _cert("another CA", other_key, _name("another CA"), other_key, ca=True)

    def pem(cert: x509.Certificate) -> bytes:
        return cert.public_bytes(serialization.Encoding.PEM)

    def write(name: str, data: bytes) -> Path:
        path = directory / name
        path.write_bytes(data)
        path.chmod(0o600)
        return path

    broker_key = ec.generate_private_key(curve)
    broker = _cert("localhost", broker_key, ca.subject, ca_key,
                   san=[x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
                   usage=[ExtendedKeyUsageOID.SERVER_AUTH])
    local_key = ec.generate_private_key(curve)
    local = _cert("localhost", local_key, ca.subject, ca_key, san=[x509.DNSName("localhost")],
                  usage=[ExtendedKeyUsageOID.SERVER_AUTH])
    client_key = ec.generate_private_key(curve)
    client = _cert("client", client_key, ca.subject, ca_key, usage=[ExtendedKeyUsageOID.CLIENT_AUTH])
    return Pki(
        ca=write("ca.pem", pem(ca)),
        broker_keystore=write("broker-keystore.pem", _pem_key(broker_key) + pem(broker) + pem(ca)),
        broker_cert=write("broker-chain.pem", pem(broker) + pem(ca)),
        broker_key=write("broker-key.pem", _pem_key(broker_key)),
        localhost_keystore=write("localhost-keystore.pem", _pem_key(local_key) + pem(local) + pem(ca)),
        client_cert=write("client.pem", pem(client)),
        client_key=write("client-key.pem", _pem_key(client_key)),
        client_key_encrypted=write("client-key-enc.pem", _pem_key(client_key, KEY_PASSWORD)),
        other_ca=write("other-ca.pem", pem(other)),
    )
