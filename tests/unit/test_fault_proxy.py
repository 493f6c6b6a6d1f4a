"""Unit tests of :mod:`oncelog.testing.fault_proxy` against a fake Kafka-framed server.

The fake upstream answers every request frame with a response frame whose
body is the request's correlation id followed by the whole request body (so
the client can check both directions byte for byte), except Produce with
acks=0, which gets no answer, as from a broker. It records every request it
received, so a test sees what really reached "the broker".
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest

from oncelog.protocol.headers import parse_request_header_prefix
from oncelog.testing.embedded import free_port
from oncelog.testing.fault_proxy import FaultProxy, Faults, expects_response

pytestmark = pytest.mark.timeout(60)

PRODUCE, METADATA = 0, 3


# -- fake upstream ---------------------------------------------------------------


class FakeKafka:
    """Kafka-framed echo server on loopback, in its own event-loop thread."""

    def __init__(self, port: int = 0) -> None:
        self.port = port or free_port()
        self.received: list[bytes] = []
        self.connections = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> "FakeKafka":
        ready = threading.Event()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            try:
                while True:
                    (size,) = struct.unpack(">i", await reader.readexactly(4))
                    body = await reader.readexactly(size)
                    self.received.append(body)
                    api_key, version, corr = struct.unpack_from(">hhi", body, 0)
                    _, pos = parse_request_header_prefix(body)
                    if not expects_response(api_key, version, body, pos):
                        continue
                    resp = struct.pack(">i", corr) + body
                    writer.write(struct.pack(">i", len(resp)) + resp)
                    await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                writer.transport.abort()

        def main() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            server = loop.run_until_complete(asyncio.start_server(handle, "127.0.0.1", self.port,
                                                                  reuse_address=True))
            ready.set()
            try:
                loop.run_forever()
            finally:
                server.close()
                for t in asyncio.all_tasks(loop):
                    t.cancel()
                loop.run_until_complete(asyncio.sleep(0))
                loop.close()

        self._thread = threading.Thread(target=main, daemon=True)
        self._thread.start()
        assert ready.wait(10)
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._thread = None


@pytest.fixture
def fake() -> Iterator[FakeKafka]:
    f = FakeKafka().start()
    try:
        yield f
    finally:
        f.stop()


# -- requests and a tiny blocking client -------------------------------------------


def request(api_key: int, corr: int, payload: bytes = b"", version: int | None = None,
            client_id: bytes | None = b"unit", acks: int = -1) -> bytes:
    """A request body: header prefix, then for Produce transactional_id + acks + timeout."""
    if version is None:
        version = 7 if api_key == PRODUCE else 1
    cid = struct.pack(">h", -1) if client_id is None else struct.pack(">h", len(client_id)) + client_id
    head = struct.pack(">hhi", api_key, version, corr) + cid
    if api_key == PRODUCE:
        if version >= 9:
            head += b"\x00" + b"\x00" + struct.pack(">hi", acks, 30000)  # tags, null compact txn id
        else:
            head += struct.pack(">h", -1) + struct.pack(">hi", acks, 30000)
    return head + payload


class Client:
    def __init__(self, port: int, timeout: float = 5.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)

    def send(self, body: bytes) -> None:
        self.sock.sendall(struct.pack(">i", len(body)) + body)

    def recv(self) -> bytes:
        (size,) = struct.unpack(">i", self._exact(4))
        return self._exact(size)

    def _exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        return bytes(buf)

    def recv_all(self, idle: float = 0.3) -> list[bytes]:
        """Responses until the connection stays quiet for ``idle`` s or closes."""
        out = []
        self.sock.settimeout(idle)
        try:
            while True:
                out.append(self.recv())
        except (socket.timeout, ConnectionError, OSError):
            pass
        return out

    def close(self) -> None:
        self.sock.close()


def corr_of(resp: bytes) -> int:
    return struct.unpack_from(">i", resp, 0)[0]


def run_pipelined(port: int, bodies: list[bytes]) -> list[bytes]:
    """Send all bodies on one connection, then read what comes back."""
    c = Client(port)
    try:
        for b in bodies:
            c.send(b)
        return c.recv_all()
    finally:
        c.close()


def wait_for(pred, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


# -- tests ---------------------------------------------------------------------------


def test_frames_forwarded_intact(fake: FakeKafka) -> None:
    bodies = [
        request(METADATA, 1),
        request(PRODUCE, 2, b"x" * 1_000_000),
        request(METADATA, 3, client_id=None),
        request(PRODUCE, 4, bytes(range(256)) * 3, version=9),
        request(18, 5, client_id=b""),
    ]
    with FaultProxy(("127.0.0.1", fake.port), seed=1) as proxy:
        got = run_pipelined(proxy.port, bodies)
        st = proxy.stats
    assert fake.received == bodies
    assert got == [b[4:8] + b for b in bodies], "response = correlation id + request body"
    assert st.requests == st.forwarded_requests == len(bodies)
    assert st.responses == st.forwarded_responses == len(bodies)
    assert st.faults == 0 and st.connections == 1


def test_drop_rate_is_seeded_and_only_hits_produce(fake: FakeKafka) -> None:
    n = 2000
    bodies = [request(PRODUCE if i % 2 == 0 else METADATA, i, b"p%d" % i) for i in range(n)]

    def run(seed: int) -> set[int]:
        fake.received.clear()
        with FaultProxy(("127.0.0.1", fake.port), seed=seed, drop_response_rate=0.1) as proxy:
            got = run_pipelined(proxy.port, bodies)
            st = proxy.stats
        assert fake.received == bodies, "every request must reach upstream, dropped or not"
        answered = [corr_of(r) for r in got]
        assert answered == sorted(answered)
        missing = set(range(n)) - set(answered)
        assert all(i % 2 == 0 for i in missing), "only Produce responses may be dropped"
        assert st.dropped_responses == len(missing) == st.dropped_by_api.get(PRODUCE, 0)
        assert st.forwarded_responses == len(got) == n - len(missing)
        # 1000 Produce responses at 10%: mean 100, sd 9.5
        assert 60 <= len(missing) <= 140, len(missing)
        for r in got:
            i = corr_of(r)
            assert r == r[:4] + bodies[i], f"response {i} altered"
        return missing

    a = run(7)
    assert run(7) == a, "same seed, same faults"
    assert run(8) != a


def test_api_keys_selects_affected_requests(fake: FakeKafka) -> None:
    bodies = [request(PRODUCE if i % 2 == 0 else METADATA, i) for i in range(200)]
    with FaultProxy(("127.0.0.1", fake.port), seed=3, drop_response_rate=1.0, api_keys={METADATA}) as proxy:
        got = run_pipelined(proxy.port, bodies)
        assert proxy.stats.dropped_by_api == {METADATA: 100}
    assert [corr_of(r) for r in got] == list(range(0, 200, 2))


def test_duplicates_reach_upstream_and_second_response_is_swallowed(fake: FakeKafka) -> None:
    n = 2000
    bodies = [request(PRODUCE, i, b"d%d" % i) for i in range(n)]
    with FaultProxy(("127.0.0.1", fake.port), seed=5, duplicate_rate=0.2) as proxy:
        got = run_pipelined(proxy.port, bodies)
        st = proxy.stats
    assert [corr_of(r) for r in got] == list(range(n)), "each request answered exactly once, in order"
    dups = len(fake.received) - n
    assert dups == st.duplicated_requests == st.swallowed_duplicate_responses
    assert 320 <= dups <= 480, dups  # mean 400, sd 18
    # a duplicate is the same frame, right after the original
    seen: list[bytes] = []
    for body in fake.received:
        if seen and seen[-1] == body:
            seen.append(b"")  # consumed pair marker
            continue
        seen.append(body)
    assert [b for b in seen if b] == bodies


def test_acks0_produce_is_not_waited_for(fake: FakeKafka) -> None:
    bodies = []
    for i in range(100):
        bodies.append(request(PRODUCE, 2 * i, b"fire-and-forget", acks=0, version=3 + i % 10))
        bodies.append(request(METADATA, 2 * i + 1))
    with FaultProxy(("127.0.0.1", fake.port), seed=1, drop_response_rate=1.0, duplicate_rate=1.0) as proxy:
        got = run_pipelined(proxy.port, bodies)
        st = proxy.stats
    assert [corr_of(r) for r in got] == [2 * i + 1 for i in range(100)]
    assert st.dropped_responses == 0
    assert st.duplicated_requests == 0


@pytest.mark.parametrize("version", [3, 8, 9, 12])
def test_expects_response_parses_acks(version: int) -> None:
    for acks, expected in ((0, False), (1, True), (-1, True)):
        body = request(PRODUCE, 9, b"rest", version=version, acks=acks)
        _, pos = parse_request_header_prefix(body)
        assert expects_response(PRODUCE, version, body, pos) is expected


def test_close_rate(fake: FakeKafka) -> None:
    """Request/response one at a time; a closed connection is reopened."""
    n = 2000
    closes_seen = 0
    with FaultProxy(("127.0.0.1", fake.port), seed=11, close_rate=0.01) as proxy:
        c = Client(proxy.port)
        for i in range(n):
            body = request(METADATA, i, b"c%d" % i)
            try:
                c.send(body)
                resp = c.recv()
                assert resp == body[4:8] + body
            except (ConnectionError, OSError):
                closes_seen += 1
                c.close()
                c = Client(proxy.port)
        c.close()
        st = proxy.stats
    assert st.closes == closes_seen
    assert st.connections == closes_seen + 1
    # 2 frames per round trip; about 4000 draws at 1%: mean 40, sd 6.3 (minus the draws lost to closes)
    assert 18 <= closes_seen <= 65, closes_seen


def test_drop_mode_close_and_stall(fake: FakeKafka) -> None:
    bodies = [request(METADATA, 0), request(PRODUCE, 1), request(METADATA, 2), request(METADATA, 3)]
    with FaultProxy(("127.0.0.1", fake.port), seed=2, drop_response_rate=1.0, drop_mode="close") as proxy:
        c = Client(proxy.port)
        for b in bodies:
            c.send(b)
        got = c.recv_all(idle=2.0)
        c.close()
        st = proxy.stats
    assert [corr_of(r) for r in got] == [0]
    assert st.dropped_responses == 1 and st.closes == 1
    wait_for(lambda: len(fake.received) >= 2)
    assert fake.received[1] == bodies[1], "the dropped Produce reached upstream"

    with FaultProxy(("127.0.0.1", fake.port), seed=2, drop_response_rate=1.0, drop_mode="stall") as proxy:
        got = run_pipelined(proxy.port, bodies)
        wait_for(lambda: proxy.stats.stalled_responses == 2)
        st = proxy.stats
    assert [corr_of(r) for r in got] == [0]
    assert st.dropped_responses == 1 and st.closes == 0


def test_pause_resume_and_set_faults(fake: FakeKafka) -> None:
    with FaultProxy(("127.0.0.1", fake.port), seed=4, drop_response_rate=1.0) as proxy:
        proxy.pause()
        assert len(run_pipelined(proxy.port, [request(PRODUCE, i) for i in range(50)])) == 50
        proxy.resume()
        assert run_pipelined(proxy.port, [request(PRODUCE, i) for i in range(50)]) == []
        assert proxy.stats.dropped_responses == 50
        proxy.set_faults(drop_response_rate=0.0, duplicate_rate=1.0)
        assert len(run_pipelined(proxy.port, [request(PRODUCE, i) for i in range(50)])) == 50
        assert proxy.stats.duplicated_requests == 50
        assert proxy.faults == Faults(duplicate_rate=1.0)
    with pytest.raises(ValueError):
        Faults(drop_response_rate=1.5)
    with pytest.raises(ValueError):
        Faults(delay_ms=(5, 1))


def test_close_connections(fake: FakeKafka) -> None:
    with FaultProxy(("127.0.0.1", fake.port), seed=1) as proxy:
        c = Client(proxy.port)
        c.send(request(METADATA, 1))
        assert corr_of(c.recv()) == 1
        proxy.close_connections()
        assert c.recv_all(idle=2.0) == []
        c.close()
        # new connections are served as before
        assert [corr_of(r) for r in run_pipelined(proxy.port, [request(METADATA, 2)])] == [2]
        assert proxy.stats.connections == 2 and proxy.stats.faults == 0


def test_delay(fake: FakeKafka) -> None:
    with FaultProxy(("127.0.0.1", fake.port), seed=4, delay_ms=(20, 30)) as proxy:
        c = Client(proxy.port)
        started = time.monotonic()
        for i in range(5):
            c.send(request(METADATA, i))
            assert corr_of(c.recv()) == i
        elapsed = time.monotonic() - started
        c.close()
        st = proxy.stats
    assert st.delays == 10
    assert 200 <= st.delayed_ms <= 300  # 10 frames, 20-30 ms each
    assert elapsed >= st.delayed_ms / 1000 * 0.95


def test_blackhole_and_upstream_restart() -> None:
    port = free_port()
    with FaultProxy(("127.0.0.1", port), seed=1, connect_timeout=1.0) as proxy:
        # upstream down: the client connection just fails
        c = Client(proxy.port)
        c.send(request(METADATA, 1))
        assert c.recv_all(idle=2.0) == []
        c.close()
        assert proxy.stats.upstream_connect_failures == 1

        fake = FakeKafka(port).start()
        try:
            c = Client(proxy.port)
            c.send(request(METADATA, 2))
            assert corr_of(c.recv()) == 2
            # blackhole cuts the live connection and refuses new ones
            proxy.set_faults(blackhole=True)
            assert c.recv_all(idle=2.0) == []
            c.close()
            c = Client(proxy.port)
            c.send(request(METADATA, 3))
            assert c.recv_all(idle=2.0) == []
            c.close()
            assert proxy.stats.blackholed == 2  # one connection cut, one refused
            proxy.set_faults(blackhole=False)
        finally:
            fake.stop()

        # upstream restarted on the same port: new client connections work again
        fake = FakeKafka(port).start()
        try:
            assert [corr_of(r) for r in run_pipelined(proxy.port, [request(METADATA, 4)])] == [4]
        finally:
            fake.stop()
        st = proxy.stats
    assert st.connections == 2


# -- late requests (held, or delayed past the client's close) -----------------------------------


def test_hold_then_release_delivers_late_on_a_fresh_connection(fake: FakeKafka) -> None:
    with FaultProxy(("127.0.0.1", fake.port), seed=1) as proxy:
        proxy.hold(PRODUCE)
        c = Client(proxy.port)
        try:
            for corr, api in ((1, METADATA), (2, PRODUCE), (3, METADATA), (4, PRODUCE)):
                c.send(request(api, corr))
            # the held Produce (2) never reached the broker and gets no answer; the rest flow
            assert [corr_of(r) for r in c.recv_all(idle=0.5)] == [1, 3, 4]
        finally:
            c.close()
        assert [struct.unpack_from(">hhi", b)[2] for b in fake.received] == [1, 3, 4]
        assert proxy.held() == 1
        connections = fake.connections
        (answer,) = proxy.release_held()
        assert proxy.held() == 0
        # delivered after the client left, on a new upstream connection, and answered
        assert struct.unpack_from(">hhi", fake.received[-1])[2] == 2
        assert fake.connections == connections + 1
        assert (answer.api_key, answer.correlation_id, answer.reason, answer.answered) == (PRODUCE, 2, "held", True)
        assert answer.error.startswith("undecodable")  # the fake echoes; a real broker's answer is decoded
        assert proxy.late_answers() == [answer]
        st = proxy.stats
    assert (st.held_requests, st.late_requests) == (1, 1)


def test_hold_counts_only_the_named_api(fake: FakeKafka) -> None:
    with FaultProxy(("127.0.0.1", fake.port), seed=1) as proxy:
        proxy.hold(PRODUCE, count=2)
        got = run_pipelined(proxy.port, [request(PRODUCE, i) for i in range(1, 5)])
        assert [corr_of(r) for r in got] == [3, 4]
        assert proxy.held() == 2
        answers = proxy.release_held()
        assert sorted(a.correlation_id for a in answers) == [1, 2]
        # nothing left to hold
        assert [corr_of(r) for r in run_pipelined(proxy.port, [request(PRODUCE, 5)])] == [5]


def test_request_delayed_past_the_clients_close_still_arrives(fake: FakeKafka) -> None:
    with FaultProxy(("127.0.0.1", fake.port), seed=1, delay_ms=(300, 300), api_keys={PRODUCE}) as proxy:
        c = Client(proxy.port)
        c.send(request(PRODUCE, 7))
        c.close()  # the client gives up while the request is still "in the network"
        wait_for(lambda: len(proxy.late_answers()) == 1)
        (answer,) = proxy.late_answers()
        assert (answer.correlation_id, answer.reason, answer.answered) == (7, "client_left", True)
        assert [struct.unpack_from(">hhi", b)[2] for b in fake.received] == [7]
        assert proxy.stats.late_requests == 1


def test_answer_error_codes_of_real_responses() -> None:
    from oncelog.protocol.fast_produce import encode_produce_response
    from oncelog.testing.fault_proxy import LateAnswer, answer_error_codes

    for version in (3, 9, 10):
        body = struct.pack(">i", 9) + (b"\x00" if version >= 9 else b"") + encode_produce_response(
            version, [{"name": "t", "partition_responses": [
                {"index": i, "error_code": code, "base_offset": base, "log_append_time": -1, "log_start_offset": 0,
                 "error_message": None} for i, code, base in ((0, 47, -1), (1, 0, 5))]}])
        assert answer_error_codes(PRODUCE, version, body) == (47, 0)
    a = LateAnswer(PRODUCE, 10, 9, "held", True, (47, 0))
    assert a.refused and a.error_names == ("INVALID_PRODUCER_EPOCH", "NONE") and a.api == "produce"
    assert not LateAnswer(PRODUCE, 10, 9, "held", True, (0,)).refused


def test_late_rate_takes_requests_out_and_delivers_them_later(fake: FakeKafka) -> None:
    with FaultProxy(("127.0.0.1", fake.port), seed=4, late_rate=0.5, late_ms=(400, 400),
                    late_api_keys={PRODUCE}) as proxy:
        bodies = [request(PRODUCE if i % 2 else METADATA, i) for i in range(1, 41)]
        got = {corr_of(r) for r in run_pipelined(proxy.port, bodies)}
        late = proxy.stats.late_scheduled
        assert 3 <= late <= 17  # about half of the 20 Produce requests
        metadata = set(range(2, 41, 2))
        produce_answered = got - metadata
        assert metadata <= got and len(produce_answered) == 20 - late  # later frames kept flowing
        wait_for(lambda: len(proxy.late_answers()) == late)
        answers = proxy.late_answers()
        assert {a.reason for a in answers} == {"late"}
        assert {a.correlation_id for a in answers} == set(range(1, 41, 2)) - produce_answered
        # each reached the broker once, after the connection's other frames
        received = [struct.unpack_from(">hhi", b)[2] for b in fake.received]
        assert sorted(received) == list(range(1, 41))
        assert set(received[-late:]) == {a.correlation_id for a in answers}
    with FaultProxy(("127.0.0.1", fake.port), seed=4, late_rate=0.5, late_ms=(400, 400)) as proxy2:
        run_pipelined(proxy2.port, bodies)
        assert proxy2.stats.late_scheduled == late  # same seed, same fates


def test_answer_error_codes_finds_partition_error_codes() -> None:
    from oncelog.protocol.build import materialize
    from oncelog.protocol.codec import encode_response, response_type
    from oncelog.testing.fault_proxy import answer_error_codes

    resp = materialize(response_type(24, 3), {"throttle_time": 0, "results_by_topic_v3_and_below": [
        {"name": "t", "results_by_partition": [{"partition_index": 0, "partition_error_code": 51},
                                               {"partition_index": 1, "partition_error_code": 0}]}]})
    body = struct.pack(">i", 3) + b"\x00" + encode_response(resp)  # v3 is flexible: header tags
    assert answer_error_codes(24, 3, body) == (51, 0)
