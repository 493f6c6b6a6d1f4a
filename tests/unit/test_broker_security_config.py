"""The broker's TLS and SASL settings (oncelog.broker.security) as BrokerConfig reads them."""

from __future__ import annotations

import logging

import pytest

from oncelog.broker.config import BrokerConfig, ConfigError, parse_properties
from oncelog.broker.security import SaslSession, parse_jaas
from oncelog.protocol.sasl import SaslError, ScramClient, plain_message

# the file is read as Java properties: "\\" there is one backslash for the JAAS parser
JAAS_FILE = r"""
listeners=SASL_PLAINTEXT://127.0.0.1:9094
sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256
listener.name.sasl_plaintext.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required \
    username="admin" password="admin-secret" \
    user_admin="admin-secret" \
    user_alice="al\\"ice";
"""


def test_jaas_users_from_continued_lines_and_listener_prefix(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="oncelog.config"):
        cfg = BrokerConfig.from_properties(parse_properties(JAAS_FILE))
    assert (cfg.listener_name, cfg.security_protocol) == ("SASL_PLAINTEXT", "SASL_PLAINTEXT")
    sasl = cfg.security.sasl
    assert sasl.users == {"admin": "admin-secret", "alice": 'al"ice'}
    assert sasl.mechanisms == ("PLAIN", "SCRAM-SHA-256") and set(sasl.scram) == {"SCRAM-SHA-256"}
    assert not [r for r in caplog.records if "unknown config" in r.getMessage()]
    assert cfg.broker_configs()["listeners"] == "SASL_PLAINTEXT://127.0.0.1:9094"


def test_session_plain_and_scram_from_the_same_users() -> None:
    cfg = BrokerConfig.from_properties(parse_properties(JAAS_FILE))
    s = SaslSession(cfg.security.sasl)
    assert s.handshake("PLAIN", 1) == 0
    s.evaluate(plain_message("admin", "admin-secret"))
    assert s.complete and s.principal == "admin"
    s = SaslSession(cfg.security.sasl)
    assert s.handshake("SCRAM-SHA-256", 1) == 0
    c = ScramClient("SCRAM-SHA-256", "alice", 'al"ice')
    c.verify(s.evaluate(c.final(s.evaluate(c.first()))))
    assert s.complete and s.principal == "alice"
    s = SaslSession(cfg.security.sasl)
    assert s.handshake("SCRAM-SHA-512", 1) == 33 and s.close_after_response  # not enabled
    s = SaslSession(cfg.security.sasl)
    s.handshake("PLAIN", 1)
    with pytest.raises(SaslError, match="Invalid username or password"):
        s.evaluate(plain_message("admin", "nope"))
    assert not s.complete and s.close_after_response


