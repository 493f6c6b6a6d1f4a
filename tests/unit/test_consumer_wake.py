"""The blocking facade's caller thread (``take_nowait``) wakes the fetcher for a partition it drained only
when no Fetch is in flight to that partition's leader: the answer's arrival wakes the fetcher anyway
(``_fetch`` clears the node's busy mark, then sets ``_wake``), and each wake from another thread is a
self-pipe write and a GIL hand-off to the loop thread. A drained partition whose leader is idle, or
unknown, still wakes it at once (otherwise its next Fetch would wait for another broker's answer)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from oncelog.client.aio.cluster import TopicInfo
from oncelog.client.aio.consumer import Consumer
from oncelog.protocol.records import Record, encode_record_batch


class Loop:
    """Counts what take_nowait() hands to the loop thread."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    def call_soon_threadsafe(self, fn: Any, *args: Any) -> None:
        self.calls.append(fn)


def consumer(leaders: dict[int, int]) -> tuple[Consumer, Loop]:
    c = Consumer({"bootstrap.servers": "127.0.0.1:1"})
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


def test_no_wake_while_a_fetch_is_in_flight_to_the_leader() -> None:
    c, loop = consumer({0: 1, 1: 1})
    c._node_busy.add(1)
    assert [m.offset for m in c.take_nowait(3) or []] == [0, 1, 2]  # partition 0 drained
    assert loop.calls == []  # before: one wake per drained partition
    c._node_busy.clear()
    assert len(c.take_nowait(3) or []) == 3  # partition 1 drained, nothing in flight
    assert loop.calls == [c._wake.set]


def test_wake_when_the_leader_is_idle_or_unknown() -> None:
    c, loop = consumer({0: 2, 1: 1, 2: -1})
    c._node_busy.add(1)  # a Fetch in flight to node 1 only
    assert len(c.take_nowait(3) or []) == 3  # partition 0 (node 2, idle) drained
    assert loop.calls == [c._wake.set]
    assert len(c.take_nowait(3) or []) == 3  # partition 1 (node 1, busy): no wake
    assert len(loop.calls) == 1
    assert len(c.take_nowait(3) or []) == 3  # partition 2: no leader known, wake (metadata refresh)
    assert len(loop.calls) == 2
