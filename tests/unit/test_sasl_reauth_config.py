"""connections.max.reauth.ms (KIP-368) as the broker reads it, and the SASL session's lifetime rules."""

from __future__ import annotations

import logging

import pytest

from oncelog.broker.config import BrokerConfig, ConfigError
from oncelog.broker.security import SaslSession
from oncelog.protocol.sasl import SaslAuthenticationError, plain_message

BASE = {"listeners": "SASL_PLAINTEXT://127.0.0.1:9094", "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config":
            'org.apache.kafka.common.security.plain.PlainLoginModule required user_alice="a" user_bob="b";'}


@pytest.mark.parametrize("extra, plain, scram", [
    ({}, 0, 0),
    ({"connections.max.reauth.ms": "60000"}, 60000, 60000),
    ({"connections.max.reauth.ms": "60000", "listener.name.sasl_plaintext.connections.max.reauth.ms": "3000"},
     3000, 3000),
    ({"listener.name.sasl_plaintext.connections.max.reauth.ms": "3000",
      "listener.name.sasl_plaintext.scram-sha-256.connections.max.reauth.ms": "1000"}, 3000, 1000),
])
def test_lifetime_per_mechanism_most_specific_key_wins(extra: dict[str, str], plain: int, scram: int,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        cfg = BrokerConfig.from_properties({**BASE, **extra})
    assert cfg.security.sasl.max_reauth_ms == {"PLAIN": plain, "SCRAM-SHA-256": scram}
    assert not [r for r in caplog.records if "unknown config" in r.getMessage()]
    assert cfg.broker_configs()["connections.max.reauth.ms"] == extra.get("connections.max.reauth.ms", "0")


def test_bad_value_is_one_line() -> None:
    with pytest.raises(ConfigError, match=r"invalid value 'soon' for listener\.name\.sasl_plaintext\.plain\."
                                          r"connections\.max\.reauth\.ms: expected an integer"):
        BrokerConfig.from_properties({**BASE, "listener.name.sasl_plaintext.plain.connections.max.reauth.ms": "soon"})


def _session(lifetime: int) -> SaslSession:
    cfg = BrokerConfig.from_properties({**BASE, "connections.max.reauth.ms": str(lifetime)})
    s = SaslSession(cfg.security.sasl)
    assert s.handshake("PLAIN", 1) == 0
    s.evaluate(plain_message("alice", "a"))
    return s


def test_session_expiry_and_the_one_second_rule() -> None:
    s = _session(2000)
    assert s.complete and s.session_lifetime_ms == 2000 and s.expires_at is not None
    assert not s.expired(s.expires_at - 0.01) and s.expired(s.expires_at + 0.01)
    assert s.arm_reauthentication(100.0)
    assert not _session(0).arm_reauthentication(100.0)  # no lifetime, no re-authentication
    s.begin_reauthentication()
    assert not s.complete and s.handshake("PLAIN", 1) == 0
    s.evaluate(plain_message("alice", "a"))
    assert s.complete and not s.reauthenticating
    assert not s.arm_reauthentication(100.9)  # within a second of the previous start
    assert s.arm_reauthentication(101.0)


def test_reauthentication_keeps_the_principal() -> None:
    s = _session(2000)
    assert s.arm_reauthentication(1.0)
    s.begin_reauthentication()
    s.handshake("PLAIN", 1)
    with pytest.raises(SaslAuthenticationError, match="Cannot change principals during re-authentication from "
                                                      "User.alice: User.bob"):
        s.evaluate(plain_message("bob", "b"))
    assert s.close_after_response and not s.complete
