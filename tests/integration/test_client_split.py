"""A batch the broker refuses as MESSAGE_TOO_LARGE is split and its records delivered (as Java's producer:
Sender.completeBatch -> RecordAccumulator.splitAndReenqueue), against the real broker.

The topics have ``max.message.bytes`` 2000, far below ``batch.size`` (16384): a full batch is refused, the
producer splits it (again while a part is still too large) and resends the parts in place, before the
partition's later batches. Every record is read back once, in produce order per partition, at the offset its
future names; a record larger than the limit alone fails with MessageTooLargeError and only it. Before, every
record of a refused batch failed.
"""

from __future__ import annotations

import asyncio
from typing import Any

from oncelog.client import Producer, aio
from oncelog.client.errors import MessageTooLargeError
from oncelog.testing import EmbeddedBroker

LIMIT = {"max.message.bytes": "2000"}


def _value(tag: str, i: int) -> bytes:
    return (b"%s-%05d-" % (tag.encode(), i)).ljust(100, b"v")


def _read_back(kit: Any, broker: EmbeddedBroker, topic: str, partitions: int,
               extra: dict[str, Any] | None = None, ends: dict[int, int] | None = None
               ) -> dict[int, list[tuple[int, bytes]]]:
    if ends is None:
        ends = {q: hw for q, (_, hw) in kit.confluent_watermarks(broker.bootstrap, topic, partitions).items()}
    got = kit.confluent_consume_all(broker.bootstrap, topic, ends, timeout=20, extra=extra)
    return {q: [(m.offset(), m.value()) for m in msgs] for q, msgs in got.items()}


def _check(sent: list[tuple[int, bytes, Any]], read: dict[int, list[tuple[int, bytes]]],
           control: bool = False) -> None:
    """``sent``: (partition, value, metadata) of each delivered record, in produce order within each
    produce() run or produce_batch call (the values carry their run's tag). The log of each partition holds
    exactly those records, once, at the offsets their futures name, each run's records in produce order
    (``control``: transaction markers take offsets between them)."""
    for q in read:
        mine = [(md.offset, v) for p, v, md in sent if p == q]
        assert all(md.partition == q for p, _, md in sent if p == q)
        assert read[q] == sorted(mine), f"partition {q}"  # (each offset once: read back in offset order)
        if not control:
            assert [o for o, _ in read[q]] == list(range(len(mine))), f"partition {q}"
        runs: dict[bytes, list[int]] = {}
        for off, v in mine:
            runs.setdefault(v.split(b"-")[0], []).append(off)
        assert all(offs == sorted(offs) for offs in runs.values()), f"partition {q}: order"


def test_asyncio_producer_splits_refused_batches(broker: EmbeddedBroker, kit: Any) -> None:
    """Idempotent asyncio producer: per-record produce() to two partitions (one 5000-byte record among them),
    then produce_batch lists; everything but the big record is delivered exactly once, in order."""
    kit.create_topic(broker.bootstrap, "split-aio", 2, LIMIT)
    big_at = 150

    async def run() -> tuple[list[tuple[int, bytes, Any]], Any]:
        sent: list[tuple[int, bytes, Any]] = []
        async with aio.Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20}) as p:
            futs = []
            for i in range(400):
                v = b"B" * 5000 if i == big_at else _value("r", i)
                futs.append((i % 2, v, p.produce("split-aio", v, partition=i % 2)))
            batches = []
            for q in (0, 1):
                vals = [_value("b%d" % q, i) for i in range(300)]
                batches.append((q, vals, await p.produce_batch("split-aio", vals, partition=q)))
            assert await p.flush(15) == 0
            big = None
            for q, v, f in futs:
                if v.startswith(b"B"):
                    big = f.exception()
                else:
                    sent.append((q, v, f.result()))
            for q, vals, bf in batches:
                assert bf.done() and bf.exception() is None
                sent.extend((q, v, f.result()) for v, f in zip(vals, bf))
        return sent, big

    sent, big = asyncio.run(asyncio.wait_for(run(), 30))
    assert isinstance(big, MessageTooLargeError)
    assert len(sent) == 399 + 600
    _check(sent, _read_back(kit, broker, "split-aio", 2))


def test_blocking_producer_splits_refused_batches(broker: EmbeddedBroker, kit: Any) -> None:
    """The blocking facade: produce() fills batches on the caller's thread (one shared completion per batch,
    split with it), delivery callbacks report each record once; then a keyless produce_batch list."""
    kit.create_topic(broker.bootstrap, "split-sync", 1, LIMIT)
    reports: list[tuple[Any, Any]] = []
    with Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20}) as p:
        futs = []
        for i in range(300):
            v = b"B" * 5000 if i == 77 else _value("s", i)
            futs.append((0, v, p.produce("split-sync", v, on_delivery=lambda e, m: reports.append((e, m)))))
        vals = [_value("l", i) for i in range(300)]
        bf = p.produce_batch("split-sync", vals, partition=0)
        assert p.flush(15) == 0
        p.poll(0)
        assert isinstance(futs[77][2].exception(5), MessageTooLargeError)
        sent = [(q, v, f.result(5)) for q, v, f in futs if not v.startswith(b"B")]
        assert bf.exception() is None
        sent.extend((0, v, f.result(5)) for v, f in zip(vals, bf))
    assert len(reports) == 300
    assert sum(1 for e, _ in reports if e is not None) == 1
    assert sorted(m.offset for e, m in reports if e is None) == list(range(299))
    _check(sent, _read_back(kit, broker, "split-sync", 1))


