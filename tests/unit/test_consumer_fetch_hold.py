"""The blocking consumer's fetch policy (``AioConsumer._fetch_hold``, 1 in the blocking facade): a leader's
drained partitions are fetched once at most one of its partitions still has records to hand out, not
each as it drains (Java's ``fetchablePartitions``, still the asyncio consumer's policy): fewer, larger
Fetches whose answers do not arrive while the caller's thread decodes. The caller's thread wakes the
fetcher only when a drain lets a Fetch go out."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from oncelog.client.aio.cluster import TopicInfo
from oncelog.client.aio.consumer import Consumer
from oncelog.protocol.records import Record, encode_record_batch


class Loop:
    def __init__(self) -> None:
        self.calls: list[Any] = []

    def call_soon_threadsafe(self, fn: Any, *args: Any) -> None:
        self.calls.append(fn)


def consumer(leaders: dict[int, int], hold: int | None) -> tuple[Consumer, Loop]:
    c = Consumer({"bootstrap.servers": "127.0.0.1:1"})
    c._fetch_hold = hold
    c.cluster.topics["t"] = TopicInfo("t", None, leaders=dict(leaders))
    c.assign([("t", p, 0) for p in leaders])
    loop = Loop()
    c._loop = loop  # type: ignore[assignment]
    gens = {k: (st.generation, st.fetch_pos) for k, st in c._parts.items()}
    batch = encode_record_batch([Record(None, b"v%d" % i) for i in range(3)], base_offset=0)
    c._apply_answer(SimpleNamespace(responses=[SimpleNamespace(topic="t", partitions=[
        SimpleNamespace(partition_index=p, error_code=0, records=batch, aborted_transactions=[])
        for p in leaders])]), gens)
    return c, loop


def wakes(loop: Loop) -> int:
    return sum(getattr(fn, "__name__", "") == "set" for fn in loop.calls)


def fetched(c: Consumer) -> list[tuple[int, list[int]]]:
    """One pass of the fetcher: the Fetches it sends, as (node, partitions)."""
    sent: list[tuple[int, list[int]]] = []

    async def fetch(node: int, states: list[Any]) -> None:
        sent.append((node, sorted(st.partition for st in states)))

    async def one_pass() -> None:
        c._fetch = fetch  # type: ignore[method-assign]
        c._wake = asyncio.Event()  # (asyncio.Event binds to the first loop it is used in)
        task = asyncio.ensure_future(c._run())
        await asyncio.sleep(0.05)
        c._closed = True
        c._wake.set()
        await task

    asyncio.run(one_pass())
    c._closed = False
    return sent


def test_the_drained_partitions_are_fetched_once_one_partition_is_left() -> None:
    c, loop = consumer({0: 1, 1: 1, 2: 1, 3: 2}, hold=1)
    assert len(c.take_nowait(3) or []) == 3  # partition 0 drained; 1 and 2 (node 1) still buffered
    assert wakes(loop) == 0  # before: a wake, and a Fetch of partition 0 alone
    assert fetched(c) == []
    assert len(c.take_nowait(3) or []) == 3  # partition 1 drained: only 2 left on node 1
    assert wakes(loop) == 1
    assert fetched(c) == [(1, [0, 1])]


def test_a_paused_partitions_records_do_not_hold_the_fetch_back() -> None:
    c, loop = consumer({0: 1, 1: 1, 2: 1}, hold=1)
    c.pause([("t", 2)])
    assert len(c.take_nowait(3) or []) == 3  # partition 0 drained; 1 buffered, 2 paused
    assert wakes(loop) == 1
    assert fetched(c) == [(1, [0])]


def test_without_the_hold_each_drained_partition_is_fetched() -> None:  # the asyncio consumer, Java's policy
    c, loop = consumer({0: 1, 1: 1, 2: 1}, hold=None)
    assert len(c.take_nowait(3) or []) == 3
    assert wakes(loop) == 1
    assert fetched(c) == [(1, [0])]


def test_pausing_the_held_partitions_wakes_the_fetcher() -> None:
    """Partition 0 drained while 1 and 2 hold its leader's Fetch back; pausing 1 and 2 releases the hold, and
    must wake the fetcher (before: partition 0 was fetched only when the fetcher's 1 s timer fired)."""
    c, loop = consumer({0: 1, 1: 1, 2: 1}, hold=1)
    assert len(c.take_nowait(3) or []) == 3
    assert wakes(loop) == 0
    c._wake.clear()
    c.pause([("t", 1), ("t", 2)])
    assert c._wake.is_set()
    assert fetched(c) == [(1, [0])]


def test_revoking_the_held_partitions_wakes_the_fetcher() -> None:
    c, loop = consumer({0: 1, 1: 1, 2: 1}, hold=1)
    assert len(c.take_nowait(3) or []) == 3
    c._wake.clear()
    c.incremental_unassign([("t", 1), ("t", 2)])
    assert c._wake.is_set()
    assert fetched(c) == [(1, [0])]
