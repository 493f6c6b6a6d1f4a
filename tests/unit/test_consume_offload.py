"""The asyncio ``consume()`` decompressing a large compressed decode group in a worker thread
(``reader.unpack_into``): under concurrency (another thread or task decoding the same group),
cancellation, ``close()``, and a take reaching several large groups. Without a broker: the
consumer's buffer is filled by ``_apply`` from a Fetch answer made here.
"""

from __future__ import annotations

import asyncio
import inspect
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import oncelog.client.aio.consumer as consumer_mod
from oncelog.client.aio.consumer import Consumer, Message
from oncelog.client.errors import ClientClosedError
from oncelog.protocol import compression
from oncelog.protocol.records import Record, encode_record_batch
from tests.unit.test_client_fetch_decode import compressed, response


def big_zstd(offsets: tuple[int, ...] = (0, 300), seed: int = 7) -> bytes:
    """Batches of 300 records of 1000 random bytes, zstd: ~300 KB compressed each (over OFFLOAD_BYTES)."""
    rng = random.Random(seed)
    return b"".join(compressed(4, encode_record_batch([Record(None, rng.randbytes(1000)) for _ in range(300)],
                                                      base_offset=o)) for o in offsets)


def new_consumer(data: bytes, start: int = 0) -> Consumer:
    c = Consumer({"bootstrap.servers": "127.0.0.1:1", "enable.auto.commit": False})
    c.assign([("t", 0, start)])
    assert c._apply(c._parts[("t", 0)], response(data))
    return c


class Gate:
    """``compression.decompress_into`` spied on: counts the calls made off the loop's thread (the
    worker's), and holds the first of them until ``release`` is set (``started`` is set when it begins)."""

    def __init__(self, monkeypatch: Any, hold: bool = True, delay: float = 0.0) -> None:
        self.loop_thread = -1
        self.started, self.release = threading.Event(), threading.Event()
        self.worker_calls = 0
        self.loop_calls = 0
        real = compression.decompress_into
        lock = threading.Lock()
        if not hold:
            self.release.set()

        def spy(c: int, d: Any, o: Any) -> int:
            first = False
            if threading.get_ident() == self.loop_thread:
                self.loop_calls += 1
            else:
                with lock:
                    self.worker_calls += 1
                    if not self.started.is_set():
                        self.started.set()
                        first = True
                if delay:
                    time.sleep(delay)
            if first:
                self.release.wait(10)
            return real(c, d, o)

        monkeypatch.setattr(compression, "decompress_into", spy)

    def on_loop(self) -> None:
        self.loop_thread = threading.get_ident()

    async def wait_started(self) -> None:
        while not self.started.is_set():
            await asyncio.sleep(0.001)


async def gated_consume(gate: Gate, c: Consumer, action: Callable[[Consumer], Any], n: int = 70) -> list[Message]:
    """``c.consume(n, 0)`` (a large group: offloaded) with the worker held by ``gate``: ``action(c)``
    (awaited if it returns an awaitable) once the worker started, then the worker released; the
    call's result (or its exception). Call it on the loop ``gate.on_loop()`` was called on."""
    t1 = asyncio.ensure_future(c.consume(n, 0))
    await gate.wait_started()
    try:
        done = action(c)
        if inspect.isawaitable(done):
            await done
    finally:
        gate.release.set()
    return await t1


def test_a_blocking_callers_thread_decoding_the_group_the_worker_decompresses(monkeypatch: Any) -> None:
    """The blocking facade with two caller threads: one's consume() went to the loop (offload), the
    other's take_nowait decodes the same group on its own thread meanwhile (it clears the batches'
    ``packed``). Was: TypeError out of consume() (``packed`` read a second time, then None)."""
    gate = Gate(monkeypatch)
    other: list[int] = []

    async def run() -> list[int]:
        gate.on_loop()
        c = new_consumer(big_zstd())

        def caller() -> None:
            gate.started.wait(10)
            got = c.take_nowait(10)
            other.extend(m.offset for m in got or [])
            gate.release.set()

        t = threading.Thread(target=caller)
        t.start()
        try:
            got = await c.consume(70, 0)
        finally:
            gate.release.set()
            t.join()
        return [m.offset for m in got]

    got = asyncio.run(run())
    assert other == list(range(10))
    assert got == list(range(10, 80))


