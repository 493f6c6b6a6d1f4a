"""The blocking facade's caller thread (``take_nowait``) wakes the fetcher for a partition it drained only
when no Fetch is in flight to that partition's leader: the answer's arrival wakes the fetcher anyway
(``_fetch`` clears the node's busy mark, then sets ``_wake``), and each wake from another thread is a
self-pipe write and a GIL hand-off to the loop thread. A drained partition whose leader is idle, or
unknown, still wakes it at once (otherwise its next Fetch would wait for another broker's answer)."""

from __future__ import annotations

from tests.unit.consumer_fakes import consumer


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
