"""Per-partition log order follows call order across produce() and produce_batch().

The first records for a topic the producer has no metadata for wait for it (max.block.ms); a
``produce_batch()`` made after them, to the same partition, must not overtake them (Java's send()
blocks the caller for metadata, so a thread's sends are a partition's log order; librdkafka keeps
each partition's order of produce calls). Read back with confluent-kafka.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from oncelog.client import Producer
from oncelog.client import aio
from oncelog.testing import EmbeddedBroker

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.filterwarnings("ignore:read_text is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:open_text is deprecated:DeprecationWarning"),
]


def _read(kit: Any, bootstrap: str, topic: str, partitions: int, committed: bool = False
          ) -> dict[int, list[bytes]]:
    ends = {q: hw for q, (_, hw) in kit.confluent_watermarks(bootstrap, topic, partitions).items()}
    if committed:  # one committed transaction: its marker is the last offset, which the reader does not return
        ends = {q: max(hw - 1, 0) for q, hw in ends.items()}
    got = kit.confluent_consume_all(bootstrap, topic, ends)
    return {q: [m.value() for m in got.get(q, [])] for q in range(partitions)}


def _vals(prefix: str, n: int) -> list[bytes]:
    return [b"%s-%d" % (prefix.encode(), i) for i in range(n)]


def test_asyncio_produce_waiting_for_metadata_stays_ahead_of_a_later_batch(broker: EmbeddedBroker,
                                                                           kit: Any) -> None:
    for t, n in (("explicit", 3), ("keyed", 3), ("unkeyed", 1), ("known", 2), ("fresh", 2), ("later", 2)):
        kit.create_topic(broker.bootstrap, t, n)

    async def run() -> None:
        # started before the topics' first use: the producer holds none of their metadata
        async with aio.Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5}) as p:
            await (p.produce("known", b"warm", partition=0))  # metadata of "known" only
            futs: list[Any] = []
            # explicit partition: produce() x5 (waiting for metadata), batch, produce() x3
            futs += [p.produce("explicit", v, partition=1) for v in _vals("a", 5)]
            futs += await p.produce_batch("explicit", _vals("b", 5), partition=1)
            futs += [p.produce("explicit", v, partition=1) for v in _vals("c", 3)]
            # keyed: one key, so one partition, in every call
            futs += [p.produce("keyed", v, key=b"k") for v in _vals("a", 4)]
            futs += await p.produce_batch("keyed", _vals("b", 4), keys=[b"k"] * 4)
            futs += [p.produce("keyed", v, key=b"k") for v in _vals("c", 2)]
            # unkeyed, one partition
            futs += [p.produce("unkeyed", v) for v in _vals("a", 4)]
            futs += await p.produce_batch("unkeyed", _vals("b", 4))
            futs += [p.produce("unkeyed", v) for v in _vals("c", 2)]
            # two topics: "known" has metadata, "fresh" has not; order matters per partition only
            futs += [p.produce("fresh", v, partition=0) for v in _vals("a", 3)]
            futs += [p.produce("known", v, partition=0) for v in _vals("a", 3)]
            futs += await p.produce_batch("known", _vals("b", 3), partition=0)
            futs += await p.produce_batch("fresh", _vals("b", 3), partition=0)
            futs += [p.produce("fresh", v, partition=0) for v in _vals("c", 2)]
            # the opposite order: a batch still waiting for metadata, then produce()
            batch = asyncio.ensure_future(p.produce_batch("later", _vals("b", 3), partition=1))
            await asyncio.sleep(0)  # the batch call has started (and waits for the topic)
            futs += [p.produce("later", v, partition=1) for v in _vals("c", 2)]
            futs += await batch
            assert await p.flush(60) == 0
            for f in futs:
                await f

    asyncio.run(asyncio.wait_for(run(), 120))
    abc = _vals("a", 5) + _vals("b", 5) + _vals("c", 3)
    assert _read(kit, broker.bootstrap, "explicit", 3)[1] == abc
    keyed = [v for vs in _read(kit, broker.bootstrap, "keyed", 3).values() for v in vs]
    assert keyed == _vals("a", 4) + _vals("b", 4) + _vals("c", 2)
    assert _read(kit, broker.bootstrap, "unkeyed", 1)[0] == _vals("a", 4) + _vals("b", 4) + _vals("c", 2)
    assert _read(kit, broker.bootstrap, "known", 2)[0] == [b"warm"] + _vals("a", 3) + _vals("b", 3)
    assert _read(kit, broker.bootstrap, "fresh", 2)[0] == _vals("a", 3) + _vals("b", 3) + _vals("c", 2)
    assert _read(kit, broker.bootstrap, "later", 2)[1] == _vals("b", 3) + _vals("c", 2)


def test_blocking_produce_then_batch_in_call_order(broker: EmbeddedBroker, kit: Any) -> None:
    """The blocking facade: plain (the caller's thread waits for metadata) and transactional (every
    record goes through the loop thread, where it waits for the topic's metadata)."""
    kit.create_topic(broker.bootstrap, "plain", 2)
    kit.create_topic(broker.bootstrap, "txn", 2)
    with Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5}) as p:
        futs = [p.produce("plain", v, partition=1) for v in _vals("a", 5)]
        futs += list(p.produce_batch("plain", _vals("b", 5), partition=1))
        futs += [p.produce("plain", v, partition=1) for v in _vals("c", 2)]
        futs += list(p.produce_batch("plain", _vals("d", 2), partition=1))
        assert p.flush(60) == 0
        for f in futs:
            f.result(0)
    with Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "transactional.id": "order-t"}) as p:
        p.init_transactions(30)
        p.begin_transaction()
        futs = [p.produce("txn", v, partition=0) for v in _vals("a", 5)]
        futs += list(p.produce_batch("txn", _vals("b", 5), partition=0))
        futs += [p.produce("txn", v, partition=0) for v in _vals("c", 2)]
        p.commit_transaction(30)
        for f in futs:
            f.result(0)
    assert _read(kit, broker.bootstrap, "plain", 2)[1] == \
        _vals("a", 5) + _vals("b", 5) + _vals("c", 2) + _vals("d", 2)
    txn = _read(kit, broker.bootstrap, "txn", 2, committed=True)[0]
    assert txn == _vals("a", 5) + _vals("b", 5) + _vals("c", 2)


