"""oncelog's client side of conditional produce (issue 13, docs/conditional-publish.md), real broker.

Covered: ``produce(..., expected_offset=k)`` on the blocking and asyncio
producers (a match lands at k; a mismatch fails the record and its
``on_delivery`` with OffsetMismatch carrying the actual next offset, and
nothing is appended; records of the batch queued behind are failed too, and
the partition's later unconditional records still go in, re-sequenced);
configuration errors at the call; ConditionalProduceNotSupported against
librdkafka's mock cluster (no feature advertised: nothing written); dropped
responses through the fault proxy (every acknowledged conditional batch
exactly once, no false refusals); two LogWriters competing for one partition
(no interleaving, every acknowledged append exactly once).
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from oncelog.client import (
    ConditionalProduceNotSupported,
    ConditionalProduceRefused,
    ConfigError,
    Consumer,
    LogWriter,
    OffsetMismatch,
    Producer,
    TopicPartition,
)
from oncelog.client.aio import Producer as AioProducer
from oncelog.client.logwriter import AsyncLogWriter
from oncelog.testing import EmbeddedBroker, free_port
from oncelog.testing.fault_proxy import FaultProxy

pytestmark = pytest.mark.timeout(180)


def _read_all(bootstrap: str, topic: str, partition: int, end: int) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    with Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"}) as c:
        c.assign([TopicPartition(topic, partition, 0)])
        import time
        deadline = time.monotonic() + 30
        while len(out) < end:
            assert time.monotonic() < deadline, (len(out), end)
            for m in c.consume(500, timeout=0.5):
                out.append((m.offset, m.value))
    return out


def _end_offset(bootstrap: str, topic: str, partition: int) -> int:
    with Consumer({"bootstrap.servers": bootstrap}) as c:
        return c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)[1]


def test_match_and_mismatch_blocking(broker: EmbeddedBroker, kit: Any) -> None:
    kit.create_topic(broker.bootstrap, "wal", 2)
    delivered: list[Any] = []
    with Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5}) as p:
        ok = [p.produce("wal", b"a%d" % i, partition=0, expected_offset=i) for i in range(3)]
        assert p.flush(10) == 0
        assert [f.result().offset for f in ok] == [0, 1, 2]
        # a stale writer: expects 1, the next offset is 3; its on_delivery sees the refusal too
        bad = [p.produce("wal", b"stale%d" % i, partition=0, expected_offset=1 + i,
                         on_delivery=lambda e, m: delivered.append(e)) for i in range(2)]
        p.flush(10)
        for f in bad:
            e = f.exception(5)
            assert isinstance(e, OffsetMismatch) and not isinstance(e, ConditionalProduceRefused), e
            assert (e.actual_offset, e.expected_offset, e.topic, e.partition) == (3, 1, "wal", 0)
        p.poll(0.5)
        assert len(delivered) == 2 and all(isinstance(e, OffsetMismatch) for e in delivered)
        # the partition goes on: an unconditional record and a conditional one at the right offset
        plain = p.produce("wal", b"plain", partition=0)
        nxt = p.produce("wal", b"a3", partition=0, expected_offset=4)
        assert p.flush(10) == 0
        assert plain.result().offset == 3 and nxt.result().offset == 4
        # the refused batch used no sequence numbers: the later batches were re-sequenced, no epoch bump
        assert p._core.stats["epoch_bumps"] == 0 and p.producer_id[1] == 0
        # configuration errors are raised at the call
        with pytest.raises(ValueError):
            p.produce("wal", b"x", expected_offset=5)  # no partition
        with pytest.raises(ValueError):
            p.produce("wal", b"x", partition=0, expected_offset=-2)
    with Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": False}) as p:
        with pytest.raises(ConfigError):
            p.produce("wal", b"x", partition=0, expected_offset=5)
    assert _read_all(broker.bootstrap, "wal", 0, 5) == [(0, b"a0"), (1, b"a1"), (2, b"a2"), (3, b"plain"),
                                                       (4, b"a3")]


def test_asyncio_producer_and_async_log_writer(broker: EmbeddedBroker, kit: Any) -> None:
    kit.create_topic(broker.bootstrap, "awal", 1)

    async def main() -> None:
        async with AioProducer({"bootstrap.servers": broker.bootstrap}) as p:
            md = await p.produce("awal", b"x", partition=0, expected_offset=0)
            assert md.offset == 0
            with pytest.raises(OffsetMismatch) as ei:
                await p.produce("awal", b"y", partition=0, expected_offset=0)
            assert ei.value.actual_offset == 1
            w = AsyncLogWriter(p, "awal", 0, 1)
            assert await w.append([b"b", b"c"]) == 1
            assert w.next_offset == 3
            stale = AsyncLogWriter(p, "awal", 0, 2)
            with pytest.raises(OffsetMismatch) as ei:
                await stale.append([b"z"])
            assert ei.value.actual_offset == 3
            with pytest.raises(OffsetMismatch):  # stays refused
                await stale.append([b"z"])

    asyncio.run(main())
    assert _read_all(broker.bootstrap, "awal", 0, 3) == [(0, b"x"), (1, b"b"), (2, b"c")]


def _mock_cluster_class() -> Any:
    path = Path(__file__).resolve().parents[2] / "bench" / "common.py"
    spec = importlib.util.spec_from_file_location("oncelog_bench_common", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("oncelog_bench_common", module)
    spec.loader.exec_module(module)
    return module.MockCluster


def test_not_supported_by_a_broker_without_the_feature() -> None:
    """librdkafka's mock cluster speaks Produce v9+ but does not advertise oncelog.conditional.produce:
    the record fails with ConditionalProduceNotSupported and nothing is written (a broker that ignores
    the tag would have appended it unconditionally)."""
    with _mock_cluster_class()(1) as mock:
        mock.create_topic("t", 1)
        with Producer({"bootstrap.servers": mock.bootstrap}) as p:
            f = p.produce("t", b"cond", partition=0, expected_offset=0)
            p.flush(10)
            e = f.exception(5)
            assert isinstance(e, ConditionalProduceNotSupported), e
            assert "not supported by this broker" in str(e)
            plain = p.produce("t", b"plain", partition=0)  # the producer is still usable
            assert p.flush(10) == 0
            assert plain.result().offset == 0  # so the conditional record was never appended


def test_dropped_responses_every_acknowledged_batch_once(tmp_path: Path, kit: Any) -> None:
    """The fault proxy drops a third of the Produce responses after the broker applied them; the
    idempotent producer retries, and the retry of an appended conditional batch is answered with its
    original offset: every batch acknowledged exactly once at its expected offset, no false refusal."""
    port = free_port()
    with FaultProxy(("127.0.0.1", port), seed=27, drop_response_rate=0.3, drop_mode="close") as proxy:
        broker = kit.start_broker(tmp_path, config={"advertised.listeners": f"PLAINTEXT://127.0.0.1:{proxy.port}"},
                                  port=port)
        try:
            kit.create_topic(broker.bootstrap, "dw", 1)
            with Producer({"bootstrap.servers": proxy.bootstrap, "request.timeout.ms": 2000,
                           "retry.backoff.ms": 20, "linger.ms": 0}) as p:
                w = LogWriter(p, "dw", 0, 0)
                for i in range(40):
                    assert w.append([b"%d-0" % i, b"%d-1" % i]) == 2 * i  # never a false refusal
            assert proxy.stats.dropped_responses >= 5, proxy.stats
            assert _end_offset(broker.bootstrap, "dw", 0) == 80
            got = _read_all(broker.bootstrap, "dw", 0, 80)
            assert got == [(2 * i + j, b"%d-%d" % (i, j)) for i in range(40) for j in range(2)]
        finally:
            broker.stop()


def test_two_log_writers_compete_without_interleaving(broker: EmbeddedBroker, kit: Any) -> None:
    """Two writers believe they own the partition: each append goes in whole at the offset its writer
    tracked, or not at all; a refused writer re-bootstraps from .actual_offset. The log holds every
    acknowledged append exactly once, contiguous, and nothing else."""
    kit.create_topic(broker.bootstrap, "race", 1)
    acked: dict[str, list[tuple[int, list[bytes]]]] = {"A": [], "B": []}
    refusals = {"A": 0, "B": 0}
    start = threading.Barrier(2)

    def writer(name: str) -> None:
        with Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0}) as p:
            w = LogWriter(p, "race", 0, 0)
            start.wait()
            for i in range(60):
                vals = [b"%s%d.%d" % (name.encode(), i, j) for j in range(3)]
                try:
                    acked[name].append((w.append(vals), vals))
                except OffsetMismatch as e:
                    refusals[name] += 1
                    w = LogWriter(p, "race", 0, e.actual_offset)  # re-bootstrap (here: just jump)

    ts = [threading.Thread(target=writer, args=(n,)) for n in "AB"]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    total = 3 * (len(acked["A"]) + len(acked["B"]))
    assert refusals["A"] + refusals["B"] > 0, "the writers never raced; the test proves nothing"
    log = _read_all(broker.bootstrap, "race", 0, total)
    assert _end_offset(broker.bootstrap, "race", 0) == total  # nothing unacknowledged went in
    by_offset = dict(log)
    for name in "AB":
        for base, vals in acked[name]:
            assert [by_offset[base + j] for j in range(3)] == vals  # whole, at its offset
    values = [v for _, v in log]
    assert len(values) == len(set(values))  # exactly once
