"""SASL/OAUTHBEARER sans IO: Kafka's unsecured JWS validator, the RFC 7628 initial response, both sides of
the exchange, the broker's SaslSession (session lifetime bounded by the token) and configuration on both
sides (oncelog.protocol.oauthbearer, oncelog.broker.security, oncelog.client.oauthbearer)."""

from __future__ import annotations

import base64
import concurrent.futures
import json
import threading
import time
from typing import Any

import pytest

from oncelog.broker.config import BrokerConfig, ConfigError
from oncelog.broker.security import SaslSession
from oncelog.client.config import ConfigError as ClientConfigError
from oncelog.client.config import parse_config
from oncelog.client.oauthbearer import TokenError, TokenSource, parse_unsecured_config
from oncelog.protocol.oauthbearer import (
    OAuthBearerClient,
    OAuthBearerServer,
    TokenValidationError,
    UnsecuredValidator,
    b64url_decode,
    client_initial_response,
    parse_client_initial_response,
    parse_unsecured_jws,
    unsecured_jws,
)
from oncelog.protocol.sasl import SaslAuthenticationError, SaslError

NOW_MS = 1_700_000_000_000
NOW = NOW_MS / 1000


def _b64(obj: Any) -> str:
    raw = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _jws(claims: dict[str, Any], header: dict[str, Any] | None = None, signature: str = "") -> str:
    return f"{_b64(header or {'alg': 'none'})}.{_b64(claims)}.{signature}"


GOOD = {"sub": "alice", "iat": NOW - 10, "exp": NOW + 60}


# -- the unsecured JWS and Kafka's validator ------------------------------------------------------------


def test_valid_token_gives_principal_expiry_and_scope() -> None:
    token = UnsecuredValidator().validate(_jws({**GOOD, "scope": ["read", " write ", ""]}), NOW_MS)
    assert token.principal == "alice"
    assert token.lifetime_ms == round((NOW + 60) * 1000) and token.start_ms == round((NOW - 10) * 1000)
    assert token.scope == {"read", "write"}


@pytest.mark.parametrize("claims,header,signature,reason", [
    ({**GOOD, "exp": NOW - 1}, None, "", "on or after the Expiration Time"),
    ({**GOOD, "exp": NOW}, None, "", "on or after the Expiration Time"),  # exp == now is expired
    ({"iat": NOW, "exp": NOW + 60}, None, "", "No principal name in JWT claim: sub"),
    ({**GOOD, "sub": "  "}, None, "", "No principal name in JWT claim: sub"),
    ({**GOOD, "sub": 42}, None, "", "'sub' claim was not of type String"),
    ({"sub": "alice"}, None, "", "No expiration time in JWT"),
    ({**GOOD, "exp": "soon"}, None, "", "'exp' claim was not of type Number"),
    (GOOD, {"alg": "HS256"}, "", "must have 'none' for an algorithm"),
    (GOOD, {"typ": "JWT"}, "", "must have an Algorithm value"),
    (GOOD, None, "c2ln", "must not contain a digital signature"),
    ({**GOOD, "iat": NOW + 5}, None, "", "Issued At value"),
    ({**GOOD, "iat": NOW + 70}, None, "", "Issued At value"),
])
def test_invalid_tokens_are_refused_with_kafkas_reason(claims: dict[str, Any], header: dict[str, Any] | None,
                                                        signature: str, reason: str) -> None:
    with pytest.raises(TokenValidationError, match=reason) as refused:
        UnsecuredValidator().validate(_jws(claims, header, signature), NOW_MS)
    assert refused.value.scope is None


@pytest.mark.parametrize("token,reason", [
    ("garbage", "3 dot-separated"),
    ("a.b", "3 dot-separated"),
    ("a..b", "contains '..'"),
    ("a.b.c.d", "3 dot-separated"),
    ("!!!.e30.", "malformed Base64"),
    (f"{_b64(b'not json')}.{_b64(GOOD)}.", "malformed JSON"),
    (f"{_b64({'alg': 'none'})}.{_b64(b'[1, 2')}.", "malformed JSON"),
])
def test_garbage_is_refused(token: str, reason: str) -> None:
    with pytest.raises(TokenValidationError, match=reason):
        UnsecuredValidator().validate(token, NOW_MS)


def _raw_jws(claims: bytes) -> str:
    return f"{_b64({'alg': 'none'})}.{_b64(claims)}."


@pytest.mark.parametrize("claims,reason", [
    (b'{"sub":"a","exp":NaN}', "malformed JSON"),  # not JSON (Jackson refuses it too)
    (b'{"sub":"a","exp":Infinity}', "malformed JSON"),
    (b'{"sub":"a","exp":1e999,"iat":-Infinity}', "malformed JSON"),
    (b'{"sub":"a","exp":1e400}', "'exp' claim was not a finite number"),  # a double's Infinity
    (b'{"sub":"a","exp":9999999999,"iat":-1e400}', "'iat' claim was not a finite number"),
    (b'{"sub":"a","exp":1' + b"0" * 400 + b"}", "'exp' claim was not a finite number"),  # too large for a double
    (b'{"sub":"a","exp":9999999999,"x":' + b"[" * 50000 + b"]" * 50000 + b"}", "malformed JSON"),  # too deep
])
def test_crafted_numbers_and_nesting_are_refused_not_crashed(claims: bytes, reason: str) -> None:
    with pytest.raises(TokenValidationError, match=reason):
        UnsecuredValidator().validate(_raw_jws(claims), NOW_MS)


@pytest.mark.parametrize("exp", ["1e20", "1e300", "1.7e308"])  # 1.7e308 * 1000 is inf in a double
def test_huge_finite_expiry_saturates_at_a_long(exp: str) -> None:
    token = UnsecuredValidator().validate(_raw_jws(b'{"sub":"a","iat":1,"exp":' + exp.encode() + b"}"), NOW_MS)
    assert token.lifetime_ms == 2**63 - 1 and token.start_ms == 1000


