"""The oncelog data source for PySpark 4 (``spark.read`` / ``spark.readStream`` ``.format("oncelog")``).

Built on Spark's Python Data Source API. Same options and row schema as
Spark's Kafka source; read_committed by default. Offsets are Spark's
Kafka source offsets (``{"topic": {"0": 23}}``), so the checkpoint holds the
same JSON and an end offset can be given back as ``startingOffsets``.

Batch: ``partitions()`` resolves starting and ending offsets on the driver
and plans one input partition per topic partition (more with
``minPartitions``). Streaming: ``latestOffset(start, limit)`` reads the
latest offsets (the last stable offset under read_committed), applies
``maxOffsetsPerTrigger`` (``ReadMaxRows``) and ``minOffsetsPerTrigger`` /
``maxTriggerDelay``; ``partitions(start, end)`` handles added and deleted
partitions as Spark does. ``read()`` yields ``pyarrow.RecordBatch``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from oncelog.spark._kafka import KafkaAccess, log, read_arrow, resolve
from oncelog.spark.options import (
    DATA_LOSS_WARNING,
    OffsetMap,
    SourceOptionError,
    SourceOptions,
    data_loss,
    offsets_from_json,
    offsets_to_json,
    parse_options,
    rate_limit,
    split_ranges,
    tp_name,
    tp_set,
)

BASE_SCHEMA = ("key binary, value binary, topic string, partition int, offset long, "
               "timestamp timestamp, timestampType int")
HEADERS_SCHEMA = BASE_SCHEMA + ", headers array<struct<key: string, value: binary>>"


class OffsetRangePartition(InputPartition):
    """One Spark task: offsets ``[start, end)`` of one topic partition."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end


def _read(opts: SourceOptions, partition: InputPartition) -> Iterator[Any]:
    if not isinstance(partition, OffsetRangePartition):
        return iter(())  # Spark's placeholder when there is nothing to read
    return read_arrow(opts, partition.topic, partition.partition, partition.start, partition.end)


