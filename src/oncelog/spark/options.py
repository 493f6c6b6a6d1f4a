"""Options of the oncelog Spark source, checked as Spark's Kafka source checks them.

Pure functions (no pyspark, no network): option parsing and validation, the
offsets JSON of Spark's Kafka source (``{"topic":{"0":23,"1":-2}}``, -2
earliest, -1 latest), the per-trigger rate limit and the ``minPartitions``
split. The messages follow Spark's (``KafkaSourceProvider``,
``KafkaMicroBatchStream``, ``KafkaOffsetRangeCalculator``), so a job moved
between the two sources fails the same way.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

EARLIEST, LATEST = -2, -1
READ_UNCOMMITTED, READ_COMMITTED = 0, 1

TopicPartition = tuple[str, int]
OffsetMap = dict[TopicPartition, int]


class SourceOptionError(ValueError):
    """A source option is missing, malformed or not allowed (Spark: IllegalArgumentException)."""


class DataLossError(RuntimeError):
    """Data the query should read is gone, and ``failOnDataLoss`` is true (Spark: KAFKA_DATA_LOSS)."""


DATA_LOSS_HEAD = (
    "Some data may have been lost because they are not available in Kafka any more; either the data was "
    "aged out by Kafka or the topic may have been deleted before all the data in the topic was processed. "
    "If you don't want your streaming query to fail on such cases, set the source option failOnDataLoss "
    "to false. Reason: ")
DATA_LOSS_WARNING = (
    "There may have been some data loss because some data may have been aged out in Kafka or the topic "
    "may have been deleted before all the data in the topic was processed. If you want your streaming "
    "query to fail on such cases, set the source option \"failOnDataLoss\" to \"true\".")


def data_loss(sub_class: str, reason: str) -> DataLossError:
    return DataLossError(f"[KAFKA_DATA_LOSS.{sub_class}] {DATA_LOSS_HEAD}{reason}")


def tp_name(tp: TopicPartition) -> str:
    """A topic partition as Kafka's ``TopicPartition.toString`` prints it."""
    return f"{tp[0]}-{tp[1]}"


def tp_set(tps: Any) -> str:
    return "{" + ", ".join(tp_name(tp) for tp in sorted(tps)) + "}"


# -- offsets JSON -------------------------------------------------------------------


def offsets_to_json(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    """``{(t, p): o}`` -> Spark's ``{"t": {"p": o}}`` (partitions in numeric order)."""
    out: dict[str, dict[str, int]] = {}
    for (t, p), o in sorted(offsets.items()):
        out.setdefault(t, {})[str(p)] = int(o)
    return out


def offsets_from_json(value: str | Mapping[str, Any], what: str = "offsets") -> OffsetMap:
    """Spark's ``{"t": {"0": 23}}`` (a string or an already-parsed dict) -> ``{(t, 0): 23}``."""
    try:
        obj = json.loads(value) if isinstance(value, str) else value
        if not isinstance(obj, Mapping):
            raise TypeError
        out: OffsetMap = {}
        for t, parts in obj.items():
            if not isinstance(parts, Mapping):
                raise TypeError
            for p, o in parts.items():
                if isinstance(o, bool) or not isinstance(o, int):
                    raise TypeError
                out[(str(t), int(p))] = int(o)
        return out
    except (ValueError, TypeError):
        raise SourceOptionError(
            f'Expected e.g. {{"topicA":{{"0":23,"1":-1}},"topicB":{{"0":-2}}}}, got {value} ({what})') from None


def topics_from_json(value: str) -> list[TopicPartition]:
    """The ``assign`` option: ``{"t": [0, 1]}`` -> ``[(t, 0), (t, 1)]``."""
    try:
        obj = json.loads(value)
        if not isinstance(obj, dict):
            raise TypeError
        out = []
        for t, parts in obj.items():
            if not isinstance(parts, list):
                raise TypeError
            for p in parts:
                if isinstance(p, bool) or not isinstance(p, int):
                    raise TypeError
                out.append((str(t), p))
        return out
    except (ValueError, TypeError):
        raise SourceOptionError(f'Expected e.g. {{"topicA":[0,1],"topicB":[0,1]}}, got {value}') from None


# -- the options ----------------------------------------------------------------------

_STRATEGIES = ("subscribe", "subscribepattern", "assign")


@dataclass(frozen=True)
class OffsetSpec:
    """Where a read starts or ends: earliest, latest, per-partition offsets or timestamps."""

    kind: str  # "earliest" | "latest" | "offsets" | "timestamps" | "timestamp"
    offsets: OffsetMap = field(default_factory=dict)  # "offsets" and "timestamps"
    timestamp: int = 0  # "timestamp": one for every partition


@dataclass(frozen=True)
class SourceOptions:
    bootstrap: str  # "host:port[,host:port...]"
    strategy: str  # subscribe | subscribepattern | assign
    topics: tuple[str, ...] = ()
    pattern: str = ""
    assign: tuple[TopicPartition, ...] = ()
    starting: OffsetSpec = OffsetSpec("latest")
    ending: OffsetSpec = OffsetSpec("latest")
    starting_by_timestamp_strategy: str = "error"
    isolation_level: int = READ_COMMITTED
    fail_on_data_loss: bool = True
    include_headers: bool = False
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60 * 1000
    min_partitions: int | None = None
    poll_timeout_s: float = 120.0
    fetch_max_bytes: int = 4 << 20
    client_id: str = "oncelog-spark"
    # TLS and SASL client properties from the kafka.* options, mapped to oncelog's client names
    # (:func:`client_security`); every connection of the source (driver and executors) uses them
    security: tuple[tuple[str, str], ...] = field(default=(), repr=False)  # holds the SASL password

    @property
    def client_config(self) -> dict[str, str]:
        return dict(self.security)


def client_security(kafka_options: Mapping[str, str], bootstrap: str) -> dict[str, str]:
    """The TLS and SASL settings among a Spark job's ``kafka.*`` options (given without the prefix), as
    oncelog client properties: ``security.protocol``, ``ssl.*`` and ``sasl.*``, with the Java client's
    ``sasl.jaas.config`` and PEM trust and key stores mapped (:mod:`oncelog.client.java_config`),
    checked as the client checks them (files readable, a supported mechanism, credentials given).
    Raises ValueError (the client's ConfigError) with the client's message."""
    from oncelog.client.config import parse_config
    from oncelog.client.java_config import from_java, is_security_key

    conf = from_java({k: v for k, v in kafka_options.items() if is_security_key(k)})
    parse_config({**conf, "bootstrap.servers": bootstrap}, "consumer")
    return conf


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items() if v is not None}