def test_session_lifetime_of_a_huge_expiry_fits_the_response() -> None:
    """A token valid until 1e20 s: the session lifetime is capped to what SaslAuthenticate can carry and the
    answer encodes (it crashed the encoder: timedelta overflow)."""
    from oncelog.protocol.build import materialize
    from oncelog.protocol.codec import encode_response, response_type

    s = SaslSession(_broker().security.sasl)
    s.handshake("OAUTHBEARER", 1)
    assert s.evaluate(client_initial_response(_raw_jws(b'{"sub":"a","exp":1e20}'))) == b""
    assert s.complete and 10**16 < s.session_lifetime_ms <= 2**63 - 1
    assert not s.expired(time.monotonic() + 10 * 365 * 86400)
    answer = {"error_code": 0, "error_message": None, "auth_bytes": b"", "session_lifetime": s.session_lifetime_ms}
    assert encode_response(materialize(response_type(36, 1), answer))


def test_exp_on_iat_is_inconsistent() -> None:
    with pytest.raises(TokenValidationError, match="was not after the Issued At"):
        UnsecuredValidator(clock_skew_ms=100_000).validate(_jws({**GOOD, "iat": NOW + 60}), NOW_MS)


def test_clock_skew_allows_a_just_expired_or_early_token() -> None:
    late = _jws({**GOOD, "exp": NOW - 1})
    assert UnsecuredValidator(clock_skew_ms=2000).validate(late, NOW_MS).principal == "alice"
    with pytest.raises(TokenValidationError):
        UnsecuredValidator(clock_skew_ms=1000).validate(late, NOW_MS)  # now - skew == exp: expired
    assert UnsecuredValidator(clock_skew_ms=6000).validate(_jws({**GOOD, "iat": NOW + 5}), NOW_MS)


def test_required_scope_and_scope_claim_forms() -> None:
    v = UnsecuredValidator(required_scope=("read", "write"))
    assert v.validate(_jws({**GOOD, "scope": ["write", "read", "x"]}), NOW_MS)
    with pytest.raises(TokenValidationError, match="missing a required scope \\(write\\)") as refused:
        v.validate(_jws({**GOOD, "scope": ["read"]}), NOW_MS)
    assert refused.value.scope == "[read, write]"
    with pytest.raises(TokenValidationError) as refused:
        v.validate(_jws(GOOD), NOW_MS)
    assert refused.value.scope == "[read, write]"
    # a string scope claim is one item, as Kafka reads it (not split on spaces)
    assert parse_unsecured_jws(_jws({**GOOD, "scope": "read write"})).scope == {"read write"}
    with pytest.raises(TokenValidationError):
        UnsecuredValidator(required_scope=("read",)).validate(_jws({**GOOD, "scope": "read write"}), NOW_MS)


def test_principal_and_scope_claim_names_are_configurable() -> None:
    v = UnsecuredValidator(principal_claim="client_id", scope_claim="scp", required_scope=("a",))
    assert v.validate(_jws({**GOOD, "client_id": "svc", "scp": ["a"]}), NOW_MS).principal == "svc"
    with pytest.raises(TokenValidationError, match="No principal name in JWT claim: client_id"):
        v.validate(_jws({**GOOD, "scp": ["a"]}), NOW_MS)


def test_base64url_alphabet_is_accepted() -> None:
    # librdkafka encodes base64url: a claims part with '-' or '_' must validate
    for n in range(40):
        token = unsecured_jws({**GOOD, "sub": "user" + "?" * n + ">"})
        if "-" in token or "_" in token:
            break
    else:
        pytest.fail("no token with a base64url-only character was made")
    assert UnsecuredValidator().validate(token, NOW_MS).principal.startswith("user")
    assert b64url_decode("YQ") == b"a" and b64url_decode("YQ==") == b"a"
    with pytest.raises(ValueError):
        b64url_decode("Y+Q")


# -- the initial response ----------------------------------------------------------------------------


def test_initial_response_round_trip_and_kafkas_layout() -> None:
    token = _jws(GOOD)
    msg = client_initial_response(token, {"traceId": "abc 123", "x": "y=z"})
    assert msg == f"n,,\x01auth=Bearer {token}\x01traceId=abc 123\x01x=y=z\x01\x01".encode()
    assert parse_client_initial_response(msg) == (token, "", {"traceId": "abc 123", "x": "y=z"})
    assert parse_client_initial_response(f"n,a=al=2Cice,\x01auth=bearer {token}\x01\x01".encode()) == \
        (token, "al,ice", {})


@pytest.mark.parametrize("msg,reason", [
    (b"", "Invalid OAUTHBEARER client first message"),
    (b"garbage", "Invalid OAUTHBEARER client first message"),
    (b"n,,\x01auth=Bearer abc\x01", "Invalid OAUTHBEARER client first message"),  # no final \x01
    (b"y,,\x01auth=Bearer abc\x01\x01", "Invalid OAUTHBEARER client first message"),  # channel binding
    (b"n,,\x01\x01", "'auth' not specified"),
    (b"n,,\x01foo=bar\x01\x01", "'auth' not specified"),
    (b"n,,\x01auth=Bearer abc\x01k1=v\x01\x01", "Invalid OAUTHBEARER client first message"),  # key: letters only
    (b"n,,\x01auth=Basic abc\x01\x01", "Invalid scheme in OAUTHBEARER client first message: Basic"),
    (b"n,,\x01auth=Bearer a+b\x01\x01", "invalid 'auth' format"),
    (b"n,,\x01auth=Bearer\x01\x01", "invalid 'auth' format"),
    (b"n,,\x01auth=Bearer \xff\x01\x01", "Invalid OAUTHBEARER client first message"),
])
def test_malformed_initial_responses(msg: bytes, reason: str) -> None:
    with pytest.raises(SaslError, match=reason) as failed:
        parse_client_initial_response(msg)
    assert not isinstance(failed.value, SaslAuthenticationError)  # a server sends its fixed text for these


def test_client_refuses_invalid_extensions() -> None:
    for ext in ({"auth": "x"}, {"k1": "v"}, {"k": "\x01"}, {"k": ""}):
        with pytest.raises(ValueError):
            OAuthBearerClient("tok", ext)


# -- the exchange ---------------------------------------------------------------------------------------


def _server(**kwargs: Any) -> OAuthBearerServer:
    return OAuthBearerServer(lambda value: UnsecuredValidator(**kwargs).validate(value, NOW_MS))


