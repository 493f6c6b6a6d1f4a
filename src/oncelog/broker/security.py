"""TLS and SASL for the broker's listener: configuration (Kafka's names) and per-connection SASL state.

Configuration (read by :mod:`oncelog.broker.config`, see docs/configuration.md):

* TLS (``SSL`` and ``SASL_SSL`` listeners), PEM only: ``ssl.keystore.type=PEM``
  with ``ssl.keystore.location`` (one PEM file holding the private key and
  the certificate chain) or ``ssl.keystore.certificate.chain`` and
  ``ssl.keystore.key`` inline; ``ssl.key.password`` for an encrypted key;
  ``ssl.truststore.type=PEM`` with ``ssl.truststore.location`` or
  ``ssl.truststore.certificates`` (the CAs client certificates are checked
  against); ``ssl.client.auth=none|requested|required``.
* SASL (``SASL_PLAINTEXT`` and ``SASL_SSL``): ``sasl.enabled.mechanisms``
  (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER) and the users, from Kafka's JAAS
  syntax for PLAIN, ``listener.name.<listener>.plain.sasl.jaas.config=
  org.apache.kafka.common.security.plain.PlainLoginModule required
  user_alice="alice-secret";``. The SCRAM mechanisms authenticate the same
  users: their SCRAM credentials (random salt, 4096 iterations) are derived
  from those passwords at startup, where Kafka would read them from its
  metadata (``kafka-configs --alter --add-config 'SCRAM-SHA-256=[...]'``).
* OAUTHBEARER (KIP-255): ``listener.name.<listener>.oauthbearer.sasl.jaas.config=
  org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;`` with Kafka's
  default, unsecured, validator and its options ``unsecuredValidatorPrincipalClaimName``,
  ``unsecuredValidatorScopeClaimName``, ``unsecuredValidatorRequiredScope`` and
  ``unsecuredValidatorAllowableClockSkewMs`` (:class:`oncelog.protocol.oauthbearer.UnsecuredValidator`).
  A token's expiry bounds its session (KIP-368, as Kafka: the lifetime sent to the client is the
  token's remaining lifetime, or ``connections.max.reauth.ms`` when that is set and shorter).
* Re-authentication (KIP-368): ``connections.max.reauth.ms`` (default 0, off),
  also as ``listener.name.<listener>.connections.max.reauth.ms`` and
  ``listener.name.<listener>.<mechanism>.connections.max.reauth.ms`` (the
  mechanism in lower case), the most specific winning, as Kafka reads it.

Every key may carry Kafka's listener prefix ``listener.name.<listener>.``,
which wins over the plain key. Anything wrong is a ConfigError (one line).

:class:`SaslSession` is one connection's authentication state, driven by the
SaslHandshake and SaslAuthenticate handlers and by the dispatcher, which
serves nothing but ApiVersions, SaslHandshake and SaslAuthenticate before
the session is complete (Kafka's SaslServerAuthenticator). With
``connections.max.reauth.ms`` > 0, or an OAUTHBEARER token (until it expires,
if sooner), a session lasts that long: SaslAuthenticate
tells the client (``session_lifetime_ms``), a SaslHandshake on the live
connection starts a re-authentication (same mechanism and principal, at most
one a second, as Kafka's KafkaChannel), and the server closes a connection
whose session expired when it sends anything else.
"""

from __future__ import annotations

import datetime
import hmac
import logging
import os
import re
import ssl
import tempfile
import time
from dataclasses import dataclass, field
from oncelog.protocol.sasl import (
    SCRAM_MECHANISMS,
    SaslAuthenticationError,
    SaslError,
    ScramCredential,
    ScramServer,
    parse_plain,
    scram_credential,
)
from oncelog.protocol import tls
from oncelog.protocol.oauthbearer import OAuthBearerServer, UnsecuredValidator, parse_scope

log = logging.getLogger("oncelog.security")

SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
PLAIN_LOGIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
OAUTHBEARER_LOGIN_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
# Kafka's settings for other token validators (JWKS, OIDC): refused with OAUTHBEARER enabled rather than
# ignored, which would accept unsigned tokens where signed ones were meant
_OAUTH_UNSUPPORTED = re.compile(r"^(?:listener\.name\.[^.]+\.)?(?:[a-z0-9-]+\.)?(?:sasl\.server\.callback\.handler\.class"
                                r"|sasl\.oauthbearer\..+)$")
