"""SCRAM and PLAIN (oncelog.protocol.sasl) against the RFC test vectors."""

from __future__ import annotations

import base64

import pytest

from oncelog.protocol.sasl import (
    SaslError,
    ScramClient,
    ScramServer,
    parse_plain,
    plain_message,
    scram_credential,
)

# RFC 7677 section 3 (SCRAM-SHA-256), user "user", password "pencil"
C_NONCE = "rOprNGfwEbeRWgbNEkqO"
S_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
SERVER_FIRST = b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
CLIENT_FINAL = (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def test_rfc7677_client_side() -> None:
    c = ScramClient("SCRAM-SHA-256", "user", "pencil", nonce=C_NONCE)
    assert c.first() == CLIENT_FIRST
    assert c.final(SERVER_FIRST) == CLIENT_FINAL
    c.verify(SERVER_FINAL)  # raises if the server signature were wrong
    with pytest.raises(SaslError):
        c.verify(b"v=" + base64.b64encode(b"\x00" * 32))


def test_rfc7677_server_side() -> None:
    cred = scram_credential("SCRAM-SHA-256", "pencil", iterations=4096, salt=SALT)
    s = ScramServer("SCRAM-SHA-256", nonce=S_NONCE)
    assert s.first(CLIENT_FIRST, {"user": cred}.get) == SERVER_FIRST
    assert s.final(CLIENT_FINAL) == SERVER_FINAL
    assert s.complete and s.username == "user"


def test_server_refuses_wrong_password_unknown_user_and_channel_binding() -> None:
    cred = scram_credential("SCRAM-SHA-256", "not-pencil", iterations=4096, salt=SALT)
    s = ScramServer("SCRAM-SHA-256", nonce=S_NONCE)
    s.first(CLIENT_FIRST, {"user": cred}.get)
    with pytest.raises(SaslError, match="invalid client proof"):
        s.final(CLIENT_FINAL)
    assert not s.complete
    with pytest.raises(SaslError, match="Invalid user credentials"):
        ScramServer("SCRAM-SHA-256").first(CLIENT_FIRST, {}.get)
    with pytest.raises(SaslError, match="channel binding"):
        ScramServer("SCRAM-SHA-256").first(b"p=tls-unique,,n=user,r=abc", {"user": cred}.get)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_client_and_server_agree_with_extensions_and_escaped_names(mechanism: str) -> None:
    name = "a=b,c"
    cred = scram_credential(mechanism, "pw")
    c = ScramClient(mechanism, name, "pw")
    first = c.first() + b",tokenauth=true"  # Kafka's delegation-token extension: ignored
    assert b"n=a=3Db=2Cc," in first
    s = ScramServer(mechanism)
    server_first = s.first(first, {name: cred}.get)
    # the extension is not part of the client's own bare message, so build the final message from a
    # client that sent exactly what the server saw
    c2 = ScramClient(mechanism, name, "pw", nonce=c.nonce)
    c2._bare += ",tokenauth=true"
    server_final = s.final(c2.final(server_first))
    c2.verify(server_final)
    assert s.username == name


def test_plain() -> None:
    assert parse_plain(plain_message("alice", "secret")) == ("", "alice", "secret")
    assert parse_plain(b"alice\x00alice\x00pw") == ("alice", "alice", "pw")
    with pytest.raises(SaslError, match="authorization id"):
        parse_plain(b"bob\x00alice\x00pw")
    with pytest.raises(SaslError, match="password not specified"):
        parse_plain(b"\x00alice\x00")
    with pytest.raises(SaslError):
        parse_plain(b"alice:pw")


@pytest.mark.parametrize("iterations", [1, 4095, 16385, 2147483647])
def test_client_refuses_iteration_counts_outside_kafkas_bounds(iterations: int) -> None:
    # i=1 would make an offline guess of the password from the proof cheap; i=2**31-1 would run
    # PBKDF2 for hours on the client's event loop (a man in the middle can send either)
    c = ScramClient("SCRAM-SHA-256", "user", "pencil", nonce=C_NONCE)
    c.first()
    first = SERVER_FIRST.replace(b"i=4096", b"i=%d" % iterations)
    with pytest.raises(SaslError, match="iterations"):
        c.final(first)


@pytest.mark.parametrize("iterations", [4096, 16384])
def test_client_accepts_kafkas_iteration_bounds(iterations: int) -> None:
    c = ScramClient("SCRAM-SHA-256", "user", "pencil", nonce=C_NONCE)
    c.first()
    assert c.final(SERVER_FIRST.replace(b"i=4096", b"i=%d" % iterations)).startswith(b"c=biws,r=" + C_NONCE.encode())


@pytest.mark.parametrize("salt", [b"", b"not base64!", b"W22ZaJ0SNY7soEsUEjb6gQ="])
def test_client_refuses_an_empty_or_undecodable_salt(salt: bytes) -> None:
    c = ScramClient("SCRAM-SHA-256", "user", "pencil", nonce=C_NONCE)
    c.first()
    with pytest.raises(SaslError, match="salt"):
        c.final(SERVER_FIRST.replace(b"s=W22ZaJ0SNY7soEsUEjb6gQ==", b"s=" + salt))
