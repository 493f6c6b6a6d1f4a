"""Per-connection request order (Broker correctness item 2), in-process.

* ``KafkaConnection`` starts a request only once the request before it on the
  connection has applied its effects (``ctx.applied()``, or its return), while
  what comes after the effects (fsync, long polls) still overlaps, and writes
  the answers in request order.
* A TV2 Produce (v12) that adds several partitions to the transaction
  implicitly does it in one transaction-log write.
"""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from oncelog.broker import server as server_mod
from oncelog.broker.broker import Broker
from oncelog.broker.config import BrokerConfig
from oncelog.broker.dispatch import handle_frame
from oncelog.protocol.build import materialize
from oncelog.protocol.codec import decode_response, encode_request, request_type
from oncelog.protocol.headers import skip_tagged_fields
from oncelog.protocol.records import Record, encode_record_batch

PRODUCE = 0


# -- the connection's ordering --------------------------------------------------------------


class FakeTransport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.aborted = False

    def get_extra_info(self, _name: str) -> Any:
        return ("127.0.0.1", 1)

    def writelines(self, parts: Any) -> None:
        self.written.append(b"".join(parts))

    def abort(self) -> None:
        self.aborted = True

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


def test_a_request_starts_after_the_previous_one_applied_its_effects(monkeypatch: pytest.MonkeyPatch) -> None:
    """Request 1 awaits before its effect (like a TV2 produce waiting for its implicit adds) and
    then waits for "fsync"; request 2 has an effect at once. Request 2 must start only after
    request 1's effect, but before request 1's fsync is over (pipelining), and the answers
    go out in request order."""
    events: list[str] = []

    async def main() -> None:
        gate, fsync = asyncio.Event(), asyncio.Event()

        async def fake_handle_frame(_broker: Any, body: bytes, _peer: str, applied: Any = None) -> list[bytes]:
            name = body.decode()
            events.append(f"{name} start")
            if name == "one":
                await gate.wait()  # the implicit adds
            events.append(f"{name} effect")
            if applied is not None:
                applied()
            if name == "one":
                await fsync.wait()
            events.append(f"{name} done")
            return [name.encode()]

        monkeypatch.setattr(server_mod, "handle_frame", fake_handle_frame)
        fake_server = SimpleNamespace(broker=SimpleNamespace(config=BrokerConfig()), connections=set())
        conn = server_mod.KafkaConnection(fake_server)  # type: ignore[arg-type]
        transport = FakeTransport()
        conn.connection_made(transport)  # type: ignore[arg-type]
        conn.data_received(struct.pack(">i", 3) + b"one" + struct.pack(">i", 3) + b"two")
        for _ in range(5):
            await asyncio.sleep(0)
        assert events == ["one start"], "request two started before request one applied its effects"
        gate.set()
        for _ in range(5):
            await asyncio.sleep(0)
        assert events == ["one start", "one effect", "two start", "two effect", "two done"]
        assert transport.written == [], "two's answer must wait for one's"
        fsync.set()
        for _ in range(5):
            await asyncio.sleep(0)
        # in order (both became ready in the same pass, so they went out in one write)
        assert b"".join(transport.written) == struct.pack(">i", 3) + b"one" + struct.pack(">i", 3) + b"two"

    asyncio.run(main())


