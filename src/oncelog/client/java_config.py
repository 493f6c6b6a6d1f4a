"""Java client properties as oncelog client properties (TLS and SASL).

A Kafka user's client settings are written for the Java client: a
``client.properties`` for Kafka's tools (``--command-config``), or the
``kafka.*`` options of a Spark job. oncelog's client takes librdkafka's names
for TLS and SASL (docs/client.md), so :func:`from_java` maps the Java-only ones:

* ``sasl.jaas.config`` with ``org.apache.kafka.common.security.plain.PlainLoginModule``
  or ``org.apache.kafka.common.security.scram.ScramLoginModule`` and
  ``username="..." password="...";`` -> ``sasl.username`` / ``sasl.password``
  (parsed by Kafka's rules: one login module, a control flag, quoted or bare
  values, ``;`` at the end);
* ``sasl.jaas.config`` with ``org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule``
  and Kafka's unsecured-token options (``unsecuredLoginStringClaim_sub="alice"``,
  ``unsecuredLoginLifetimeSeconds``, ``unsecuredLoginPrincipalClaimName``,
  ``unsecuredLoginScopeClaimName``, ``unsecuredLoginListClaim_<scope claim>``,
  ``unsecuredLoginExtension_<name>``) -> ``enable.sasl.oauthbearer.unsecure.jwt=true`` and
  the equivalent ``sasl.oauthbearer.config`` (librdkafka's builder makes the same token);
* ``ssl.truststore.location`` with ``ssl.truststore.type=PEM`` -> ``ssl.ca.location``;
* ``ssl.keystore.location`` with ``ssl.keystore.type=PEM`` (key and certificate
  chain in one file, the key's password in ``ssl.key.password``) ->
  ``ssl.certificate.location``.

Java key stores (JKS, PKCS12: Kafka's default type is JKS), inline PEM values
(``ssl.truststore.certificates``, ``ssl.keystore.key``), other login
modules (GSSAPI) and OAUTHBEARER's OIDC login (a token endpoint) raise :class:`~oncelog.client.config.ConfigError`
naming what to use instead. Every other key is passed through unchanged, to be
checked by :func:`~oncelog.client.config.parse_config` (so a typo is still an
unknown property).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from oncelog.client.config import ConfigError

__all__ = ["LOGIN_MODULES", "from_java", "is_security_key", "parse_jaas"]

PLAIN_LOGIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM_LOGIN_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
OAUTHBEARER_LOGIN_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
LOGIN_MODULES = (PLAIN_LOGIN_MODULE, SCRAM_LOGIN_MODULE)
_FLAGS = ("required", "requisite", "sufficient", "optional")
_STORE_TYPES = ("JKS", "PKCS12", "PEM")


def is_security_key(name: str) -> bool:
    """Whether a client property is a TLS or SASL one (``security.protocol``, ``ssl.*``, ``sasl.*``)."""
    return name == "security.protocol" or name.startswith(("ssl.", "sasl."))


def _tokens(text: str) -> list[tuple[str, str]]:
    """JAAS tokens as Kafka's ``JaasConfig`` reads them (a ``StreamTokenizer``): ``("word", w)``,
    ``("quoted", s)``, ``(";", ";")``, ``("=", "=")``; white space separates, ``//`` and ``/* */``
    are comments, single or double quotes make one value (backslash escapes inside)."""
    out: list[tuple[str, str]] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c <= " ":
            i += 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j + 1
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
        elif c == "/":  # a lone slash starts a comment to the end of the line, as in StreamTokenizer
            j = text.find("\n", i)
            i = n if j < 0 else j + 1
        elif c in ";=":
            out.append((c, c))
            i += 1
        elif c in "\"'":
            buf: list[str] = []
            i += 1
            while i < n and text[i] != c and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n:
                    i += 1
                    buf.append({"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f"}.get(text[i], text[i]))
                else:
                    buf.append(text[i])
                i += 1
            i += 1  # the closing quote (an unterminated value ends at the line's end, as in Java)
            out.append(("quoted", "".join(buf)))
        else:
            j = i
            while j < n and text[j] > " " and text[j] not in ";=\"'/":
                j += 1
            out.append(("word", text[i:j]))
            i = j
    return out


def parse_jaas(value: str, key: str = "sasl.jaas.config") -> list[tuple[str, str, dict[str, str]]]:
    """``Module flag k=v ...;`` entries -> ``[(module, flag, options)]``, by Kafka's JaasConfig rules."""
    toks = _tokens(value)
    entries: list[tuple[str, str, dict[str, str]]] = []
    i = 0
    while i < len(toks):
        kind, module = toks[i]
        if kind == ";" or kind == "=":
            raise ConfigError(f"{key}: expected a login module class name, not {module!r}")
        i += 1
        if i >= len(toks):
            raise ConfigError(f"{key}: login module control flag not specified")
        flag = toks[i][1]
        if flag.lower() not in _FLAGS:
            raise ConfigError(f"{key}: invalid login module control flag {flag!r} (expected required, requisite, "
                              "sufficient or optional)")
        i += 1
        options: dict[str, str] = {}
        while i < len(toks) and toks[i][0] != ";":
            name = toks[i][1]
            if i + 2 >= len(toks) or toks[i + 1][0] != "=" or toks[i + 2][0] not in ("word", "quoted"):
                raise ConfigError(f"{key}: value not specified for key {name!r}")
            options[name] = toks[i + 2][1]
            i += 3
        if i >= len(toks):
            raise ConfigError(f"{key}: JAAS config entry not terminated by a semicolon")
        i += 1
        entries.append((module, flag, options))
    if not entries:
        raise ConfigError(f"{key}: login module not specified")
    return entries