def test_close_while_the_worker_decompresses_hands_out_nothing(monkeypatch: Any) -> None:
    """close() completes (auto-commit would have committed the positions) while consume() waits for
    its worker: that consume() hands out nothing and raises ClientClosedError, as a consume() waiting
    for data does. Was: 70 records handed out after close(); then [] (one outcome per path)."""
    gate = Gate(monkeypatch)

    async def run() -> int:
        gate.on_loop()
        c = new_consumer(big_zstd())
        with pytest.raises(ClientClosedError):
            await gated_consume(gate, c, Consumer.close)
        return c._parts[("t", 0)].consumed if ("t", 0) in c._parts else 0

    assert asyncio.run(run()) == 0


def test_close_with_autocommit_during_the_offload_hands_out_nothing_after_its_commit(monkeypatch: Any) -> None:
    """The worker ends while close() is still in progress (its final auto-commit on the wire): the
    consume() must not hand out records past the positions close() committed (they would be delivered
    again after a restart). Was: 70 records handed out (only a completed close() was checked)."""
    gate = Gate(monkeypatch)
    committed: list[dict[Any, int]] = []

    async def run() -> None:
        gate.on_loop()
        c = Consumer({"bootstrap.servers": "127.0.0.1:1", "enable.auto.commit": True, "group.id": "g"})
        c.assign([("t", 0, 0)])
        assert c._apply(c._parts[("t", 0)], response(big_zstd()))

        async def slow_commit(offsets: Any) -> None:
            committed.append(dict(offsets))
            gate.release.set()  # the worker ends while the final commit is on the wire
            await asyncio.sleep(0.2)

        c._commit = slow_commit  # type: ignore[method-assign]
        c._next_auto_commit = float("inf")
        with pytest.raises(ClientClosedError):
            await gated_consume(gate, c, Consumer.close)

    asyncio.run(run())
    assert committed == [{("t", 0): 0}]


def test_close_during_a_wait_with_autocommit_hands_out_nothing_after_its_commit() -> None:
    """The plain wait path: a Fetch answer lands (and wakes the waiting consume()) while close()'s final
    auto-commit is on the wire. Was: its records handed out after offset 0 was committed."""
    committed: list[dict[Any, int]] = []

    async def run() -> None:
        c = Consumer({"bootstrap.servers": "127.0.0.1:1", "enable.auto.commit": True, "group.id": "g"})
        c.assign([("t", 0, 0)])
        c._next_auto_commit = float("inf")

        async def slow_commit(offsets: Any) -> None:
            committed.append(dict(offsets))
            c._apply(c._parts[("t", 0)], response(encode_record_batch(
                [Record(None, b"v%d" % i) for i in range(5)], base_offset=0)))
            c._signal()
            await asyncio.sleep(0.2)

        c._commit = slow_commit  # type: ignore[method-assign]
        t = asyncio.ensure_future(c.consume(10, None))
        await asyncio.sleep(0.05)
        await c.close()
        with pytest.raises(ClientClosedError):
            await t
        # the caller-thread paths of the blocking facade hand out nothing either
        assert c.take_nowait(10) is None and c.take_one_nowait() is None

    asyncio.run(run())
    assert committed == [{("t", 0): 0}]


def test_async_for_ends_quietly_when_close_ends_a_wait_or_an_offload(monkeypatch: Any) -> None:
    """``async for`` over the consumer, close() from another task: the iteration ends (no exception),
    whether its poll() waited for data or for the worker; iterating a closed consumer raises
    ClientClosedError, as consume() does (Java: poll() after close() throws). Was: the wait path
    raised ClientClosedError and the offload path ended quietly."""
    gate = Gate(monkeypatch)

    async def iterate(c: Consumer) -> list[int]:
        return [m.offset async for m in c]

    async def run() -> None:
        gate.on_loop()
        idle = Consumer({"bootstrap.servers": "127.0.0.1:1", "enable.auto.commit": False})
        idle.assign([("t", 0, 0)])
        for c, started in ((idle, lambda: asyncio.sleep(0.05)), (new_consumer(big_zstd()), gate.wait_started)):
            gate.release.clear()  # the idle round released it: the worker must be held in the offload round
            t = asyncio.ensure_future(iterate(c))
            await started()
            await c.close()
            gate.release.set()
            assert await asyncio.wait_for(t, 5) == []
            with pytest.raises(ClientClosedError):
                await iterate(c)

    asyncio.run(run())


