"""Records and produce_batch() calls waiting for a topic's metadata keep their call order, sans-IO.

The cluster's ``wait_topic`` is a gate the test opens (metadata arrives) or fails (the topic never
appears): every produce() record and produce_batch() call made while the topic is waited for is placed
in call order, or fails with the same error in that order. Before, a produce_batch() awaited the
metadata itself and was placed as soon as it resumed, ahead of the produce() records queued earlier.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from oncelog.client.aio.cluster import TopicInfo
from oncelog.client.aio.producer import BatchFutures, ProducerCore, produce_batch_into
from oncelog.client.config import parse_config
from oncelog.client.errors import UnknownTopicOrPartitionError
from oncelog.protocol.records import decode_records


def _core() -> tuple[ProducerCore, "asyncio.Future[None]"]:
    core = ProducerCore(parse_config({"bootstrap.servers": "127.0.0.1:9", "linger.ms": 60_000}, "producer"))
    core._idle = asyncio.Event()
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def wait_topic(name: str, timeout: float) -> TopicInfo:
        await asyncio.shield(gate)  # raises the test's error when it fails the gate
        info = core.cluster.topics[name] = TopicInfo(name, None, {0: 1, 1: 1})
        return info

    core.cluster.wait_topic = wait_topic  # type: ignore[method-assign]
    return core, gate


def _produce(core: ProducerCore, values: list[bytes], partition: int | None = 1, key: bytes | None = None
             ) -> list["asyncio.Future[Any]"]:
    futs = []
    for v in values:
        f: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        core.append("t", v, key, partition, None, 1_700_000_000_000, f)
        futs.append(f)
    return futs


def _batch(core: ProducerCore, values: list[bytes], partition: int | None = 1, keys: Any = None
           ) -> "asyncio.Task[None]":
    futs = BatchFutures(len(values), asyncio.get_running_loop().create_future)
    return asyncio.ensure_future(produce_batch_into(core, "t", values, keys, partition, None, futs))


def _log(core: ProducerCore, partition: int) -> list[bytes]:
    p = core.partitions.get(("t", partition))
    if p is None:
        return []
    batches = list(p.ready) + ([p.open] if p.open is not None else [])
    return [r.value for b in batches for r in decode_records(b.builder.to_bytes())]


def _vals(prefix: str, n: int) -> list[bytes]:
    return [b"%s-%d" % (prefix.encode(), i) for i in range(n)]


def test_batches_and_records_waiting_for_metadata_are_placed_in_call_order() -> None:
    async def main() -> None:
        core, gate = _core()
        _produce(core, _vals("a", 3))
        first = _batch(core, _vals("b", 2))
        await asyncio.sleep(0)  # the call has started: it waits in line
        _produce(core, _vals("c", 2))
        second = _batch(core, _vals("d", 2), partition=None, keys=[b"k"] * 2)  # keyed: its own partition
        bad = _batch(core, _vals("x", 2), partition=5)  # no such partition: raises, places nothing
        await asyncio.sleep(0)
        _produce(core, _vals("e", 1))
        _produce(core, _vals("f", 2), partition=None, key=b"k")
        await asyncio.sleep(0.01)
        assert _log(core, 1) == [] and not first.done()  # nothing placed before the metadata
        gate.set_result(None)
        await asyncio.gather(first, second)
        with pytest.raises(UnknownTopicOrPartitionError):
            await bad
        assert _log(core, 1) == _vals("a", 3) + _vals("b", 2) + _vals("c", 2) + _vals("e", 1)
        # keyed records: in call order on the key's partition (0 or 1, with partition 1's others)
        keyed = [v for q in (0, 1) for v in _log(core, q) if v[:1] in (b"d", b"f")]
        assert keyed == _vals("d", 2) + _vals("f", 2)
        # the topic known now: a batch is placed at once, behind everything
        await _batch(core, _vals("g", 1))
        assert _log(core, 1)[-1] == b"g-0"

    asyncio.run(main())


def test_topic_never_appears_fails_records_and_batches_in_call_order() -> None:
    async def main() -> None:
        core, gate = _core()
        order: list[bytes] = []

        def watch(futs: list[Any], values: list[bytes]) -> None:
            for f, v in zip(futs, values):
                f.add_done_callback(lambda f, v=v: order.append(v))

        watch(_produce(core, _vals("a", 2)), _vals("a", 2))
        batch = _batch(core, _vals("b", 2))
        await asyncio.sleep(0)
        later = _produce(core, _vals("c", 1))
        watch(later, _vals("c", 1))
        gate.set_exception(UnknownTopicOrPartitionError("topic t not present in metadata"))
        with pytest.raises(UnknownTopicOrPartitionError):  # the call raises, as when its own wait failed
            await batch
        for f in later:
            with pytest.raises(UnknownTopicOrPartitionError):
                await f
        assert order == _vals("a", 2) + _vals("c", 1)
        assert core._outstanding == 0 and not core._waiting and _log(core, 1) == []

    asyncio.run(main())


def test_batch_cancelled_while_waiting_places_none_of_its_records() -> None:
    async def main() -> None:
        core, gate = _core()
        _produce(core, _vals("a", 1))
        batch = _batch(core, _vals("b", 2))
        await asyncio.sleep(0)
        _produce(core, _vals("c", 1))
        batch.cancel()
        await asyncio.sleep(0)
        gate.set_result(None)
        await asyncio.sleep(0.01)
        assert batch.cancelled()
        assert _log(core, 1) == [b"a-0", b"c-0"]

    asyncio.run(main())


def test_waiting_batch_counts_as_outstanding_until_it_ends() -> None:
    """flush() (and so a transaction's end) waits for a produce_batch() call still waiting for metadata;
    before, nothing counted it and flush() returned at once."""
    async def main() -> None:
        core, gate = _core()
        core._idle.set()
        batch = _batch(core, _vals("b", 2))
        await asyncio.sleep(0)
        assert core._outstanding == 1 and not core._idle.is_set()
        flushed = asyncio.ensure_future(core.flush(None))
        await asyncio.sleep(0.01)
        assert not flushed.done()
        gate.set_exception(UnknownTopicOrPartitionError("never"))
        with pytest.raises(UnknownTopicOrPartitionError):
            await asyncio.wait_for(batch, 5)
        assert await asyncio.wait_for(flushed, 5) == 0

    asyncio.run(main())


def _txn_core() -> tuple[ProducerCore, "asyncio.Future[None]"]:
    core, gate = _core()
    txn_core = ProducerCore(parse_config({"bootstrap.servers": "127.0.0.1:9", "linger.ms": 60_000,
                                          "transactional.id": "x"}, "producer"))
    core.txn = txn_core.txn
    core.txn.core = core  # type: ignore[union-attr]
    return core, gate


@pytest.mark.parametrize("state,placed", [("IN_TRANSACTION", True), ("COMMITTING", True), ("READY", False),
                                          ("ABORTING", False)])
def test_waiting_batch_checks_the_transaction_when_placed(state: str, placed: bool) -> None:
    """A call made in a transaction is placed while that transaction is open or being committed (commit
    waits for it), and fails when the transaction ended meanwhile instead of going into the next one or
    outside any."""
    from oncelog.client.aio.transactions import S
    from oncelog.client.errors import IllegalStateError

    async def main() -> None:
        core, gate = _txn_core()
        core._idle.set()
        core.txn.state = S.IN_TRANSACTION  # type: ignore[union-attr]
        batch = _batch(core, _vals("b", 2))
        await asyncio.sleep(0)
        core.txn.state = S[state]  # type: ignore[union-attr]
        gate.set_result(None)
        if placed:
            await asyncio.wait_for(batch, 5)
            assert _log(core, 1) == [b"b-0", b"b-1"]
        else:
            with pytest.raises(IllegalStateError):
                await asyncio.wait_for(batch, 5)
            assert _log(core, 1) == []
            assert core._outstanding == 0

    asyncio.run(main())


def test_batch_to_a_topic_with_stale_metadata_is_placed_before_later_produce() -> None:
    """Metadata known but marked stale (NOT_LEADER_OR_FOLLOWER invalidated it): produce_batch() places
    at once as produce() does. Before, it awaited a refresh and a later produce() landed first."""
    async def main() -> None:
        core = ProducerCore(parse_config({"bootstrap.servers": "127.0.0.1:9", "linger.ms": 60_000}, "producer"))
        core._idle = asyncio.Event()
        core.cluster.topics["t"] = TopicInfo("t", None, {0: 1, 1: 1})
        core.cluster.invalidate("t")
        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def refresh(topics: Any = None) -> None:
            await gate
            core.cluster._stale.discard("t")
        core.cluster.refresh = refresh  # type: ignore[method-assign]
        task = _batch(core, _vals("batch", 2))
        await asyncio.sleep(0)
        _produce(core, [b"later"])
        gate.set_result(None)
        await asyncio.wait_for(task, 5)
        assert _log(core, 1) == [b"batch-0", b"batch-1", b"later"]

    asyncio.run(main())


def test_cancelled_waiting_batch_is_dropped_at_once() -> None:
    async def main() -> None:
        core, gate = _core()
        core._idle.set()
        _produce(core, _vals("a", 1))
        batch = _batch(core, _vals("b", 2))
        await asyncio.sleep(0)
        assert len(core._waiting["t"]) == 2 and core._outstanding == 2
        batch.cancel()
        await asyncio.sleep(0)
        assert len(core._waiting["t"]) == 1 and core._outstanding == 1  # the produce() record only
        gate.set_result(None)
        await asyncio.sleep(0.01)
        assert _log(core, 1) == [b"a-0"]

    asyncio.run(main())