def test_exchange_success_and_authzid() -> None:
    s = _server()
    assert s.evaluate(client_initial_response(_jws(GOOD), {"a": "b"})) == b""
    assert s.complete and s.token is not None and s.token.principal == "alice" and s.extensions == {"a": "b"}
    s = _server()
    s.evaluate(client_initial_response(_jws(GOOD), authzid="alice"))
    assert s.complete
    with pytest.raises(SaslAuthenticationError, match="authorization id \\(bob\\) that is different"):
        _server().evaluate(client_initial_response(_jws(GOOD), authzid="bob"))


def test_refused_token_json_challenge_then_failure() -> None:
    s = _server()
    client = OAuthBearerClient(_jws({**GOOD, "exp": NOW - 5}))
    challenge = s.evaluate(client.first())
    assert challenge == b'{"status":"invalid_token"}' and not s.complete
    assert "Expiration Time" in str(s.failure)
    reply = client.answer(challenge)
    assert reply == b"\x01" and client.server_error == '{"status":"invalid_token"}'
    with pytest.raises(SaslAuthenticationError, match='^{"status":"invalid_token"}$'):
        s.evaluate(reply)
    scoped = _server(required_scope=("write",))
    assert scoped.evaluate(client_initial_response(_jws(GOOD))) == \
        b'{"status":"insufficient_scope", "scope":"[write]"}'
    # a lone \x01 with no error before it is a malformed first message
    with pytest.raises(SaslError, match="Invalid OAUTHBEARER"):
        _server().evaluate(b"\x01")
    assert OAuthBearerClient("t").answer(b"") is None


# -- the broker's configuration and session -------------------------------------------------------------

MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
KEY = "listener.name.sasl_plaintext.oauthbearer.sasl.jaas.config"


def _broker(options: str = "", **extra: str) -> BrokerConfig:
    props = {"listeners": "SASL_PLAINTEXT://127.0.0.1:9094", "sasl.enabled.mechanisms": "OAUTHBEARER",
             KEY: f"{MODULE} required {options};", **extra}
    return BrokerConfig.from_properties(props)


def test_broker_oauthbearer_only_needs_no_users_and_reads_validator_options() -> None:
    cfg = _broker('unsecuredValidatorPrincipalClaimName="client_id" unsecuredValidatorRequiredScope="a  b" '
                  'unsecuredValidatorAllowableClockSkewMs="30" unsecuredLoginStringClaim_sub="admin"')
    sasl = cfg.security.sasl
    assert sasl.users == {} and sasl.mechanisms == ("OAUTHBEARER",)
    assert sasl.oauthbearer == UnsecuredValidator("client_id", "scope", ("a", "b"), 30)
    assert _broker().security.sasl.oauthbearer == UnsecuredValidator()


@pytest.mark.parametrize("props,expected", [
    ({KEY: None}, "enables OAUTHBEARER but listener.name.sasl_plaintext.oauthbearer.sasl.jaas.config is not set"),
    ({KEY: "org.apache.kafka.common.security.plain.PlainLoginModule required;"}, "the login module must be"),
    ({KEY: f'{MODULE} required unsecuredValidatorAllowableClockSkewMs="-1";'}, "must be between 0"),
    ({KEY: f'{MODULE} required unsecuredValidatorAllowableClockSkewMs="x";'}, "is not an integer"),
    ({KEY: f'{MODULE} required unsecuredValidatorRequiredScope="a\\"b";'}, "Invalid scope value"),
    ({"listener.name.sasl_plaintext.oauthbearer.sasl.server.callback.handler.class": "x.Y"}, "is not supported"),
    ({"sasl.oauthbearer.jwks.endpoint.url": "https://idp/jwks"}, "is not supported"),
    ({"sasl.enabled.mechanisms": "OAUTHBEARER,PLAIN"}, "has no users"),
])
def test_bad_broker_oauthbearer_config(props: dict[str, str | None], expected: str) -> None:
    base = {"listeners": "SASL_PLAINTEXT://127.0.0.1:9094", "sasl.enabled.mechanisms": "OAUTHBEARER",
            KEY: f"{MODULE} required;"}
    merged = {k: v for k, v in {**base, **props}.items() if v is not None}
    with pytest.raises(ConfigError, match=expected):
        BrokerConfig.from_properties(merged)


def test_unsecured_oauthbearer_beside_plain_or_scram_is_warned_about() -> None:
    from oncelog.broker.security import security_warnings

    assert security_warnings(_broker().security) == []  # OAUTHBEARER alone
    plain = 'org.apache.kafka.common.security.plain.PlainLoginModule required user_alice="a";'
    for mechanisms in ("OAUTHBEARER,PLAIN", "SCRAM-SHA-256,OAUTHBEARER"):
        sec = _broker(**{"sasl.enabled.mechanisms": mechanisms,
                         "listener.name.sasl_plaintext.plain.sasl.jaas.config": plain}).security
        (warning,) = security_warnings(sec)
        assert "any client can mint an unsigned token and log in as any principal" in warning, warning
    sec = _broker(**{"sasl.enabled.mechanisms": "PLAIN", "listener.name.sasl_plaintext.plain.sasl.jaas.config": plain})
    assert security_warnings(sec.security) == []


def test_failed_authentication_delay_config() -> None:
    assert _broker().connection_failed_authentication_delay_ms == 100  # Kafka's default
    assert _broker(**{"connection.failed.authentication.delay.ms": "0"}).connection_failed_authentication_delay_ms == 0
    with pytest.raises(ConfigError, match="connection.failed.authentication.delay.ms"):
        _broker(**{"connection.failed.authentication.delay.ms": "-1"})
    # Kafka refuses a delay not below connections.max.idle.ms (when that is not -1): the answer would time out
    with pytest.raises(ConfigError, match="must be less than connections.max.idle.ms=600000"):
        _broker(**{"connection.failed.authentication.delay.ms": "600000"})
    with pytest.raises(ConfigError, match="must be less than connections.max.idle.ms=50"):
        _broker(**{"connection.failed.authentication.delay.ms": "100", "connections.max.idle.ms": "50"})
    assert _broker(**{"connection.failed.authentication.delay.ms": "599999"}) \
        .connection_failed_authentication_delay_ms == 599999
    assert _broker(**{"connection.failed.authentication.delay.ms": "700000", "connections.max.idle.ms": "-1"}) \
        .connection_failed_authentication_delay_ms == 700000