def _credentials(value: str) -> tuple[str, str]:
    """sasl.jaas.config -> (username, password), for the PLAIN and SCRAM login modules only."""
    entries = parse_jaas(value)
    if len(entries) != 1:
        # the Java client: "JAAS config property contains N login modules, should be 1 module"
        raise ConfigError(f"sasl.jaas.config: {len(entries)} login modules given, expected 1")
    module, _flag, options = entries[0]
    if module not in LOGIN_MODULES:
        raise ConfigError(f"sasl.jaas.config: login module {module} is not supported by oncelog's client (expected "
                          f"{PLAIN_LOGIN_MODULE} or {SCRAM_LOGIN_MODULE} with username=\"...\" password=\"...\", "
                          "for sasl.mechanism PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)")
    if options.get("tokenauth", "").lower() == "true":
        raise ConfigError("sasl.jaas.config: tokenauth=true (delegation tokens) is not supported by oncelog's client")
    missing = [k for k in ("username", "password") if k not in options]
    if missing:
        raise ConfigError(f"sasl.jaas.config: {' and '.join(missing)} not given ({module.rsplit('.', 1)[1]} "
                          'required username="..." password="...";)')
    return options["username"], options["password"]


def _unsecured_login(options: dict[str, str]) -> str:
    """Kafka's unsecured login options (OAuthBearerUnsecuredLoginCallbackHandler) as librdkafka's
    ``sasl.oauthbearer.config``, which builds the same kind of token."""
    prefix = "unsecuredLogin"
    if not any(k.startswith(prefix) for k in options):
        raise ConfigError(f"sasl.jaas.config: {OAUTHBEARER_LOGIN_MODULE} without unsecuredLogin* options (an OIDC "
                          "token endpoint, sasl.login.callback.handler.class) is not supported by oncelog's client: "
                          "give the token through oauth_cb in code, or unsecuredLoginStringClaim_sub=\"NAME\" for "
                          "unsigned tokens")
    principal_claim = options.get(f"{prefix}PrincipalClaimName", "").strip() or "sub"
    scope_claim = options.get(f"{prefix}ScopeClaimName", "").strip() or "scope"
    parts: list[str] = []
    principal = options.get(f"{prefix}StringClaim_{principal_claim}")
    if not principal or not principal.strip():
        raise ConfigError(f"sasl.jaas.config: no principal: set {prefix}StringClaim_{principal_claim}=\"NAME\"")
    parts.append(f"principal={principal}")
    if principal_claim != "sub":
        parts.append(f"principalClaimName={principal_claim}")
    for name, value in options.items():
        if not name.startswith(prefix) or name in (f"{prefix}PrincipalClaimName", f"{prefix}ScopeClaimName",
                                                   f"{prefix}StringClaim_{principal_claim}"):
            continue
        if name == f"{prefix}LifetimeSeconds":
            parts.append(f"lifeSeconds={value}")
        elif name == f"{prefix}ListClaim_{scope_claim}":
            items = [v for v in value[1:].split(value[0]) if v] if len(value) > 1 else []  # first char: delimiter
            if items:
                parts += [f"scope={','.join(items)}"] + ([f"scopeClaimName={scope_claim}"] if scope_claim != "scope"
                                                          else [])
        elif name.startswith(f"{prefix}Extension_") and len(name) > len(f"{prefix}Extension_"):
            parts.append(f"extension_{name[len(prefix) + len('Extension_'):]}={value}")
        else:
            raise ConfigError(f"sasl.jaas.config: {name} cannot be expressed with oncelog's unsecured token builder "
                              "(librdkafka's: a principal, a scope list, a lifetime and extensions)")
    if any(" " in p or not p.partition("=")[2] for p in parts):
        raise ConfigError("sasl.jaas.config: unsecuredLogin* values must be non-empty and without spaces for "
                          "oncelog's unsecured token builder")
    return " ".join(parts)


