"""A burst of acks=0 records followed by the producer's close: every record is appended.

Two halves of one path: the client reports an acks=0 record delivered only once its request was
handed to the socket, and closing sends what is queued (client/aio/connection.py); the broker keeps
handling the requests it read from a connection the client then closed (only their answers are
dropped), as Kafka does, instead of cancelling them (broker/server.py ``connection_lost``).
The real clients' bursts are usually handled by the broker before their close arrives; the raw
test writes a burst and closes in one go, so the close reaches the broker while it has most of the
burst read but not handled. Cost: about 1-2 s per test.
"""

from __future__ import annotations

import asyncio
import socket
import struct

import pytest

from oncelog.client import aio
from oncelog.protocol.build import materialize
from oncelog.protocol.codec import encode_request, request_type
from oncelog.protocol.records import Record, encode_record_batch
from oncelog.testing import EmbeddedBroker
from oncelog.testing.readback import end_offset
from tests.integration.conftest import create_topic, wait_until


def _settled_end(bootstrap: str, topic: str, n: int) -> int:
    """The end offset once it reaches ``n`` or stops moving."""
    seen: list[int] = []

    def settled() -> bool:
        seen.append(end_offset(bootstrap, topic, 0, 0))
        return seen[-1] >= n or (len(seen) >= 8 and seen[-1] == seen[-8])

    wait_until(settled, 30, interval=0.25, message="the end offset to settle")
    return seen[-1]


def test_oncelog_producer_acks0_burst_then_close(broker: EmbeddedBroker) -> None:
    n = 160
    create_topic(broker.bootstrap, "burst", 1)

    async def main() -> None:
        p = aio.Producer({"bootstrap.servers": broker.bootstrap, "acks": 0, "linger.ms": 5,
                          "batch.size": 1 << 20, "max.request.size": 8 << 20, "buffer.memory": 128 << 20})
        await p.start()
        value = b"x" * 100_000
        futs = [p.produce("burst", value, partition=0) for _ in range(n)]
        await p.close()  # flushes: every acks=0 record is "delivered" once its request went out
        assert all(f.done() and f.exception() is None for f in futs)

    asyncio.run(main())
    assert _settled_end(broker.bootstrap, "burst", n) == n


@pytest.mark.parametrize("linger", [0, 5])
def test_confluent_kafka_acks0_burst_then_close(broker: EmbeddedBroker, linger: int) -> None:
    from confluent_kafka import Producer

    n = 3000
    create_topic(broker.bootstrap, "burst", 1)
    p = Producer({"bootstrap.servers": broker.bootstrap, "acks": 0, "linger.ms": linger,
                  "batch.num.messages": 10, "enable.idempotence": False})
    errors: list[object] = []
    for _ in range(n):
        p.produce("burst", b"y" * 2000, partition=0, on_delivery=lambda err, _m: err and errors.append(err))
    assert p.flush(30) == 0 and not errors
    del p  # librdkafka closes its sockets
    assert _settled_end(broker.bootstrap, "burst", n) == n


def _request(api_key: int, version: int, corr: int, body: dict, flexible: bool) -> bytes:
    payload = encode_request(materialize(request_type(api_key, version), body))
    head = struct.pack(">hhih", api_key, version, corr, 3) + b"raw" + (b"\x00" if flexible else b"")
    return struct.pack(">i", len(head) + len(payload)) + head + payload


def test_raw_requests_read_before_the_close_are_handled(broker: EmbeddedBroker) -> None:
    """Kafka handles the requests it read from a connection the client then closed (only the answers
    are dropped). An OffsetCommit (the connection's next request starts once it is durable) then 200
    acks=0 Produce requests and the FIN, in one go: the commit and every record are applied, in order."""
    n = 200
    create_topic(broker.bootstrap, "burst", 1)
    out = bytearray(_request(8, 2, 1, {
        "group_id": "burst-group", "generation_id_or_member_epoch": -1, "member_id": "", "retention_time_ms": -1,
        "topics": [{"name": "burst", "partitions": [
            {"partition_index": 0, "committed_offset": 7, "committed_metadata": ""}]}]}, False))
    for i in range(n):
        out += _request(0, 9, i + 2, {
            "transactional_id": None, "acks": 0, "timeout": 10000,
            "topic_data": [{"name": "burst", "partition_data": [
                {"index": 0, "records": encode_record_batch([Record(None, b"%d" % i)])}]}]}, True)
    with socket.create_connection((broker.host, broker.port), timeout=10) as sock:
        sock.sendall(out)
    assert _settled_end(broker.bootstrap, "burst", n) == n
    from oncelog.client.admin import Admin
    from oncelog.client.reader import PartitionReader

    with PartitionReader(broker.bootstrap, timeout=10) as reader:  # appended in the order sent
        values = [r.value for r in reader.read_partition("burst", 0).records]
    assert values == [b"%d" % i for i in range(n)]
    with Admin({"bootstrap.servers": broker.bootstrap}) as admin:
        assert admin.list_group_offsets("burst-group") == {("burst", 0): 7}