def test_pause_while_the_worker_decompresses_keeps_the_paused_batches_small(monkeypatch: Any) -> None:
    """pause() while the worker decompresses: pause() copies the batches out of the Fetch answer, but
    they have no section yet; the job's end then gave them sections into the whole group's
    decompressed bytes, which the paused partition kept alive until resume(). Was: a 545-byte
    batch holding ~600 KB."""
    gate = Gate(monkeypatch)
    small = compressed(4, encode_record_batch([Record(None, b"x" * 100) for _ in range(5)], base_offset=600))

    async def run() -> list[Any]:
        gate.on_loop()
        c = new_consumer(big_zstd() + small)
        batches = [b for ch in c._parts[("t", 0)].buffer for b in ch.batches or ()]
        assert await gated_consume(gate, c, lambda c: c.pause([("t", 0)]), n=1) == []
        return batches

    for b in asyncio.run(run()):
        data, s, e = b.section if b.section is not None else b.packed
        assert len(data) == e - s, f"paused batch of {e - s} bytes holds {len(data)} bytes"


def test_a_caller_timeout_shorter_than_the_decompression_still_makes_progress(monkeypatch: Any) -> None:
    """``asyncio.timeout(0.02)`` around consume(), the worker's decompression taking 60 ms: the job is
    the consumer's, so a cancelled call's work is applied and reused by the next, the group is
    decompressed once and records come out, each once, in order. Was: 0 records in 10 calls, the
    group decompressed again by every call."""
    gate = Gate(monkeypatch, hold=False, delay=0.03)  # 30 ms for each of the two batches

    async def run() -> list[int]:
        gate.on_loop()
        c = new_consumer(big_zstd())
        got: list[int] = []
        for _ in range(10):
            try:
                async with asyncio.timeout(0.02):
                    got += [m.offset for m in await c.consume(70, None)]
            except TimeoutError:
                pass
        return got

    got = asyncio.run(run())
    assert got and got == list(range(len(got)))
    assert gate.worker_calls == 2  # one job (the group's two batches), reused after the cancellations


def test_cancel_while_the_worker_decompresses_loses_nothing(monkeypatch: Any) -> None:
    gate = Gate(monkeypatch)

    async def run() -> list[int]:
        gate.on_loop()
        c = new_consumer(big_zstd())
        t1 = asyncio.ensure_future(c.consume(70, None))
        await gate.wait_started()
        t1.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t1
        assert c._parts[("t", 0)].consumed == 0
        gate.release.set()
        got: list[int] = []
        while msgs := await c.consume(70, 0):
            got += [m.offset for m in msgs]
        return got

    assert asyncio.run(run()) == list(range(600))
    assert gate.worker_calls == 2 and gate.loop_calls == 0


def test_two_tasks_consuming_at_once_share_one_job(monkeypatch: Any) -> None:
    gate = Gate(monkeypatch)

    async def run() -> tuple[list[int], list[int]]:
        gate.on_loop()
        c = new_consumer(big_zstd())
        t1 = asyncio.ensure_future(c.consume(70, 0))
        await gate.wait_started()
        asyncio.get_running_loop().call_later(0.05, gate.release.set)
        got2 = await c.consume(70, 0)  # awaits t1's job
        got1 = await t1
        return [m.offset for m in got1], [m.offset for m in got2]

    got1, got2 = asyncio.run(run())
    assert sorted(got1 + got2) == list(range(140))
    assert gate.worker_calls == 2


class _NoLock:
    def __enter__(self) -> None:
        raise AssertionError("_big_group took the lock and scanned the buffers")

    def __exit__(self, *a: Any) -> None:
        pass