def _token(principal: str = "alice", life: float = 60.0, **claims: Any) -> bytes:
    now = int(time.time() * 1000) / 1000  # millisecond precision, as librdkafka and Kafka's login write iat
    return client_initial_response(unsecured_jws({"sub": principal, "iat": now, "exp": now + life, **claims}))


@pytest.mark.parametrize("max_reauth,life,expected_ms", [
    (0, 60.0, 60_000), (5000, 60.0, 5000), (120_000, 30.0, 30_000)])
def test_session_lifetime_is_bounded_by_the_token(max_reauth: int, life: float, expected_ms: int) -> None:
    extra = {"connections.max.reauth.ms": str(max_reauth)} if max_reauth else {}
    s = SaslSession(_broker(**extra).security.sasl)
    assert s.handshake("OAUTHBEARER", 1) == 0
    assert s.evaluate(_token(life=life)) == b""
    assert s.complete and s.principal == "alice"
    assert expected_ms - 1000 <= s.session_lifetime_ms <= expected_ms
    assert s.expires_at is not None and not s.expired(time.monotonic())
    assert s.expired(time.monotonic() + expected_ms / 1000 + 0.01)
    assert s.ended_by == ("connections.max.reauth.ms" if max_reauth == 5000 else "the expiry of its OAUTHBEARER token")


def test_session_reauthentication_keeps_the_principal() -> None:
    s = SaslSession(_broker().security.sasl)
    s.handshake("OAUTHBEARER", 1)
    s.evaluate(_token())
    assert s.arm_reauthentication(time.monotonic())
    s.begin_reauthentication()
    s.handshake("OAUTHBEARER", 1)
    with pytest.raises(SaslAuthenticationError, match="Cannot change principals during re-authentication"):
        s.evaluate(_token("bob"))


def test_session_refused_token_closes_after_the_failure() -> None:
    s = SaslSession(_broker().security.sasl)
    s.handshake("OAUTHBEARER", 1)
    assert s.evaluate(_token(life=-5)) == b'{"status":"invalid_token"}'
    assert not s.complete and not s.close_after_response
    with pytest.raises(SaslAuthenticationError):
        s.evaluate(b"\x01")
    assert s.state == s.FAILED and s.close_after_response


def test_refused_tokens_log_one_warning_per_failed_login(caplog: pytest.LogCaptureFixture) -> None:
    """A client may send token after token on one unauthenticated connection (Kafka allows it): each refusal
    is logged at DEBUG, as Kafka, and the failed login once at WARNING with the last reason (each refusal
    was a WARNING: about 6000 lines a second from one connection)."""
    s = SaslSession(_broker().security.sasl, peer="10.0.0.9:1234")
    s.handshake("OAUTHBEARER", 1)
    with caplog.at_level("DEBUG", logger="oncelog.security"):
        for _ in range(100):
            assert s.evaluate(_token(life=-5)) == b'{"status":"invalid_token"}'
        assert [r.levelname for r in caplog.records] == ["DEBUG"] * 100
        with pytest.raises(SaslAuthenticationError):
            s.evaluate(b"\x01")
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "10.0.0.9:1234" in warnings[0], warnings
    assert "token refused: The indicated time" in warnings[0] and "Expiration Time" in warnings[0]


def test_failed_login_warning_does_not_blame_an_earlier_refused_token(caplog: pytest.LogCaptureFixture) -> None:
    s = SaslSession(_broker().security.sasl)
    s.handshake("OAUTHBEARER", 1)
    assert s.evaluate(_token(life=-5)) == b'{"status":"invalid_token"}'
    with caplog.at_level("WARNING", logger="oncelog.security"):
        with pytest.raises(SaslAuthenticationError, match="authorization id"):
            s.evaluate(_token("a").replace(b"n,,", b"n,a=b,"))
    (line,) = [r.getMessage() for r in caplog.records]
    assert "authorization id (b)" in line and "token refused" not in line, line


def test_principals_from_tokens_are_escaped_in_log_lines(caplog: pytest.LogCaptureFixture) -> None:
    """A sub with a newline cannot forge a second log line (it was written raw)."""
    forged = "x\n2026-11-24 12:00:00,000 INFO oncelog.security: 10.0.0.1 authenticated as User:admin"
    s = SaslSession(_broker().security.sasl, peer="10.0.0.9:1234")
    s.handshake("OAUTHBEARER", 1)
    with caplog.at_level("INFO", logger="oncelog.security"):
        assert s.evaluate(_token(forged)) == b""
    assert s.principal == forged  # the principal itself is the token's
    (line,) = [r.getMessage() for r in caplog.records]
    assert "\n" not in line and "authenticated as User:x\\n2026-11-24" in line, line
    s = SaslSession(_broker().security.sasl, peer="10.0.0.9:1234")
    s.handshake("OAUTHBEARER", 1)
    caplog.clear()
    with caplog.at_level("DEBUG", logger="oncelog.security"):
        with pytest.raises(SaslAuthenticationError, match="authorization id"):  # an escape sequence in the authzid
            s.evaluate(_token("a").replace(b"n,,", b"n,a=b\x1b[31m,"))
    (line,) = [r.getMessage() for r in caplog.records]
    assert "\x1b" not in line and "authorization id (b\\x1b[31m)" in line, line


# -- the client's configuration and tokens ---------------------------------------------------------------

BASE = {"bootstrap.servers": "127.0.0.1:9092", "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER"}


def test_unsecured_builder_config() -> None:
    c = parse_unsecured_config("  principal=alice scope=a,b,,a lifeSeconds=30 principalClaimName=cid "
                               "scopeClaimName=scp extension_traceId=x1 ")
    assert (c.principal, c.principal_claim, c.scope, c.scope_claim, c.life_seconds) == \
        ("alice", "cid", ("a", "b"), "scp", 30)
    assert c.extensions == {"traceId": "x1"}
    tok = c.token(NOW)
    jws = UnsecuredValidator("cid", "scp", ("a", "b")).validate(tok.value, NOW_MS)
    assert jws.principal == "alice" and jws.lifetime_ms == NOW_MS + 30_000 and tok.expiry == NOW + 30