class OncelogDataSource(DataSource):
    """``format("oncelog")``: Spark's Kafka source options and schema, read_committed by default."""

    @classmethod
    def name(cls) -> str:
        return "oncelog"

    def schema(self) -> str:
        headers = str(self.options.get("includeHeaders", "false")).strip().lower() == "true"
        return HEADERS_SCHEMA if headers else BASE_SCHEMA

    def reader(self, schema: StructType) -> "OncelogBatchReader":
        return OncelogBatchReader(parse_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> "OncelogStreamReader":
        return OncelogStreamReader(parse_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> Any:
        from oncelog.spark.sink import OncelogBatchWriter, parse_sink_options

        return OncelogBatchWriter(parse_sink_options(self.options, streaming=False))

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        from oncelog.spark.sink import OncelogStreamWriter, parse_sink_options

        return OncelogStreamWriter(parse_sink_options(self.options, streaming=True))


def _ranges(opts: SourceOptions, start: OffsetMap, end: OffsetMap) -> list[InputPartition]:
    planned = split_ranges([(tp, start[tp], end[tp]) for tp in sorted(end) if tp in start], opts.min_partitions)
    return [OffsetRangePartition(tp[0], tp[1], f, u) for tp, f, u in planned]


class OncelogBatchReader(DataSourceReader):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts

    def partitions(self) -> list[InputPartition]:
        with KafkaAccess(self.opts) as k:
            tps = k.partitions()
            start = resolve(k, self.opts.starting, tps, starting=True,
                            no_match_latest=self.opts.starting_by_timestamp_strategy == "latest")
            end = resolve(k, self.opts.ending, tps, starting=False)
        for tp in sorted(tps):
            if start[tp] > end[tp]:
                raise SourceOptionError(
                    f"The resolved start offset {start[tp]} is greater than the resolved end offset {end[tp]} "
                    f"for topic {tp[0]} partition {tp[1]}.")
        return _ranges(self.opts, start, end)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read(self.opts, partition)


class OncelogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over Spark's Kafka offsets; state kept here lives in the driver's Python worker."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._access: KafkaAccess | None = None
        self._last_trigger_ms = 0.0
        self._available_now: OffsetMap | None = None

    def __getstate__(self) -> dict[str, Any]:  # pickled to the executors for read(): no sockets
        state = self.__dict__.copy()
        state["_access"] = None
        return state

    @property
    def access(self) -> KafkaAccess:
        if self._access is None:
            self._access = KafkaAccess(self.opts)
        return self._access

    def initialOffset(self) -> dict:
        tps = self.access.partitions()
        start = resolve(self.access, self.opts.starting, tps, starting=True,
                        no_match_latest=self.opts.starting_by_timestamp_strategy == "latest")
        return offsets_to_json(start)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        if self.opts.min_offsets_per_trigger is not None:
            return ReadMinRows(self.opts.min_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = self.access.latest(self.access.partitions())

    def _latest(self) -> OffsetMap:
        if self._available_now is not None:
            return dict(self._available_now)
        return self.access.latest(self.access.partitions())

    def _delay(self, latest: OffsetMap, start: OffsetMap) -> bool:
        """minOffsetsPerTrigger: hold the batch back until enough offsets or maxTriggerDelay passed."""
        now = time.time() * 1000
        if now - self._last_trigger_ms >= self.opts.max_trigger_delay_ms:
            self._last_trigger_ms = now
            return False
        new = sum(o - start.get(tp, 0) for tp, o in latest.items())
        if new < (self.opts.min_offsets_per_trigger or 0):
            return True
        self._last_trigger_ms = now
        return False

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        start_map = offsets_from_json(start, "start offset")
        latest = self._latest()
        if isinstance(limit, ReadAllAvailable):
            return offsets_to_json(latest)
        if self.opts.min_offsets_per_trigger is not None and self._delay(latest, start_map):
            return start
        if isinstance(limit, ReadMaxRows):
            new = [tp for tp in latest if tp not in start_map]
            return offsets_to_json(rate_limit(limit.max_rows, start_map, latest, self.access.earliest(new)))
        return offsets_to_json(latest)

    def reportLatestOffset(self) -> dict | None:
        return None

    def _report(self, sub_class: str, reason: str) -> None:
        if self.opts.fail_on_data_loss:
            raise data_loss(sub_class, reason)
        log.warning("%s %s", reason, DATA_LOSS_WARNING)

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        start_map = offsets_from_json(start, "start offset")
        end_map = offsets_from_json(end, "end offset")
        added = set(end_map) - set(start_map)
        if added:
            live = self.access.partitions()
            initial = self.access.earliest(added & live)
            gone = added - set(initial)
            if gone:
                self._report("INITIAL_OFFSET_NOT_FOUND_FOR_PARTITIONS",
                             f"Cannot find initial offsets for partitions {tp_set(gone)}. They may have been deleted.")
            for tp, o in sorted(initial.items()):
                if o != 0:
                    self._report("ADDED_PARTITION_DOES_NOT_START_FROM_OFFSET_ZERO",
                                 f"Added partition {tp_name(tp)} starts from {o} instead of 0.")
            start_map.update(initial)
        deleted = set(start_map) - set(end_map)
        if deleted:
            self._report("PARTITIONS_DELETED", f"Partitions {tp_set(deleted)} have been deleted.")
        for tp in sorted(end_map):
            if tp in start_map and end_map[tp] < start_map[tp]:
                self._report("PARTITION_OFFSET_CHANGED",
                             f"Partition {tp_name(tp)} offset was changed from {start_map[tp]} to {end_map[tp]}.")
        return _ranges(self.opts, start_map, end_map)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read(self.opts, partition)

    def commit(self, end: dict) -> None:
        pass

    def stop(self) -> None:
        if self._access is not None:
            self._access.close()
            self._access = None
