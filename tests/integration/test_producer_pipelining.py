"""The producer pipelines the batches of one partition up to ``max.in.flight.requests.per.connection``.

A Produce request (v3+) holds one batch per partition (Kafka's rule), so a
partition with many closed batches needs many requests. They go out without
waiting for each other's answers, up to max.in.flight, as Java's sender does
(found profiling the transact session's ``end()``: a transaction of 500 x
512 B records to one partition, 17 batches, flushed one request per round
trip; docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio

import pytest

from oncelog.client import aio
from oncelog.testing import EmbeddedBroker

from tests.integration.conftest import create_topic

pytestmark = [pytest.mark.timeout(60)]


@pytest.mark.parametrize("in_flight", [1, 3, 5])
def test_batches_of_one_partition_go_out_without_waiting_for_answers(broker: EmbeddedBroker, in_flight: int) -> None:
    create_topic(broker.bootstrap, "pipelined", 1)

    async def go() -> tuple[int, int]:
        conf = {"bootstrap.servers": broker.bootstrap, "batch.size": 2048, "linger.ms": 1000,
                "max.in.flight.requests.per.connection": in_flight}
        async with aio.Producer(conf) as p:
            core = p._core
            await core.cluster.wait_topic("pipelined", 10)
            peak = 0
            send = core._send_request

            def counting(*args: object, **kw: object) -> None:
                nonlocal peak
                send(*args, **kw)  # type: ignore[arg-type]
                peak = max(peak, max(core._node_inflight.values(), default=0))

            core._send_request = counting  # type: ignore[method-assign]
            # 60 records of ~500 B, appended without yielding: about 15 closed batches of partition 0
            futs = [p.produce("pipelined", b"v" * 500, key=b"%d" % i, partition=0) for i in range(60)]
            assert await p.flush(30) == 0
            offsets = [(await f).offset for f in futs]
            assert offsets == list(range(60))
            return peak, core.stats["requests"]

    peak, requests = asyncio.run(go())
    assert requests >= 10, requests
    assert peak == in_flight, f"at most {peak} Produce requests in flight (max.in.flight {in_flight})"