def test_transaction_with_split_batches_commits(broker: EmbeddedBroker, kit: Any) -> None:
    """In a transaction the split is no failure: the transaction commits (not abortable) and a
    read_committed consumer reads every record once, in order, at its future's offset."""
    kit.create_topic(broker.bootstrap, "split-txn", 2, LIMIT)

    async def run() -> list[tuple[int, bytes, Any]]:
        sent: list[tuple[int, bytes, Any]] = []
        async with aio.Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "split-txn",
                                 "linger.ms": 20}) as p:
            await p.init_transactions()
            await p.begin_transaction()
            futs = [(i % 2, _value("t", i), p.produce("split-txn", _value("t", i), partition=i % 2))
                    for i in range(300)]
            vals = [_value("u", i) for i in range(200)]
            bf = await p.produce_batch("split-txn", vals, partition=1)
            await p.commit_transaction()
            sent.extend((q, v, f.result()) for q, v, f in futs)
            sent.extend((1, v, f.result()) for v, f in zip(vals, bf))
        return sent

    sent = asyncio.run(asyncio.wait_for(run(), 30))
    # up to the last record (the commit marker follows it); the high watermarks are past the markers
    ends = {q: max(md.offset for p, _, md in sent if p == q) + 1 for q in (0, 1)}
    assert all(hw == ends[q] + 1 for q, (_, hw) in kit.confluent_watermarks(broker.bootstrap, "split-txn",
                                                                             2).items())
    read = _read_back(kit, broker, "split-txn", 2, {"isolation.level": "read_committed"}, ends)
    assert sum(len(r) for r in read.values()) == 500
    _check(sent, read, control=True)


def test_compressed_batch_refused_is_split(broker: EmbeddedBroker, kit: Any) -> None:
    """A gzip batch of incompressible values (it compresses worse than the producer could know): refused,
    read back from its compressed bytes, split and delivered, each record once, in order."""
    import random

    kit.create_topic(broker.bootstrap, "split-gzip", 1, LIMIT)
    rng = random.Random(7)
    vals = [b"z-%05d-" % i + rng.randbytes(90) for i in range(200)]

    async def run() -> tuple[list[tuple[int, bytes, Any]], dict[str, int]]:
        async with aio.Producer({"bootstrap.servers": broker.bootstrap, "compression.type": "gzip",
                                 "linger.ms": 20}) as p:
            bf = await p.produce_batch("split-gzip", vals, partition=0)
            assert await p.flush(15) == 0
            assert bf.exception() is None
            return [(0, v, f.result()) for v, f in zip(vals, bf)], dict(p._core.stats)

    sent, stats = asyncio.run(asyncio.wait_for(run(), 30))
    assert stats["batch_splits"] >= 1
    _check(sent, _read_back(kit, broker, "split-gzip", 1))


def test_conditional_batch_refused_is_split_with_its_expected_offsets(broker: EmbeddedBroker, kit: Any) -> None:
    """A conditional produce_batch (expected_offset) refused as too large: its parts carry the expected
    offsets of their first records, so they are written at exactly those offsets; a second conditional
    batch too large with a wrong expected offset fails every record with OffsetMismatch (a part refused
    takes the parts continuing it down) and writes nothing."""
    from oncelog.client import OffsetMismatch

    kit.create_topic(broker.bootstrap, "split-cond", 1, LIMIT)

    async def run() -> tuple[list[tuple[int, bytes, Any]], list[BaseException | None], dict[str, int]]:
        async with aio.Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5}) as p:
            vals = [_value("c", i) for i in range(60)]
            bf = await p.produce_batch("split-cond", vals, partition=0, expected_offset=0)
            assert await p.flush(15) == 0
            assert bf.exception() is None
            sent = [(0, v, f.result()) for v, f in zip(vals, bf)]
            wrong = await p.produce_batch("split-cond", [_value("w", i) for i in range(60)], partition=0,
                                          expected_offset=5)
            await p.flush(15)
            return sent, [f.exception() for f in wrong], dict(p._core.stats)

    sent, errs, stats = asyncio.run(asyncio.wait_for(run(), 30))
    assert [md.offset for _, _, md in sent] == list(range(60))
    assert stats["batch_splits"] >= 1
    assert all(isinstance(e, OffsetMismatch) for e in errs), errs
    _check(sent, _read_back(kit, broker, "split-cond", 1))
