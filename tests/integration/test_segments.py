"""Segments, retention and topic configs, observed through real clients and on disk.

Brokers here run with tiny limits (4 KiB segments, a 200 ms retention check)
so a few thousand records roll many segments and retention acts quickly.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore:read_text is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:open_text is deprecated:DeprecationWarning"),
]

SEGMENT_BYTES = 4096
TINY = {"log.segment.bytes": str(SEGMENT_BYTES), "log.retention.check.interval.ms": "200"}


def value_of(i: int) -> bytes:
    return f"rec-{i:06d}-".encode() + b"v" * (40 + i % 60)


def id_of(value: bytes) -> int:
    return int(value[4:10])


def produce(bootstrap: str, topic: str, ids: range, partitions: int,
            ts_of: Any = None) -> dict[int, tuple[int, int]]:
    """acks=all, small batches (so segments hold several); returns id -> (partition, offset)."""
    from confluent_kafka import Producer

    acked: dict[int, tuple[int, int]] = {}
    errors: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            acked[id_of(msg.value())] = (msg.partition(), msg.offset())

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 2, "batch.size": 1500})
    for i in ids:
        kwargs = {"timestamp": ts_of(i)} if ts_of else {}
        while True:
            try:
                p.produce(topic, value=value_of(i), key=b"%d" % i, partition=i % partitions,
                          on_delivery=on_delivery, **kwargs)
                break
            except BufferError:
                p.poll(0.05)
        if i % 500 == 0:
            p.poll(0)
    assert p.flush(60) == 0
    assert not errors, errors[:3]
    assert len(acked) == len(ids)
    return acked


def per_partition(acked: dict[int, tuple[int, int]]) -> dict[int, dict[int, int]]:
    """partition -> {offset: id}"""
    out: dict[int, dict[int, int]] = {}
    for i, (p, off) in acked.items():
        out.setdefault(p, {})[off] = i
    return out


def segment_sizes(kit: Any, data_dir: Path, topic: str, p: int) -> list[tuple[int, int]]:
    """(base offset, bytes) of each segment; tolerates retention deleting files meanwhile."""
    out = []
    for f in kit.segment_files(data_dir, topic, p):
        try:
            out.append((int(f.stem), f.stat().st_size))
        except FileNotFoundError:
            continue
    return out


def segment_bases(kit: Any, data_dir: Path, topic: str, p: int) -> list[int]:
    return [base for base, _size in segment_sizes(kit, data_dir, topic, p)]


# -- rolling and reading across segments ------------------------------------------------------


def test_segments_roll_and_reads_span_them(tmp_path: Path, kit: Any) -> None:
    from confluent_kafka import Consumer, TopicPartition

    b = kit.start_broker(tmp_path, config=TINY)
    try:
        topic, partitions, n = "rolled", 2, 3_000
        kit.create_topic(b.bootstrap, topic, partitions)
        base_ts = int(time.time() * 1000) - 600_000
        acked = produce(b.bootstrap, topic, range(n), partitions, ts_of=lambda i: base_ts + i * 10)
        by_part = per_partition(acked)
        ends = {p: len(by_part[p]) for p in range(partitions)}

        for p in range(partitions):
            files = kit.segment_files(b.data_dir, topic, p)
            assert len(files) >= 20, f"partition {p}: only {len(files)} segments"
            assert kit.partition_dir(b.data_dir, topic, p).is_dir()
            for f in files:
                size = f.stat().st_size
                assert size <= SEGMENT_BYTES or len(kit.scan_batches(f)) == 1, f"{f.name} is {size} bytes"
                assert f.name == f"{int(f.stem):020d}.log"
            # segment names are the base offsets of a contiguous chain of whole batches
            first, nxt, batches = kit.check_segment_chain(b.data_dir, topic, p)
            assert (first, nxt) == (0, ends[p]) and batches >= len(files)
            assert segment_bases(kit, b.data_dir, topic, p)[0] == 0

        # everything readable across all segments, in order, at the acked offsets
        msgs = kit.confluent_consume_all(b.bootstrap, topic, ends, timeout=60)
        for p, lst in msgs.items():
            assert [m.offset() for m in lst] == list(range(ends[p]))
            assert [id_of(m.value()) for m in lst] == [by_part[p][o] for o in range(ends[p])]
            assert all(m.value() == value_of(id_of(m.value())) for m in lst)
            assert [m.timestamp()[1] for m in lst] == [base_ts + by_part[p][o] * 10 for o in range(ends[p])]

        # reads starting in the middle: inside a segment, and exactly at a segment base
        for p in range(partitions):
            bases = segment_bases(kit, b.data_dir, topic, p)
            mid_base = bases[len(bases) // 2]
            for start in (ends[p] // 2 + 1, mid_base, mid_base + 1, ends[p] - 1):
                got = kit.confluent_consume_all(b.bootstrap, topic, {p: ends[p]}, start={p: start}, timeout=30)[p]
                assert [m.offset() for m in got] == list(range(start, ends[p])), (p, start)
                assert id_of(got[0].value()) == by_part[p][start]

        # kafka-python from a middle offset, and its view of the offsets
        from kafka import KafkaConsumer
        from kafka import TopicPartition as KTP

        kc = KafkaConsumer(bootstrap_servers=b.bootstrap, enable_auto_commit=False, auto_offset_reset="none")
        try:
            tp = KTP(topic, 1)
            assert kc.beginning_offsets([tp]) == {tp: 0}
            assert kc.end_offsets([tp]) == {tp: ends[1]}
            kc.assign([tp])
            start = ends[1] // 3
            kc.seek(tp, start)
            got_ids: list[int] = []
            deadline = time.monotonic() + 30
            while len(got_ids) < 50:
                assert time.monotonic() < deadline, "kafka-python read from the middle timed out"
                for recs in kc.poll(timeout_ms=500, max_records=50).values():
                    assert recs[0].offset == start + len(got_ids)
                    got_ids += [id_of(r.value) for r in recs]
            assert got_ids[:50] == [by_part[1][o] for o in range(start, start + 50)]
        finally:
            kc.close()

        # offsets_for_times goes through the time indexes of the right segment
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "unused", "enable.auto.commit": False})
        try:
            for i in (0, 1, n // 2, n // 2 + 1, n - 1):
                p, off = acked[i]
                (res,) = c.offsets_for_times([TopicPartition(topic, p, base_ts + i * 10)], timeout=10)
                assert (res.error, res.offset) == (None, off), (i, res)
            (res,) = c.offsets_for_times([TopicPartition(topic, 0, base_ts + n * 10 + 1)], timeout=10)
            assert res.offset == -1  # nothing that late: end of log
        finally:
            c.close()
    finally:
        b.close()


# -- retention by size -------------------------------------------------------------------------


def test_retention_by_size_deletes_old_segments(tmp_path: Path, kit: Any) -> None:
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    retention = 20_000
    b = kit.start_broker(tmp_path, config={**TINY, "log.retention.bytes": str(retention)})
    try:
        topic, n = "sized", 2_000
        kit.create_topic(b.bootstrap, topic, 1)
        acked = produce(b.bootstrap, topic, range(n), 1)
        offset_to_id = per_partition(acked)[0]
        assert sorted(offset_to_id) == list(range(n))

        # Kafka's rule: drop the oldest segment while the rest would still hold
        # retention.bytes.  Wait for a retention pass to get there.
        def settled() -> bool:
            sizes = segment_sizes(kit, b.data_dir, topic, 0)
            total = sum(size for _b, size in sizes)
            return sizes[0][0] > 0 and total - sizes[0][1] < retention

        kit.wait_until(settled, timeout=30, message="size retention")
        low, high = kit.confluent_watermarks(b.bootstrap, topic, 1)[0]
        sizes = segment_sizes(kit, b.data_dir, topic, 0)
        total = sum(size for _b, size in sizes)
        assert high == n
        assert 0 < low < n
        # whole segments went: the log starts at the base of the oldest remaining segment
        assert sizes[0][0] == low
        # ... and no more than needed
        assert total >= retention, f"{total} bytes left, retention.bytes {retention}"
        assert len(sizes) >= retention // SEGMENT_BYTES
        first, nxt, _ = kit.check_segment_chain(b.data_dir, topic, 0)
        assert (first, nxt) == (low, n)

        # kafka-python agrees on the log start offset
        from kafka import KafkaConsumer
        from kafka import TopicPartition as KTP

        kc = KafkaConsumer(bootstrap_servers=b.bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
        try:
            ktp = KTP(topic, 0)
            assert kc.beginning_offsets([ktp]) == {ktp: low}
            # a fetch below the log start: OFFSET_OUT_OF_RANGE, reset to earliest
            kc.assign([ktp])
            kc.seek(ktp, 0)
            deadline = time.monotonic() + 30
            first_rec = None
            while first_rec is None:
                assert time.monotonic() < deadline, "kafka-python did not recover from OFFSET_OUT_OF_RANGE"
                for recs in kc.poll(timeout_ms=500, max_records=10).values():
                    first_rec = recs[0]
            assert first_rec.offset == low
            assert id_of(first_rec.value) == offset_to_id[low]
        finally:
            kc.close()

        # confluent with auto.offset.reset=earliest: same recovery, then everything left
        got = kit.confluent_consume_all(b.bootstrap, topic, {0: n}, start={0: 0}, timeout=30,
                                        extra={"auto.offset.reset": "earliest"})[0]
        assert [m.offset() for m in got] == list(range(low, n))
        assert [id_of(m.value()) for m in got] == [offset_to_id[o] for o in range(low, n)]

        # confluent with auto.offset.reset=error surfaces the broker's OFFSET_OUT_OF_RANGE
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "unused", "enable.auto.commit": False,
                      "auto.offset.reset": "error"})
        try:
            c.assign([TopicPartition(topic, 0, 0)])
            deadline = time.monotonic() + 30
            err = None
            while err is None:
                assert time.monotonic() < deadline, "no offset reset error for a fetch below the log start"
                m = c.poll(0.5)
                if m is not None:
                    assert m.error() is not None, f"got a record at {m.offset()} from below the log start"
                    err = m.error()
            assert err.code() == KafkaError._AUTO_OFFSET_RESET, err
        finally:
            c.close()
    finally:
        b.close()


# -- retention by time -------------------------------------------------------------------------


def test_retention_by_time_topic_config(tmp_path: Path, kit: Any) -> None:
    """retention.ms set through CreateTopics removes segments whose newest record is too old."""
    b = kit.start_broker(tmp_path, config=TINY)
    try:
        topic, n, old_n = "timed", 1_500, 1_000
        kit.create_topic(b.bootstrap, topic, 1, config={"retention.ms": "60000"})
        now = int(time.time() * 1000)
        # the first old_n records are an hour old, the rest are current
        acked = produce(b.bootstrap, topic, range(n), 1,
                        ts_of=lambda i: now - 3_600_000 + i if i < old_n else now + i)
        offset_to_id = per_partition(acked)[0]
        first_new = min(off for i, (_p, off) in acked.items() if i >= old_n)
        assert first_new == old_n

        def settled() -> bool:
            bases = segment_bases(kit, b.data_dir, topic, 0)
            return bases[0] > 0 and (len(bases) == 1 or bases[1] > first_new)

        # wait until the oldest remaining segment is the one that holds the first current record
        kit.wait_until(settled, timeout=30, message="time retention")
        low, high = kit.confluent_watermarks(b.bootstrap, topic, 1)[0]
        assert high == n
        assert low == segment_bases(kit, b.data_dir, topic, 0)[0]
        assert 0 < low <= first_new, (low, first_new)

        # every current record survived; only old ones went
        got = kit.confluent_consume_all(b.bootstrap, topic, {0: n}, start={0: low}, timeout=30)[0]
        assert [m.offset() for m in got] == list(range(low, n))
        assert [id_of(m.value()) for m in got] == [offset_to_id[o] for o in range(low, n)]
    finally:
        b.close()


def test_retention_by_time_after_alter_configs(tmp_path: Path, kit: Any) -> None:
    """Records an hour old survive the 7-day default, then go once retention.ms is lowered."""
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    b = kit.start_broker(tmp_path, config=TINY)
    try:
        topic, n = "altered", 800
        kit.create_topic(b.bootstrap, topic, 1)
        old = int(time.time() * 1000) - 3_600_000
        produce(b.bootstrap, topic, range(n), 1, ts_of=lambda i: old + i)
        assert len(segment_bases(kit, b.data_dir, topic, 0)) > 5
        assert kit.confluent_watermarks(b.bootstrap, topic, 1)[0] == (0, n)

        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        res = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
            ConfigEntry("retention.ms", "60000", incremental_operation=AlterConfigOpType.SET)])
        admin.incremental_alter_configs([res])[res].result(timeout=15)

        # every segment is too old now; the log empties to its end offset and stays writable
        kit.wait_until(lambda: kit.confluent_watermarks(b.bootstrap, topic, 1)[0] == (n, n),
                       timeout=30, message="retention after AlterConfigs")
        assert segment_bases(kit, b.data_dir, topic, 0)[0] == n
        acked = produce(b.bootstrap, topic, range(n, n + 10), 1)  # current timestamps
        assert sorted(off for _p, off in acked.values()) == list(range(n, n + 10))
        got = kit.confluent_consume_all(b.bootstrap, topic, {0: n + 10}, start={0: n}, timeout=30)[0]
        assert [id_of(m.value()) for m in got] == list(range(n, n + 10))
    finally:
        b.close()


# -- topic-level configs -----------------------------------------------------------------------


def test_topic_segment_bytes_config_described_and_applied(tmp_path: Path, kit: Any) -> None:
    from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource

    # broker defaults are large here: only the topic override can make small segments
    b = kit.start_broker(tmp_path, config={"log.retention.bytes": "123456789"})
    try:
        topic, seg = "configured", 8192
        kit.create_topic(b.bootstrap, topic, 1, config={"segment.bytes": str(seg), "retention.ms": "86400000"})

        def describe() -> dict[str, Any]:
            admin = AdminClient({"bootstrap.servers": b.bootstrap})
            res = ConfigResource(ConfigResource.Type.TOPIC, topic)
            return admin.describe_configs([res])[res].result(timeout=15)

        def check(cfg: dict[str, Any]) -> None:
            assert cfg["segment.bytes"].value == str(seg)
            assert cfg["segment.bytes"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
            assert cfg["retention.ms"].value == "86400000"
            assert cfg["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
            # from the broker's config file
            assert cfg["retention.bytes"].value == "123456789"
            assert cfg["retention.bytes"].source == ConfigSource.STATIC_BROKER_CONFIG.value
            # nobody set it: Kafka's default
            assert cfg["max.message.bytes"].value == "1048588"
            assert cfg["max.message.bytes"].source == ConfigSource.DEFAULT_CONFIG.value

        check(describe())

        produce(b.bootstrap, topic, range(1_000), 1)
        files = kit.segment_files(b.data_dir, topic, 0)
        assert len(files) >= 5
        assert all(f.stat().st_size <= seg for f in files)
        assert kit.check_segment_chain(b.data_dir, topic, 0)[:2] == (0, 1_000)

        # the override survives a restart
        b.restart()
        check(describe())
    finally:
        b.close()


# -- ListOffsets by timestamp inside a compressed batch -------------------------------------------


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_offsets_for_times_finds_the_record_inside_a_compressed_batch(tmp_path: Path, kit: Any, codec: str) -> None:
    """librdkafka packs many records (distinct CreateTime timestamps) into one compressed batch;
    offsets_for_times must return the exact record's offset (Kafka's FileRecords.searchForTimestamp),
    not the batch's base offset."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    b = kit.start_broker(tmp_path)
    try:
        topic = f"ts-{codec}"
        kit.create_topic(b.bootstrap, topic, 1)
        n, base_ts = 60, int(time.time() * 1000) - 60_000
        p = Producer({"bootstrap.servers": b.bootstrap, "compression.type": codec, "linger.ms": 500,
                      "batch.num.messages": 1000, "enable.idempotence": True})
        offsets: dict[int, int] = {}
        for i in range(n):
            p.produce(topic, value=value_of(i), partition=0, timestamp=base_ts + i * 10,
                      on_delivery=lambda err, msg, i=i: offsets.__setitem__(i, msg.offset()) if err is None else None)
        assert p.flush(30) == 0 and len(offsets) == n
        batches = [bt for f in kit.segment_files(b.data_dir, topic, 0) for bt in kit.scan_batches(f)]
        assert max(count for _base, count, _codec in batches) >= 10, batches  # records share batches
        assert {kit.CODEC_NAMES[c] for _b, _n, c in batches} == {codec}

        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "unused", "enable.auto.commit": False})
        try:
            for i in (1, 7, n // 2, n - 1):
                (res,) = c.offsets_for_times([TopicPartition(topic, 0, base_ts + i * 10)], timeout=10)
                assert (res.error, res.offset) == (None, offsets[i]), (i, res)
                (res,) = c.offsets_for_times([TopicPartition(topic, 0, base_ts + i * 10 - 5)], timeout=10)
                assert (res.error, res.offset) == (None, offsets[i]), (i, "between two timestamps", res)
            (res,) = c.offsets_for_times([TopicPartition(topic, 0, base_ts + n * 10)], timeout=10)
            assert res.offset == -1  # nothing that late: end of log
        finally:
            c.close()
    finally:
        b.close()
