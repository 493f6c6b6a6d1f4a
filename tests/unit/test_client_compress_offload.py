"""The producer's compression offload (a large gzip/zstd batch compressed in a worker thread), sans-IO.

review5 A1: a worker that raises (a codec error, MemoryError) fails that batch only, with a clear
error, and the sender goes on with the partition's next batch (it used to compress the batch again
on the loop, which raised in the sender pass and killed the sender: flush() waited for ever)."""

from __future__ import annotations

import asyncio
import time
import types
from concurrent.futures import Future
from typing import Any

import pytest

import oncelog.client.batch as batch_mod
from oncelog.client.aio.producer import ProducerCore
from oncelog.client.config import parse_config
from oncelog.client.errors import KafkaError


def test_a_compression_thread_error_fails_that_batch_only(monkeypatch: pytest.MonkeyPatch) -> None:
    real = batch_mod.compress

    def compress(codec: int, data: bytes) -> bytes:
        if len(data) > 1500:
            raise MemoryError("boom")
        return real(codec, data)

    monkeypatch.setattr(batch_mod, "compress", compress)

    async def run() -> None:
        core = ProducerCore(parse_config({"bootstrap.servers": "127.0.0.1:9", "compression.type": "gzip",
                                          "linger.ms": 0}, "producer"))
        core._idle = asyncio.Event()
        core._wake = asyncio.Event()
        core.producer_id, core.producer_epoch = 7, 0
        core.offload_min = 1000  # the first batch (2 kB) goes to the thread, the second (small) does not
        core.cluster.topic = lambda name: types.SimpleNamespace(partitions=1)  # type: ignore[method-assign]
        core.cluster.leader = lambda topic, partition: 1  # type: ignore[method-assign]
        core.cluster.stale = lambda topic: False  # type: ignore[method-assign]
        core.cluster.last_refresh = time.monotonic() + 1e9
        sent: list[Any] = []
        core._send = lambda node, items, now: sent.extend(b for _p, b in items)  # type: ignore[method-assign]
        big: list[Future[Any]] = [Future() for _ in range(2)]
        core.append_many("t", [b"x" * 1000] * 2, None, 0, 1_700_000_000_000, big)
        p = core.partitions[("t", 0)]
        b1 = p.ready[-1]
        small: list[Future[Any]] = [Future()]
        core.append_many("t", [b"y"], None, 0, 1_700_000_000_000, small)
        core._pass(time.monotonic())
        assert b1.compressing is not None and sent == []
        await asyncio.wait([b1.compressing])
        core._pass(time.monotonic())  # the sender does not die: the batch fails, the next one goes
        err = big[0].exception(0)
        assert isinstance(err, KafkaError) and "compression failed: MemoryError('boom')" in str(err)
        assert all(f.done() for f in big) and not small[0].done()
        assert core._wake.is_set()  # another pass is due at once
        core._pass(time.monotonic())
        assert [b.count for b in sent] == [1]  # the small batch is sent

    asyncio.run(run())
