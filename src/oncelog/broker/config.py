"""Broker configuration with Kafka's property names.

``oncelog serve --config FILE`` reads a Java-style properties file. Broker-wide
log defaults (``log.segment.bytes``, ``log.retention.ms``, ...) are handed to
:class:`oncelog.storage.config.LogConfig`; the rest is read here.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oncelog.storage.config import BROKER_LOG_KEYS, BROKER_SYNONYM, LogConfig

log = logging.getLogger("oncelog.config")

_LISTENER = re.compile(r"^(?:([A-Za-z0-9_]+)://)?\[?([^\]]*?)\]?:(\d+)$")
_INT_RANGE = (-(2**31), 2**31 - 1)
_LONG_RANGE = (-(2**63), 2**63 - 1)
# Kafka's default listener.security.protocol.map (listener name -> security protocol)
_DEFAULT_PROTOCOL_MAP = {p: p for p in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")}
IMPLEMENTED_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")


class ConfigError(ValueError):
    """A broker property or flag with a value the broker cannot use (one line)."""


class StartupError(Exception):
    """The broker cannot start (port taken, data directory locked or unusable)."""


_NATURAL_LINE = re.compile(r"\r\n|\r|\n")  # Java's line terminators (not \f, \v or U+2028)
_WS = " \t\f"  # what java.util.Properties counts as white space
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _logical_lines(text: str) -> list[str]:
    """The logical lines of a properties text, as java.util.Properties.load forms them: a natural line
    ending in an odd number of backslashes continues on the next, whose leading white space is dropped;
    blank lines and comment lines (first non-blank character ``#`` or ``!``; they never continue) are
    left out. Escapes are left in place (see :func:`_unescape`)."""
    out: list[str] = []
    pending: str | None = None
    natural = _NATURAL_LINE.split(text)
    if text.endswith(("\r", "\n")) and not text.endswith("\r\n"):
        # a line continued by "\\\r" or "\\\n" onto the very end is kept, even empty, as Java's reader does
        # (not after "\\\r\n", where the reader looks for more and finds a blank line)
        natural.pop()
    for raw in natural:
        line = raw.lstrip(_WS)
        # nothing yet (a new line, or only a backslash continued onto this one): blank or comment?
        if not pending and (not line or line[0] in "#!"):
            pending = None
            continue
        trailing = len(line) - len(line.rstrip("\\"))
        joined = (pending or "") + (line[:-1] if trailing % 2 else line)
        if trailing % 2:
            pending = joined
        else:
            out.append(joined)
            pending = None
    if pending is not None:  # a backslash at the very end continues onto nothing (Java: an empty key)
        out.append(pending)
    return out


def _unescape(text: str) -> str:
    """java.util.Properties.load's escapes: ``\\uXXXX`` (exactly four hex digits),
    ``\\t \\n \\r \\f``, and a backslash before any other character stands for that character.
    ValueError (the bad escape) on a malformed ``\\u``."""
    if "\\" not in text:
        return text
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        i += 1
        if i == n:
            break
        c = text[i]
        if c == "u":
            digits = text[i + 1 : i + 5]
            if len(digits) != 4 or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise ValueError(text[i - 1 : i + 5])
            out.append(chr(int(digits, 16)))
            i += 5
        else:
            out.append(_ESCAPES.get(c, c))
            i += 1
    return "".join(out)


def parse_properties(text: str) -> dict[str, str]:
    """Parse Java properties the way java.util.Properties.load does (see :func:`_logical_lines`). The key
    runs to the first unescaped ``=``, ``:`` or white space; white space around it and one ``=`` or ``:``
    after it are skipped; the rest is the value. Escapes are resolved in keys and values
    (:func:`_unescape`), and values are trimmed as Kafka's ConfigDef trims them. ConfigError on a
    malformed ``\\u`` escape."""
    props: dict[str, str] = {}
    for line in _logical_lines(text):
        i, n = 0, len(line)
        while i < n and line[i] not in "=:" and line[i] not in _WS:
            i += 2 if line[i] == "\\" else 1
        key_end = min(i, n)
        while i < n and line[i] in _WS:
            i += 1
        if i < n and line[i] in "=:":
            i += 1
            while i < n and line[i] in _WS:
                i += 1
        try:
            key = _unescape(line[:key_end])
        except ValueError as exc:
            raise ConfigError(f"malformed \\uxxxx escape {exc} in a properties key") from None
        try:
            props[key] = _java_trim(_unescape(line[i:]))
        except ValueError as exc:  # the value is not shown: it may be a password
            raise ConfigError(f"malformed \\uxxxx escape in the value of {key}") from None
    return props


def format_properties(props: dict[str, str]) -> str:
    """``props`` as a properties text that :func:`parse_properties` (and Java) read back unchanged:
    backslashes, line breaks, tabs and form feeds escaped everywhere, a leading space of a value and
    the separators (``= : # !`` and white space) in keys escaped, as Properties.store writes them."""

    def esc(text: str, key: bool) -> str:
        out = []
        for i, c in enumerate(text):
            if c == "\\":
                out.append("\\\\")
            elif c in "\t\n\r\f":
                out.append("\\" + {"\t": "t", "\n": "n", "\r": "r", "\f": "f"}[c])
            elif (key and c in "=:#! ") or (c == " " and i == 0) or (i == 0 and c in "#!"):
                out.append("\\" + c)
            else:
                out.append(c)
        return "".join(out)

    return "".join(f"{esc(k, True)}={esc(str(v), False)}\n" for k, v in props.items())


def _java_trim(value: str) -> str:
    """String.trim(): drop leading and trailing characters up to U+0020."""
    lo, hi = 0, len(value)
    while lo < hi and value[lo] <= " ":
        lo += 1
    while hi > lo and value[hi - 1] <= " ":
        hi -= 1
    return value[lo:hi]


def _split_listener(value: str, key: str, protocols: dict[str, str] | None = None) -> tuple[str, int]:
    """One ``[NAME://]HOST:PORT`` → (host, port); ConfigError naming ``key`` otherwise,
    or if the listener's security protocol is one the broker does not implement."""
    host, port, _name = _listener_parts(value, key, protocols)
    return host, port


def _listener_parts(value: str, key: str, protocols: dict[str, str] | None = None) -> tuple[str, int, str]:
    """(host, port, listener name) of one ``[NAME://]HOST:PORT`` (name PLAINTEXT when absent)."""
    m = _LISTENER.match(value.strip())
    if not m or not 0 <= int(m.group(3)) <= 65535:
        raise ConfigError(f"invalid value {value!r} for {key}: expected [PLAINTEXT://]HOST:PORT with a port 0-65535")
    name = (m.group(1) or "PLAINTEXT").upper()
    protocol = (protocols if protocols is not None else _DEFAULT_PROTOCOL_MAP).get(name)
    if protocol is None:
        raise ConfigError(
            f"invalid value {value!r} for {key}: no security protocol for listener name {name} "
            "(listener.security.protocol.map)"
        )
    if protocol not in IMPLEMENTED_PROTOCOLS:
        raise ConfigError(
            f"invalid value {value!r} for {key}: security protocol {protocol} is not implemented "
            f"(oncelog serves {', '.join(IMPLEMENTED_PROTOCOLS)} only)"
        )
    return m.group(2) or "127.0.0.1", int(m.group(3)), name


def parse_listener(value: str, key: str = "--listen") -> tuple[str, int]:
    """``PLAINTEXT://127.0.0.1:19092`` or ``127.0.0.1:19092`` → (host, port)."""
    return _split_listener(value.split(",")[0], key)


def parse_listener_name(value: str) -> str | None:
    """The listener name ``NAME://`` of ``--listen``'s value, None when it has none."""
    m = _LISTENER.match(value.split(",")[0].strip())
    return m.group(1).upper() if m and m.group(1) else None


def _parse_listeners(value: str, key: str, protocols: dict[str, str]) -> tuple[str, int, str]:
    """A ``listeners``-style list: every entry is checked; the first is used."""
    entries = [e for e in (x.strip() for x in value.split(",")) if e]
    if not entries:
        raise ConfigError(f"invalid value {value!r} for {key}: expected a list of NAME://HOST:PORT")
    found = [_listener_parts(e, key, protocols) for e in entries]
    if len(found) > 1:
        log.warning("%s: oncelog serves one listener; using %s and ignoring %s", key, entries[0], ", ".join(entries[1:]))
    return found[0]


def _protocol_map(value: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for entry in (x.strip() for x in value.split(",")):
        if not entry:
            continue
        name, sep, protocol = entry.partition(":")
        if not sep or not name.strip() or protocol.strip().upper() not in _DEFAULT_PROTOCOL_MAP:
            raise ConfigError(
                f"invalid value {value!r} for listener.security.protocol.map: expected NAME:PROTOCOL pairs "
                f"with a protocol among {', '.join(_DEFAULT_PROTOCOL_MAP)}"
            )
        out[name.strip().upper()] = protocol.strip().upper()
    return out


@dataclass(frozen=True)
class _Spec:
    """Kafka's ConfigDef type of a property and its range (``lo``/``hi`` inclusive)."""

    kind: str  # "int" (32-bit), "long" (64-bit), "boolean", "string"
    lo: int | None = None
    hi: int | None = None
    choices: tuple[str, ...] = ()


def _check(key: str, value: str, spec: _Spec) -> int | bool | str:
    """The typed value of ``key``, or ConfigError with one line naming key, value and what is expected."""
    text = value.strip()
    if spec.kind == "boolean":
        # Kafka's BOOLEAN type: "true" or "false" in any case, nothing else
        if text.lower() not in ("true", "false"):
            raise ConfigError(f"invalid value {value!r} for {key}: expected true or false")
        return text.lower() == "true"
    if spec.kind == "double":
        try:
            x = float(text)
        except ValueError:
            x = None
        if x is None or x != x or (spec.lo is not None and x < spec.lo) or (spec.hi is not None and x > spec.hi):
            raise ConfigError(f"invalid value {value!r} for {key}: expected a number{_double_range(spec)} (double)")
        return x  # type: ignore[return-value]
    if spec.kind == "string":
        if spec.choices and text not in spec.choices:
            raise ConfigError(f"invalid value {value!r} for {key}: expected one of {', '.join(spec.choices)}")
        return text
    lo, hi = _INT_RANGE if spec.kind == "int" else _LONG_RANGE
    try:
        n = int(text, 10)
    except ValueError:
        n = None
    if (n is None or "_" in text or not lo <= n <= hi or (spec.lo is not None and n < spec.lo)
            or (spec.hi is not None and n > spec.hi)):
        raise ConfigError(f"invalid value {value!r} for {key}: expected {_range_text(spec, lo, hi)} ({spec.kind})")
    return n


def check_long(key: str, value: str) -> int:
    """``value`` as Kafka's LONG type, or ConfigError naming ``key``."""
    return int(_check(key, value, _LONG))


def _shown(value: object) -> str:
    """A value as Kafka prints it (doubles as Java's Double.toString: 1.7976931348623157E308)."""
    if isinstance(value, float):
        return repr(value).replace("e+", "E").replace("e-", "E-")
    return str(value)


def _double_range(spec: _Spec) -> str:
    if spec.lo is not None and spec.hi is not None:
        return f" from {spec.lo} to {spec.hi}"
    return f" >= {spec.lo}" if spec.lo is not None else ""


def _range_text(spec: _Spec, lo: int, hi: int) -> str:
    if spec.lo is not None and spec.hi is not None:
        return f"an integer from {spec.lo} to {spec.hi}"
    if spec.lo is not None:
        return f"an integer >= {spec.lo}"
    return f"an integer from {lo} to {hi}"


_INT, _LONG = _Spec("int"), _Spec("long")
_POS_INT, _POS_LONG = _Spec("int", lo=1), _Spec("long", lo=1)
_BOOL = _Spec("boolean")

# Kafka property name -> (BrokerConfig attribute, type and range as Kafka's ConfigDef declares them)
_INTS: dict[str, tuple[str, _Spec]] = {
    "num.partitions": ("num_partitions", _POS_INT),
    "default.replication.factor": ("default_replication_factor", _INT),
    "socket.request.max.bytes": ("socket_request_max_bytes", _POS_INT),
    "sasl.server.max.receive.size": ("sasl_server_max_receive_size", _POS_INT),
    "connections.max.idle.ms": ("connections_max_idle_ms", _LONG),
    "connections.max.reauth.ms": ("connections_max_reauth_ms", _LONG),
    "connection.failed.authentication.delay.ms": ("connection_failed_authentication_delay_ms", _Spec("int", lo=0)),
    "log.flush.interval.messages": ("log_flush_interval_messages", _POS_LONG),
    "log.flush.interval.ms": ("log_flush_interval_ms", _LONG),
    "log.retention.check.interval.ms": ("log_retention_check_interval_ms", _POS_LONG),
    "producer.id.expiration.ms": ("producer_id_expiration_ms", _POS_INT),
    "producer.id.expiration.check.interval.ms": ("producer_id_expiration_check_interval_ms", _POS_INT),
    "oncelog.producer.state.max.producers": ("max_producers_per_partition", _POS_INT),
    "group.min.session.timeout.ms": ("group_min_session_timeout_ms", _INT),
    "group.max.session.timeout.ms": ("group_max_session_timeout_ms", _INT),
    "group.initial.rebalance.delay.ms": ("group_initial_rebalance_delay_ms", _INT),
    "group.max.size": ("group_max_size", _POS_INT),
    "offset.metadata.max.bytes": ("offset_metadata_max_bytes", _INT),
    "offsets.retention.minutes": ("offsets_retention_minutes", _POS_INT),
    "offsets.retention.check.interval.ms": ("offsets_retention_check_interval_ms", _POS_LONG),
    "oncelog.group.coordinator.tick.ms": ("group_coordinator_tick_ms", _POS_INT),
    "oncelog.offsets.snapshot.bytes": ("offsets_snapshot_bytes", _POS_LONG),
    "transaction.max.timeout.ms": ("transaction_max_timeout_ms", _POS_INT),
    "transactional.id.expiration.ms": ("transactional_id_expiration_ms", _POS_INT),
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": (
        "transaction_abort_timed_out_transaction_cleanup_interval_ms", _POS_INT),
    "transaction.remove.expired.transaction.cleanup.interval.ms": (
        "transaction_remove_expired_transaction_cleanup_interval_ms", _POS_INT),
    "oncelog.transaction.version": ("transaction_version", _Spec("int", lo=0, hi=2)),
    "add.partitions.to.txn.retry.backoff.ms": ("add_partitions_to_txn_retry_backoff_ms", _POS_INT),
    "add.partitions.to.txn.retry.backoff.max.ms": ("add_partitions_to_txn_retry_backoff_max_ms",
                                                   _Spec("int", lo=0)),
    # the log cleaner (Kafka's CleanerConfig; docs/compaction.md)
    "log.cleaner.threads": ("log_cleaner_threads", _Spec("int", lo=0)),
    "log.cleaner.dedupe.buffer.size": ("log_cleaner_dedupe_buffer_size", _LONG),
    "log.cleaner.io.buffer.size": ("log_cleaner_io_buffer_size", _Spec("int", lo=0)),
    "log.cleaner.io.buffer.load.factor": ("log_cleaner_io_buffer_load_factor", _Spec("double")),
    "log.cleaner.io.max.bytes.per.second": ("log_cleaner_io_max_bytes_per_second", _Spec("double")),
    "log.cleaner.backoff.ms": ("log_cleaner_backoff_ms", _Spec("long", lo=0)),
}
_BOOLS = {
    "auto.create.topics.enable": "auto_create_topics_enable",
    "delete.topic.enable": "delete_topic_enable",
    "transaction.two.phase.commit.enable": "transaction_two_phase_commit_enable",
    "log.cleaner.enable": "log_cleaner_enable",
}
# broker-level log defaults, handed to LogConfig once checked here
_RETENTION_KEYS = ("log.retention.ms", "log.retention.minutes", "log.retention.hours")
_LOG_KEYS: dict[str, _Spec] = {
    "log.segment.bytes": _Spec("int", lo=14),
    "log.roll.ms": _POS_LONG,
    "log.roll.hours": _POS_INT,
    "log.retention.ms": _LONG,
    "log.retention.minutes": _INT,
    "log.retention.hours": _INT,
    "log.retention.bytes": _LONG,
    "log.index.interval.bytes": _Spec("int", lo=4),
    "message.max.bytes": _Spec("int", lo=0),
    "log.message.timestamp.type": _Spec("string", choices=("CreateTime", "LogAppendTime")),
}
_OTHER_KEYS = {
    "node.id": _Spec("int", lo=0),
    "broker.id": _Spec("int", lo=0),
    "listeners": _Spec("string"),
    "advertised.listeners": _Spec("string"),
    "listener.security.protocol.map": _Spec("string"),
    "log.dirs": _Spec("string"),
    "log.dir": _Spec("string"),
}
KNOWN_KEYS = frozenset(_INTS) | frozenset(_BOOLS) | frozenset(_LOG_KEYS) | frozenset(_OTHER_KEYS) | BROKER_LOG_KEYS


@dataclass
class BrokerConfig:
    host: str = "127.0.0.1"
    port: int = 9092
    # the listener's name and security protocol (listener.security.protocol.map); TLS and SASL
    # settings of SSL/SASL listeners (oncelog.broker.security.SecuritySettings)
    listener_name: str = "PLAINTEXT"
    security_protocol: str = "PLAINTEXT"
    security: Any = None
    data_dir: Path = Path("./data")
    node_id: int = 1
    advertised_host: str | None = None
    advertised_port: int | None = None
    auto_create_topics_enable: bool = True
    num_partitions: int = 1
    default_replication_factor: int = 1
    socket_request_max_bytes: int = 104857600
    # largest request frame before SASL authentication completes (Kafka's default)
    sasl_server_max_receive_size: int = 524288
    # a connection that reads and writes nothing for this long is closed, authenticated or not (Kafka's
    # Selector idle expiry; negative: never)
    connections_max_idle_ms: int = 600000
    # a failed SASL authentication is answered, and its connection closed, this much later (Kafka's, against
    # password guessing)
    connection_failed_authentication_delay_ms: int = 100
    # SASL session lifetime (KIP-368; 0: no re-authentication); the listener's per-mechanism values, which
    # listener-prefixed keys may override, are in security.sasl.max_reauth_ms
    connections_max_reauth_ms: int = 0
    # 1 = fsync before every acknowledgement (group commit); larger values leave
    # data in the page cache and flush every log_flush_interval_ms, as Kafka does.
    log_flush_interval_messages: int = 1
    log_flush_interval_ms: int = 1000
    log_retention_check_interval_ms: int = 300000
    delete_topic_enable: bool = True
    producer_id_expiration_ms: int = 86400000
    producer_id_expiration_check_interval_ms: int = 600000
    # oncelog's bound on idempotent-producer entries kept per partition (LRU)
    max_producers_per_partition: int = 10000
    # consumer groups (Kafka's names; see docs/groups.md)
    group_min_session_timeout_ms: int = 6000
    group_max_session_timeout_ms: int = 1800000
    group_initial_rebalance_delay_ms: int = 3000
    group_max_size: int = 2147483647
    offset_metadata_max_bytes: int = 4096
    offsets_retention_minutes: int = 10080
    offsets_retention_check_interval_ms: int = 600000
    # oncelog's own: coordinator timer resolution, offsets log snapshot threshold
    group_coordinator_tick_ms: int = 100
    offsets_snapshot_bytes: int = 8388608
    # transactions (Kafka's names; see docs/transactions.md)
    transaction_max_timeout_ms: int = 900000
    transactional_id_expiration_ms: int = 604800000
    transaction_abort_timed_out_transaction_cleanup_interval_ms: int = 10000
    transaction_remove_expired_transaction_cleanup_interval_ms: int = 3600000
    transaction_two_phase_commit_enable: bool = False
    # the finalized level of the transaction.version feature (KIP-890): 2 = TV2
    transaction_version: int = 2
    # TV2: a Produce whose implicit add meets CONCURRENT_TRANSACTIONS (the previous transaction's markers are
    # being written) is retried inside the broker every backoff ms, for up to max ms (Kafka's defaults)
    add_partitions_to_txn_retry_backoff_ms: int = 20
    add_partitions_to_txn_retry_backoff_max_ms: int = 100
    # the log cleaner (Kafka's names and defaults)
    log_cleaner_enable: bool = True
    log_cleaner_threads: int = 1
    log_cleaner_dedupe_buffer_size: int = 134217728
    log_cleaner_io_buffer_size: int = 524288
    log_cleaner_io_buffer_load_factor: float = 0.9
    log_cleaner_io_max_bytes_per_second: float = 1.7976931348623157e308
    log_cleaner_backoff_ms: int = 15000
    log: LogConfig = field(default_factory=LogConfig)
    raw: dict[str, str] = field(default_factory=dict)

    @property
    def fsync_on_ack(self) -> bool:
        return self.log_flush_interval_messages <= 1

    @property
    def advertised(self) -> tuple[str, int]:
        return (self.advertised_host or self.host, self.advertised_port or self.port)

    @classmethod
    def from_properties(cls, props: dict[str, str], **overrides: object) -> "BrokerConfig":
        """Check every property (type and range, as Kafka's ConfigDef does) and build the
        config. ConfigError names the first bad key; unknown keys are logged and ignored."""
        cfg = cls(raw=dict(props))
        from oncelog.broker.security import is_security_key, load_security

        for key in props:
            if key not in KNOWN_KEYS and not is_security_key(key):
                log.warning("unknown config %r ignored (not a broker property oncelog knows)", key)
        for key in ("node.id", "broker.id"):
            if key in props:
                cfg.node_id = int(_check(key, props[key], _OTHER_KEYS[key]))
                break
        protocols = _DEFAULT_PROTOCOL_MAP
        if "listener.security.protocol.map" in props:
            protocols = _protocol_map(props["listener.security.protocol.map"])
        if "listeners" in props:
            cfg.host, cfg.port, cfg.listener_name = _parse_listeners(props["listeners"], "listeners", protocols)
        if "advertised.listeners" in props:
            cfg.advertised_host, cfg.advertised_port, _name = _parse_listeners(
                props["advertised.listeners"], "advertised.listeners", protocols)
        for key in ("log.dirs", "log.dir"):
            if key in props:
                dirs = [d.strip() for d in props[key].split(",") if d.strip()]
                if not dirs:
                    raise ConfigError(f"invalid value {props[key]!r} for {key}: expected a directory")
                if len(dirs) > 1:
                    log.warning("%s: oncelog uses one log directory; using %s and ignoring %s",
                                key, dirs[0], ", ".join(dirs[1:]))
                cfg.data_dir = Path(dirs[0])
                break
        for key, (attr, spec) in _INTS.items():
            if key in props:
                setattr(cfg, attr, _check(key, props[key], spec))
        for key, attr in _BOOLS.items():
            if key in props:
                setattr(cfg, attr, _check(key, props[key], _BOOL))
        log_props = {}
        for key, spec in _LOG_KEYS.items():
            if key in props:
                value = _check(key, props[key], spec)
                if key in _RETENTION_KEYS and value != -1 and int(value) < 1:
                    raise ConfigError(f"invalid value {props[key]!r} for {key}: expected -1 (unlimited) or >= 1")
                log_props[key] = str(value)
        for key in BROKER_LOG_KEYS - _LOG_KEYS.keys():  # the other topic defaults: LogConfig checks them
            if key in props and key not in _INTS and key not in _BOOLS:
                log_props[key] = props[key]
        try:
            cfg.log = LogConfig.from_properties(log_props)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        for key, value in overrides.items():
            if value is not None:
                setattr(cfg, key, value)
        if 0 <= cfg.connections_max_idle_ms <= cfg.connection_failed_authentication_delay_ms:
            # Kafka's rule (its broker config validation): the delayed answer must not outlive the idle timeout
            raise ConfigError(f"connection.failed.authentication.delay.ms={cfg.connection_failed_authentication_delay_ms}"
                              f" must be less than connections.max.idle.ms={cfg.connections_max_idle_ms}, or a "
                              "failed authentication's delayed answer could time out")
        # the listener's security protocol (--listen NAME://... may have named another listener)
        protocol = protocols.get(cfg.listener_name)
        if protocol is None:
            raise ConfigError(f"no security protocol for listener name {cfg.listener_name} "
                              "(listener.security.protocol.map)")
        cfg.security_protocol = protocol
        cfg.security = load_security(props, cfg.listener_name, protocol) if protocol != "PLAINTEXT" else None
        return cfg

    @classmethod
    def load(cls, path: str | Path | None, **overrides: object) -> "BrokerConfig":
        """``path``'s properties (ConfigError if it cannot be read) with ``overrides`` on top."""
        props: dict[str, str] = {}
        if path:
            try:
                props = parse_properties(Path(path).read_text())
            except (OSError, UnicodeDecodeError) as exc:
                reason = getattr(exc, "strerror", None) or str(exc)
                raise ConfigError(f"cannot read config file {path}: {reason}") from None
        return cls.from_properties(props, **overrides)

    def broker_configs(self) -> dict[str, str]:
        """Broker-level configs as DescribeConfigs(BROKER) reports them."""
        out = {
            "node.id": str(self.node_id),
            "broker.id": str(self.node_id),
            "listeners": f"{self.listener_name}://{self.host}:{self.port}",
            "advertised.listeners": f"{self.listener_name}://%s:%d" % self.advertised,
            "log.dirs": str(self.data_dir),
        }
        out.update((key, _shown(getattr(self, attr))) for key, (attr, _spec) in _INTS.items())
        out.update((key, str(getattr(self, attr)).lower()) for key, attr in _BOOLS.items())
        for key, value in self.log.to_topic_configs().items():
            if key in BROKER_SYNONYM:  # oncelog's own meaning wins (log.flush.interval.messages)
                out.setdefault(BROKER_SYNONYM[key], value)
        return out

