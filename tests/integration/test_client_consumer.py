"""oncelog's own consumer (``oncelog.client``): read_committed, seek/position/watermarks, asyncio.

The round trips with every producer and codec are in test_clients.py; this
module covers what is specific to the consumer.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from oncelog.client import Consumer, TopicPartition
from oncelog.client import aio
from oncelog.client.errors import OffsetOutOfRangeError
from oncelog.testing import EmbeddedBroker

pytestmark = [pytest.mark.timeout(180)]


def _read_all(c: Any, topic: str, partitions: int, ends: dict[int, int]) -> list[Any]:
    import time

    out: list[Any] = []
    deadline = time.monotonic() + 60
    # the position moves past transaction markers, so it reaches the high watermark
    while any(c.position((topic, p)) < ends[p] for p in ends):
        assert time.monotonic() < deadline, ({p: c.position((topic, p)) for p in ends}, ends)
        out.extend(c.consume(1000, 0.2))
    return out


def test_read_committed_hides_aborted_transactions(broker: EmbeddedBroker, kit: Any) -> None:
    """confluent-kafka transactions committed and aborted in turn; we read only the committed ones."""
    from confluent_kafka import Producer as CProducer

    kit.create_topic(broker.bootstrap, "txn", 2)
    p = CProducer({"bootstrap.servers": broker.bootstrap, "transactional.id": "client-consumer-test",
                   "compression.type": "lz4", "linger.ms": 5})
    p.init_transactions(30)
    committed = []
    for t in range(6):
        p.begin_transaction()
        for i in range(200):
            v = b"t%d-%d" % (t, i)
            p.produce("txn", v, partition=i % 2)
        if t % 2 == 0:
            p.commit_transaction(30)
            committed.extend(b"t%d-%d" % (t, i) for i in range(200))
        else:
            assert p.flush(30) == 0  # written, then aborted (librdkafka drops unsent records on abort)
            p.abort_transaction(30)
    with Consumer({"bootstrap.servers": broker.bootstrap, "isolation.level": "read_committed",
                   "auto.offset.reset": "earliest"}) as c:
        c.assign([TopicPartition("txn", 0), TopicPartition("txn", 1)])
        # under read_committed the high watermark reported is the LSO: it reaches the end once the
        # coordinator has written the last (abort) markers, which EndTxn does not wait for

        def settled() -> dict[int, int] | None:
            hws = {q: hw for q, (_, hw) in kit.confluent_watermarks(broker.bootstrap, "txn", 2).items()}
            return hws if all(c.get_watermark_offsets(("txn", q)) == (0, hws[q]) for q in hws) else None

        ends = kit.wait_until(settled, timeout=20, message="LSO at the high watermark")
        got = [m.value for m in _read_all(c, "txn", 2, ends)]
    assert sorted(got) == sorted(committed)
    assert len(got) == len(set(got)) == 600
    with Consumer({"bootstrap.servers": broker.bootstrap, "auto.offset.reset": "earliest"}) as c:
        c.assign([TopicPartition("txn", 0), TopicPartition("txn", 1)])
        every = [m.value for m in _read_all(c, "txn", 2, ends)]
    assert len(every) == 1200  # read_uncommitted sees the aborted records too (markers are never returned)


def test_seek_position_and_offset_reset(broker: EmbeddedBroker, kit: Any) -> None:
    from oncelog.client import Producer

    kit.create_topic(broker.bootstrap, "pos", 1)
    with Producer({"bootstrap.servers": broker.bootstrap, "compression.type": "snappy"}) as p:
        for i in range(500):
            p.produce("pos", b"%d" % i, partition=0)
    with Consumer({"bootstrap.servers": broker.bootstrap}) as c:  # auto.offset.reset=latest
        c.assign([("pos", 0)])
        assert c.position(("pos", 0)) == 500
        assert c.poll(0.3) is None
        c.seek(("pos", 0), 123)
        m = c.poll(5)
        assert (m.offset, m.value) == (123, b"123")
        assert c.position(("pos", 0)) == 124
        c.seek(TopicPartition("pos", 0, -2))  # earliest
        assert c.poll(5).offset == 0
    with Consumer({"bootstrap.servers": broker.bootstrap, "auto.offset.reset": "none"}) as c:
        c.assign([TopicPartition("pos", 0, 1000)])  # past the end
        with pytest.raises(OffsetOutOfRangeError):
            c.poll(5)


def test_asyncio_consumer_iterates(broker: EmbeddedBroker, kit: Any) -> None:
    kit.create_topic(broker.bootstrap, "aiter", 3)

    async def run() -> list[Any]:
        async with aio.Producer({"bootstrap.servers": broker.bootstrap}) as p:
            await p.produce_batch("aiter", [b"%d" % i for i in range(3000)], keys=[b"%d" % i for i in range(3000)])
            await p.flush()
        out = []
        async with aio.Consumer({"bootstrap.servers": broker.bootstrap, "auto.offset.reset": "earliest"}) as c:
            c.assign([("aiter", q) for q in range(3)])
            async for m in c:
                out.append(m)
                if len(out) == 3000:
                    break
        return out

    got = asyncio.run(asyncio.wait_for(run(), 60))
    assert sorted(int(m.value) for m in got) == list(range(3000))
    for q in range(3):
        offs = [m.offset for m in got if m.partition == q]
        assert offs == list(range(len(offs)))


def test_group_requests_do_not_wait_behind_a_held_fetch(broker: EmbeddedBroker, kit: Any) -> None:
    """Commits, committed() and heartbeats go on the group's own connections (Java's
    coordinator socket): with nothing new to read the broker holds each Fetch for
    fetch.max.wait.ms, and on the fetch connection a commit waited behind it (answers come
    in request order per connection)."""
    import time

    from oncelog.client import Producer

    kit.create_topic(broker.bootstrap, "idle", 1)
    with Producer({"bootstrap.servers": broker.bootstrap}) as p:
        p.produce("idle", b"only", partition=0)
        p.flush(30)
    with Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "held-fetch", "auto.offset.reset": "earliest",
                   "enable.auto.commit": False, "fetch.max.wait.ms": 10_000,
                   "request.timeout.ms": 40_000}) as c:
        c.subscribe(["idle"])
        got: list[Any] = []
        deadline = time.monotonic() + 60
        while not got:
            assert time.monotonic() < deadline, "nothing consumed"
            got = c.consume(10, 1.0)
        assert [m.value for m in got] == [b"only"]
        c.consume(10, 0.5)  # the next Fetch is now in flight, held by the broker (no new data)
        took = []
        for _ in range(3):
            t0 = time.monotonic()
            c.commit(asynchronous=False)
            assert c.committed([TopicPartition("idle", 0)])[0].offset == 1
            took.append(time.monotonic() - t0)
        assert max(took) < 3.0, took  # behind the held Fetch: up to 10 s each


def test_out_of_range_is_raised_while_another_partition_delivers(broker: EmbeddedBroker, kit: Any) -> None:
    """The blocking consumer, partition 0 out of range with auto.offset.reset=none, partition 1 getting a
    record every 50 ms: the error comes at the first call that finds nothing to hand out. Before, the
    caller-thread wait handed out partition 1's records and never raised it."""
    import threading
    import time

    from oncelog.client import Producer

    kit.create_topic(broker.bootstrap, "oor-flow", 2)
    stop = threading.Event()
    with Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0}) as p:
        p.produce("oor-flow", b"x", partition=0)
        p.flush(10)

        def feed() -> None:
            while not stop.is_set():
                p.produce("oor-flow", b"y", partition=1)
                p.flush(10)
                time.sleep(0.05)

        th = threading.Thread(target=feed)
        th.start()
        try:
            with Consumer({"bootstrap.servers": broker.bootstrap, "auto.offset.reset": "none"}) as c:
                c.assign([TopicPartition("oor-flow", 0, 1000), TopicPartition("oor-flow", 1, 0)])
                n, raised, t0 = 0, False, time.monotonic()
                while time.monotonic() - t0 < 4 and not raised:
                    try:
                        n += len(c.consume(100, 5.0))
                    except OffsetOutOfRangeError:
                        raised = True
        finally:
            stop.set()
            th.join()
    assert raised, f"{n} records of partition 1 in 4 s, partition 0's OffsetOutOfRangeError never raised"


def test_close_from_another_thread_ends_a_long_wait_with_client_closed(broker: EmbeddedBroker, kit: Any) -> None:
    """Past the first second the blocking consume() waits on the loop: close() must end it with
    ClientClosedError (before: the loop thread's CancelledError)."""
    import threading
    import time

    from oncelog.client.errors import ClientClosedError

    kit.create_topic(broker.bootstrap, "close-wait", 1)
    c = Consumer({"bootstrap.servers": broker.bootstrap, "auto.offset.reset": "earliest"})
    c.assign([("close-wait", 0)])
    out: list[Any] = []

    def caller() -> None:
        try:
            out.append(c.consume(10, 20.0))
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
            out.append(exc)

    th = threading.Thread(target=caller)
    th.start()
    time.sleep(1.5)  # past the caller-thread wait (FAST_WAIT, 1 s)
    t0 = time.monotonic()
    c.close()
    th.join(10)
    assert len(out) == 1 and isinstance(out[0], ClientClosedError), out
    assert time.monotonic() - t0 < 5
