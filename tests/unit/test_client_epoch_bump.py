"""The idempotent producer's KIP-360 epoch bump, sans-IO (no broker, no socket).

As Java's idempotent producer (TransactionManager.canRetry, bumpIdempotentProducerEpoch): a batch
answered OUT_OF_ORDER_SEQUENCE_NUMBER or UNKNOWN_PRODUCER_ID was not appended, so it is retried; the
epoch is bumped client-side (same id, epoch + 1, no request) and the partition's sequences restart at
0, except for UNKNOWN_PRODUCER_ID in an answer with no log start offset (-1), which is retried as is.
Only an exhausted epoch (32767) takes a fresh id, InitProducerId(-1, -1). The librdkafka mock cluster
test (test_client_mock_cluster.py) cannot show the UNKNOWN_PRODUCER_ID bump: its error answers carry -1.
"""

from __future__ import annotations

import asyncio
import time
import types
from concurrent.futures import Future
from typing import Any

from oncelog.client.errors import error_for
from tests.unit.test_client_expiry import _batch, _Conn, _core, _send

UNKNOWN_PRODUCER_ID, OUT_OF_ORDER_SEQUENCE_NUMBER = 59, 45


def _answer(core: Any, p: Any, b: Any, code: int, log_start_offset: int) -> None:
    """What _on_response does with a partition's error answer."""
    p.inflight -= 1
    b.in_flight = False
    core._batch_failed(p, b, error_for(code), in_doubt=False, log_start_offset=log_start_offset)


def _first_then_failed(code: int, log_start_offset: int) -> tuple[Any, Any, Any, list[Any]]:
    core = _core()
    conn = _Conn()
    p, b, _ = _batch(core, 10)
    _send(core, conn, p, b)
    conn.sent[-1].set_result(None)  # acknowledged (answered as acks=0 would be)
    assert (p.acked_seq, list(p.unacked)) == (10, [])
    p, b2, futs = _batch(core, 5)
    _send(core, conn, p, b2)
    assert b2.seq == 10
    _answer(core, p, b2, code, log_start_offset)
    return core, p, b2, futs


def test_unknown_producer_id_with_a_log_start_offset_bumps_the_epoch_client_side_and_retries() -> None:
    core, p, b, futs = _first_then_failed(UNKNOWN_PRODUCER_ID, 0)
    assert not any(f.done() for f in futs) and list(p.unacked) == [b]  # kept for a retry
    assert p.needs_bump and p.blocked
    core._pass(0.0)  # nothing in flight: the bump happens now, without a request
    assert (core.producer_id, core.producer_epoch, core.stats["epoch_bumps"]) == (7, 1, 1)
    assert core._init_task is None
    assert (b.seq, p.next_seq, p.needs_bump) == (0, 5, False)


def test_out_of_order_sequence_bumps_the_epoch_and_retries() -> None:
    core, p, b, futs = _first_then_failed(OUT_OF_ORDER_SEQUENCE_NUMBER, 0)
    assert not any(f.done() for f in futs) and list(p.unacked) == [b]
    core._pass(0.0)
    assert (core.producer_id, core.producer_epoch) == (7, 1) and b.seq == 0


def test_unknown_producer_id_without_a_log_start_offset_is_retried_as_is() -> None:
    core, p, b, futs = _first_then_failed(UNKNOWN_PRODUCER_ID, -1)
    assert not any(f.done() for f in futs) and list(p.unacked) == [b]
    assert not p.needs_bump
    core._resequence(p)
    assert (core.producer_epoch, core.stats["epoch_bumps"], b.seq) == (0, 0, 10)


def test_an_exhausted_epoch_takes_a_fresh_producer_id() -> None:
    async def run() -> None:
        core, p, b, _ = _first_then_failed(OUT_OF_ORDER_SEQUENCE_NUMBER, 0)
        core.producer_epoch = 32767
        asked: list[tuple[int, int]] = []

        async def init_producer_id() -> None:
            asked.append((core.producer_id, core.producer_epoch))  # what the request would carry
            core.producer_id, core.producer_epoch = 8, 0

        core._init_producer_id = init_producer_id  # type: ignore[method-assign]
        core._pass(0.0)
        assert core._init_task is not None
        await core._init_task
        assert asked == [(-1, -1)]
        assert (core.producer_id, core.producer_epoch, core.stats["epoch_bumps"]) == (8, 0, 1)
        assert (b.seq, p.needs_bump) == (0, False)

    asyncio.run(run())


def test_a_fatal_fresh_id_answer_stops_asking_for_ids() -> None:
    """review5 K4: InitProducerId answered with a non-retriable error makes the producer fatal (its
    batches fail) and the sender asks for no further id (Java's FATAL_ERROR), however many passes run."""
    async def run() -> None:
        core, p, b, futs = _first_then_failed(OUT_OF_ORDER_SEQUENCE_NUMBER, 0)
        core.producer_epoch = 32767
        calls: list[int] = []

        async def init_producer_id() -> None:
            calls.append(1)
            raise error_for(31)  # CLUSTER_AUTHORIZATION_FAILED (not retriable)

        core._init_producer_id = init_producer_id  # type: ignore[method-assign]
        core._pass(0.0)
        assert core._init_task is not None
        await core._init_task
        assert core._fatal is not None and core._fatal.code == 31
        assert all(f.done() and f.exception() is core._fatal for f in futs)
        for _ in range(3):  # later sender passes (one a second at least in _run)
            core._pass(0.0)
            assert core._init_task is None
            await asyncio.sleep(0)
        assert calls == [1] and not core._bump_wanted

    asyncio.run(run())


def test_the_pass_that_asks_for_a_fresh_id_sends_no_batch_without_an_id() -> None:
    """review5 K2: at epoch 32767 the pass that starts InitProducerId(-1, -1) (partition 0 answered
    OUT_OF_ORDER) must not send partition 1's new batch with producer id -1; it goes, sequenced,
    under the fresh id."""
    async def run() -> None:
        core, p0, b0, _ = _first_then_failed(OUT_OF_ORDER_SEQUENCE_NUMBER, 0)
        core.cluster.topic = lambda name: types.SimpleNamespace(partitions=2)  # type: ignore[method-assign]
        core.producer_epoch = 32767
        futs: list[Future[Any]] = [Future() for _ in range(3)]
        core.append_many("t", [b"b"] * 3, None, 1, 1_700_000_000_000, futs)
        p1 = core.partitions[("t", 1)]
        assert len(p1.ready) == 1
        fresh = asyncio.Event()

        async def init_producer_id() -> None:
            await fresh.wait()
            core.producer_id, core.producer_epoch = 8, 0

        core._init_producer_id = init_producer_id  # type: ignore[method-assign]
        core.cluster.leader = lambda topic, partition: 1  # type: ignore[method-assign]
        core.cluster.stale = lambda topic: False  # type: ignore[method-assign]
        core.cluster.last_refresh = time.monotonic() + 1e9
        sent: list[tuple[int, int, int]] = []
        core._send = lambda node, items, now: sent.extend(  # type: ignore[method-assign]
            (p.partition, core.producer_id, core.producer_epoch) for p, _b in items)
        core._pass(time.monotonic())
        assert core._init_task is not None and core.producer_id == -1
        assert sent == []  # nothing without an id
        fresh.set()
        await core._init_task
        core._pass(time.monotonic())
        assert sorted(sent) == [(0, 8, 0), (1, 8, 0)]

    asyncio.run(run())
