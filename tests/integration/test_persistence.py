"""Durability across restarts: a clean stop (SIGTERM) and a crash (SIGKILL)
while a confluent-kafka producer (acks=all) is writing.

Acknowledged means: librdkafka delivered a success delivery report, i.e. the
broker answered the acks=all Produce request.  Every such record must be
readable after the restart at the offset it was acknowledged with.
"""

from __future__ import annotations

import os
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(120)

TOPIC = "durable"


# -- producing ---------------------------------------------------------------------


def content(i: int, tag: str) -> tuple[bytes, bytes, list[tuple[str, bytes]], int]:
    key = f"k-{i}".encode()
    value = f"{tag}|{i}|".encode() + bytes((i * 7 + n) % 251 for n in range(i % 97))
    headers = [("i", str(i).encode())]
    if i % 3 == 0:
        headers.append(("tag", tag.encode()))
    ts = 1_700_000_000_000 + i  # fixed CreateTime; retention is disabled in these brokers
    return key, value, headers, ts


def id_of(value: bytes) -> int:
    return int(value.split(b"|", 2)[1])


@dataclass
class Ledger:
    """What was sent and what was acknowledged."""

    tag: str
    partitions: int
    sent: dict[int, int] = field(default_factory=dict)  # id -> partition
    send_order: dict[int, list[int]] = field(default_factory=dict)  # partition -> ids
    acked: dict[int, tuple[int, int]] = field(default_factory=dict)  # id -> (partition, offset)
    errors: list[str] = field(default_factory=list)
    duplicate_reports: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.send_order = {p: [] for p in range(self.partitions)}

    def on_delivery(self, err: Any, msg: Any) -> None:
        i = id_of(msg.value())
        if err is not None:
            self.errors.append(str(err))
            return
        if i in self.acked:
            self.duplicate_reports.append(i)
        self.acked[i] = (msg.partition(), msg.offset())

    def expected(self, i: int) -> tuple[int, bytes, bytes, tuple[tuple[str, bytes], ...], int]:
        key, value, headers, ts = content(i, self.tag)
        return self.sent[i], key, value, tuple(headers), ts

    def acked_in_send_order(self, p: int) -> list[tuple[int, int]]:
        return [(i, self.acked[i][1]) for i in self.send_order[p] if i in self.acked]


def make_producer(bootstrap: str, codec: str = "none", timeout_ms: int = 30_000) -> Any:
    from confluent_kafka import Producer

    return Producer({
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "enable.idempotence": False,
        "compression.type": codec,
        "linger.ms": 2,
        "message.timeout.ms": timeout_ms,
        "reconnect.backoff.ms": 50,
        "reconnect.backoff.max.ms": 200,
        "queue.buffering.max.messages": 20_000,
        # stay well below the brokers' small segment.bytes: like Kafka, the broker
        # rejects a batch larger than a segment with RECORD_LIST_TOO_LARGE
        "batch.size": 16_384,
    })


def send(producer: Any, ledger: Ledger, i: int) -> None:
    p = i % ledger.partitions
    key, value, headers, ts = content(i, ledger.tag)
    while True:
        try:
            producer.produce(TOPIC, value=value, key=key, partition=p, headers=headers, timestamp=ts,
                             on_delivery=ledger.on_delivery)
            break
        except BufferError:
            producer.poll(0.05)
    ledger.sent[i] = p
    ledger.send_order[p].append(i)


def produce_range(bootstrap: str, ledger: Ledger, ids: range) -> None:
    producer = make_producer(bootstrap)
    for i in ids:
        send(producer, ledger, i)
        if i % 500 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0, "messages left undelivered"
    assert not ledger.errors, ledger.errors[:5]
    assert not ledger.duplicate_reports
    missing = [i for i in ids if i not in ledger.acked]
    assert not missing, f"{len(missing)} records not acknowledged"


# -- reading back and checking ----------------------------------------------------------


