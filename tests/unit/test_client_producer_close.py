"""The producer's close(), sans-IO (no broker, no socket).

review5 K3: an answer read while close() awaits the ending sender (a socket read in one of those
loop iterations) is processed, not dropped: a producer that is not idempotent keeps its sent
batch in no queue, so a dropped answer left the batch's futures pending for ever."""

from __future__ import annotations

import asyncio
import types
from concurrent.futures import Future
from typing import Any

from oncelog.client.aio.producer import ProducerCore
from oncelog.client.config import parse_config
from oncelog.client.errors import KafkaError
from tests.unit.test_client_expiry import _Conn

NODE = 1


def test_an_answer_read_while_close_awaits_the_sender_completes_its_batch() -> None:
    async def run() -> None:
        core = ProducerCore(parse_config({"bootstrap.servers": "127.0.0.1:9", "enable.idempotence": False,
                                          "acks": 1, "linger.ms": 0}, "producer"))
        core._idle = asyncio.Event()
        core.cluster.topic = lambda name: types.SimpleNamespace(partitions=1)  # type: ignore[method-assign]
        assert not core.idempotent
        futs: list[Future[Any]] = [Future() for _ in range(3)]
        core.append_many("t", [b"v%d" % i for i in range(3)], None, 0, 1_700_000_000_000, futs)
        p = core.partitions[("t", 0)]
        conn = _Conn()
        core._send_request(NODE, conn, 9, [(p, p.ready[0])], False)
        assert not p.ready and not p.unacked  # not idempotent: the sent batch is in no queue

        async def sender() -> None:
            try:
                await asyncio.sleep(60)
            finally:  # the answer arrives while close() awaits the cancelled sender
                conn.sent[-1].set_result(None)  # acknowledged (as an acks=0 answer is read)

        core._task = asyncio.ensure_future(sender())
        await asyncio.sleep(0)
        await asyncio.wait_for(core.close(0.05), 5)
        assert all(f.done() for f in futs)
        assert all(f.exception() is None and f.result().partition == 0 for f in futs)
        assert core.buffered_bytes == 0

    asyncio.run(run())


def test_failing_a_completed_batch_again_releases_nothing_twice() -> None:
    async def run() -> None:
        core = ProducerCore(parse_config({"bootstrap.servers": "127.0.0.1:9", "linger.ms": 0}, "producer"))
        core._idle = asyncio.Event()
        core.cluster.topic = lambda name: types.SimpleNamespace(partitions=1)  # type: ignore[method-assign]
        released: list[int] = []
        core.on_complete = released.append
        futs: list[Future[Any]] = [Future() for _ in range(2)]
        core.append_many("t", [b"abc", b"def"], None, 0, 1_700_000_000_000, futs)
        b = core.partitions[("t", 0)].ready[0]
        before = core.buffered_bytes
        core._fail_batch(b, KafkaError("failed"))
        core._fail_batch(b, KafkaError("failed again"))  # e.g. from a request list and a partition queue
        assert core.buffered_bytes == before - b.nbytes and released == [b.nbytes]
        assert isinstance(futs[0].exception(), KafkaError) and str(futs[0].exception()).endswith(": failed")

    asyncio.run(run())
