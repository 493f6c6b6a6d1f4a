"""SASL/OAUTHBEARER (RFC 7628, KIP-255) as Kafka speaks it, sans IO: both sides of the exchange and
Kafka's default *unsecured* tokens (an unsecured JWS, ``alg: none``, RFC 7515/7519).

Shared by the broker (:mod:`oncelog.broker.security`) and the client
(:mod:`oncelog.client.oauthbearer`); imports nothing of ours outside :mod:`oncelog.protocol`.

* Client initial response (RFC 7628 3.1): ``n,[a=authzid],`` ``\\x01auth=Bearer <token>\\x01``
  then ``key=value\\x01`` per extension, then a final ``\\x01``:
  :func:`client_initial_response` builds it, :func:`parse_client_initial_response` parses it with
  Kafka's grammar (an extension key is letters only, ``auth`` is reserved, a value is printable ASCII,
  space, tab, CR or LF; the token is ``[-_.a-zA-Z0-9]+``).
* :class:`OAuthBearerServer`: one server exchange. A valid token completes it with an empty answer; an
  invalid one is answered with RFC 7628's JSON error (``{"status":"invalid_token"}``, or
  ``insufficient_scope`` with the required scope), to which the client answers a lone ``\\x01``, and
  the exchange then fails with that JSON as the message (a :class:`SaslAuthenticationError`), as Kafka's
  ``OAuthBearerSaslServer``. A malformed initial response fails at once (a :class:`SaslError`, for which
  a server sends its fixed text).
* :class:`OAuthBearerClient`: one client exchange (Kafka's ``OAuthBearerSaslClient``).
* :class:`UnsecuredValidator`: Kafka's ``OAuthBearerUnsecuredValidatorCallbackHandler`` rules: the
  token is an unsecured JWS (three dot-separated base64url parts, the last one empty, header
  ``alg: none``); ``exp`` is required and must be later than now minus the allowed clock skew; ``iat``,
  if present, not later than now plus the skew, and before ``exp``; the principal claim (``sub`` by
  default) a non-blank string; every required scope present in the scope claim (a string is one scope
  item, a list several).
* :func:`unsecured_jws` builds such a token from claims (librdkafka's and Kafka's unsecured login).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from oncelog.protocol.sasl import SaslAuthenticationError, SaslError

__all__ = [
    "OAuthBearerClient",
    "OAuthBearerServer",
    "OAuthBearerToken",
    "TokenValidationError",
    "UnsecuredValidator",
    "b64url_decode",
    "b64url_encode",
    "check_extensions",
    "client_initial_response",
    "error_challenge",
    "parse_client_initial_response",
    "parse_scope",
    "parse_unsecured_jws",
    "unsecured_jws",
]

KVSEP = "\x01"
_SASLNAME = r"(?:[\x01-\x2B\x2D-\x3C\x3E-\x7F]|=2C|=3D)+"
_KEY = r"[A-Za-z]+"
_VALUE = r"[\x21-\x7E \t\r\n]+"
_INITIAL = re.compile(rf"n,(?:a=(?P<authzid>{_SASLNAME}))?,\x01(?P<kvpairs>(?:{_KEY}={_VALUE}\x01)*)\x01", re.S)
_AUTH = re.compile(r"(?P<scheme>\w+) +(?P<token>[-_.a-zA-Z0-9]+)", re.A)
_EXT_KEY = re.compile(_KEY)
_EXT_VALUE = re.compile(_VALUE)
_SCOPE_ITEM = re.compile(r"[\x21\x23-\x5B\x5D-\x7E]+")
LONG_MAX = 2**63 - 1  # a token's expiry in milliseconds is a Java long in Kafka: larger ones saturate there


def _no_constant(name: str) -> Any:
    # JSON has no NaN or Infinity (Jackson, which Kafka reads tokens with, refuses them by default)
    raise ValueError(f"{name} is not JSON")


class TokenValidationError(Exception):
    """A token is not acceptable; ``scope`` is the required scope when that is why (RFC 7628's
    ``insufficient_scope``). The message says why; a server logs it and tells the client only the status."""

    def __init__(self, message: str, scope: str | None = None) -> None:
        super().__init__(message)
        self.scope = scope


@dataclass(frozen=True)
class OAuthBearerToken:
    """A validated token: Kafka's ``OAuthBearerToken``."""

    value: str
    principal: str
    lifetime_ms: int  # the expiry, milliseconds since the epoch
    start_ms: int | None = None  # iat
    scope: frozenset[str] = frozenset()
    claims: Mapping[str, Any] = field(default_factory=dict)