@pytest.mark.parametrize("text,reason", [
    (None, "principal=<value>"), ("", "principal=<value>"), ("lifeSeconds=5", "no principal=<value>"),
    ("principal=", "empty 'principal='"), ("principal=a lifeSeconds=x", "non-integral"),
    ("principal=a lifeSeconds=0", "out of range"), ("principal=a bogus=1", "Unrecognized sasl.oauthbearer.config"),
    ("principal=a extension_=v", "empty 'extension_' key"), ("principal=a extension_k1=v", "Extension name k1"),
    ("principal=a extension_auth=v", "Extension name auth"),
    ("principal=alice principal=bob", "multiple 'principal=' entries"),  # was last-wins: a token for bob
    ("principal=a lifeSeconds=5 lifeSeconds=6", "multiple 'lifeSeconds=' entries"),
    ("principal=a extension_x=1 extension_x=2", "multiple 'extension_x=' entries"),
])
def test_bad_unsecured_builder_config(text: str | None, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_unsecured_config(text)


@pytest.mark.parametrize("extra,reason", [
    ({}, "needs a token: set oauth_cb"),
    ({"enable.sasl.oauthbearer.unsecure.jwt": True}, "principal=<value>"),
    ({"enable.sasl.oauthbearer.unsecure.jwt": "true", "sasl.oauthbearer.config": "principal=a lifeSeconds=-1"},
     "out of range"),
    ({"oauth_cb": "not callable"}, "oauth_cb: invalid value 'not callable' \\(expected a callable\\)"),
    ({"oauth_cb": lambda c: ("t", 1.0), "enable.sasl.oauthbearer.unsecure.jwt": True,
      "sasl.oauthbearer.config": "principal=a"}, "mutually exclusive"),
    ({"sasl.mechanism": "PLAIN", "sasl.username": "u", "sasl.password": "p", "oauth_cb": lambda c: ("t", 1.0)},
     "need sasl.mechanism=OAUTHBEARER"),
    ({"enable.sasl.oauthbearer.unsecure.jwt": "maybe"}, "expected true or false"),
    ({"sasl.oauthbearer.method": "oidc"}, "unknown configuration property 'sasl.oauthbearer.method'"),
])
def test_bad_client_config_fails_at_construction(extra: dict[str, Any], reason: str) -> None:
    with pytest.raises(ClientConfigError, match=reason):
        parse_config({**BASE, **extra}, "producer")


def test_client_config_accepts_both_sources_and_the_alias() -> None:
    sec = parse_config({**BASE, "enable.sasl.oauthbearer.unsecure.jwt": True,
                        "sasl.oauthbearer.config": "principal=alice"}, "consumer").security
    assert sec.sasl_mechanism == "OAUTHBEARER" and sec.oauth.unsecured.principal == "alice"
    conf = {k: v for k, v in BASE.items() if k != "sasl.mechanism"}
    sec = parse_config({**conf, "sasl.mechanisms": "oauthbearer", "oauth_cb": lambda c: ("t", 1.0)}, "admin").security
    assert sec.sasl_mechanism == "OAUTHBEARER" and sec.oauth.oauth_cb is not None


def test_sasl_oauthbearer_config_is_hidden_in_the_config_repr() -> None:
    cfg = parse_config({**BASE, "oauth_cb": lambda c: ("t", 1.0),
                        "sasl.oauthbearer.config": "clientId=app clientSecret=s3cr3t"}, "consumer")
    assert cfg["sasl.oauthbearer.config"] == "clientId=app clientSecret=s3cr3t"
    assert "s3cr3t" not in repr(cfg) and "'sasl.oauthbearer.config': '[hidden]'" in repr(cfg)
    assert "s3cr3t" not in repr(cfg.security) and "s3cr3t" not in repr(cfg.security.oauth)


class _Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


def test_token_source_refreshes_at_80_percent_of_the_lifetime() -> None:
    clock = _Clock()
    calls: list[str | None] = []

    def cb(config: str | None) -> tuple[str, float, str, dict[str, str]]:
        calls.append(config)
        return f"tok{len(calls)}", clock.now + 100, "alice", {"k": "v"}

    src = TokenSource(cb, "cfg", None, clock=clock)
    t = src.token()
    assert (t.value, t.principal, dict(t.extensions)) == ("tok1", "alice", {"k": "v"}) and calls == ["cfg"]
    clock.now += 79
    assert src.token().value == "tok1"
    clock.now += 1.5
    # past 80%: the still-valid token at once, the next one fetched in the background
    assert src.token().value == "tok1"
    _wait_background(src)
    assert src.token().value == "tok2" and len(calls) == 2


def _wait_background(src: TokenSource) -> None:
    """Let the blocking path's background refresh end."""
    job = src._job
    if job is not None:
        concurrent.futures.wait([job], timeout=10)


def test_token_source_async_callback_and_shared_fetch() -> None:
    import asyncio

    clock = _Clock()
    calls = 0

    async def cb(config: str | None) -> tuple[str, float]:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.01)
        return "tok", clock.now + 10

    async def main() -> list[str]:
        src = TokenSource(cb, None, None, clock=clock)
        return [t.value for t in await asyncio.gather(*(src.atoken() for _ in range(5)))]

    assert asyncio.run(main()) == ["tok"] * 5 and calls == 1


@pytest.mark.parametrize("result,reason", [
    ("tok", "must return \\(token_str"), (("tok",), "must return"), ((None, NOW + 5), "non-empty string"),
    (("", NOW + 5), "non-empty string"), (("tok", "soon"), "seconds since the epoch"),
    (("tok", NOW - 1), "already expired"), (("tok", (NOW + 5) * 1000.0), "looks like milliseconds"),
    (("tok", 1e11), "looks like milliseconds"),
    (("tok", NOW + 5, "p", {"k1": "v"}), "invalid SASL extension"),
    (("tok", NOW + 5, 5, {}), "principal must be a string"), (("tok", NOW + 5, "p", ["x"]), "dict of str"),
])
def test_bad_oauth_cb_results_are_clear_errors(result: Any, reason: str) -> None:
    with pytest.raises(TokenError, match=reason):
        TokenSource(lambda c: result, None, None, clock=_Clock()).token()