def read_and_check(kit: Any, bootstrap: str, ledger: Ledger, start: dict[int, int],
                   end: dict[int, int]) -> dict[int, int]:
    """Read ``[start, end)`` of every partition and check each record exactly.

    Every record must be one that was sent, with the exact content, offsets
    dense, no id twice, and every acknowledged id in range at its acked offset.
    Returns partition -> number of records read.
    """
    msgs = kit.confluent_consume_all(bootstrap, TOPIC, end, start=start, timeout=60,
                                     extra={"check.crcs": True})
    seen: dict[int, tuple[int, int]] = {}
    for p, lst in msgs.items():
        assert [m.offset() for m in lst] == list(range(start.get(p, 0), end[p])), f"partition {p}: offsets not dense"
        for m in lst:
            i = id_of(m.value())
            assert i in ledger.sent, f"record {i} at {p}/{m.offset()} was never sent"
            assert i not in seen, f"record {i} stored twice: {seen[i]} and {(p, m.offset())}"
            seen[i] = (p, m.offset())
            got = (m.partition(), m.key(), m.value(), tuple(m.headers() or ()), m.timestamp()[1])
            assert got == ledger.expected(i), f"record {i} at {p}/{m.offset()} differs"
    for i, (p, off) in ledger.acked.items():
        if start.get(p, 0) <= off < end[p]:
            assert seen.get(i) == (p, off), f"acked record {i} at {p}/{off} is {'at ' + str(seen[i]) if i in seen else 'missing'}"
    return {p: len(lst) for p, lst in msgs.items()}


def watermarks(kit: Any, bootstrap: str, partitions: int) -> tuple[dict[int, int], dict[int, int]]:
    wm = kit.confluent_watermarks(bootstrap, TOPIC, partitions)
    return {p: lo for p, (lo, _hi) in wm.items()}, {p: hi for p, (_lo, hi) in wm.items()}


def check_new_writes(kit: Any, bootstrap: str, ledger: Ledger, ids: range, high: dict[int, int]) -> dict[int, int]:
    """Produce ``ids`` and check they land right after ``high``; returns the new ends."""
    before = {p: len(ledger.send_order[p]) for p in range(ledger.partitions)}
    produce_range(bootstrap, ledger, ids)
    new_end = dict(high)
    for p in range(ledger.partitions):
        fresh = ledger.send_order[p][before[p]:]
        offsets = [ledger.acked[i][1] for i in fresh]
        assert offsets == list(range(high[p], high[p] + len(fresh))), (
            f"partition {p}: new writes acked at {offsets[:3]}..., want from {high[p]}")
        new_end[p] = high[p] + len(fresh)
    read_and_check(kit, bootstrap, ledger, start=high, end=new_end)
    return new_end


# -- tests ---------------------------------------------------------------------------------


def test_clean_restart_keeps_records_and_offsets(tmp_path: Path, kit: Any) -> None:
    partitions, n = 3, 6_000
    # small segments, so the restart also reopens several closed segments
    b = kit.start_broker(tmp_path, config={"log.segment.bytes": "65536", "log.retention.ms": "-1"})
    try:
        kit.create_topic(b.bootstrap, TOPIC, partitions)
        ledger = Ledger("restart", partitions)
        produce_range(b.bootstrap, ledger, range(n))
        ends = {p: len(ledger.send_order[p]) for p in range(partitions)}
        for p in range(partitions):
            assert [off for _i, off in ledger.acked_in_send_order(p)] == list(range(ends[p]))
        assert watermarks(kit, b.bootstrap, partitions) == ({p: 0 for p in ends}, ends)
        for p in range(partitions):
            assert len(kit.segment_files(b.data_dir, TOPIC, p)) > 1

        port = b.port
        b.stop()
        assert not b.running
        b.start()
        assert b.port == port

        assert watermarks(kit, b.bootstrap, partitions) == ({p: 0 for p in ends}, ends)
        assert read_and_check(kit, b.bootstrap, ledger, {}, ends) == ends
        ends = check_new_writes(kit, b.bootstrap, ledger, range(n, n + 1_500), ends)

        # and once more: a second clean restart keeps old and new records
        b.restart()
        assert watermarks(kit, b.bootstrap, partitions) == ({p: 0 for p in ends}, ends)
        assert read_and_check(kit, b.bootstrap, ledger, {}, ends) == ends
        for p in range(partitions):
            first, nxt, _ = kit.check_segment_chain(b.data_dir, TOPIC, p)
            assert (first, nxt) == (0, ends[p])
    finally:
        b.close()


