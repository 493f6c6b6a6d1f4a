"""SASL mechanisms as Kafka uses them, sans IO: PLAIN (RFC 4616) and SCRAM (RFC 5802, RFC 7677).

Both the client (:mod:`oncelog.client.aio.connection`) and the broker
(:mod:`oncelog.broker.sasl`) build on these. Kafka's SCRAM is RFC 5802
without channel binding (the GS2 header must be ``n,,`` or ``n,a=NAME,``)
and without SASLprep (passwords are used as their UTF-8 bytes, as Kafka's
``ScramFormatter`` does); extensions after the nonce in the client-first
message (Kafka's ``tokenauth=true`` for delegation tokens) are parsed and
ignored.

* :func:`plain_message`, :func:`parse_plain`: the PLAIN token.
* :class:`ScramCredential` and :func:`scram_credential`: what a server
  stores (salt, iterations, StoredKey, ServerKey).
* :class:`ScramClient`: ``first()`` -> client-first, ``final(server_first)``
  -> client-final, ``verify(server_final)``.
* :class:`ScramServer`: ``first(client_first, lookup)`` -> server-first,
  ``final(client_final)`` -> server-final; :class:`SaslError` on anything
  wrong (only a :class:`SaslAuthenticationError`'s message is meant for the
  client; a server sends a fixed text for the others, as Kafka).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "SCRAM_MECHANISMS",
    "SaslAuthenticationError",
    "SaslError",
    "ScramClient",
    "ScramCredential",
    "ScramServer",
    "parse_plain",
    "plain_message",
    "scram_credential",
]

# mechanism name -> hashlib name (Kafka's ScramMechanism)
SCRAM_MECHANISMS = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
# Kafka's ScramMechanism minimum iterations (and kafka-configs' default); the Java client refuses a
# server-first message asking for fewer
SCRAM_MIN_ITERATIONS = 4096
# Kafka's ScramMechanism maximum: a Kafka broker never stores a credential with more, so a server asking
# for more is not a Kafka broker; refusing it keeps a forged i=2147483647 from freezing the client in PBKDF2
SCRAM_MAX_ITERATIONS = 16384


class SaslError(Exception):
    """Authentication failed or a SASL message is malformed. A server answers the client with a fixed
    text, not this message (which may say, e.g., that a user does not exist)."""


class SaslAuthenticationError(SaslError):
    """A failure whose message is meant for the client (Kafka's SaslAuthenticationException): it tells
    nothing an unauthenticated peer should not learn."""


# -- PLAIN --------------------------------------------------------------------------


def plain_message(username: str, password: str, authzid: str = "") -> bytes:
    """RFC 4616: ``authzid NUL authcid NUL passwd`` in UTF-8."""
    return f"{authzid}\x00{username}\x00{password}".encode()


def parse_plain(token: bytes) -> tuple[str, str, str]:
    """(authzid, username, password) of a PLAIN token; SaslAuthenticationError when malformed (as Kafka's
    PlainSaslServer, whose messages, the token count included, go to the client)."""
    try:
        text = token.decode("utf-8")
    except UnicodeDecodeError:
        raise SaslAuthenticationError("Authentication failed: invalid SASL/PLAIN response: not UTF-8") from None
    parts = text.split("\x00")
    if len(parts) != 3:
        raise SaslAuthenticationError("Invalid SASL/PLAIN response: expected 3 tokens, got " + str(len(parts)))
    authzid, username, password = parts
    if not username:
        raise SaslAuthenticationError("Authentication failed: username not specified")
    if not password:
        raise SaslAuthenticationError("Authentication failed: password not specified")
    if authzid and authzid != username:
        raise SaslAuthenticationError("Authentication failed: Client requested an authorization id that is "
                                      "different from username")
    return authzid, username, password


# -- SCRAM primitives -------------------------------------------------------------


def _hmac(hash_name: str, key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, hash_name).digest()


def _xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


def salted_password(hash_name: str, password: str, salt: bytes, iterations: int) -> bytes:
    """RFC 5802 ``Hi(password, salt, i)``: PBKDF2 with HMAC of the mechanism's hash."""
    return hashlib.pbkdf2_hmac(hash_name, password.encode("utf-8"), salt, iterations)


def client_key(hash_name: str, salted: bytes) -> bytes:
    return _hmac(hash_name, salted, b"Client Key")


def server_key(hash_name: str, salted: bytes) -> bytes:
    return _hmac(hash_name, salted, b"Server Key")


def stored_key(hash_name: str, ckey: bytes) -> bytes:
    return hashlib.new(hash_name, ckey).digest()


def _escape_name(name: str) -> str:
    """RFC 5802 saslname: ``=`` -> ``=3D``, ``,`` -> ``=2C``."""
    return name.replace("=", "=3D").replace(",", "=2C")


def _unescape_name(name: str) -> str:
    out, i = [], 0
    while i < len(name):
        if name[i] == "=":
            code = name[i + 1 : i + 3]
            if code == "3D":
                out.append("=")
            elif code == "2C":
                out.append(",")
            else:
                raise SaslError("Invalid SCRAM client first message: bad saslname escape")
            i += 3
        else:
            out.append(name[i])
            i += 1
    return "".join(out)


def _attrs(message: str, what: str) -> list[tuple[str, str]]:
    out = []
    for part in message.split(","):
        key, sep, value = part.partition("=")
        if not sep or not key.isalnum():  # one letter; Kafka's extensions (tokenauth=...) are longer
            raise SaslError(f"Invalid SCRAM {what}: {part!r} is not an attribute")
        out.append((key, value))
    return out


def _nonce() -> str:
    # printable ASCII without ',' (RFC 5802): base64 of random bytes, no padding
    return base64.b64encode(os.urandom(24)).decode().rstrip("=")


@dataclass(frozen=True)
class ScramCredential:
    """What a server keeps for one user and mechanism (Kafka's ScramCredential)."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


def scram_credential(mechanism: str, password: str, iterations: int = SCRAM_MIN_ITERATIONS,
                     salt: bytes | None = None) -> ScramCredential:
    hash_name = SCRAM_MECHANISMS[mechanism]
    salt = os.urandom(16) if salt is None else salt
    salted = salted_password(hash_name, password, salt, iterations)
    return ScramCredential(salt, iterations, stored_key(hash_name, client_key(hash_name, salted)),
                           server_key(hash_name, salted))


class ScramClient:
    """The client side of one SCRAM exchange."""

    def __init__(self, mechanism: str, username: str, password: str, nonce: str | None = None) -> None:
        self.hash = SCRAM_MECHANISMS[mechanism]
        self.mechanism = mechanism
        self.username = username
        self.password = password
        self.nonce = nonce or _nonce()
        self._bare = f"n={_escape_name(username)},r={self.nonce}"
        self._server_signature: bytes | None = None

    def first(self) -> bytes:
        return ("n,," + self._bare).encode()

    def final(self, server_first: bytes) -> bytes:
        text = server_first.decode("utf-8", "replace")
        attrs = dict(_attrs(text, "server first message"))
        if "e" in attrs:
            raise SaslError(f"SCRAM server error: {attrs['e']}")
        nonce, salt, iters = attrs.get("r"), attrs.get("s"), attrs.get("i")
        if nonce is None or salt is None or iters is None:
            raise SaslError("Invalid SCRAM server first message: r, s and i are required")
        if not nonce.startswith(self.nonce) or len(nonce) == len(self.nonce):
            raise SaslError("Invalid SCRAM server first message: the server nonce does not extend ours")
        try:
            iterations = int(iters)
            salt_bytes = base64.b64decode(salt, validate=True)
        except ValueError:
            raise SaslError("Invalid SCRAM server first message: bad salt or iteration count") from None
        if not salt_bytes:  # a Kafka broker's salt is random bytes: an empty one is not from a broker
            raise SaslError("Invalid SCRAM server first message: empty salt")
        if iterations < SCRAM_MIN_ITERATIONS:
            raise SaslError(f"Invalid SCRAM server first message: requested iterations {iterations} is less than "
                            f"the minimum {SCRAM_MIN_ITERATIONS} for {self.mechanism}")
        if iterations > SCRAM_MAX_ITERATIONS:
            raise SaslError(f"Invalid SCRAM server first message: requested iterations {iterations} is more than "
                            f"the maximum {SCRAM_MAX_ITERATIONS} for {self.mechanism}")
        salted = salted_password(self.hash, self.password, salt_bytes, iterations)
        ckey = client_key(self.hash, salted)
        without_proof = f"c={base64.b64encode(b'n,,').decode()},r={nonce}"
        auth_message = f"{self._bare},{text},{without_proof}".encode()
        signature = _hmac(self.hash, stored_key(self.hash, ckey), auth_message)
        proof = base64.b64encode(_xor(ckey, signature)).decode()
        self._server_signature = _hmac(self.hash, server_key(self.hash, salted), auth_message)
        return f"{without_proof},p={proof}".encode()

    def verify(self, server_final: bytes) -> None:
        attrs = dict(_attrs(server_final.decode("utf-8", "replace"), "server final message"))
        if "e" in attrs:
            raise SaslError(f"SCRAM server error: {attrs['e']}")
        try:
            got = base64.b64decode(attrs.get("v", ""), validate=True)
        except ValueError:
            got = b""
        if self._server_signature is None or not hmac.compare_digest(got, self._server_signature):
            raise SaslError("Invalid SCRAM server final message: the server signature does not match")


class ScramServer:
    """The server side of one SCRAM exchange (no channel binding, extensions ignored)."""

    def __init__(self, mechanism: str, nonce: str | None = None) -> None:
        self.hash = SCRAM_MECHANISMS[mechanism]
        self.mechanism = mechanism
        self._nonce = nonce
        self.username: str | None = None
        self._credential: ScramCredential | None = None
        self._client_bare = ""
        self._server_first = ""
        self._gs2 = ""
        self.complete = False

    def first(self, client_first: bytes, lookup: Callable[[str], ScramCredential | None]) -> bytes:
        try:
            text = client_first.decode("utf-8")
        except UnicodeDecodeError:
            raise SaslError("Invalid SCRAM client first message: not UTF-8") from None
        # gs2-header: "n," [ "a=" authzid ] "," ; Kafka supports no channel binding ("y"/"p" refused)
        cbind, sep, rest = text.partition(",")
        authz, sep2, bare = rest.partition(",")
        if not sep or not sep2 or cbind != "n":
            raise SaslError("Invalid SCRAM client first message: channel binding is not supported")
        if authz and not authz.startswith("a="):
            raise SaslError("Invalid SCRAM client first message: bad authzid")
        attrs = _attrs(bare, "client first message")
        if len(attrs) < 2 or attrs[0][0] != "n" or attrs[1][0] != "r" or not attrs[1][1]:
            raise SaslError("Invalid SCRAM client first message: n= and r= are required")
        username = _unescape_name(attrs[0][1])
        authzid = _unescape_name(authz[2:]) if authz else ""
        if authzid and authzid != username:
            raise SaslAuthenticationError("Authentication failed: Client requested an authorization id that is "
                                          "different from username")
        # attrs[2:] are extensions (Kafka's tokenauth=true ...): ignored
        self.username = username
        self._credential = lookup(username)
        if self._credential is None:
            # as Kafka: logged with this text, but the client gets the same fixed text as for a wrong password
            raise SaslError("Authentication failed: Invalid user credentials")
        self._client_bare = bare
        self._gs2 = f"{cbind},{authz},"
        nonce = attrs[1][1] + (self._nonce or _nonce())
        salt = base64.b64encode(self._credential.salt).decode()
        self._server_first = f"r={nonce},s={salt},i={self._credential.iterations}"
        self._combined_nonce = nonce
        return self._server_first.encode()

    def final(self, client_final: bytes) -> bytes:
        cred = self._credential
        if cred is None:
            raise SaslError("Invalid SCRAM exchange: client final message before client first message")
        text = client_final.decode("utf-8", "replace")
        head, sep, proof_b64 = text.rpartition(",p=")
        if not sep:
            raise SaslError("Invalid SCRAM client final message: no proof")
        attrs = dict(_attrs(head, "client final message"))
        try:
            cbind = base64.b64decode(attrs.get("c", ""), validate=True).decode("utf-8", "replace")
            proof = base64.b64decode(proof_b64, validate=True)
        except ValueError:
            raise SaslError("Invalid SCRAM client final message: bad base64") from None
        if cbind != self._gs2:
            raise SaslError("Invalid SCRAM client final message: channel binding does not match")
        if attrs.get("r") != self._combined_nonce:
            raise SaslError("Invalid SCRAM client final message: nonce mismatch")
        auth_message = f"{self._client_bare},{self._server_first},{head}".encode()
        signature = _hmac(self.hash, cred.stored_key, auth_message)
        if len(proof) != len(signature):
            raise SaslError("Invalid SCRAM client final message: bad proof length")
        if not hmac.compare_digest(hashlib.new(self.hash, _xor(proof, signature)).digest(), cred.stored_key):
            raise SaslError("Invalid SCRAM client final message: invalid client proof")
        self.complete = True
        server_signature = _hmac(self.hash, cred.server_key, auth_message)
        return ("v=" + base64.b64encode(server_signature).decode()).encode()