def _store_type(props: Mapping[str, Any], key: str) -> str:
    raw = props.get(key)
    kind = "JKS" if raw is None else str(raw).strip().upper()  # Kafka's default ssl.*store.type is JKS
    if kind not in _STORE_TYPES:
        raise ConfigError(f"{key}: invalid value {raw!r} (expected JKS, PKCS12 or PEM)")
    return kind


def from_java(props: Mapping[str, Any]) -> dict[str, Any]:
    """``props`` with the Java client's TLS and SASL properties mapped to oncelog's (module docstring).

    Raises :class:`~oncelog.client.config.ConfigError` for what oncelog's client cannot do.
    """
    out = dict(props)
    jaas = out.pop("sasl.jaas.config", None)
    entries = parse_jaas(str(jaas)) if jaas is not None else []
    if len(entries) == 1 and entries[0][0] == OAUTHBEARER_LOGIN_MODULE:
        if out.get("sasl.oauthbearer.config") is not None:
            raise ConfigError("set either sasl.jaas.config or sasl.oauthbearer.config, not both")
        out["enable.sasl.oauthbearer.unsecure.jwt"] = True
        out["sasl.oauthbearer.config"] = _unsecured_login(entries[0][2])
    elif jaas is not None:
        if out.get("sasl.username") is not None or out.get("sasl.password") is not None:
            raise ConfigError("set either sasl.jaas.config or sasl.username/sasl.password, not both")
        out["sasl.username"], out["sasl.password"] = _credentials(str(jaas))

    trust_type = _store_type(out, "ssl.truststore.type")
    out.pop("ssl.truststore.type", None)
    trust = out.pop("ssl.truststore.location", None)
    trust_password = out.pop("ssl.truststore.password", None)
    if out.pop("ssl.truststore.certificates", None) is not None:
        raise ConfigError("ssl.truststore.certificates (PEM given inline) is not supported by oncelog's client: put "
                          "the CA certificates in a PEM file and set ssl.truststore.location (with "
                          "ssl.truststore.type=PEM) or ssl.ca.location to it")
    if trust is not None:
        if trust_type != "PEM":
            raise ConfigError(f"ssl.truststore.location: a {trust_type} trust store is not supported by oncelog's "
                              "client (Python reads PEM only): export the CA certificates as PEM (keytool "
                              "-exportcert -rfc) and set ssl.truststore.type=PEM, or set ssl.ca.location to the "
                              "PEM file")
        if trust_password is not None:
            raise ConfigError("ssl.truststore.password cannot be set with ssl.truststore.type=PEM (as in Kafka)")
        if out.get("ssl.ca.location") is not None:
            raise ConfigError("set either ssl.truststore.location or ssl.ca.location, not both")
        out["ssl.ca.location"] = trust
    elif trust_password is not None:
        raise ConfigError("ssl.truststore.password is set but ssl.truststore.location is not")

    key_type = _store_type(out, "ssl.keystore.type")
    out.pop("ssl.keystore.type", None)
    keystore = out.pop("ssl.keystore.location", None)
    keystore_password = out.pop("ssl.keystore.password", None)
    for inline in ("ssl.keystore.key", "ssl.keystore.certificate.chain"):
        if out.pop(inline, None) is not None:
            raise ConfigError(f"{inline} (PEM given inline) is not supported by oncelog's client: put the key and "
                              "certificate chain in a PEM file and set ssl.keystore.location (with "
                              "ssl.keystore.type=PEM), or set ssl.certificate.location and ssl.key.location")
    if keystore is not None:
        if key_type != "PEM":
            raise ConfigError(f"ssl.keystore.location: a {key_type} key store is not supported by oncelog's client "
                              "(Python reads PEM only): convert it to PEM (openssl pkcs12) and set "
                              "ssl.keystore.type=PEM, or set ssl.certificate.location and ssl.key.location")
        if keystore_password is not None:
            raise ConfigError("ssl.keystore.password cannot be set with ssl.keystore.type=PEM; the key's password "
                              "is ssl.key.password (as in Kafka)")
        if out.get("ssl.certificate.location") is not None:
            raise ConfigError("set either ssl.keystore.location or ssl.certificate.location, not both")
        out["ssl.certificate.location"] = keystore
    elif keystore_password is not None:
        raise ConfigError("ssl.keystore.password is set but ssl.keystore.location is not")
    return out