# the largest session_lifetime_ms SaslAuthenticate can carry here (an int64 field, encoded from a timedelta):
# a token expiring later (exp 1e20) gets this lifetime, as Kafka's long saturates
MAX_SESSION_LIFETIME_MS = min(2**63 - 1, datetime.timedelta.max // datetime.timedelta(milliseconds=1))
CLIENT_AUTH = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}

# the keys this module reads (each also with a listener.name.<name>. prefix)
SSL_KEYS = (
    "ssl.keystore.type", "ssl.keystore.location", "ssl.keystore.password", "ssl.keystore.certificate.chain",
    "ssl.keystore.key", "ssl.key.password", "ssl.truststore.type", "ssl.truststore.location",
    "ssl.truststore.password", "ssl.truststore.certificates", "ssl.client.auth",
)
SASL_KEYS = ("sasl.enabled.mechanisms", "connections.max.reauth.ms")
_PREFIXED = re.compile(r"^listener\.name\.([^.]+)\.(.+)$")


def is_security_key(key: str) -> bool:
    """A key this module understands (with or without a listener prefix)."""
    m = _PREFIXED.match(key)
    rest = m.group(2) if m else key
    if rest in SSL_KEYS or rest in SASL_KEYS:
        return True
    return bool(m) and (rest.endswith(".sasl.jaas.config") or rest.endswith(".connections.max.reauth.ms"))


def _config_error(message: str) -> Exception:
    from oncelog.broker.config import ConfigError

    return ConfigError(message)


@dataclass
class SaslSettings:
    mechanisms: tuple[str, ...]
    users: dict[str, str]  # PLAIN: name -> password
    oauthbearer: UnsecuredValidator | None = None  # OAUTHBEARER's validator
    scram: dict[str, dict[str, ScramCredential]] = field(default_factory=dict)  # mechanism -> name -> credential
    max_reauth_ms: dict[str, int] = field(default_factory=dict)  # mechanism -> connections.max.reauth.ms


@dataclass
class SecuritySettings:
    listener_name: str
    protocol: str
    ssl_context: ssl.SSLContext | None = None
    client_auth: str = "none"
    sasl: SaslSettings | None = None


class _Lookup:
    def __init__(self, props: dict[str, str], listener: str) -> None:
        self.props = props
        self.prefix = f"listener.name.{listener.lower()}."

    def key(self, name: str) -> str:
        return self.prefix + name if self.prefix + name in self.props else name

    def get(self, name: str) -> str | None:
        value = self.props.get(self.key(name))
        return None if value is None or value.strip() == "" else value.strip()


def load_security(props: dict[str, str], listener_name: str, protocol: str) -> SecuritySettings:
    """The listener's TLS context and SASL settings from ``props``; ConfigError on anything wrong."""
    look = _Lookup(props, listener_name)
    out = SecuritySettings(listener_name, protocol)
    if protocol in ("SSL", "SASL_SSL"):
        out.ssl_context, out.client_auth = _ssl_context(look, listener_name, sasl=protocol == "SASL_SSL")
    if protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
        out.sasl = _sasl_settings(look, props, listener_name)
    return out


# -- TLS ----------------------------------------------------------------------------------------

_PEM_BLOCK = re.compile(r"-----BEGIN ([A-Z0-9 ]+)-----(.*?)-----END \1-----", re.S)


def _normalise_pem(text: str, key: str) -> str:
    """PEM blocks rewrapped at 64 columns: a properties value joined from continued lines has lost its
    line breaks, which Kafka's PEM reader tolerates and OpenSSL does not."""
    blocks = _PEM_BLOCK.findall(text.replace("\\n", "\n"))  # a literal \n (Java properties' escape) too
    if not blocks:
        raise _config_error(f"invalid value for {key}: no PEM block (-----BEGIN ...-----) found")
    out = []
    for label, body in blocks:
        b64 = "".join(body.split())
        # an encrypted traditional key carries "Proc-Type:"/"DEK-Info:" headers: keep those blocks as given
        if ":" in body:
            out.append(f"-----BEGIN {label}-----{body}-----END {label}-----\n")
            continue
        lines = [b64[i : i + 64] for i in range(0, len(b64), 64)]
        out.append(f"-----BEGIN {label}-----\n" + "\n".join(lines) + f"\n-----END {label}-----\n")
    return "".join(out)