def _int(params: dict[str, str], key: str, name: str) -> int | None:
    if key not in params:
        return None
    try:
        return int(params[key].strip())
    except ValueError:
        raise SourceOptionError(f"Invalid value '{params[key]}' for option '{name}': expected an integer") from None


def _bool(params: dict[str, str], key: str, name: str, default: bool) -> bool:
    if key not in params:
        return default
    v = params[key].strip().lower()
    if v not in ("true", "false"):
        raise SourceOptionError(f"Invalid value '{params[key]}' for option '{name}': expected true or false")
    return v == "true"


_TIME_UNITS = {"us": 1e-3, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def time_string_ms(value: str, name: str) -> int:
    """Spark's ``Utils.timeStringAsMs``: "15m", "30s", "500ms", a bare number is milliseconds."""
    m = re.fullmatch(r"\s*(-?\d+)\s*([a-z]*)\s*", value.lower())
    if not m or m.group(2) not in ("", *_TIME_UNITS):
        raise SourceOptionError(f"Invalid value '{value}' for option '{name}': expected a duration like 15m, 30s or 500ms")
    return int(int(m.group(1)) * _TIME_UNITS.get(m.group(2) or "ms", 1))


def _offset_spec(params: dict[str, str], ts_key: str, by_ts_key: str, key: str, default: OffsetSpec) -> OffsetSpec:
    """Spark's ``getKafkaOffsetRangeLimit``: the global timestamp, then per-partition timestamps, then offsets."""
    if ts_key in params:
        try:
            return OffsetSpec("timestamp", timestamp=int(params[ts_key].strip()))
        except ValueError:
            raise SourceOptionError(f"Invalid value '{params[ts_key]}' for a timestamp option: expected milliseconds") from None
    if by_ts_key in params:
        return OffsetSpec("timestamps", offsets=offsets_from_json(params[by_ts_key].strip(), by_ts_key))
    if key in params:
        v = params[key].strip()
        if v.lower() in ("earliest", "latest"):
            return OffsetSpec(v.lower())
        return OffsetSpec("offsets", offsets=offsets_from_json(v, key))
    return default


def parse_options(options: Mapping[str, str], streaming: bool) -> SourceOptions:
    """Check the options as Spark's Kafka source does and return them parsed.

    Raises :class:`SourceOptionError` with Spark's message on the first problem.
    """
    params = _lower(options)
    if streaming:
        if "endingoffsets" in params:
            raise SourceOptionError("ending offset not valid in streaming queries")
        if "endingoffsetsbytimestamp" in params or "endingtimestamp" in params:
            raise SourceOptionError("ending timestamp not valid in streaming queries")
        starting = _offset_spec(params, "startingtimestamp", "startingoffsetsbytimestamp", "startingoffsets",
                                OffsetSpec("latest"))
        ending = OffsetSpec("latest")
    else:
        starting = _offset_spec(params, "startingtimestamp", "startingoffsetsbytimestamp", "startingoffsets",
                                OffsetSpec("earliest"))
        if starting.kind == "latest":
            raise SourceOptionError("starting offset can't be latest for batch queries on Kafka")
        for tp, off in starting.offsets.items():
            if starting.kind == "offsets" and off == LATEST:
                raise SourceOptionError(f"startingOffsets for {tp_name(tp)} can't be latest for batch queries on Kafka")
        ending = _offset_spec(params, "endingtimestamp", "endingoffsetsbytimestamp", "endingoffsets",
                              OffsetSpec("latest"))
        if ending.kind == "earliest":
            raise SourceOptionError("ending offset can't be earliest for batch queries on Kafka")
        for tp, off in ending.offsets.items():
            if ending.kind == "offsets" and off == EARLIEST:
                raise SourceOptionError(f"ending offset for {tp_name(tp)} can't be earliest for batch queries on Kafka")

    strategies = [k for k in _STRATEGIES if k in params]
    names = ", ".join(_STRATEGIES)
    if not strategies:
        raise SourceOptionError(
            f"One of the following options must be specified for Kafka source: {names}. See the docs for more details.")
    if len(strategies) > 1:
        raise SourceOptionError(
            f"Only one of the following options can be specified for Kafka source: {names}. See the docs for more details.")
    strategy = strategies[0]
    value = params[strategy]
    topics: tuple[str, ...] = ()
    pattern = ""
    assign: tuple[TopicPartition, ...] = ()
    if strategy == "assign":
        if not value.strip().startswith("{"):
            raise SourceOptionError(f"No topicpartitions to assign as specified value for option 'assign' is '{value}'")
        assign = tuple(topics_from_json(value.strip()))
    elif strategy == "subscribe":
        topics = tuple(t.strip() for t in value.split(",") if t.strip())
        if not topics:
            raise SourceOptionError(f"No topics to subscribe to as specified value for option 'subscribe' is '{value}'")
    else:
        pattern = value.strip()
        if not pattern:
            raise SourceOptionError(
                f"Pattern to subscribe is empty as specified value for option 'subscribePattern' is '{value}'")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise SourceOptionError(f"Invalid value '{value}' for option 'subscribePattern': {exc}") from None

    min_partitions = _int(params, "minpartitions", "minPartitions")
    if min_partitions is not None and min_partitions <= 0:
        raise SourceOptionError("minPartitions must be positive")

    if "kafka.auto.offset.reset" in params:
        raise SourceOptionError(
            "Kafka option 'auto.offset.reset' is not supported. Instead set the source option 'startingoffsets' "
            "to 'earliest' or 'latest' to specify where to start. Structured Streaming manages which offsets are "
            "consumed internally, rather than relying on the kafkaConsumer to do it.")
    for kind in ("key", "value"):
        if f"kafka.{kind}.deserializer" in params:
            raise SourceOptionError(
                f"Kafka option '{kind}.deserializer' is not supported as {kind}s are deserialized as byte arrays "
                f"with ByteArrayDeserializer. Use DataFrame operations to explicitly deserialize the {kind}s.")
    for c in ("enable.auto.commit", "interceptor.classes"):
        if f"kafka.{c}" in params:
            raise SourceOptionError(f"Kafka option '{c}' is not supported")
    bootstrap = params.get("kafka.bootstrap.servers", "").strip()
    if not bootstrap:
        raise SourceOptionError("Option 'kafka.bootstrap.servers' must be specified for configuring Kafka consumer")

    max_per = _int(params, "maxoffsetspertrigger", "maxOffsetsPerTrigger")
    min_per = _int(params, "minoffsetspertrigger", "minOffsetsPerTrigger")
    for name, v in (("maxOffsetsPerTrigger", max_per), ("minOffsetsPerTrigger", min_per)):
        if v is not None and v <= 0:
            raise SourceOptionError(f"Invalid value '{v}' for option '{name}': must be positive")
    if max_per is not None and min_per is not None and min_per > max_per:
        raise SourceOptionError(
            f"The value of minOffsetPerTrigger({min_per}) is higher than the maxOffsetsPerTrigger({max_per}).")

    isolation = params.get("kafka.isolation.level", "read_committed").strip().lower()
    if isolation not in ("read_committed", "read_uncommitted"):
        raise SourceOptionError(
            f"Invalid value {params['kafka.isolation.level']} for configuration isolation.level: "
            "String must be one of: read_committed, read_uncommitted")
    strategy_no_match = params.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
    if strategy_no_match not in ("error", "latest"):
        raise SourceOptionError(
            f"Invalid value '{params['startingoffsetsbytimestampstrategy']}' for option "
            "'startingOffsetsByTimestampStrategy': expected error or latest")
    try:
        security = client_security({k[len("kafka."):]: v for k, v in params.items() if k.startswith("kafka.")},
                                   bootstrap)
    except ValueError as exc:
        raise SourceOptionError(f"Invalid Kafka option: {exc}") from None
    poll_ms = _int(params, "kafkaconsumer.polltimeoutms", "kafkaConsumer.pollTimeoutMs")
    fetch_max = _int(params, "kafka.max.partition.fetch.bytes", "kafka.max.partition.fetch.bytes")
    return SourceOptions(
        bootstrap=",".join(b.strip() for b in bootstrap.split(",") if b.strip()),
        strategy=strategy,
        topics=topics,
        pattern=pattern,
        assign=assign,
        starting=starting,
        ending=ending,
        starting_by_timestamp_strategy=strategy_no_match,
        isolation_level=READ_COMMITTED if isolation == "read_committed" else READ_UNCOMMITTED,
        fail_on_data_loss=_bool(params, "failondataloss", "failOnDataLoss", True),
        include_headers=_bool(params, "includeheaders", "includeHeaders", False),
        max_offsets_per_trigger=max_per,
        min_offsets_per_trigger=min_per,
        max_trigger_delay_ms=time_string_ms(params.get("maxtriggerdelay", "15m"), "maxTriggerDelay"),
        min_partitions=min_partitions,
        poll_timeout_s=(poll_ms if poll_ms is not None else 120_000) / 1000.0,
        fetch_max_bytes=fetch_max if fetch_max and fetch_max > 0 else 4 << 20,
        client_id=params.get("kafka.client.id", "oncelog-spark"),
        security=tuple(sorted(security.items())),
    )


# -- planning --------------------------------------------------------------------------


def rate_limit(limit: int, start: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int],
               new_start: Mapping[TopicPartition, int]) -> OffsetMap:
    """Spark's ``KafkaMicroBatchStream.rateLimit``: share ``limit`` offsets among partitions by backlog.

    ``new_start`` gives the earliest offsets of partitions not in ``start``.
    Counts offsets, not records: with read_committed gaps (markers, aborted
    records) a batch holds at most ``limit`` records.
    """
    sizes: dict[TopicPartition, int] = {}
    for tp, end in latest.items():
        begin = start.get(tp, new_start.get(tp))
        if begin is not None and end - begin > 0:
            sizes[tp] = end - begin
    total = float(sum(sizes.values()))
    if total < 1:
        return dict(latest)
    out: OffsetMap = {}
    for tp, end in latest.items():
        if tp not in sizes:
            out[tp] = end
            continue
        begin = start.get(tp, new_start.get(tp, 0))
        prorate = limit * (sizes[tp] / total)
        n = math.ceil(prorate) if prorate < 1 else math.floor(prorate)  # don't starve small partitions
        out[tp] = min(end, begin + n)
    return out


def split_ranges(ranges: list[tuple[TopicPartition, int, int]], min_partitions: int | None) -> list[tuple[TopicPartition, int, int]]:
    """Spark's ``KafkaOffsetRangeCalculator.getRanges``: drop empty ranges; split big ones for ``minPartitions``."""
    ranges = [r for r in ranges if r[2] - r[1] > 0]
    if min_partitions is None or len(ranges) >= min_partitions:
        return ranges
    total = sum(u - f for _, f, u in ranges)

    def parts_of(size: int, tot: int, n: int) -> int:
        return max(int(math.floor(size / tot * n + 0.5)), 1)

    unsplit = {tp for tp, f, u in ranges if parts_of(u - f, total, min_partitions) == 1}
    split_total = total - sum(u - f for tp, f, u in ranges if tp in unsplit)
    split_min = max(min_partitions - len(unsplit), 1)
    out = []
    for tp, f, u in ranges:
        parts = 1 if tp in unsplit else parts_of(u - f, split_total, split_min)
        remaining, begin = u - f, f
        for i in range(parts):
            this = remaining // (parts - i)
            remaining -= this
            end = min(begin + this, u)
            if end > begin:
                out.append((tp, begin, end))
            begin = end
    return out