# -- base64url and unsecured JWS -----------------------------------------------------------------


def b64url_encode(data: bytes) -> str:
    """base64url without padding (RFC 7515 section 2)."""
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def b64url_decode(text: str) -> bytes:
    """base64url with or without padding; ValueError when it is not."""
    if not re.fullmatch(r"[A-Za-z0-9_-]*=*", text) or len(text.rstrip("=")) % 4 == 1:
        raise ValueError("not base64url")
    try:
        return base64.urlsafe_b64decode(text.rstrip("=") + "=" * (-len(text.rstrip("=")) % 4))
    except (binascii.Error, ValueError):
        raise ValueError("not base64url") from None


def unsecured_jws(claims: Mapping[str, Any]) -> str:
    """An unsecured JWS (``{"alg":"none"}``, no signature) carrying ``claims``."""
    header = b64url_encode(b'{"alg":"none"}')
    body = b64url_encode(json.dumps(dict(claims), separators=(",", ":")).encode())
    return f"{header}.{body}."


def _claim_value(value: Any) -> Any:
    # as Kafka reads a JWS's JSON: numbers stay numbers, arrays become lists of their items' text, anything
    # else its text (a boolean "true", null "null", an object "")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return value
    if isinstance(value, list):
        return [_claim_text(v) for v in value]
    if value is None:
        return "null"
    return ""


def _claim_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return json.dumps(value)
    return value if isinstance(value, str) else ""


def _json_part(part: str, what: str) -> dict[str, Any]:
    try:
        raw = b64url_decode(part)
    except ValueError:
        raise TokenValidationError(f"malformed Base64 URL encoded value in the JWS {what}") from None
    try:
        value = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):  # RecursionError: nested too deeply (Jackson: 1000)
        raise TokenValidationError(f"malformed JSON in the JWS {what}") from None
    if not isinstance(value, dict):
        return {}
    return {str(k): _claim_value(v) for k, v in value.items()}


def _number(claims: Mapping[str, Any], name: str) -> float | None:
    value = claims.get(name)
    if value is None:
        return None
    if not isinstance(value, (int, float)):
        raise TokenValidationError(f"The '{name}' claim was not of type Number: {_type(value)}")
    try:
        number = float(value)
    except OverflowError:  # an integer too large for a double
        number = math.inf
    if not math.isfinite(number):  # 1e400: a double's Infinity, which no time is
        raise TokenValidationError(f"The '{name}' claim was not a finite number: {value!r:.40}")
    return number


def _ms(seconds: float) -> int:
    """Seconds to epoch milliseconds as Kafka's Math.round: a long, saturating at its bounds."""
    ms = seconds * 1000
    if not math.isfinite(ms):
        return LONG_MAX if ms > 0 else -LONG_MAX - 1
    return max(-LONG_MAX - 1, min(LONG_MAX, round(ms)))


def _type(value: Any) -> str:
    return "List" if isinstance(value, list) else "String" if isinstance(value, str) else "Number"


def parse_unsecured_jws(token: str, principal_claim: str = "sub", scope_claim: str = "scope") -> OAuthBearerToken:
    """The token's principal, expiry and scope, or TokenValidationError (Kafka's ``OAuthBearerUnsecuredJws``:
    the structure, ``alg: none``, no signature, an ``exp`` and a non-blank principal)."""
    if ".." in token:
        raise TokenValidationError("Malformed compact serialization contains '..'")
    parts = token.split(".")
    if len(parts) != 3:
        raise TokenValidationError("Unsecured JWS compact serializations must have 3 dot-separated "
                                   "Base64URL-encoded values")
    header = _json_part(parts[0], "header")
    claims = _json_part(parts[1], "claims")
    alg = header.get("alg")
    if alg is None:
        raise TokenValidationError("JWS header must have an Algorithm value")
    if _claim_text(alg) != "none":
        raise TokenValidationError("Unsecured JWS must have 'none' for an algorithm")
    if parts[2]:
        raise TokenValidationError("Unsecured JWS must not contain a digital signature")
    scope_value = claims.get(scope_claim)
    if isinstance(scope_value, str):
        scope = frozenset([scope_value.strip()]) if scope_value.strip() else frozenset()
    elif isinstance(scope_value, list) or scope_value is None:
        scope = frozenset(s.strip() for s in scope_value or () if s.strip())
    else:
        raise TokenValidationError(f"The '{scope_claim}' claim was not of type List: {_type(scope_value)}")
    exp = _number(claims, "exp")
    if exp is None:
        raise TokenValidationError("No expiration time in JWT")
    principal = claims.get(principal_claim)
    if principal is not None and not isinstance(principal, str):
        raise TokenValidationError(f"The '{principal_claim}' claim was not of type String: {_type(principal)}")
    if principal is None or not principal.strip():
        raise TokenValidationError(f"No principal name in JWT claim: {principal_claim}")
    iat = _number(claims, "iat")
    return OAuthBearerToken(token, principal, _ms(exp), None if iat is None else _ms(iat), scope, claims)