class ContinuousProducer(threading.Thread):
    """Produces as fast as librdkafka accepts until stopped, then drains."""

    def __init__(self, bootstrap: str, ledger: Ledger, codec: str) -> None:
        super().__init__(name="continuous-producer", daemon=True)
        self.bootstrap = bootstrap
        self.ledger = ledger
        self.codec = codec
        self.stop_event = threading.Event()
        self.undelivered = -1
        self.exc: BaseException | None = None

    def run(self) -> None:
        try:
            # short message timeout: once the broker is dead, pending sends fail fast
            producer = make_producer(self.bootstrap, self.codec, timeout_ms=2_000)
            i = 0
            while not self.stop_event.is_set():
                send(producer, self.ledger, i)
                i += 1
                if i % 200 == 0:
                    producer.poll(0)
            self.undelivered = producer.flush(20)
        except BaseException as exc:  # surfaced by the test
            self.exc = exc


CRASH_RUNS = [
    # (run, kill delay window in seconds after producing is under way, codec)
    pytest.param(1, (0.05, 0.3), "none", id="early-none"),
    pytest.param(2, (0.3, 0.8), "gzip", id="mid-gzip"),
    pytest.param(3, (0.8, 1.5), "zstd", id="late-zstd"),
]


@pytest.mark.parametrize(("run", "window", "codec"), CRASH_RUNS)
def test_crash_keeps_every_acknowledged_record(tmp_path: Path, kit: Any, run: int,
                                               window: tuple[float, float], codec: str) -> None:
    seed = int(os.environ.get("ONCELOG_CRASH_SEED", random.randrange(1 << 32)))
    delay = random.Random(seed + run).uniform(*window)
    where = f"(seed {seed}, kill delay {delay:.3f}s; rerun with ONCELOG_CRASH_SEED={seed})"
    partitions = 4
    b = kit.start_broker(tmp_path, config={"log.segment.bytes": "262144", "log.retention.ms": "-1"})
    producer = None
    try:
        kit.create_topic(b.bootstrap, TOPIC, partitions)
        ledger = Ledger(f"crash{run}", partitions)
        producer = ContinuousProducer(b.bootstrap, ledger, codec)
        producer.start()
        kit.wait_until(lambda: len(ledger.acked) >= 200 or producer.exc, timeout=30,
                       message="the producer to get going")
        time.sleep(delay)  # the random crash point, not an assertion
        b.kill()
        acked_before_kill_returned = len(ledger.acked)
        producer.stop_event.set()
        producer.join(60)
        assert not producer.is_alive(), "producer did not drain after the broker died"
        assert producer.exc is None, producer.exc
        assert producer.undelivered == 0, f"{producer.undelivered} messages neither acked nor failed {where}"
        assert not ledger.duplicate_reports, where
        assert acked_before_kill_returned >= 200
        assert len(ledger.acked) < len(ledger.sent), f"the kill should have cut some sends short {where}"

        # acked offsets are unique and increase in send order within each partition
        max_acked = {p: -1 for p in range(partitions)}
        for p in range(partitions):
            offs = [off for _i, off in ledger.acked_in_send_order(p)]
            assert offs == sorted(set(offs)), f"partition {p}: acked offsets not increasing {where}"
            if offs:
                max_acked[p] = offs[-1]

        b.start()
        low, high = watermarks(kit, b.bootstrap, partitions)
        # shown by pytest when the test fails
        print(f"crash run {run} {where}: sent {len(ledger.sent)}, acked {len(ledger.acked)}, "
              f"recovered high watermarks {high}, max acked offsets {max_acked}")
        assert low == {p: 0 for p in range(partitions)}, where
        for p in range(partitions):
            assert high[p] >= max_acked[p] + 1, f"partition {p}: high {high[p]} lost acked {max_acked[p]} {where}"

        # everything stored is whole and exact, every acked record at its offset
        counts = read_and_check(kit, b.bootstrap, ledger, {}, high)
        assert counts == high, where
        for p in range(partitions):
            first, nxt, _ = kit.check_segment_chain(b.data_dir, TOPIC, p)
            assert (first, nxt) == (0, high[p]), f"partition {p} on disk {(first, nxt)} {where}"

        # the log takes new writes right after the recovered end
        ledger.errors.clear()
        base = max(ledger.sent) + 1
        ends = check_new_writes(kit, b.bootstrap, ledger, range(base, base + 800), high)
        assert watermarks(kit, b.bootstrap, partitions) == ({p: 0 for p in range(partitions)}, ends)
    finally:
        if producer is not None:
            producer.stop_event.set()
        b.close()