@pytest.mark.parametrize("expiry", [2147483647, 4102444800, 9999999999, 99_999_999_999.0])
def test_far_future_oauth_cb_expiries_are_accepted(expiry: float) -> None:
    """"Never expires" sentinels in seconds are accepted, as confluent-kafka does (they were refused as more than
    ten years ahead, with a message saying they were milliseconds)."""
    token = TokenSource(lambda c: ("tok", expiry), None, None, clock=_Clock()).token()
    assert (token.value, token.expiry) == ("tok", expiry)


def test_oauth_cb_exception_is_one_clear_error() -> None:
    def cb(config: str | None) -> tuple[str, float]:
        raise RuntimeError("idp down")

    with pytest.raises(TokenError, match="oauth_cb raised RuntimeError: idp down"):
        TokenSource(cb, None, None).token()


class _IdpDown:
    async def __call__(self, config: str | None) -> tuple[str, float]:
        raise RuntimeError("idp down")


def test_awaitable_oauth_cb_failure_is_a_token_error() -> None:
    """An object with an async __call__, or a plain function returning a coroutine, that raises gives the
    documented TokenError (it escaped as the raw RuntimeError)."""
    import asyncio

    def returns_coroutine(config: str | None) -> Any:
        return _IdpDown()(config)

    for cb in (_IdpDown(), returns_coroutine):
        with pytest.raises(TokenError, match="oauth_cb raised RuntimeError: idp down"):
            asyncio.run(TokenSource(cb, None, None).atoken())


def _flaky(clock: _Clock, fail_at: set[int]) -> tuple[Any, list[float]]:
    """An oauth_cb of 100-second tokens that raises on the calls numbered in fail_at (from 1)."""
    calls: list[float] = []

    def cb(config: str | None) -> tuple[str, float]:
        calls.append(clock.now - NOW)
        if len(calls) in fail_at:
            raise RuntimeError("token endpoint 503")
        return f"tok{len(calls)}", clock.now + 100

    return cb, calls


@pytest.mark.parametrize("mode", ["blocking", "asyncio"])
def test_failed_refresh_keeps_the_unexpired_token_and_retries_later(mode: str, caplog: pytest.LogCaptureFixture) -> None:
    """A refresh failing at 85% of the token's life keeps the current token (one WARNING) and oauth_cb is
    not called again for 10 s, as librdkafka; once the token has expired the failure is a TokenError
    (it failed the connection's authentication at once)."""
    import asyncio

    clock = _Clock()
    cb, calls = _flaky(clock, {2, 3, 4})
    src = TokenSource(cb, None, None, clock=clock)

    async def aget() -> str:
        token = await src.atoken()
        if src._pending is not None and not src._pending.done():  # a background refresh: let it end
            await asyncio.wait([src._pending])
        return token.value

    def bget() -> str:
        token = src.token()
        _wait_background(src)
        return token.value

    def get() -> str:
        return bget() if mode == "blocking" else asyncio.run(aget())

    assert get() == "tok1"
    clock.now = NOW + 85
    with caplog.at_level("WARNING", logger="oncelog.client.oauthbearer"):
        assert get() == "tok1" and len(calls) == 2
        clock.now = NOW + 94
        assert get() == "tok1" and len(calls) == 2  # no retry within 10 s
    assert [r.getMessage() for r in caplog.records if "keeping the current one" in r.getMessage()] != []
    assert len(caplog.records) == 1 and "token endpoint 503" in caplog.records[0].getMessage()
    clock.now = NOW + 95.5
    assert get() == "tok1" and len(calls) == 3  # retried, failed again, still valid
    clock.now = NOW + 101
    with pytest.raises(TokenError, match="oauth_cb raised RuntimeError: token endpoint 503"):
        get()
    assert get() == "tok5" and len(calls) == 5  # the next call succeeds


def test_valid_cached_token_is_returned_at_once_and_a_hung_oauth_cb_is_called_again() -> None:
    """Past the refresh point a still-valid token is returned at once while oauth_cb runs in the
    background (librdkafka, Java); a call that hangs past the timeout is abandoned, so the retry 10 s
    later calls oauth_cb again (the hung call was reused for ever and every caller after each retry
    window waited the whole timeout on it)."""
    import asyncio
    import time as _time

    clock = _Clock()
    calls: list[float] = []

    async def cb(config: str | None) -> tuple[str, float]:
        calls.append(clock.now - NOW)
        if len(calls) == 1:
            return "tok1", clock.now + 100
        await asyncio.sleep(3600)  # the IdP hangs
        raise AssertionError("unreachable")

    async def main() -> None:
        src = TokenSource(cb, None, None, clock=clock, timeout=0.2)
        assert (await src.atoken()).value == "tok1"
        for at, ncalls in ((81, 2), (85, 2), (92, 3), (93, 3)):  # retries 10 s after each failure
            clock.now = NOW + at
            t0 = _time.monotonic()
            assert (await src.atoken()).value == "tok1"
            assert _time.monotonic() - t0 < 0.1, at
            await asyncio.sleep(0.01)
            assert len(calls) == ncalls, (at, calls)
            await asyncio.sleep(0.3)  # past the timeout: the hung call is abandoned
        clock.now = NOW + 103  # expired: the caller waits for a new call, and gets the timeout's TokenError
        with pytest.raises(TokenError, match="did not return within 200 ms"):
            await src.atoken()
        assert len(calls) == 4

    asyncio.run(main())


def test_asyncio_token_is_refreshed_by_a_timer_at_80_percent() -> None:
    """The next token is fetched in the background at 80% of the current one's life, without a caller
    asking (librdkafka's and Java's refresh timer): the re-authentication at 85-95% then sends it."""
    import asyncio
    import time as _time

    calls: list[float] = []

    def cb(config: str | None) -> tuple[str, float]:
        calls.append(_time.time())
        return f"tok{len(calls)}", _time.time() + 0.5

    async def main() -> None:
        src = TokenSource(cb, None, None, timeout=5)
        assert (await src.atoken()).value == "tok1"
        await asyncio.sleep(0.47)  # past 80% (0.4 s), before the expiry
        assert len(calls) == 2
        assert (await src.atoken()).value == "tok2"
        # a source nobody asks any more (its client closed) refreshes once more at most, then stops
        await asyncio.sleep(1.2)
        assert len(calls) == 3

    asyncio.run(main())


