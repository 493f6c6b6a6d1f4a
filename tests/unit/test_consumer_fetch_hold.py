"""The blocking consumer's fetch policy (``AioConsumer._fetch_hold``, 1 in the blocking facade): a leader's
drained partitions are fetched once at most one of its partitions still has records to hand out, not
each as it drains (Java's ``fetchablePartitions``, still the asyncio consumer's policy): fewer, larger
Fetches whose answers do not arrive while the caller's thread decodes. The caller's thread wakes the
fetcher only when a drain lets a Fetch go out."""

from __future__ import annotations

from tests.unit.consumer_fakes import consumer, fetched, wakes


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


def test_two_leaders_hold_and_release_their_fetches_independently() -> None:
    c, loop = consumer({0: 1, 1: 1, 2: 1, 3: 2, 4: 2, 5: 2}, hold=1)
    assert len(c.take_nowait(6) or []) == 6  # partitions 0 and 1 drained: node 1 has one left
    assert fetched(c) == [(1, [0, 1])]
    assert len(c.take_nowait(6) or []) == 6  # partitions 2 and 3: node 1 has none left, node 2 two
    assert fetched(c) == [(1, [0, 1, 2])]
    assert len(c.take_nowait(3) or []) == 3  # partition 4: node 2 has one left
    assert fetched(c) == [(1, [0, 1, 2]), (2, [3, 4])]
