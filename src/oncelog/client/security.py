"""TLS and SASL settings of one client, checked and built when the client is constructed.

:func:`build_security(config)` turns the ``security.protocol``, ``ssl.*`` and
``sasl.*`` properties into a :class:`Security` (an ``ssl.SSLContext`` or
None, the SASL mechanism and credentials or None); every connection of the
client uses it (:mod:`oncelog.client.aio.connection`). A file that cannot be
read, a key that does not match its certificate or a wrong ``ssl.key.password``,
an unsupported mechanism or missing credentials raise
:class:`~oncelog.client.config.ConfigError` here, at construction, not on the
first connection.
"""

from __future__ import annotations

import os
import random
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from oncelog.protocol import tls

__all__ = ["SASL_MECHANISMS", "Security", "build_security", "reauthentication_delay"]

SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")


@dataclass(frozen=True)
class Security:
    protocol: str  # PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL
    ssl_context: ssl.SSLContext | None = None
    check_hostname: bool = True
    sasl_mechanism: str | None = None
    sasl_username: str = ""
    sasl_password: str = field(default="", repr=False)  # never in a log line or a traceback
    oauth: Any = None  # OAUTHBEARER: the client's oncelog.client.oauthbearer.TokenSource

    @property
    def sasl(self) -> bool:
        return self.sasl_mechanism is not None


def reauthentication_delay(session_lifetime_ms: int, rand: float | None = None) -> float:
    """Seconds after a login before the connection re-authenticates (KIP-368): a random point between 85%
    and 95% of the session lifetime the broker gave, as the Java client picks it (room for network latency
    and clock drift, and connections of one client spread out)."""
    fraction = 0.85 + 0.10 * (random.random() if rand is None else rand)
    return session_lifetime_ms * fraction / 1000


def _readable(name: str, path: str) -> str:
    from oncelog.client.config import ConfigError

    return tls.readable(path, lambda why: ConfigError(f"{name}: {path!r} {why}"), "is not a file")


def build_security(values: Mapping[str, Any]) -> Security:
    """See the module docstring; ``values`` are parse_config's normalised values."""
    from oncelog.client.config import ConfigError

    protocol = str(values["security.protocol"]).upper()
    ctx: ssl.SSLContext | None = None
    check_hostname = values["ssl.endpoint.identification.algorithm"] == "https"
    if protocol in ("SSL", "SASL_SSL"):
        ca = values["ssl.ca.location"]
        cert, key, key_password = (values["ssl.certificate.location"], values["ssl.key.location"],
                                   values["ssl.key.password"])
        try:
            if ca is not None:
                # librdkafka takes a file or a directory of CA certificates
                if os.path.isdir(ca):
                    ctx = ssl.create_default_context(capath=ca)
                else:
                    ctx = ssl.create_default_context(cafile=_readable("ssl.ca.location", ca))
            else:  # no CA given: the system's trust store, as librdkafka's default "probe"
                ctx = ssl.create_default_context()
        except ssl.SSLError as exc:
            raise ConfigError(f"ssl.ca.location: {ca!r} holds no usable CA certificate ({exc.reason or exc})") from None
        ctx.check_hostname = check_hostname
        if cert is not None or key is not None:
            if cert is None:
                raise ConfigError("ssl.key.location is set but ssl.certificate.location is not")
            _readable("ssl.certificate.location", cert)
            if key is not None:
                _readable("ssl.key.location", key)
            try:
                ctx.load_cert_chain(cert, key, tls.key_password(key_password))
            except tls.KeyNeedsPassword:
                raise ConfigError(f"ssl.key.location: the private key in {key or cert!r} is encrypted: set "
                                  "ssl.key.password") from None
            except (ssl.SSLError, OSError) as exc:
                reason = getattr(exc, "reason", None) or exc.strerror or exc
                raise ConfigError(f"ssl.certificate.location/ssl.key.location: cannot load the client certificate "
                                  f"and key ({reason}; a wrong ssl.key.password?)") from None
        elif key_password is not None:
            raise ConfigError("ssl.key.password is set but ssl.key.location is not")
    mechanism = None
    username = password = ""
    if protocol.startswith("SASL_"):
        raw = values["sasl.mechanism"]
        if raw is None:
            raise ConfigError(f"sasl.mechanism is required with security.protocol={protocol} "
                              f"(one of {', '.join(SASL_MECHANISMS)}; Kafka's default GSSAPI is not supported)")
        mechanism = raw.strip().upper()
        if mechanism not in SASL_MECHANISMS:
            raise ConfigError(f"sasl.mechanism: {raw!r} is not supported (expected {' or '.join(SASL_MECHANISMS)})")
        if mechanism == "OAUTHBEARER":
            from oncelog.client.oauthbearer import token_source

            try:
                oauth = token_source(values)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            return Security(protocol, ctx, check_hostname, mechanism, oauth=oauth)
        username, password = values["sasl.username"], values["sasl.password"]
        if not username or password is None:
            raise ConfigError(f"sasl.username and sasl.password are required with sasl.mechanism={mechanism}")
    if values["oauth_cb"] is not None or values["enable.sasl.oauthbearer.unsecure.jwt"]:
        where = f"sasl.mechanism={mechanism}" if mechanism else f"security.protocol={protocol}"
        raise ConfigError(f"oauth_cb and enable.sasl.oauthbearer.unsecure.jwt need sasl.mechanism=OAUTHBEARER "
                          f"(and a SASL_* security.protocol), not {where}")
    return Security(protocol, ctx, check_hostname, mechanism, username or "", password or "")
