"""Transactions v2: the first Produce of a transaction that follows a commit at once.

EndTxn is answered once the PrepareCommit is durable; the markers are written
after that, and until they are the producer's transaction is in
PREPARE_COMMIT: an implicit add (Produce v12) then meets CONCURRENT_TRANSACTIONS.
Kafka's ReplicaManager retries that add inside the broker every
``add.partitions.to.txn.retry.backoff.ms`` (20) for up to
``add.partitions.to.txn.retry.backoff.max.ms`` (100) instead of answering the
Produce with a retriable error, because the client's produce backoff
(retry.backoff.ms, 100 ms) would delay every such transaction. Found
profiling TransactSession.end(): 12 to 18 of 40 back-to-back transactions
lost 100 ms each (docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio

import pytest

from oncelog.client import aio
from oncelog.testing import EmbeddedBroker

from tests.integration.conftest import create_topic

pytestmark = [pytest.mark.timeout(120)]

N = 40


async def back_to_back(bootstrap: str, topic: str) -> tuple[int, list[int]]:
    async with aio.Producer({"bootstrap.servers": bootstrap, "transactional.id": "b2b", "linger.ms": 0}) as p:
        await p.init_transactions()
        assert p._core.txn is not None and p._core.txn.tv2, "the client did not speak transactions v2"
        offsets = []
        for i in range(N):
            await p.begin_transaction()
            fut = p.produce(topic, b"v%d" % i, partition=0)
            await p.commit_transaction()
            offsets.append((await fut).offset)
        return p._core.stats["retries"], offsets


def test_first_produce_after_a_commit_waits_for_the_markers_in_the_broker(broker: EmbeddedBroker) -> None:
    create_topic(broker.bootstrap, "b2b", 1)
    retries, offsets = asyncio.run(back_to_back(broker.bootstrap, "b2b"))
    # each transaction: one record and one commit marker
    assert offsets == [2 * i for i in range(N)]
    assert retries == 0, f"{retries} of {N} first Produce requests were answered with a retriable error"