def test_blocking_path_returns_the_valid_token_at_once_and_bounds_a_hung_oauth_cb() -> None:
    """The blocking connection's token(): past the refresh point the still-valid token comes at once while a
    plain oauth_cb runs in a worker thread; a call that hangs is abandoned after the timeout and called
    again after the retry pause; with the token expired the caller waits the timeout and gets a TokenError
    (token() called oauth_cb inline in the caller's thread, so a hung callback blocked the connection's
    request for as long as it hung)."""
    clock = _Clock()
    calls: list[tuple[float, str]] = []
    release = threading.Event()

    def cb(config: str | None) -> tuple[str, float]:
        calls.append((clock.now - NOW, threading.current_thread().name))
        if len(calls) == 1:
            return "tok1", clock.now + 100
        release.wait(5)  # the IdP hangs
        raise RuntimeError("hung")

    src = TokenSource(cb, None, None, clock=clock, timeout=0.2)
    try:
        assert src.token().value == "tok1"
        assert calls[0][1] != threading.current_thread().name  # a worker thread, even for the first token
        for at, ncalls in ((81, 2), (85, 2), (92, 3), (93, 3)):  # retries 10 s after each failure
            clock.now = NOW + at
            t0 = time.monotonic()
            assert src.token().value == "tok1"
            assert time.monotonic() - t0 < 0.1, at
            time.sleep(0.05)
            assert len(calls) == ncalls, (at, calls)
            time.sleep(0.3)  # past the timeout: the hung call is abandoned
        clock.now = NOW + 103
        t0 = time.monotonic()
        with pytest.raises(TokenError, match="did not return within 200 ms"):
            src.token()
        assert 0.15 < time.monotonic() - t0 < 2 and len(calls) == 4
    finally:
        release.set()


def test_blocking_token_is_refreshed_by_a_timer_at_80_percent() -> None:
    """The blocking path fetches the next token at 80% of the current one's life without being asked
    (librdkafka's background refresh), so a re-authentication at 85-95% sends the new one; it stops once
    nobody asks for tokens."""
    calls: list[float] = []

    def cb(config: str | None) -> tuple[str, float]:
        calls.append(time.time())
        return f"tok{len(calls)}", time.time() + 0.5

    src = TokenSource(cb, None, None, timeout=5)
    assert src.token().value == "tok1"
    time.sleep(0.47)  # past 80% (0.4 s), before the expiry
    assert len(calls) == 2
    assert src.token().value == "tok2"
    time.sleep(1.2)
    assert len(calls) == 3


def test_oauth_cb_expiry_beyond_a_float_is_a_token_error() -> None:
    with pytest.raises(TokenError, match="the expiry must be a number"):
        TokenSource(lambda c: ("t", 10**400), None, None, clock=_Clock()).token()


def test_hung_oauth_cb_times_out_and_failed_fetch_is_retrieved(caplog: pytest.LogCaptureFixture) -> None:
    """A callback that does not return fails with a clear TokenError after the timeout (request.timeout.ms;
    it waited forever), and a failed fetch whose only waiter was cancelled is not reported by asyncio as
    "Task exception was never retrieved"."""
    import asyncio
    import gc

    async def hung(config: str | None) -> tuple[str, float]:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    async def main() -> None:
        with pytest.raises(TokenError, match="oauth_cb did not return within 50 ms \\(request.timeout.ms\\)"):
            await TokenSource(hung, None, None, timeout=0.05).atoken()

    asyncio.run(main())
    assert parse_config({**BASE, "oauth_cb": lambda c: ("t", 1.0), "request.timeout.ms": 1234},
                        "admin").security.oauth.timeout == 1.234

    async def slow_failure(config: str | None) -> tuple[str, float]:
        await asyncio.sleep(0.05)
        raise RuntimeError("idp down")

    async def cancelled_waiter() -> None:
        waiter = asyncio.ensure_future(TokenSource(slow_failure, None, None).atoken())
        await asyncio.sleep(0.01)
        waiter.cancel()
        await asyncio.sleep(0.1)  # the shared fetch fails with nobody awaiting it

    with caplog.at_level("ERROR", logger="asyncio"):
        asyncio.run(cancelled_waiter())
        gc.collect()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


# -- the Java client's OAuthBearerLoginModule (--command-config, Spark's kafka.* options) -----------------

JAVA_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"


def test_java_unsecured_login_becomes_the_unsecured_builder() -> None:
    from oncelog.client.java_config import from_java

    out = from_java({"sasl.mechanism": "OAUTHBEARER", "sasl.jaas.config":
                     f'{JAVA_MODULE} required unsecuredLoginStringClaim_sub="alice" unsecuredLoginLifetimeSeconds="60" '
                     'unsecuredLoginListClaim_scope="|read|write" unsecuredLoginExtension_traceId="t1";'})
    assert out == {"sasl.mechanism": "OAUTHBEARER", "enable.sasl.oauthbearer.unsecure.jwt": True,
                   "sasl.oauthbearer.config": "principal=alice lifeSeconds=60 scope=read,write extension_traceId=t1"}
    sec = parse_config({**out, "bootstrap.servers": "h:1", "security.protocol": "SASL_PLAINTEXT"}, "admin").security
    assert (sec.oauth.unsecured.principal, sec.oauth.unsecured.scope) == ("alice", ("read", "write"))
    out = from_java({"sasl.jaas.config": f'{JAVA_MODULE} required unsecuredLoginPrincipalClaimName="cid" '
                                         'unsecuredLoginStringClaim_cid="svc";'})
    assert out["sasl.oauthbearer.config"] == "principal=svc principalClaimName=cid"