def test_big_group_skips_the_scan_while_the_next_chunk_holds_the_records(monkeypatch: Any) -> None:
    """poll() / ``async for`` call consume(1) per record: ``_big_group`` must not take the lock and
    walk the buffers each time (it cost ~15 % CPU per record) while the decoded chunk at the head has
    the records; once the take reaches past it, it scans (and finds the next large group)."""
    monkeypatch.setattr(consumer_mod, "GROUP_RECORDS", 300)  # a group per batch

    async def run() -> None:
        c = new_consumer(big_zstd((0, 300)))
        assert [m.offset for m in await c.consume(1, 0)] == [0]  # the first group decoded
        lock, c._lock = c._lock, _NoLock()  # type: ignore[assignment]
        try:
            for _ in range(3):
                assert c._big_group(1) is None
            assert c._big_group(299) is None
        finally:
            c._lock = lock
        big = c._big_group(300)  # one record past the decoded chunk: the next group, packed
        assert big is not None and big[0].header.base_offset == 300

    asyncio.run(run())


def test_a_take_reaching_several_large_groups_offloads_each(monkeypatch: Any) -> None:
    """consume(1000) over four large one-batch groups: each is decompressed in the worker, none on the
    loop (was: the first in the worker, the three others on the loop)."""
    monkeypatch.setattr(consumer_mod, "GROUP_RECORDS", 300)
    gate = Gate(monkeypatch, hold=False)

    async def run() -> list[int]:
        gate.on_loop()
        c = new_consumer(big_zstd((0, 300, 600, 900)))
        return [m.offset for m in await c.consume(1000, 0)]

    assert asyncio.run(run()) == list(range(1000))
    assert gate.worker_calls == 4 and gate.loop_calls == 0


def test_a_damaged_batch_in_an_offloaded_group_fails_at_hand_out(monkeypatch: Any) -> None:
    """The worker's job fails: the take goes on to decode on the loop (no second job for the same
    group in a loop), hands out the records before the damaged batch, then raises CORRUPT_MESSAGE.
    The good batch before it is decompressed once, by the worker (was: again on the loop)."""
    gate = Gate(monkeypatch, hold=False)
    from oncelog.client.errors import KafkaError
    from oncelog.protocol.records import HEADER_SIZE, update_crc

    good = big_zstd((0,))
    bad = bytearray(big_zstd((300,), seed=8))
    bad[HEADER_SIZE + 1] ^= 0xFF  # the zstd magic
    update_crc(bad)

    async def run() -> list[int]:
        gate.on_loop()
        c = new_consumer(good + bytes(bad))
        got: list[int] = []
        with pytest.raises(KafkaError, match="CORRUPT_MESSAGE|batch at offset 300"):
            while msgs := await c.consume(70, 0):
                got += [m.offset for m in msgs]
        assert c._parts[("t", 0)].consumed == 300
        return got

    assert asyncio.run(run()) == list(range(300))
    assert gate.worker_calls == 2 and gate.loop_calls == 1  # the damaged batch's attempt on the loop only


def test_seek_while_the_worker_decompresses(monkeypatch: Any) -> None:
    """A seek while the job runs: nothing from the old position is handed out, the position stays at
    the seek target (the job's result is applied to batches no longer buffered: harmless)."""
    gate = Gate(monkeypatch)

    async def run() -> tuple[list[int], int]:
        gate.on_loop()
        c = new_consumer(big_zstd())
        got = await gated_consume(gate, c, lambda c: c.seek(("t", 0), 450))
        return [m.offset for m in got], c._parts[("t", 0)].consumed

    got, consumed = asyncio.run(run())
    assert got == [] and consumed == 450


def test_pause_copies_a_batch_out_of_its_groups_decompressed_bytes() -> None:
    """A paused partition's buffered batches may stay a long time: one whose section is a small part
    of a decode group's decompressed bytes (reader.unpack_group) gets a copy of its own, so that it
    does not keep the whole group's bytes alive (was: only views of the receive buffer were copied)."""
    from oncelog.client import reader

    small = compressed(4, encode_record_batch([Record(None, b"x" * 100) for _ in range(5)], base_offset=600))
    c = new_consumer(big_zstd() + small)
    st = c._parts[("t", 0)]
    batches = [b for ch in st.buffer for b in ch.batches or ()]
    assert reader.unpack_group(batches)
    whole = batches[-1].section[0]  # type: ignore[index]
    assert len(whole) > 500_000
    c.pause([("t", 0)])
    buf, s, e = batches[-1].section  # type: ignore[misc]
    assert buf is not whole and len(buf) == e - s and buf[s:e] == whole[len(whole) - len(buf):]
    c.resume([("t", 0)])
    assert [m.offset for m in c.take_nowait(1000) or []] == list(range(605))
