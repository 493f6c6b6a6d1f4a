"""Everything the Spark source asks of the cluster, in one place.

Today it reads with :class:`oncelog.client.reader.PartitionReader` (Metadata,
ListOffsets, Fetch, decompression, read_committed filtering, all over the
protocol); the rest of ``oncelog.spark`` sees only :class:`KafkaAccess` and
:func:`read_arrow`, so moving to the ``oncelog.client`` consumer changes this
module alone. Layer rule: ``oncelog.client`` only, never the broker or
storage, so the source reads from Apache Kafka as well.
"""

from __future__ import annotations

import logging
import re
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from typing import Any

from oncelog.client.reader import EARLIEST, LATEST, PartitionReader, ReaderError
from oncelog.protocol.records import decode_columns
from oncelog.spark.options import (
    DATA_LOSS_WARNING,
    OffsetMap,
    SourceOptions,
    TopicPartition,
    data_loss,
    tp_name,
)

log = logging.getLogger("oncelog.spark")

OFFSET_OUT_OF_RANGE = 1
UNKNOWN_TOPIC_OR_PARTITION = 3


def connect(opts: SourceOptions) -> PartitionReader:
    """A reader connected to the first bootstrap server that answers (tried in the given order), with the
    options' TLS and SASL settings (a failed TLS handshake or login is raised at once, not tried elsewhere)."""
    servers = opts.bootstrap.split(",")
    for i, server in enumerate(servers):
        try:
            return PartitionReader(server, timeout=30.0, client_id=opts.client_id, config=opts.client_config)
        except OSError:
            if i == len(servers) - 1:
                raise
    raise AssertionError("no bootstrap server")  # parse_options never gives an empty list