def test_responses_ready_in_the_same_pass_go_out_in_one_write(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three pipelined requests released by one event (one group-commit round): their answers
    are handed to the transport with one writelines (one send), in request order. A response
    ready alone is still written in the next pass, not held back."""

    async def main() -> None:
        durable = asyncio.Event()

        async def fake_handle_frame(_broker: Any, body: bytes, _peer: str, applied: Any = None) -> list[bytes]:
            if applied is not None:
                applied()
            if body != b"solo":
                await durable.wait()
            return [body]

        monkeypatch.setattr(server_mod, "handle_frame", fake_handle_frame)
        fake_server = SimpleNamespace(broker=SimpleNamespace(config=BrokerConfig()), connections=set())
        conn = server_mod.KafkaConnection(fake_server)  # type: ignore[arg-type]
        transport = FakeTransport()
        conn.connection_made(transport)  # type: ignore[arg-type]
        conn.data_received(b"".join(struct.pack(">i", 1) + n for n in (b"a", b"b", b"c")))
        for _ in range(5):
            await asyncio.sleep(0)
        assert transport.written == []
        durable.set()
        for _ in range(5):
            await asyncio.sleep(0)
        assert transport.written == [b"".join(struct.pack(">i", 1) + n for n in (b"a", b"b", b"c"))]
        conn.data_received(struct.pack(">i", 4) + b"solo")
        for _ in range(5):
            await asyncio.sleep(0)
        assert transport.written[1:] == [struct.pack(">i", 4) + b"solo"]

    asyncio.run(main())



def test_requests_read_before_the_peer_closed_still_apply_their_effects(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client closes with four requests read: "poll" has applied (a long poll waiting), "slow" waits
    before its effect, "p1"/"p2" (acks=0 produces) wait their turn. As Kafka, the requests read go on
    until their effects are applied, in order (their answers dropped), and what follows the effects
    (the long poll, a durability wait) is cancelled: nothing is left waiting. A close of ours (abort)
    drops the requests not yet started, as before."""
    events: list[str] = []

    async def main() -> None:
        gate, forever = asyncio.Event(), asyncio.Event()

        async def fake_handle_frame(_broker: Any, body: bytes, _peer: str, applied: Any = None) -> list[bytes]:
            name = body.decode()
            events.append(f"{name} start")
            if name == "slow":
                await gate.wait()
            events.append(f"{name} effect")
            applied()
            try:
                await forever.wait()  # a long poll / durability wait: never over here
            except asyncio.CancelledError:
                events.append(f"{name} cancelled")
                raise
            return [body]

        monkeypatch.setattr(server_mod, "handle_frame", fake_handle_frame)
        fake_server = SimpleNamespace(broker=SimpleNamespace(config=BrokerConfig()), connections=set(),
                                      orphans=set())
        conn = server_mod.KafkaConnection(fake_server)  # type: ignore[arg-type]
        transport = FakeTransport()
        conn.connection_made(transport)  # type: ignore[arg-type]
        conn.data_received(b"".join(struct.pack(">i", len(n)) + n for n in (b"poll", b"slow", b"p1", b"p2")))
        for _ in range(5):
            await asyncio.sleep(0)
        assert events == ["poll start", "poll effect", "slow start"]
        conn.connection_lost(None)  # the client closed
        for _ in range(5):
            await asyncio.sleep(0)
        assert events == ["poll start", "poll effect", "slow start", "poll cancelled"]
        assert len(fake_server.orphans) == 3
        gate.set()
        for _ in range(10):
            await asyncio.sleep(0)
        assert sorted(events[4:]) == sorted(["slow effect", "p1 start", "p1 effect", "p2 start", "p2 effect",
                                             "slow cancelled", "p1 cancelled", "p2 cancelled"]), events
        assert [e for e in events if e.endswith("effect")] == ["poll effect", "slow effect", "p1 effect", "p2 effect"]
        assert not fake_server.orphans and transport.written == []  # nothing left, no answer written

        # our own close (a bad frame, say): the requests not yet started are dropped
        events.clear()
        gate.clear()
        conn = server_mod.KafkaConnection(fake_server)  # type: ignore[arg-type]
        conn.connection_made(FakeTransport())  # type: ignore[arg-type]
        conn.data_received(b"".join(struct.pack(">i", len(n)) + n for n in (b"slow", b"p1")))
        for _ in range(5):
            await asyncio.sleep(0)
        conn.abort("test")
        conn.connection_lost(None)
        gate.set()
        for _ in range(10):
            await asyncio.sleep(0)
        assert events == ["slow start"]

    asyncio.run(main())


# -- one transaction-log write for a request's implicit adds ----------------------------------


def produce_frame(corr: int, txn_id: str, topic: str, batches: dict[int, bytes]) -> bytes:
    body = {"transactional_id": txn_id, "acks": -1, "timeout": 10000, "topic_data": [
        {"name": topic, "partition_data": [{"index": p, "records": r} for p, r in batches.items()]}]}
    header = struct.pack(">hhih", PRODUCE, 12, corr, 1) + b"t" + b"\x00"
    return header + encode_request(materialize(request_type(PRODUCE, 12), body))


def decode_produce(parts: list[bytes]) -> dict[int, int]:
    raw = b"".join(parts)
    r = decode_response(PRODUCE, 12, raw, skip_tagged_fields(raw, 4))
    return {p.index: int(p.error_code) for t in r.responses for p in t.partition_responses}


def test_implicit_adds_of_one_request_are_one_transaction_log_write(tmp_path: Path) -> None:
    """Produce v12 to 6 partitions new to the transaction: exactly one transaction-log write
    (not one per partition competing for the pending slot), no CONCURRENT_TRANSACTIONS
    (NOT_ENOUGH_REPLICAS in Produce), every batch appended."""

    async def main() -> None:
        broker = Broker(BrokerConfig(data_dir=tmp_path / "data"))
        try:
            broker.create_topic("t", 6)
            await broker.txn.start()
            init = await broker.txn.init_producer_id("tx", 60_000)
            assert init.error == 0
            pid, epoch = init.producer_id, init.producer_epoch
            writes: list[Any] = []
            real_write = broker.txn_log.write

            async def counting_write(tid: str, md: Any) -> None:
                writes.append(md)
                await real_write(tid, md)

            broker.txn_log.write = counting_write  # type: ignore[method-assign]
            batches = {
                p: encode_record_batch([Record(key=None, value=b"v%d" % p)], producer_id=pid, producer_epoch=epoch,
                                       base_sequence=0, is_transactional=True)
                for p in range(6)
            }
            parts = await handle_frame(broker, produce_frame(1, "tx", "t", batches))
            assert parts is not None
            assert decode_produce(parts) == {p: 0 for p in range(6)}
            assert len(writes) == 1, f"{len(writes)} transaction log writes for one request's implicit adds"
            md = broker.txn.metadata("tx")
            assert md is not None and {tp.partition for tp in md.partitions} == set(range(6))
            assert [broker.partition("t", p).log.log_end_offset for p in range(6)] == [1] * 6
        finally:
            await broker.txn.drain()
            broker.close()

    asyncio.run(main())