@pytest.mark.parametrize("options,reason", [
    ("", "without unsecuredLogin\\* options"),
    ('clientId="x" clientSecret="y"', "without unsecuredLogin\\* options"),
    ('unsecuredLoginLifetimeSeconds="60"', "no principal: set unsecuredLoginStringClaim_sub"),
    ('unsecuredLoginStringClaim_sub="alice" unsecuredLoginNumberClaim_n="1"', "cannot be expressed"),
    ('unsecuredLoginStringClaim_sub="al ice"', "without spaces"),
])
def test_java_oauthbearer_login_that_cannot_be_mapped(options: str, reason: str) -> None:
    from oncelog.client.java_config import from_java

    with pytest.raises(ClientConfigError, match=reason):
        from_java({"sasl.jaas.config": f"{JAVA_MODULE} required {options};"})


class _Boom(BaseException):
    """A library's own BaseException subclass."""


@pytest.mark.parametrize("exc, name", [(SystemExit(3), "SystemExit: 3"), (KeyboardInterrupt("stop"),
                                                                            "KeyboardInterrupt: stop"),
                                       (_Boom("idp client bug"), "_Boom: idp client bug")])
def test_base_exception_from_a_plain_oauth_cb_is_reported_as_itself(exc: BaseException, name: str) -> None:
    """A plain oauth_cb that raises a BaseException (SystemExit, KeyboardInterrupt, a library's own) fails
    the fetch at once with that cause, blocking and asyncio, and leaves no stray traceback: it was reported
    as "did not return within 30000 ms" (blocking) or escaped the event loop (asyncio, which ran the
    callback in its default executor). In the callback's worker thread such an exception can only come
    from the callback itself (signals go to the main thread), so it is the callback's failure."""
    import asyncio

    def cb(config: str | None) -> tuple[str, float]:
        raise exc

    hooked: list[Any] = []
    old_hook, threading.excepthook = threading.excepthook, hooked.append
    try:
        t0 = time.monotonic()
        with pytest.raises(TokenError) as info:
            TokenSource(cb, None, None, timeout=30).token()
        assert time.monotonic() - t0 < 5
        assert str(info.value) == f"oauth_cb raised {name}"

        async def main() -> str:
            try:
                await TokenSource(cb, None, None, timeout=30).atoken()
            except TokenError as err:
                return str(err)
            return "no error"

        assert asyncio.run(main()) == f"oauth_cb raised {name}"
    finally:
        threading.excepthook = old_hook
    assert hooked == []  # no thread died with it


def test_blocking_refresh_timer_stops_with_the_last_released_connection() -> None:
    """A blocking connection acquires the token source and releases it when closed: once the last one is
    released the 80% refresh timer is cancelled (it fired after the client was closed, called oauth_cb
    once more and armed another timer, a sleeping thread for ~1.6 token lifetimes), and a refresh still
    under way does not re-arm it; token() starts it again."""
    calls: list[float] = []

    def cb(config: str | None) -> tuple[str, float]:
        calls.append(time.time())
        return f"tok{len(calls)}", time.time() + 0.5

    src = TokenSource(cb, None, None, timeout=5)
    src.acquire()
    src.acquire()
    assert src.token().value == "tok1"
    time.sleep(0.1)
    src.release()  # one of two connections closed: the timer still runs
    assert src._btimer is not None and src._btimer.is_alive()
    timer = src._btimer
    src.release()  # the last one
    time.sleep(0.1)
    assert not timer.is_alive() and src._btimer is None
    time.sleep(0.5)  # past the 80% point (0.4 s)
    assert len(calls) == 1
    assert src._btimer is None
    src.acquire()  # a new connection logs in again: the timer is back
    assert src.token().value == "tok2"  # tok1 expired
    time.sleep(0.1)
    assert src._btimer is not None
    src.release()
    assert src._btimer is None


_HUNG_LOOP_SCRIPT = """
import sys, threading, time
from oncelog.client._loop import LoopThread
from oncelog.client.oauthbearer import TokenSource
n = [0]
def cb(config):
    n[0] += 1
    if n[0] == 1:
        return "tok1", time.time() + 1.0
    time.sleep(20)  # the token endpoint hangs on the refresh
    return "tok2", time.time() + 100
src = TokenSource(cb, None, None, timeout=0.3)
loop = LoopThread()
assert loop.run(src.atoken()).value == "tok1"
time.sleep(0.9)  # the 80% timer started the refresh, which hangs
assert n[0] == 2, n
loop.stop()  # the blocking client's close()
print("closed", flush=True)
"""


def test_hung_plain_oauth_cb_does_not_keep_a_closed_clients_process_alive() -> None:
    """The blocking Producer/Consumer/Admin run the asyncio client on a LoopThread: a plain oauth_cb hung in
    a refresh must not keep the process from exiting after close (it ran in the loop's default executor,
    whose worker Python joins at exit: the process lived until the callback returned, 20 s here). About
    1.5 s (a subprocess)."""
    import os
    import subprocess
    import sys

    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", _HUNG_LOOP_SCRIPT], capture_output=True, text=True, timeout=30,
                          env=os.environ.copy())
    took = time.monotonic() - t0
    assert done.returncode == 0 and done.stdout == "closed\n", done.stderr
    assert took < 8, f"the process took {took:.1f} s to exit after close"


def test_token_past_the_refresh_point_is_the_one_valid_at_the_call_even_if_the_refresh_is_quick() -> None:
    """token() past 80% returns the still-valid token it found, also when the background refresh it
    starts has already replaced it (a fast oauth_cb: that race made the test above flaky)."""
    clock = _Clock()
    calls: list[str | None] = []

    def cb(config: str | None) -> tuple[str, float, str, dict[str, str]]:
        calls.append(config)
        return f"tok{len(calls)}", clock.now + 100, "alice", {}

    class QuickRefresh(TokenSource):
        def _bstart(self) -> concurrent.futures.Future[OAuthToken]:
            job = super()._bstart()
            concurrent.futures.wait([job], timeout=10)  # the refresh ends before token() goes on
            return job

    src = QuickRefresh(cb, None, None, clock=clock)
    assert src.token().value == "tok1"
    clock.now += 81
    assert src.token().value == "tok1" and len(calls) == 2
    assert src.token().value == "tok2"