@pytest.mark.parametrize("extra,needle", [
    ({"ssl.keystore.type": "JKS", "ssl.keystore.location": "/x.jks"}, "PEM only"),
    ({"ssl.keystore.location": "/x.pem"}, "ssl.keystore.type must be PEM"),
    ({"ssl.keystore.type": "PEM", "ssl.keystore.location": "/x.pem", "ssl.keystore.password": "p"},
     "cannot be set with a PEM key store"),
    ({"ssl.keystore.type": "PEM", "ssl.keystore.key": "-----BEGIN PRIVATE KEY----- AAAA -----END PRIVATE KEY-----"},
     "ssl.keystore.certificate.chain is required"),
    ({"ssl.keystore.type": "PEM", "ssl.keystore.location": "/x.pem", "ssl.client.auth": "always"},
     "required, requested, none"),
])
def test_bad_tls_settings(extra: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        BrokerConfig.from_properties({"listeners": "SSL://127.0.0.1:9093", **extra})


@pytest.mark.parametrize("extra,needle", [
    ({"sasl.enabled.mechanisms": "GSSAPI"}, "GSSAPI not supported"),
    ({"sasl.enabled.mechanisms": "PLAIN", "listener.name.sasl_plaintext.plain.sasl.jaas.config":
      'org.apache.kafka.common.security.scram.ScramLoginModule required user_a="b";'}, "must be org.apache"),
    ({"sasl.enabled.mechanisms": "PLAIN", "listener.name.sasl_plaintext.plain.sasl.jaas.config":
      'org.apache.kafka.common.security.plain.PlainLoginModule required username="a" password="b";'},
     "no user_NAME"),
    ({"sasl.enabled.mechanisms": "PLAIN", "listener.name.sasl_plaintext.plain.sasl.jaas.config":
      'org.apache.kafka.common.security.plain.PlainLoginModule required user_a="b"'}, "one JAAS entry"),
])
def test_bad_sasl_settings(extra: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        BrokerConfig.from_properties({"listeners": "SASL_PLAINTEXT://127.0.0.1:9094", **extra})


def test_listen_override_keeps_the_listener_name_unless_it_names_one() -> None:
    props = parse_properties(JAAS_FILE)
    cfg = BrokerConfig.from_properties(props, host="127.0.0.1", port=1234, listener_name=None)
    assert (cfg.security_protocol, cfg.port) == ("SASL_PLAINTEXT", 1234)
    cfg = BrokerConfig.from_properties(props, listener_name="PLAINTEXT")
    assert cfg.security_protocol == "PLAINTEXT" and cfg.security is None


def test_parse_jaas_options() -> None:
    module, options = parse_jaas('M required a="x y" b=plain c="q\\"d";', "k")
    assert module == "M" and options == {"a": "x y", "b": "plain", "c": 'q"d'}


def _authenticate_answer(session: SaslSession, token: bytes) -> tuple[int, str | None]:
    import asyncio
    from types import SimpleNamespace

    from oncelog.broker.handlers import sasl_authenticate

    broker = SimpleNamespace(config=SimpleNamespace(connection_failed_authentication_delay_ms=0))
    resp = asyncio.run(sasl_authenticate.handle(SimpleNamespace(auth=session, broker=broker),  # type: ignore[arg-type]
                                                SimpleNamespace(auth_bytes=token)))
    return resp["error_code"], resp["error_message"]


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256"])  # the JAAS_FILE listener enables this one
def test_scram_unknown_user_and_wrong_password_get_the_same_answer(mechanism: str) -> None:
    cfg = BrokerConfig.from_properties(parse_properties(JAAS_FILE))
    # unknown user: refused at the client-first message
    s = SaslSession(cfg.security.sasl)
    s.handshake(mechanism, 1)
    unknown = _authenticate_answer(s, ScramClient(mechanism, "mallory", "x").first())
    # known user, wrong password: refused at the client-final message
    s = SaslSession(cfg.security.sasl)
    s.handshake(mechanism, 1)
    c = ScramClient(mechanism, "alice", "wrong")
    wrong = _authenticate_answer(s, c.final(s.evaluate(c.first())))
    expected = (58, f"Authentication failed during authentication due to invalid credentials with SASL mechanism "
                    f"{mechanism}")
    assert unknown == wrong == expected
    # the authorization id mismatch is the one SCRAM failure Kafka explains to the client
    s = SaslSession(cfg.security.sasl)
    s.handshake(mechanism, 1)
    code, message = _authenticate_answer(s, b"n,a=admin," + ScramClient(mechanism, "alice", "x").first()[3:])
    assert code == 58 and message is not None and "authorization id" in message


def test_plain_failures_are_explained_as_kafkas_plain_server_does() -> None:
    # PlainSaslServer throws SaslAuthenticationException for each of these: its message reaches the client
    cfg = BrokerConfig.from_properties(parse_properties(JAAS_FILE))
    for token, text in ((b"alice:pw", "Invalid SASL/PLAIN response: expected 3 tokens, got 1"),
                        (b"\x00alice\x00", "Authentication failed: password not specified"),
                        (plain_message("alice", "wrong"), "Authentication failed: Invalid username or password"),
                        (plain_message("mallory", "x"), "Authentication failed: Invalid username or password")):
        s = SaslSession(cfg.security.sasl)
        s.handshake("PLAIN", 1)
        assert _authenticate_answer(s, token) == (58, text)