def _pem_type(look: _Lookup, name: str) -> None:
    key = look.key(name)
    value = look.get(name)
    if value is None:
        raise _config_error(f"{key} must be PEM: oncelog reads PEM key material only (Kafka's default is JKS)")
    if value.upper() != "PEM":
        raise _config_error(f"invalid value {value!r} for {key}: oncelog supports PEM only (JKS and PKCS12 are not "
                            "supported)")


def _readable(key: str, path: str) -> str:
    return tls.readable(path, lambda why: _config_error(f"invalid value {path!r} for {key}: {why}"), "no such file")


def _client_auth(look: _Lookup, sasl: bool) -> str:
    """ssl.client.auth; on a SASL_SSL listener only its listener-prefixed form counts (KIP-684, as Kafka's
    ChannelBuilders: the broker-wide key is for SSL listeners, and is ignored there with a warning)."""
    if not sasl:
        return (look.get("ssl.client.auth") or "none").lower()
    prefixed = look.props.get(look.prefix + "ssl.client.auth")
    if prefixed is None or not prefixed.strip():
        plain = look.props.get("ssl.client.auth")
        if plain is not None and plain.strip().lower() != "none":
            log.warning("ssl.client.auth=%s is applied only to SSL listeners: set %sssl.client.auth to ask SASL_SSL "
                        "clients for certificates (as Kafka, KIP-684)", plain.strip(), look.prefix)
        return "none"
    return prefixed.strip().lower()


