"""delivery.timeout.ms and the idempotent producer's epoch, sans-IO (no broker, no socket).

A batch that expires after it was sent may have been written (its fate is
unknown): its sequence is unresolved (Java's markSequenceUnresolved) and, with
no later batch sent to settle it, the partition's sequences restart under a
new epoch (KIP-360; test_client_unresolved_sequence.py has the cases with a
later batch). A batch that expires before it
was ever sent spent no sequence: nothing to resolve, no bump, and the next
batch takes the sequence it would have had. The integration test
test_client_producer.py::test_delivery_timeout_then_epoch_bump_and_recovery
depends on that difference (it was flaky while its cut-off raced the send).
"""

from __future__ import annotations

import asyncio
import time
import types
from concurrent.futures import Future
from typing import Any

from oncelog.client.aio.producer import ProducerCore
from oncelog.client.config import parse_config
from oncelog.client.errors import DeliveryTimeoutError, KafkaConnectionError

NODE = 1


class _Conn:
    """What the sender sends on: Produce requests go nowhere, the test answers them."""

    def __init__(self) -> None:
        self.sent: list[Future[Any]] = []

    def send(self, api_key: int, version: int, body: Any, *, expect_response: bool = True,
             raw_response: bool = False) -> Future[Any]:
        fut: Future[Any] = Future()
        self.sent.append(fut)
        return fut


def _core() -> ProducerCore:
    core = ProducerCore(parse_config({"bootstrap.servers": "127.0.0.1:9", "delivery.timeout.ms": 3000,
                                      "request.timeout.ms": 1000, "linger.ms": 0}, "producer"))
    core._idle = asyncio.Event()
    core.producer_id, core.producer_epoch = 7, 0
    known = types.SimpleNamespace(partitions=1)
    core.cluster.topic = lambda name: known  # type: ignore[method-assign]  # a known topic
    return core


def _batch(core: ProducerCore, n: int) -> tuple[Any, Any, list[Future[Any]]]:
    futs: list[Future[Any]] = [Future() for _ in range(n)]
    core.append_many("t", [b"v%d" % i for i in range(n)], None, 0, 1_700_000_000_000, futs)
    p = core.partitions[("t", 0)]
    return p, p.ready[-1], futs


def _send(core: ProducerCore, conn: _Conn, p: Any, b: Any) -> Future[Any]:
    core._send_request(NODE, conn, 9, [(p, b)], False)
    return conn.sent[-1]


def _expire_all(core: ProducerCore, p: Any) -> None:
    for b in list(p.ready) + list(p.unacked):
        b.created -= core.delivery_timeout + 1  # older than delivery.timeout.ms
    core._expire(p, time.monotonic())


def test_batch_expired_before_it_was_sent_spends_no_sequence_and_bumps_nothing() -> None:
    core = _core()
    p, b, futs = _batch(core, 10)
    _expire_all(core, p)
    assert all(isinstance(f.exception(0), DeliveryTimeoutError) for f in futs)
    assert not p.ready and not p.unacked
    assert (p.needs_bump, p.blocked, p.next_seq) == (False, False, 0)
    # the next batch goes out under the same epoch with the sequence the expired one never used
    p, b2, _ = _batch(core, 5)
    _send(core, _Conn(), p, b2)
    assert (b2.seq, core.producer_epoch, p.next_seq) == (0, 0, 5)


def test_batch_expired_after_it_was_sent_and_not_answered_needs_an_epoch_bump() -> None:
    core = _core()
    conn = _Conn()
    p, b, futs = _batch(core, 10)
    answer = _send(core, conn, p, b)
    assert (b.seq, p.next_seq, list(p.unacked)) == (0, 10, [b])
    answer.set_exception(KafkaConnectionError("connection closed"))  # cut off: written or not, unknown
    assert b.in_doubt and not b.in_flight and p.inflight == 0
    assert not p.needs_bump  # retriable so far: resent under the same sequence
    _expire_all(core, p)
    assert all(isinstance(f.exception(0), DeliveryTimeoutError) for f in futs)
    assert not p.unacked
    # its sequence is unresolved (Java's markSequenceUnresolved) and nothing more goes out for it...
    assert (p.unresolved, p.blocked) == (10, True)
    # ...and with no later batch sent to settle it, the gap remains: the next sender pass bumps the epoch
    core.cluster.last_refresh = time.monotonic() + 1e9  # (no metadata refresh)
    core._pass(time.monotonic())
    assert (core.producer_epoch, core.stats["epoch_bumps"], p.unresolved, p.needs_bump) == (1, 1, -1, False)