def parse_scope(text: str) -> list[str]:
    """A space-delimited scope (Kafka's ``OAuthBearerScopeUtils``); ValueError naming a bad item."""
    out = []
    for item in text.split(" "):
        if item:
            if not _SCOPE_ITEM.fullmatch(item):
                raise ValueError(f"Invalid scope value: {item}")
            out.append(item)
    return out


@dataclass(frozen=True)
class UnsecuredValidator:
    """Kafka's default broker-side validator (``OAuthBearerUnsecuredValidatorCallbackHandler``), configured
    by the JAAS options ``unsecuredValidatorPrincipalClaimName`` (``sub``), ``unsecuredValidatorScopeClaimName``
    (``scope``), ``unsecuredValidatorRequiredScope`` (space-delimited, none) and
    ``unsecuredValidatorAllowableClockSkewMs`` (0)."""

    principal_claim: str = "sub"
    scope_claim: str = "scope"
    required_scope: tuple[str, ...] = ()
    clock_skew_ms: int = 0

    def validate(self, token: str, now_ms: int) -> OAuthBearerToken:
        jws = parse_unsecured_jws(token, self.principal_claim, self.scope_claim)
        skew = self.clock_skew_ms
        # the claims as given (seconds, maybe fractional), not rounded to milliseconds, as Kafka compares them
        iat, exp = _number(jws.claims, "iat"), _number(jws.claims, "exp")
        assert exp is not None
        if iat is not None and 1000 * iat > now_ms + skew:
            raise TokenValidationError(f"The Issued At value ({iat:f} seconds) was after the indicated time "
                                       f"({now_ms} ms) plus allowable clock skew ({skew} ms)")
        if now_ms - skew >= 1000 * exp:
            raise TokenValidationError(f"The indicated time ({now_ms} ms) minus allowable clock skew ({skew} ms) was on "
                                       f"or after the Expiration Time value ({exp:f} seconds)")
        if iat is not None and exp <= iat:
            raise TokenValidationError(f"The Expiration Time time ({exp:f} seconds) was not after the Issued At time "
                                       f"({iat:f} seconds)")
        for item in self.required_scope:
            if item not in jws.scope:
                required = "[" + ", ".join(self.required_scope) + "]"
                raise TokenValidationError(f"The provided scope ({sorted(jws.scope)}) was missing a required scope "
                                           f"({item}).  All required scope elements: {required}", scope=required)
        return jws


# -- the exchange ------------------------------------------------------------------------------------


def check_extensions(extensions: Mapping[str, str]) -> None:
    """RFC 7628 3.1 extension names and values (``auth`` is reserved); ValueError naming the bad one."""
    for key, value in extensions.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ValueError(f"extension {key!r}: names and values must be strings")
        if key == "auth":
            raise ValueError("Extension name auth is invalid")
        if not _EXT_KEY.fullmatch(key):
            raise ValueError(f"Extension name {key} is invalid (letters only)")
        if not _EXT_VALUE.fullmatch(value):
            raise ValueError(f"Extension value ({value}) for extension {key} is invalid")


def client_initial_response(token: str, extensions: Mapping[str, str] | None = None, authzid: str = "") -> bytes:
    """``n,[a=authzid],\\x01auth=Bearer <token>[\\x01k=v...]\\x01\\x01`` (Kafka's and librdkafka's layout)."""
    ext = "".join(f"{KVSEP}{k}={v}" for k, v in (extensions or {}).items())
    gs2 = f"n,a={authzid.replace('=', '=3D').replace(',', '=2C')}," if authzid else "n,,"
    return f"{gs2}{KVSEP}auth=Bearer {token}{ext}{KVSEP}{KVSEP}".encode()


