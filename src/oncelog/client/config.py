"""Client configuration: Kafka's property names and defaults, one dict per client.

The dictionary style is confluent-kafka's (``{"bootstrap.servers": ...,
"linger.ms": 5}``); names, value types and defaults are Apache Kafka's (the
Java client's), which is what "any Kafka" users read in Kafka's docs. Every
key is checked when the client is constructed: an unknown key, a value of
the wrong type or out of range raises :class:`ConfigError` naming the key,
the value and what is accepted (with a "did you mean" for near misses).

Internal API (for the producer, consumer and admin built on this):

* :func:`parse_config(conf, role)` -> :class:`ClientConfig`, a read-only
  mapping from property name to its *normalised* value (ints for ``*.ms``
  and sizes, bools for booleans, ``acks`` as -1/0/1, lists for list
  properties), defaults filled in. ``role`` is ``"producer"``,
  ``"consumer"`` or ``"admin"``.
* :data:`PROPERTIES`: the table itself (name -> :class:`Property`), the one
  place to add a property.

Properties of another role are accepted and ignored (a confluent-kafka
style shared dict for producer and consumer keeps working); librdkafka's own
property names that Kafka does not have are unknown keys, except for a few
common aliases listed in :data:`ALIASES`. docs/client.md lists the
differences from confluent-kafka.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ALIASES", "PROPERTIES", "ClientConfig", "ConfigError", "Property", "parse_config"]

INT32_MAX = 2**31 - 1


class ConfigError(ValueError):
    """A client configuration key is unknown or its value is invalid."""


@dataclass(frozen=True)
class Property:
    """One configuration property: its type, default, accepted values and roles."""

    name: str
    kind: str  # "str", "int", "bool", "enum", "list", "acks", "callable"
    default: Any
    roles: frozenset[str]
    doc: str
    lo: int | None = None
    hi: int | None = None
    choices: tuple[str, ...] = ()
    required: bool = False

    def convert(self, value: Any) -> Any:
        """The normalised value; raises ConfigError with a clear message."""
        try:
            return _CONVERTERS[self.kind](self, value)
        except ConfigError:
            raise
        except (TypeError, ValueError):
            raise ConfigError(f"{self.name}: invalid value {value!r} ({self._expected()})") from None

    def _expected(self) -> str:
        if self.kind == "int":
            lo = "" if self.lo is None else f" >= {self.lo}"
            hi = "" if self.hi is None else f" <= {self.hi}"
            return f"expected an integer{lo}{' and' if lo and hi else ''}{hi}"
        if self.kind == "bool":
            return "expected true or false"
        if self.kind in ("enum", "list"):
            return "expected " + (" or ".join(self.choices) if self.kind == "enum" else
                                  "a list (or comma-separated string) of " + ", ".join(self.choices))
        if self.kind == "acks":
            return "expected all, -1, 0 or 1"
        if self.kind == "callable":
            return "expected a callable"
        return "expected a string"


def _to_str(p: Property, v: Any) -> Any:
    if v is None and not p.required:
        return None
    if not isinstance(v, str):
        raise TypeError
    if p.required and not v.strip():
        raise ConfigError(f"{p.name}: must not be empty")
    return v


def _to_int(p: Property, v: Any) -> int:
    if isinstance(v, bool):
        raise TypeError
    if isinstance(v, str):
        v = int(v.strip())
    if not isinstance(v, int):
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        else:
            raise TypeError
    if (p.lo is not None and v < p.lo) or (p.hi is not None and v > p.hi):
        raise ConfigError(f"{p.name}: {v} is out of range ({p._expected()})")
    return v


def _to_bool(p: Property, v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("true", "false"):
        return v.strip().lower() == "true"
    raise TypeError


def _to_enum(p: Property, v: Any) -> str:
    if not isinstance(v, str):
        raise TypeError
    s = v.strip().lower()
    if s not in p.choices:
        raise ValueError
    return s


def _to_list(p: Property, v: Any) -> list[str]:
    items = v.split(",") if isinstance(v, str) else list(v)
    out = []
    for item in items:
        if not isinstance(item, str):
            raise TypeError
        s = item.strip().lower()
        if s not in p.choices:
            raise ValueError
        out.append(s)
    if not out:
        raise ValueError
    return out


def _to_acks(p: Property, v: Any) -> int:
    if isinstance(v, str):
        s = v.strip().lower()
        if s == "all":
            return -1
        v = int(s)
    if isinstance(v, bool) or v not in (-1, 0, 1):
        raise ValueError
    return int(v)


def _to_callable(p: Property, v: Any) -> Any:
    if v is not None and not callable(v):
        raise TypeError
    return v


_CONVERTERS: dict[str, Callable[[Property, Any], Any]] = {
    "str": _to_str, "int": _to_int, "bool": _to_bool, "enum": _to_enum, "list": _to_list, "acks": _to_acks,
    "callable": _to_callable,
}

ALL = frozenset({"producer", "consumer", "admin"})
P = frozenset({"producer"})
C = frozenset({"consumer"})
A = frozenset({"admin"})


def _props(*items: Property) -> dict[str, Property]:
    return {p.name: p for p in items}


PROPERTIES: dict[str, Property] = _props(
    # -- common ----------------------------------------------------------------
    Property("bootstrap.servers", "str", None, ALL, "host:port[,host:port...] to bootstrap from", required=True),
    Property("client.id", "str", "oncelog-python", ALL, "client id sent in every request header"),
    Property("request.timeout.ms", "int", 30000, ALL, "time to wait for a response before failing the request "
             "(the connection is closed, as the Java client does)", lo=1, hi=INT32_MAX),
    Property("retry.backoff.ms", "int", 100, ALL, "wait before retrying a failed request", lo=0, hi=INT32_MAX),
    Property("retry.backoff.max.ms", "int", 1000, ALL, "cap of the exponential retry backoff", lo=0, hi=INT32_MAX),
    Property("reconnect.backoff.ms", "int", 50, ALL, "wait before reconnecting to a broker", lo=0, hi=INT32_MAX),
    Property("reconnect.backoff.max.ms", "int", 1000, ALL, "cap of the exponential reconnect backoff",
             lo=0, hi=INT32_MAX),
    Property("socket.connection.setup.timeout.ms", "int", 10000, ALL, "TCP connect timeout", lo=1, hi=INT32_MAX),
    Property("metadata.max.age.ms", "int", 300000, ALL, "refresh metadata at least this often", lo=0, hi=INT32_MAX),
    Property("security.protocol", "enum", "plaintext", ALL, "PLAINTEXT, SSL (TLS), SASL_PLAINTEXT or SASL_SSL",
             choices=("plaintext", "ssl", "sasl_plaintext", "sasl_ssl")),
    # TLS (librdkafka's names; docs/client.md)
    Property("ssl.ca.location", "str", None, ALL, "PEM file (or directory) of the CA certificates that sign the "
             "brokers' certificates (default: the system's trust store)"),
    Property("ssl.certificate.location", "str", None, ALL, "PEM file of the client's certificate (chain), for "
             "brokers with ssl.client.auth=required"),
    Property("ssl.key.location", "str", None, ALL, "PEM file of the client's private key"),
    Property("ssl.key.password", "str", None, ALL, "password of an encrypted ssl.key.location"),
    Property("ssl.endpoint.identification.algorithm", "enum", "https", ALL, "https: the broker's certificate must "
             "name the host connected to; none: no host name check (the chain is still verified)",
             choices=("https", "none")),
    # SASL
    Property("sasl.mechanism", "str", None, ALL, "PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER"),
    Property("sasl.username", "str", None, ALL, "SASL user name (PLAIN, SCRAM)"),
    Property("sasl.password", "str", None, ALL, "SASL password (PLAIN, SCRAM)"),
    # OAUTHBEARER (confluent-kafka's names; oncelog.client.oauthbearer)
    Property("oauth_cb", "callable", None, ALL, "OAUTHBEARER token callback: f(sasl.oauthbearer.config) -> "
             "(token_str, expiry_seconds_since_epoch[, principal, extensions])"),
    Property("sasl.oauthbearer.config", "str", None, ALL, "passed to oauth_cb; with "
             "enable.sasl.oauthbearer.unsecure.jwt: principal=NAME [scope=a,b] [lifeSeconds=N] ..."),
    Property("enable.sasl.oauthbearer.unsecure.jwt", "bool", False, ALL, "build unsigned JWTs from "
             "sasl.oauthbearer.config (development and tests only)"),
    # -- producer --------------------------------------------------------------
    Property("acks", "acks", -1, P, "all (-1), 1 or 0"),
    Property("linger.ms", "int", 5, P, "how long a batch waits for more records", lo=0, hi=900000),
    Property("batch.size", "int", 16384, P, "target batch size in bytes per partition", lo=1, hi=INT32_MAX),
    Property("compression.type", "enum", "none", P, "codec of produced batches",
             choices=("none", "gzip", "snappy", "lz4", "zstd")),
    Property("enable.idempotence", "bool", True, P, "idempotent producer (sequence numbers, no duplicates)"),
    Property("max.in.flight.requests.per.connection", "int", 5, P, "unanswered Produce requests per broker "
             "(at most 5 with idempotence)", lo=1, hi=INT32_MAX),
    Property("delivery.timeout.ms", "int", 120000, P, "upper bound from produce() to success or failure",
             lo=1, hi=INT32_MAX),
    Property("retries", "int", INT32_MAX, P, "how often a failed batch is resent", lo=0, hi=INT32_MAX),
    Property("max.request.size", "int", 1048576, P, "largest record batch (and request) sent", lo=1, hi=INT32_MAX),
    Property("buffer.memory", "int", 33554432, P, "bytes of records buffered before produce() waits",
             lo=1, hi=2**62),
    Property("max.block.ms", "int", 60000, P, "how long produce() waits for buffer space or metadata",
             lo=0, hi=INT32_MAX),
    Property("partitioner", "enum", "murmur2_random", P, "murmur2 of the key (Java's and librdkafka's "
             "murmur2_random), sticky for null keys", choices=("murmur2_random",)),
    Property("transactional.id", "str", None, P, "enables transactions"),
    Property("transaction.timeout.ms", "int", 60000, P, "coordinator aborts a transaction open this long",
             lo=1, hi=INT32_MAX),
    Property("transaction.two.phase.commit.enable", "bool", False, P, "KIP-939 two-phase commit participation"),
    # -- consumer --------------------------------------------------------------
    Property("group.id", "str", None, C, "consumer group"),
    Property("group.instance.id", "str", None, C, "static membership id"),
    Property("session.timeout.ms", "int", 45000, C, "group session timeout", lo=1, hi=INT32_MAX),
    Property("heartbeat.interval.ms", "int", 3000, C, "group heartbeat interval", lo=1, hi=INT32_MAX),
    Property("max.poll.interval.ms", "int", 300000, C, "longest gap between polls before leaving the group",
             lo=1, hi=INT32_MAX),
    Property("auto.offset.reset", "enum", "latest", C, "where to start without a committed offset",
             choices=("earliest", "latest", "none")),
    Property("enable.auto.commit", "bool", True, C, "commit positions periodically"),
    Property("auto.commit.interval.ms", "int", 5000, C, "auto-commit period", lo=0, hi=INT32_MAX),
    Property("isolation.level", "enum", "read_uncommitted", C, "read_committed hides aborted and open "
             "transactions", choices=("read_uncommitted", "read_committed")),
    Property("partition.assignment.strategy", "list", ["range", "cooperative-sticky"], C, "assignors, preferred "
             "first", choices=("range", "roundrobin", "cooperative-sticky")),
    Property("fetch.min.bytes", "int", 1, C, "bytes a fetch waits for", lo=0, hi=INT32_MAX),
    Property("fetch.max.bytes", "int", 52428800, C, "bytes per fetch response", lo=0, hi=INT32_MAX),
    Property("fetch.max.wait.ms", "int", 500, C, "longest a fetch waits for fetch.min.bytes", lo=0, hi=INT32_MAX),
    Property("max.partition.fetch.bytes", "int", 1048576, C, "bytes per partition per fetch", lo=0, hi=INT32_MAX),
    Property("max.poll.records", "int", 500, C, "records returned by one poll", lo=1, hi=INT32_MAX),
    Property("check.crcs", "bool", True, C, "verify the CRC32C of fetched batches"),
    # -- admin -----------------------------------------------------------------
    Property("default.api.timeout.ms", "int", 60000, A, "upper bound of one admin operation, retries included",
             lo=1, hi=INT32_MAX),
)

# librdkafka spellings accepted for Kafka properties (name -> Kafka name, value map)
ALIASES: dict[str, tuple[str, dict[str, str]]] = {
    "queue.buffering.max.ms": ("linger.ms", {}),
    "compression.codec": ("compression.type", {}),
    "request.required.acks": ("acks", {}),
    "message.send.max.retries": ("retries", {}),
    "message.timeout.ms": ("delivery.timeout.ms", {}),
    "max.in.flight": ("max.in.flight.requests.per.connection", {}),
    "sasl.mechanisms": ("sasl.mechanism", {}),
}
# librdkafka's older auto.offset.reset values
_OFFSET_RESET_ALIASES = {"smallest": "earliest", "beginning": "earliest", "largest": "latest", "end": "latest",
                         "error": "none"}


class ClientConfig(Mapping[str, Any]):
    """The validated configuration of one client: property name -> normalised value."""

    __slots__ = ("_values", "role", "explicit", "security")

    def __init__(self, values: dict[str, Any], role: str, explicit: frozenset[str]) -> None:
        self._values = values
        self.role = role
        self.explicit = explicit  # the keys the user set (after aliasing)
        # TLS context and SASL settings (oncelog.client.security), built by parse_config
        self.security: Any = None

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        # secrets (sasl.password, ssl.key.password, and sasl.oauthbearer.config, which commonly carries an oauth_cb's
        # client secret) never reach a log line or a traceback
        shown = {k: ("[hidden]" if (k.endswith(".password") or k == "sasl.oauthbearer.config") and v is not None else v)
                 for k, v in self._values.items()}
        return f"ClientConfig({self.role}, {shown!r})"

    @property
    def bootstrap(self) -> list[tuple[str, int]]:
        """``bootstrap.servers`` as (host, port) pairs."""
        return parse_servers(self._values["bootstrap.servers"])


def parse_servers(value: str) -> list[tuple[str, int]]:
    out = []
    for item in value.split(","):
        item = item.strip()
        if not item:
            continue
        if "://" in item:
            item = item.split("://", 1)[1]
        host, sep, port = item.rpartition(":")
        if not sep:
            raise ConfigError(f"bootstrap.servers: {item!r} is not host:port")
        try:
            n = int(port)
        except ValueError:
            raise ConfigError(f"bootstrap.servers: {item!r} has an invalid port") from None
        if not 0 < n < 65536:
            raise ConfigError(f"bootstrap.servers: {item!r} has an invalid port")
        out.append((host.strip("[]") or "127.0.0.1", n))
    if not out:
        raise ConfigError("bootstrap.servers: no host:port given")
    return out


def parse_config(conf: Mapping[str, Any] | None, role: str) -> ClientConfig:
    """Validate ``conf`` for a client of ``role``; see the module docstring."""
    if role not in ALL:
        raise ValueError(f"unknown client role {role!r}")
    if conf is None:
        conf = {}
    if not isinstance(conf, Mapping):
        raise ConfigError(f"configuration must be a dict of Kafka properties, got {type(conf).__name__}")
    values: dict[str, Any] = {}
    explicit: set[str] = set()
    for raw_key, value in conf.items():
        if not isinstance(raw_key, str):
            raise ConfigError(f"configuration key {raw_key!r} is not a string")
        key = raw_key
        if key in ALIASES and key not in PROPERTIES:
            key = ALIASES[key][0]
            if key in conf:
                raise ConfigError(f"{raw_key} and {key} are the same property; set only {key}")
        prop = PROPERTIES.get(key)
        if prop is None:
            close = difflib.get_close_matches(key, list(PROPERTIES) + list(ALIASES), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(f"unknown configuration property {raw_key!r}{hint}")
        if key == "auto.offset.reset" and isinstance(value, str):
            value = _OFFSET_RESET_ALIASES.get(value.strip().lower(), value)
        if key == "ssl.endpoint.identification.algorithm" and isinstance(value, str) and not value.strip():
            value = "none"  # the Java client's spelling of "no host name check" is the empty string
        converted = prop.convert(value)
        if role in prop.roles:
            values[key] = converted
            explicit.add(key)
    for name, prop in PROPERTIES.items():
        if role not in prop.roles or name in values:
            continue
        if prop.required:
            raise ConfigError(f"{name} is required")
        values[name] = list(prop.default) if isinstance(prop.default, list) else prop.default
    cfg = ClientConfig(values, role, frozenset(explicit))
    cfg.bootstrap  # noqa: B018 - validates the server list now
    from oncelog.client.security import build_security

    cfg.security = build_security(values)  # TLS files and SASL settings are checked now too
    if role == "producer":
        _check_producer(cfg)
    if role == "consumer":
        if cfg["heartbeat.interval.ms"] >= cfg["session.timeout.ms"]:
            raise ConfigError("heartbeat.interval.ms must be lower than session.timeout.ms")
    return cfg


def _check_producer(cfg: ClientConfig) -> None:
    """Kafka's cross-property rules (ProducerConfig.postProcessAndValidateIdempotenceConfigs)."""
    user_set = cfg.explicit
    conflicts = (cfg["acks"] != -1 or cfg["max.in.flight.requests.per.connection"] > 5
                 or (cfg["retries"] == 0 and "retries" in user_set))
    if "enable.idempotence" not in user_set and conflicts and cfg["transactional.id"] is None:
        # Kafka 3.2+: idempotence left at its default is switched off by conflicting settings
        cfg._values["enable.idempotence"] = False
    idem = cfg["enable.idempotence"]
    if cfg["transactional.id"] is not None and not idem:
        raise ConfigError("transactional.id requires enable.idempotence=true")
    if cfg["transaction.two.phase.commit.enable"] and cfg["transactional.id"] is None:
        raise ConfigError("transaction.two.phase.commit.enable=true requires a transactional.id")
    if cfg["transaction.two.phase.commit.enable"] and "transaction.timeout.ms" in user_set:
        # as Kafka 4.1's ProducerConfig: a 2PC transaction never times out
        raise ConfigError("transaction.timeout.ms cannot be set when transaction.two.phase.commit.enable=true "
                          "(two-phase commit transactions do not expire)")
    if idem:
        if cfg["acks"] != -1:
            raise ConfigError(f"enable.idempotence=true requires acks=all (got acks={cfg['acks']})")
        if cfg["max.in.flight.requests.per.connection"] > 5:
            raise ConfigError("enable.idempotence=true requires max.in.flight.requests.per.connection <= 5")
        if cfg["retries"] == 0 and "retries" in user_set:
            raise ConfigError("enable.idempotence=true requires retries > 0")
    if cfg["delivery.timeout.ms"] < cfg["linger.ms"] + cfg["request.timeout.ms"]:
        raise ConfigError("delivery.timeout.ms must be at least linger.ms + request.timeout.ms")