def _ssl_context(look: _Lookup, listener: str, sasl: bool = False) -> tuple[ssl.SSLContext, str]:
    location = look.get("ssl.keystore.location")
    chain, key = look.get("ssl.keystore.certificate.chain"), look.get("ssl.keystore.key")
    if location is None and chain is None and key is None:
        raise _config_error(f"listener {listener} uses TLS but no key store is configured: set ssl.keystore.type=PEM "
                            "and ssl.keystore.location (a PEM file with the private key and the certificate chain)")
    _pem_type(look, "ssl.keystore.type")
    if look.get("ssl.keystore.password") is not None:
        raise _config_error(f"{look.key('ssl.keystore.password')} cannot be set with a PEM key store: set "
                            "ssl.key.password for an encrypted private key (as Kafka)")
    if location is not None and (chain is not None or key is not None):
        raise _config_error("set either ssl.keystore.location or ssl.keystore.certificate.chain and ssl.keystore.key, "
                            "not both")
    if location is None and (chain is None or key is None):
        missing = "ssl.keystore.key" if key is None else "ssl.keystore.certificate.chain"
        raise _config_error(f"{missing} is required with the other inline PEM key store setting")
    password = look.get("ssl.key.password")
    client_auth = _client_auth(look, sasl)
    if client_auth not in CLIENT_AUTH:
        raise _config_error(f"invalid value {look.get('ssl.client.auth')!r} for {look.key('ssl.client.auth')}: "
                            "expected one of required, requested, none")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2  # Kafka's default ssl.enabled.protocols: TLSv1.2,TLSv1.3
    try:
        if location is not None:
            _readable(look.key("ssl.keystore.location"), location)
            ctx.load_cert_chain(location, None, tls.key_password(password))
        else:
            with tempfile.TemporaryDirectory(prefix="oncelog-pem-") as tmp:
                cert_path, key_path = os.path.join(tmp, "chain.pem"), os.path.join(tmp, "key.pem")
                for path, text, name in ((cert_path, chain, "ssl.keystore.certificate.chain"),
                                         (key_path, key, "ssl.keystore.key")):
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                    with os.fdopen(fd, "w") as f:
                        f.write(_normalise_pem(str(text), look.key(name)))
                ctx.load_cert_chain(cert_path, key_path, tls.key_password(password))
    except tls.KeyNeedsPassword:
        raise _config_error(f"cannot load the key store of listener {listener}: its private key is encrypted: set "
                            f"{look.key('ssl.key.password')}") from None
    except (ssl.SSLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc.strerror or exc
        raise _config_error(f"cannot load the key store of listener {listener}: {reason} (a key that does "
                            "not match the certificate, no private key in the file, or a wrong ssl.key.password?)"
                            ) from None
    if client_auth != "none":
        trust_location, trust_inline = look.get("ssl.truststore.location"), look.get("ssl.truststore.certificates")
        if trust_location is not None or trust_inline is not None:
            _pem_type(look, "ssl.truststore.type")
            if look.get("ssl.truststore.password") is not None:
                raise _config_error(f"{look.key('ssl.truststore.password')} cannot be set with a PEM trust store")
            try:
                if trust_location is not None:
                    ctx.load_verify_locations(cafile=_readable(look.key("ssl.truststore.location"), trust_location))
                else:
                    ctx.load_verify_locations(cadata=_normalise_pem(str(trust_inline),
                                                                    look.key("ssl.truststore.certificates")))
            except ssl.SSLError as exc:
                raise _config_error(f"cannot load the trust store of listener {listener}: {exc.reason or exc}") from None
        else:
            ctx.load_default_certs(ssl.Purpose.CLIENT_AUTH)  # as a JVM's default cacerts
        ctx.verify_mode = CLIENT_AUTH[client_auth]
    return ctx, client_auth


# -- SASL -----------------------------------------------------------------------------------------

_JAAS = re.compile(r"^\s*(\S+)\s+(required|requisite|sufficient|optional)\b(.*?);\s*$", re.S)
_JAAS_OPTION = re.compile(r'\s*([A-Za-z0-9_.$-]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^\s";]+)', re.S)


def printable(text: object) -> str:
    """``text`` for a log line: control and other unprintable characters escaped (``\\n``, ``\\x1b``), so that a
    principal or message taken from a client cannot forge or garble log lines."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def parse_jaas(value: str, key: str) -> tuple[str, dict[str, str]]:
    """One JAAS login module entry, ``Module flag k="v" ...;`` -> (module, options)."""
    m = _JAAS.match(value)
    if not m:
        raise _config_error(f"invalid value for {key}: expected one JAAS entry 'LoginModule required key=\"value\" ...;'")
    module, _flag, rest = m.groups()
    options: dict[str, str] = {}
    pos = 0
    while pos < len(rest) and rest[pos:].strip():
        om = _JAAS_OPTION.match(rest, pos)
        if not om:
            raise _config_error(f"invalid value for {key}: cannot parse JAAS options at {rest[pos:].strip()[:30]!r}")
        name, raw = om.groups()
        options[name] = re.sub(r"\\(.)", r"\1", raw[1:-1]) if raw.startswith('"') else raw
        pos = om.end()
    return module, options


def _sasl_settings(look: _Lookup, props: dict[str, str], listener: str) -> SaslSettings:
    raw = look.get("sasl.enabled.mechanisms")
    if raw is None:
        raise _config_error(f"listener {listener} uses SASL but sasl.enabled.mechanisms is not set (Kafka's default "
                            f"GSSAPI is not supported): set it to some of {', '.join(SASL_MECHANISMS)}")
    mechanisms = tuple(m.strip().upper() for m in raw.split(",") if m.strip())
    bad = [m for m in mechanisms if m not in SASL_MECHANISMS]
    if bad or not mechanisms:
        raise _config_error(f"invalid value {raw!r} for {look.key('sasl.enabled.mechanisms')}: {', '.join(bad) or 'empty'}"
                            f" not supported (expected some of {', '.join(SASL_MECHANISMS)})")
    users: dict[str, str] = {}
    if any(m != "OAUTHBEARER" for m in mechanisms):
        users = _users(props, listener)
    settings = SaslSettings(mechanisms, users)
    if "OAUTHBEARER" in mechanisms:
        settings.oauthbearer = _oauthbearer_validator(props, listener)
    for mech in mechanisms:
        if mech in SCRAM_MECHANISMS:
            settings.scram[mech] = {name: scram_credential(mech, pw) for name, pw in users.items()}
        settings.max_reauth_ms[mech] = _max_reauth_ms(look, mech)
    return settings


def _users(props: dict[str, str], listener: str) -> dict[str, str]:
    """The PLAIN (and SCRAM) users: the PlainLoginModule JAAS entry's user_NAME="PASSWORD" options."""
    jaas_key = f"listener.name.{listener.lower()}.plain.sasl.jaas.config"
    if jaas_key not in props:
        raise _config_error(f"listener {listener} uses SASL but has no users: set {jaas_key}={PLAIN_LOGIN_MODULE} "
                            'required user_NAME="PASSWORD";  (the SCRAM mechanisms use the same users)')
    module, options = parse_jaas(props[jaas_key], jaas_key)
    if module != PLAIN_LOGIN_MODULE:
        raise _config_error(f"invalid value for {jaas_key}: the login module must be {PLAIN_LOGIN_MODULE}, not {module}")
    users = {name[5:]: pw for name, pw in options.items() if name.startswith("user_") and len(name) > 5}
    if not users:
        raise _config_error(f"invalid value for {jaas_key}: no user_NAME=\"PASSWORD\" option, so nobody could log in")
    return users


def _oauthbearer_validator(props: dict[str, str], listener: str) -> UnsecuredValidator:
    """OAUTHBEARER's JAAS entry (required, as Kafka needs a login module for every enabled mechanism) and
    its unsecuredValidator* options (Kafka's OAuthBearerUnsecuredValidatorCallbackHandler; other options,
    e.g. the broker's own unsecuredLogin* token, do not concern the validator and are ignored)."""
    for key in props:
        if _OAUTH_UNSUPPORTED.match(key):
            raise _config_error(f"{key} is not supported: oncelog validates OAUTHBEARER tokens with Kafka's default "
                                "unsecured validator only (unsigned JWTs, for development and tests); remove it")
    jaas_key = f"listener.name.{listener.lower()}.oauthbearer.sasl.jaas.config"
    if jaas_key not in props:
        raise _config_error(f"listener {listener} enables OAUTHBEARER but {jaas_key} is not set: set it to "
                            f"{OAUTHBEARER_LOGIN_MODULE} required;  (with unsecuredValidator* options if needed)")
    module, options = parse_jaas(props[jaas_key], jaas_key)
    if module != OAUTHBEARER_LOGIN_MODULE:
        raise _config_error(f"invalid value for {jaas_key}: the login module must be {OAUTHBEARER_LOGIN_MODULE}, "
                            f"not {module}")

    def option(name: str, default: str) -> str:
        value = options.get(name, "")
        return value.strip() if value.strip() else default

    skew_text = option("unsecuredValidatorAllowableClockSkewMs", "0")
    try:
        skew = int(skew_text)
    except ValueError:
        raise _config_error(f"invalid value for {jaas_key}: unsecuredValidatorAllowableClockSkewMs={skew_text!r} is "
                            "not an integer") from None
    if skew < 0 or skew > 2**31 - 1:
        raise _config_error(f"invalid value for {jaas_key}: unsecuredValidatorAllowableClockSkewMs must be between 0 "
                            f"and 2147483647, not {skew}")
    try:
        scope = tuple(parse_scope(option("unsecuredValidatorRequiredScope", "")))
    except ValueError as exc:
        raise _config_error(f"invalid value for {jaas_key}: unsecuredValidatorRequiredScope: {exc}") from None
    return UnsecuredValidator(option("unsecuredValidatorPrincipalClaimName", "sub"),
                              option("unsecuredValidatorScopeClaimName", "scope"), scope, skew)


def _max_reauth_ms(look: _Lookup, mechanism: str) -> int:
    """connections.max.reauth.ms for one mechanism: the listener-and-mechanism prefixed key, then the listener
    prefixed one, then the plain key (Kafka's per-mechanism lookup); a long, 0 or less meaning off."""
    from oncelog.broker.config import check_long

    for key in (f"{look.prefix}{mechanism.lower()}.connections.max.reauth.ms",
                f"{look.prefix}connections.max.reauth.ms", "connections.max.reauth.ms"):
        if key in look.props:
            return check_long(key, look.props[key])
    return 0


class SaslSession:
    """One connection's SASL state (Kafka's SaslServerAuthenticator and its re-authentication)."""

    HANDSHAKE, AUTHENTICATE, COMPLETE, FAILED = "handshake", "authenticate", "complete", "failed"

    def __init__(self, settings: SaslSettings, peer: str = "?") -> None:
        self.settings = settings
        self.peer = peer
        self.state = self.HANDSHAKE
        self.mechanism: str | None = None
        self.raw_tokens = False  # SaslHandshake v0: the tokens that follow have no Kafka header
        self.principal: str | None = None
        self.close_after_response = False
        self.api_versions_done = False  # one ApiVersions before the handshake (Kafka's SaslServerAuthenticator)
        self._scram: ScramServer | None = None
        self._oauth: OAuthBearerServer | None = None
        # KIP-368: the session's end (time.monotonic()) when connections.max.reauth.ms > 0, else None
        self.session_lifetime_ms = 0
        self.expires_at: float | None = None
        self.ended_by = "connections.max.reauth.ms"  # what bounds the session, for the log line when it expires
        self.reauth_armed = False  # a SaslHandshake received on the live session starts a re-authentication
        self._last_reauth_start = 0.0
        self._previous: tuple[str, str] | None = None  # (mechanism, principal) being re-authenticated
        self._bad_mechanism: str | None = None

    @property
    def complete(self) -> bool:
        return self.state == self.COMPLETE

    @property
    def reauthenticating(self) -> bool:
        return self._previous is not None

    def expired(self, now: float) -> bool:
        """The session has outlived its lifetime (Kafka's serverAuthenticationSessionExpired)."""
        return self.expires_at is not None and now > self.expires_at

    def arm_reauthentication(self, now: float) -> bool:
        """A SaslHandshake arrived on the authenticated connection at ``now``: whether it starts a
        re-authentication (Kafka's maybeBeginServerReauthentication: only when the session has a lifetime,
        and not within a second of the previous start). If not, it is served as any request: with
        ILLEGAL_SASL_STATE, or by closing the connection when the session has expired."""
        if self.expires_at is None or (self._last_reauth_start and now - self._last_reauth_start < 1.0):
            return False
        self._last_reauth_start = now
        self.reauth_armed = True
        return True

    def begin_reauthentication(self) -> None:
        """The armed SaslHandshake is being handled: back to the handshake state, remembering who logged in."""
        assert self.mechanism is not None and self.principal is not None
        self._previous = (self.mechanism, self.principal)
        self.reauth_armed = False
        self.state = self.HANDSHAKE
        self.api_versions_done = True  # re-authentication starts with the SaslHandshake itself
        self._scram = None
        self._oauth = None

    def handshake(self, mechanism: str, version: int) -> int:
        """0, or UNSUPPORTED_SASL_MECHANISM (33) after which the connection closes."""
        if mechanism not in self.settings.mechanisms:
            log.warning("closing connection from %s: SASL mechanism %s is not enabled", self.peer,
                        printable(repr(mechanism)))
            self.state = self.FAILED
            self.close_after_response = True
            return 33
        self.raw_tokens = version == 0
        self.state = self.AUTHENTICATE
        if self._previous is not None and mechanism != self._previous[0]:
            # answered NONE, as Kafka does; the first token then closes the connection
            self._bad_mechanism = (f"SASL mechanism '{mechanism}' requested by client is not supported for "
                                   f"re-authentication of mechanism '{self._previous[0]}'")
            return 0
        self.mechanism = mechanism
        if mechanism in SCRAM_MECHANISMS:
            self._scram = ScramServer(mechanism)
        elif mechanism == "OAUTHBEARER":
            validator = self.settings.oauthbearer
            assert validator is not None
            self._oauth = OAuthBearerServer(lambda value: validator.validate(value, int(time.time() * 1000)))
        return 0

    def evaluate(self, token: bytes) -> bytes:
        """The server's answer to one client token; SaslError (its message goes to the client) on failure,
        CloseConnection (no answer) for a re-authentication that changed mechanism."""
        if self._bad_mechanism is not None:
            from oncelog.broker.context import CloseConnection

            self.state = self.FAILED
            log.warning("closing connection from %s: %s", self.peer, printable(self._bad_mechanism))
            raise CloseConnection(self._bad_mechanism)
        try:
            if self.mechanism == "PLAIN":
                _authzid, user, password = parse_plain(token)
                expected = self.settings.users.get(user)
                if expected is None or not hmac.compare_digest(expected.encode(), password.encode()):
                    raise SaslAuthenticationError("Authentication failed: Invalid username or password")
                self._done(user)
                return b""
            oauth = self._oauth
            if oauth is not None:
                answer = oauth.evaluate(token)
                if oauth.token is not None:
                    self._done(oauth.token.principal, oauth.token.lifetime_ms)
                else:  # the token is refused: the JSON error goes out, the client's \x01 ends the exchange, whose
                    # WARNING says why; here DEBUG (as Kafka), as a client may send token after token unauthenticated
                    log.debug("%s of %s with OAUTHBEARER: token refused: %s",
                              "re-authentication" if self._previous else "authentication", self.peer,
                              printable(oauth.failure))
                return answer
            scram = self._scram
            assert scram is not None and self.mechanism is not None
            creds = self.settings.scram[self.mechanism]
            if scram.username is None:
                return scram.first(token, creds.get)
            answer = scram.final(token)
            self._done(scram.username)
            return answer
        except SaslError as exc:
            self.state = self.FAILED
            self.close_after_response = True
            why = f" (token refused: {self._oauth.failure})" if self._oauth is not None and self._oauth.failure else ""
            log.warning("%s of %s with %s failed: %s", "re-authentication" if self._previous else "authentication",
                        self.peer, self.mechanism, printable(f"{exc}{why}"))
            raise

    def _done(self, user: str, credential_expiry_ms: int | None = None) -> None:
        previous = self._previous
        if previous is not None and previous[1] != user:
            raise SaslAuthenticationError(f"Cannot change principals during re-authentication from "
                                          f"User.{previous[1]}: User.{user}")
        self.state = self.COMPLETE
        self.principal = user
        assert self.mechanism is not None
        # KIP-368, as Kafka's SaslServerAuthenticator: the session lasts connections.max.reauth.ms, or until the
        # credential expires (an OAUTHBEARER token), whichever comes first; neither: no expiry
        max_reauth = self.settings.max_reauth_ms.get(self.mechanism, 0)
        if credential_expiry_ms is None:
            self.ended_by = "connections.max.reauth.ms"
            lifetime = min(max(max_reauth, 0), MAX_SESSION_LIFETIME_MS)
            self.expires_at = time.monotonic() + lifetime / 1000 if lifetime > 0 else None
        else:
            remaining = credential_expiry_ms - int(time.time() * 1000)
            lifetime = max(0, min(remaining, max_reauth) if max_reauth > 0 else remaining)
            self.ended_by = "connections.max.reauth.ms" if 0 < max_reauth < remaining else \
                f"the expiry of its {self.mechanism} token"
            lifetime = min(lifetime, MAX_SESSION_LIFETIME_MS)
            self.expires_at = time.monotonic() + lifetime / 1000
        self.session_lifetime_ms = lifetime
        self._previous = None
        if previous is None:
            log.info("%s authenticated as User:%s with %s", self.peer, printable(user), self.mechanism)
        else:
            log.info("%s re-authenticated as User:%s with %s", self.peer, printable(user), self.mechanism)


def failure_message(mechanism: str | None, exc: SaslError, reauthenticating: bool = False) -> str:
    """What Kafka tells the client (SaslServerAuthenticator): the message of a SaslAuthenticationError,
    otherwise a fixed text, so that, e.g., an unknown SCRAM user and a wrong password look the same."""
    if isinstance(exc, SaslAuthenticationError):
        return str(exc)
    during = "re-authentication" if reauthenticating else "authentication"
    return f"Authentication failed during {during} due to invalid credentials with SASL mechanism {mechanism}"


def security_warnings(settings: SecuritySettings) -> list[str]:
    """What the broker warns about at startup: OAUTHBEARER's unsecured validator beside PLAIN or SCRAM, where
    anyone can mint a token naming a PLAIN/SCRAM user and be that user without the password (Kafka's
    default validator does the same; oncelog has no ACLs to limit it)."""
    sasl = settings.sasl
    if sasl is None or "OAUTHBEARER" not in sasl.mechanisms or len(sasl.mechanisms) == 1:
        return []
    others = ",".join(m for m in sasl.mechanisms if m != "OAUTHBEARER")
    return [f"listener {settings.listener_name} enables OAUTHBEARER with the unsecured validator beside {others}: "
            f"any client can mint an unsigned token and log in as any principal, including the {others} users "
            "without their passwords; for development and tests only"]


def describe(settings: SecuritySettings) -> str:
    parts = [f"{settings.listener_name} ({settings.protocol})"]
    if settings.ssl_context is not None:
        parts.append(f"ssl.client.auth={settings.client_auth}")
    if settings.sasl is not None:
        users = f" for {len(settings.sasl.users)} user(s)" if settings.sasl.users else ""
        parts.append(f"SASL {','.join(settings.sasl.mechanisms)}{users}")
    return ", ".join(parts)