def parse_client_initial_response(data: bytes) -> tuple[str, str, dict[str, str]]:
    """(token, authzid, extensions) of a client initial response; SaslError with Kafka's messages."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SaslError("Invalid OAUTHBEARER client first message") from None
    m = _INITIAL.fullmatch(text)
    if not m:
        raise SaslError("Invalid OAUTHBEARER client first message")
    props: dict[str, str] = {}
    for pair in m.group("kvpairs").split(KVSEP):
        if pair:
            key, _, value = pair.partition("=")
            props[key] = value
    auth = props.pop("auth", None)
    if auth is None:
        raise SaslError("Invalid OAUTHBEARER client first message: 'auth' not specified")
    try:
        check_extensions(props)
    except ValueError as exc:
        raise SaslError(str(exc)) from None
    am = _AUTH.fullmatch(auth)
    if not am:
        raise SaslError("Invalid OAUTHBEARER client first message: invalid 'auth' format")
    if am.group("scheme").lower() != "bearer":
        raise SaslError(f"Invalid scheme in OAUTHBEARER client first message: {am.group('scheme')}")
    authzid = (m.group("authzid") or "").replace("=2C", ",").replace("=3D", "=")
    return am.group("token"), authzid, props


def error_challenge(status: str, scope: str | None = None, openid_configuration: str | None = None) -> bytes:
    """RFC 7628 3.2.2's server error, in Kafka's spelling."""
    text = f'{{"status":"{status}"'
    if scope is not None:
        text += f', "scope":"{scope}"'
    if openid_configuration is not None:
        text += f', "openid-configuration":"{openid_configuration}"'
    return (text + "}").encode()


class OAuthBearerServer:
    """One server-side OAUTHBEARER exchange; ``validate(token_value) -> OAuthBearerToken`` or
    TokenValidationError (e.g. ``UnsecuredValidator(...).validate`` with the clock bound in)."""

    def __init__(self, validate: Callable[[str], OAuthBearerToken]) -> None:
        self._validate = validate
        self.token: OAuthBearerToken | None = None
        self.extensions: dict[str, str] = {}
        self.failure: str | None = None  # why the token was refused (for the server's log, not the client)
        self._error: bytes | None = None
        self.complete = False

    def evaluate(self, response: bytes) -> bytes:
        """The answer to one client message: b"" when authenticated, the JSON error for a refused token;
        SaslAuthenticationError (message meant for the client) or SaslError (the server's fixed text)."""
        if response == b"\x01" and self._error is not None:
            raise SaslAuthenticationError(self._error.decode())
        self._error = None
        self.failure = None  # a new initial response: an earlier refusal is not why this one fails
        token_value, authzid, extensions = parse_client_initial_response(response)
        try:
            token = self._validate(token_value)
        except TokenValidationError as exc:
            self.failure = str(exc)
            self._error = error_challenge("insufficient_scope" if exc.scope is not None else "invalid_token", exc.scope)
            return self._error
        if authzid and authzid != token.principal:
            raise SaslAuthenticationError(f"Authentication failed: Client requested an authorization id ({authzid}) "
                                          f"that is different from the token's principal name ({token.principal})")
        self.token = token
        self.extensions = extensions  # the unsecured validator accepts every extension, as Kafka's
        self.complete = True
        return b""


class OAuthBearerClient:
    """One client-side exchange: ``first()`` is the initial response; ``answer(server_message)`` is None when
    authenticated (an empty answer), else ``\\x01``, after which the server fails the exchange; the
    server's JSON error is then in ``server_error``."""

    def __init__(self, token: str, extensions: Mapping[str, str] | None = None) -> None:
        check_extensions(extensions or {})
        self.token = token
        self.extensions = dict(extensions or {})
        self.server_error: str | None = None

    def first(self) -> bytes:
        return client_initial_response(self.token, self.extensions)

    def answer(self, server_message: bytes) -> bytes | None:
        if not server_message:
            return None
        self.server_error = server_message.decode("utf-8", "replace")
        return b"\x01"


def scope_items(value: str | Iterable[str]) -> list[str]:
    """A comma-separated (librdkafka) or given list of scope items, empties and duplicates dropped."""
    items = value.split(",") if isinstance(value, str) else list(value)
    out: list[str] = []
    for item in items:
        if item and item not in out:
            out.append(item)
    return out