class KafkaAccess:
    """Driver-side questions: which partitions the options name, and their offsets."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._reader: PartitionReader | None = None

    @property
    def reader(self) -> PartitionReader:
        if self._reader is None:
            self._reader = connect(self.opts)
        return self._reader

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def __enter__(self) -> "KafkaAccess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, *args: Any) -> Any:
        """``self.reader.<method>(*args)``; on a broken connection, reconnect once and retry."""
        try:
            return getattr(self.reader, method)(*args)
        except OSError:
            self.close()
            return getattr(self.reader, method)(*args)

    def partitions(self) -> set[TopicPartition]:
        """The topic partitions the subscription covers now (deleted topics are simply absent)."""
        o = self.opts
        if o.strategy == "assign":
            return set(o.assign)
        if o.strategy == "subscribe":
            found = self._call("topic_partitions", list(o.topics))
        else:
            pattern = re.compile(o.pattern)
            found = {t: ps for t, ps in self._call("topic_partitions", None).items()
                     if pattern.fullmatch(t)}
        return {(t, p) for t, ps in found.items() if ps for p in ps}

    def _list(self, tps: Iterable[TopicPartition], timestamp: int, isolation: int) -> OffsetMap:
        out: OffsetMap = {}
        for t, p in sorted(tps):
            out[(t, p)] = self._call("list_offset", t, p, timestamp, isolation)
        return out

    def earliest(self, tps: Iterable[TopicPartition]) -> OffsetMap:
        return self._list(tps, EARLIEST, self.opts.isolation_level)

    def latest(self, tps: Iterable[TopicPartition]) -> OffsetMap:
        """The high watermark, or under read_committed the last stable offset."""
        return self._list(tps, LATEST, self.opts.isolation_level)

    def by_timestamp(self, tps: Iterable[TopicPartition], timestamps: dict[TopicPartition, int]) -> OffsetMap:
        """The first offset whose timestamp is at or after each timestamp; -1 when there is none."""
        out: OffsetMap = {}
        for tp in sorted(tps):
            out[tp] = self._call("list_offset", tp[0], tp[1], timestamps[tp], self.opts.isolation_level)
        return out


def _arrow_batch(topic: str, partition: int, batches: list[Any], start: int, end: int,
                 include_headers: bool) -> Any:
    """One ``pyarrow.RecordBatch`` in the Kafka source's row schema, built column by column.

    ``batches`` carry their uncompressed bytes (``raw``); their records are
    decoded straight into lists (no per-record objects) and cut to offsets
    ``[start, end)``. None when nothing is left.
    """
    import pyarrow as pa

    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    offsets: list[int] = []
    stamps: list[int] = []
    types: list[int] = []
    headers: list[list[dict[str, Any]]] = []
    for b in batches:
        cols = decode_columns(b.raw, 0, include_headers)
        lo, hi = 0, len(cols.offsets)
        if b.header.base_offset < start:
            lo = bisect_left(cols.offsets, start)
        if b.header.last_offset >= end:
            hi = bisect_left(cols.offsets, end)
        if lo >= hi:
            continue
        whole = lo == 0 and hi == len(cols.offsets)
        keys.extend(cols.keys if whole else cols.keys[lo:hi])
        values.extend(cols.values if whole else cols.values[lo:hi])
        offsets.extend(cols.offsets if whole else cols.offsets[lo:hi])
        stamps.extend(cols.timestamps if whole else cols.timestamps[lo:hi])
        types.extend([b.header.timestamp_type] * (hi - lo))
        if include_headers and cols.headers is not None:
            headers.extend([{"key": k, "value": v} for k, v in hs] for hs in cols.headers[lo:hi])
    n = len(offsets)
    if not n:
        return None
    arrays = [
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        pa.array(offsets, pa.int64()),
        pa.array(stamps, pa.int64()).cast(pa.timestamp("ms", tz="UTC")).cast(pa.timestamp("us", tz="UTC")),
        pa.array(types, pa.int32()),
    ]
    names = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
    if include_headers:
        arrays.append(pa.array(headers, HEADERS_ARROW_TYPE()))
        names.append("headers")
    return pa.RecordBatch.from_arrays(arrays, names=names)


def HEADERS_ARROW_TYPE() -> Any:  # noqa: N802 - a type constant, built lazily (pyarrow is optional)
    import pyarrow as pa

    return pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def read_arrow(opts: SourceOptions, topic: str, partition: int, start: int, end: int) -> Iterator[Any]:
    """Offsets ``[start, end)`` of one partition as Arrow record batches (executor side).

    Offsets of markers and aborted records are gaps; the range may end on
    one. Data that is gone follows ``failOnDataLoss``: an error, or a warning
    and a skip to what is left.
    """
    tp = (topic, partition)
    pos = start
    with connect(opts) as reader:
        while pos < end:
            try:
                for batches, next_pos in reader.iter_range(topic, partition, pos, end, opts.isolation_level,
                                                           opts.fetch_max_bytes, opts.poll_timeout_s, records=False):
                    # cut at this fetch's position: after a data-loss skip it is above ``start``
                    arrow = _arrow_batch(topic, partition, batches, pos, end, opts.include_headers)
                    pos = next_pos
                    if arrow is not None:
                        yield arrow
            except ReaderError as exc:
                if exc.error_code == OFFSET_OUT_OF_RANGE:
                    earliest = reader.list_offset(topic, partition, EARLIEST)
                    if opts.fail_on_data_loss or earliest <= pos:
                        raise data_loss("COULD_NOT_READ_OFFSET_RANGE",
                                        f"Could not read records in offset [{pos}, {end}) for topic partition "
                                        f"{tp_name(tp)}: the log starts at {earliest} now.") from None
                    log.warning("Offset %d of %s is out of range, records in [%d, %d) are skipped. %s",
                                pos, tp_name(tp), pos, min(earliest, end), DATA_LOSS_WARNING)
                    pos = earliest
                    continue
                if exc.error_code == UNKNOWN_TOPIC_OR_PARTITION:
                    if opts.fail_on_data_loss:
                        raise data_loss("PARTITIONS_DELETED",
                                        f"Partitions {{{tp_name(tp)}}} have been deleted.") from None
                    log.warning("%s is gone, records in [%d, %d) are skipped. %s", tp_name(tp), pos, end,
                                DATA_LOSS_WARNING)
                    return
                raise


def resolve(access: KafkaAccess, spec: Any, tps: set[TopicPartition], *, starting: bool,
            no_match_latest: bool = False) -> OffsetMap:
    """An :class:`~oncelog.spark.options.OffsetSpec` as concrete offsets of ``tps``."""
    from oncelog.spark.options import SourceOptionError

    which = "startingOffsets" if starting else "endingOffsets"
    if spec.kind == "earliest":
        return access.earliest(tps)
    if spec.kind == "latest":
        return access.latest(tps)
    if spec.kind == "offsets":
        if set(spec.offsets) != tps:
            raise SourceOptionError(
                f"If {which} contains specific offsets, you must specify all TopicPartitions. "
                f"Use -1 for latest, -2 for earliest. Specified: {_set(spec.offsets)} Assigned: {_set(tps)}")
        out = dict(spec.offsets)
        need_e = [tp for tp, o in out.items() if o == EARLIEST]
        need_l = [tp for tp, o in out.items() if o == LATEST]
        out.update(access.earliest(need_e))
        out.update(access.latest(need_l))
        return out
    if spec.kind == "timestamps":
        if set(spec.offsets) != tps:
            raise SourceOptionError(
                f"Partitions specified for Kafka timestamp based {'starting' if starting else 'ending'} offsets "
                f"don't match what are assigned. Maybe topic partitions are created or deleted while the query "
                f"is running, or you didn't specify all the partitions. Specified: {_set(spec.offsets)} "
                f"Assigned: {_set(tps)}")
        stamps = dict(spec.offsets)
    else:  # one timestamp for all partitions
        stamps = {tp: spec.timestamp for tp in tps}
    found = access.by_timestamp(tps, stamps)
    missing = [tp for tp, o in found.items() if o < 0]
    if missing:
        if starting and not no_match_latest:
            tp = sorted(missing)[0]
            raise SourceOptionError(
                f"No offset matched from request of topic-partition {tp_name(tp)} and timestamp {stamps[tp]}.")
        found.update(access.latest(missing))  # ending offsets, or startingOffsetsByTimestampStrategy=latest
    return found


def _set(tps: Iterable[TopicPartition]) -> str:
    return "Set(" + ", ".join(tp_name(tp) for tp in sorted(tps)) + ")"