def test_asyncio_commit_includes_a_batch_still_waiting_for_metadata(broker: EmbeddedBroker, kit: Any) -> None:
    """produce_batch() to a topic this producer has no metadata for, not awaited, then
    commit_transaction() at once: the commit waits for the call (as Java's send() returns only once the
    record is appended), so read_committed sees its records once, in that transaction, and the next
    transaction's abort takes none of them. Before, the commit did not wait, and the records went after
    it (into no transaction, or the next)."""
    kit.create_topic(broker.bootstrap, "txn-fresh", 2)

    async def run() -> list[Any]:
        async with aio.Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5,
                                 "transactional.id": "order-fresh"}) as p:
            await p.init_transactions(30)
            await p.begin_transaction()
            call = asyncio.ensure_future(p.produce_batch("txn-fresh", _vals("b", 5), partition=0))
            await asyncio.sleep(0)  # waiting for the topic's metadata
            await asyncio.wait_for(p.commit_transaction(30), 60)
            assert call.done()
            futs = list(call.result())
            await p.begin_transaction()
            late = p.produce("txn-fresh", b"aborted", partition=0)
            await p.flush(30)
            await p.abort_transaction(30)
            await late
            return [await f for f in futs]

    mds = asyncio.run(run())
    assert [m.offset for m in mds] == [0, 1, 2, 3, 4]
    got = kit.confluent_consume_all(broker.bootstrap, "txn-fresh", {0: 5}, timeout=20,
                                    extra={"isolation.level": "read_committed"})
    assert [m.value() for m in got[0]] == _vals("b", 5)
