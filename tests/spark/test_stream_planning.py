"""The stream reader's admission control and partition planning, driven directly (no SparkSession).

A fake cluster answers the partition and offset questions, so each rule of
``latestOffset(start, limit)`` and ``partitions(start, end)`` is checked
exactly; the end-to-end behaviour is in test_source.py.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

from oncelog.spark.options import DataLossError, parse_options
from oncelog.spark.source import OffsetRangePartition, OncelogStreamReader


class FakeCluster:
    def __init__(self, latest: dict[tuple[str, int], int], earliest: dict[tuple[str, int], int] | None = None):
        self.latest_offsets = latest
        self.earliest_offsets = earliest or {tp: 0 for tp in latest}

    def partitions(self) -> set[tuple[str, int]]:
        return set(self.latest_offsets)

    def latest(self, tps: Any) -> dict[tuple[str, int], int]:
        return {tp: self.latest_offsets[tp] for tp in tps}

    def earliest(self, tps: Any) -> dict[tuple[str, int], int]:
        return {tp: self.earliest_offsets[tp] for tp in tps if tp in self.earliest_offsets}

    def close(self) -> None:
        pass


def reader(cluster: FakeCluster, **opts: str) -> OncelogStreamReader:
    r = OncelogStreamReader(parse_options({"kafka.bootstrap.servers": "x:1", "subscribe": "t", **opts}, streaming=True))
    r._access = cluster  # type: ignore[assignment]
    return r


def test_max_offsets_per_trigger_is_the_default_limit_and_bounds_offsets() -> None:
    c = FakeCluster({("t", 0): 100, ("t", 1): 10})
    r = reader(c, maxOffsetsPerTrigger="22")
    assert r.getDefaultReadLimit() == ReadMaxRows(22)
    end = r.latestOffset({"t": {"0": 0, "1": 0}}, ReadMaxRows(22))
    assert end == {"t": {"0": 20, "1": 2}}  # 22 * 100/110 = 20, 22 * 10/110 = 2
    # the engine may ask for everything (Trigger.AvailableNow without support, or a one-off): obey it
    assert r.latestOffset({"t": {"0": 0, "1": 0}}, ReadAllAvailable()) == {"t": {"0": 100, "1": 10}}


def test_min_offsets_per_trigger_waits_until_enough_or_max_delay() -> None:
    c = FakeCluster({("t", 0): 5})
    r = reader(c, minOffsetsPerTrigger="10", maxTriggerDelay="300ms")
    assert r.getDefaultReadLimit() == ReadMinRows(10)
    start = {"t": {"0": 0}}
    assert r.latestOffset(start, ReadMinRows(10)) == {"t": {"0": 5}}  # the first batch is never held back
    c.latest_offsets[("t", 0)] = 9
    assert r.latestOffset({"t": {"0": 5}}, ReadMinRows(10)) == {"t": {"0": 5}}  # 4 new < 10: wait
    c.latest_offsets[("t", 0)] = 15
    assert r.latestOffset({"t": {"0": 5}}, ReadMinRows(10)) == {"t": {"0": 15}}  # 10 new: go
    c.latest_offsets[("t", 0)] = 16
    assert r.latestOffset({"t": {"0": 15}}, ReadMinRows(10)) == {"t": {"0": 15}}
    time.sleep(0.35)
    assert r.latestOffset({"t": {"0": 15}}, ReadMinRows(10)) == {"t": {"0": 16}}  # maxTriggerDelay passed


def test_available_now_stops_at_the_offsets_of_its_start() -> None:
    c = FakeCluster({("t", 0): 50})
    r = reader(c, maxOffsetsPerTrigger="30")
    r.prepareForTriggerAvailableNow()
    c.latest_offsets[("t", 0)] = 500
    assert r.latestOffset({"t": {"0": 0}}, ReadMaxRows(30)) == {"t": {"0": 30}}
    assert r.latestOffset({"t": {"0": 30}}, ReadMaxRows(30)) == {"t": {"0": 50}}
    assert r.latestOffset({"t": {"0": 50}}, ReadMaxRows(30)) == {"t": {"0": 50}}


def test_partitions_plan_added_and_deleted_partitions() -> None:
    c = FakeCluster({("t", 0): 10, ("t", 1): 4, ("t", 2): 3}, earliest={("t", 0): 0, ("t", 1): 0, ("t", 2): 2})
    r = reader(c, minPartitions="3")
    parts = r.partitions({"t": {"0": 2}}, {"t": {"0": 10, "1": 4}})
    assert all(isinstance(p, OffsetRangePartition) for p in parts)
    assert sorted((p.partition, p.start, p.end) for p in parts) == [(0, 2, 6), (0, 6, 10), (1, 0, 4)]
    with pytest.raises(DataLossError, match=r"ADDED_PARTITION_DOES_NOT_START_FROM_OFFSET_ZERO.*t-2 starts from 2"):
        r.partitions({"t": {"0": 2}}, {"t": {"0": 10, "2": 3}})
    with pytest.raises(DataLossError, match=r"PARTITIONS_DELETED.*Partitions \{t-1\} have been deleted"):
        r.partitions({"t": {"0": 2, "1": 1}}, {"t": {"0": 10}})
    with pytest.raises(DataLossError, match=r"PARTITION_OFFSET_CHANGED.*t-0 offset was changed from 8 to 3"):
        r.partitions({"t": {"0": 8}}, {"t": {"0": 3}})
    lenient = reader(c, failOnDataLoss="false")
    assert [(p.partition, p.start, p.end) for p in lenient.partitions({"t": {"0": 2, "1": 1}}, {"t": {"0": 10}})] == [
        (0, 2, 10)]
    assert lenient.partitions({"t": {"0": 5}}, {"t": {"0": 5}}) == []
