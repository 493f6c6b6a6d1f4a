"""Closing a client connection (oncelog.client.aio.connection.BrokerConnection) with writes still queued.

With the plain socket's write buffer limits at 0, what the socket cannot take yet waits in the
connection's ``_backlog``. A request sent with ``expect_response=False`` (Produce acks=0) completes only
once its bytes were handed to the socket (as the Java client completes an acks=0 send), and a graceful
``close()`` sends the backlog before it closes the socket; a close with an error (abort) drops it and
keeps nothing of it, nor of a half-received answer.
"""

from __future__ import annotations

import asyncio
import logging
import struct

from oncelog.client.aio.connection import BrokerConnection
from oncelog.client.errors import KafkaConnectionError

PART = 1 << 20


async def _connected(port: int, request_timeout_ms: int = 30000) -> BrokerConnection:
    """A connection made without ApiVersions (the peer here is no broker)."""
    loop = asyncio.get_running_loop()
    conn = BrokerConnection("127.0.0.1", port, client_id="c", request_timeout_ms=request_timeout_ms)
    conn._loop = loop
    conn.closed_future = loop.create_future()
    await loop.create_connection(lambda: conn, "127.0.0.1", port)
    return conn


def _run_slow_reader(n_requests: int, close: str) -> tuple[int, int, BrokerConnection, list[asyncio.Future]]:
    """A peer that starts reading only after a while, then reads until EOF; ``n_requests`` acks=0
    requests of ``PART`` bytes; returns (bytes the peer got, bytes written, connection, futures)."""
    received = 0
    done = asyncio.Event()

    async def main() -> tuple[int, int, BrokerConnection, list[asyncio.Future]]:
        nonlocal received

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal received
            await asyncio.sleep(0.3)  # meanwhile the socket's buffers fill and the rest waits in the backlog
            while chunk := await reader.read(1 << 20):
                received += len(chunk)
            writer.close()
            done.set()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        conn = await _connected(port)
        body = [b"\x01" * PART]
        futs = [conn.send(0, 3, body, expect_response=False) for _ in range(n_requests)]
        written = n_requests * (4 + 2 + 2 + 4 + 2 + 1 + PART)  # size, key, version, corr, client id "c"
        if close == "after-flush":
            await asyncio.wait_for(asyncio.gather(*futs), 20)
            assert not conn._backlog
            conn.close()
        elif close == "graceful":
            conn.close()  # at once: the backlog still goes out
        else:
            assert conn._backlog, "the test needs writes waiting in the backlog"
            conn.close(KafkaConnectionError("test abort"))
            assert not conn._backlog  # N1: nothing of the unsent requests kept
        await asyncio.wait_for(done.wait(), 20)
        server.close()
        await server.wait_closed()
        return received, written, conn, futs

    return asyncio.run(main())


def test_acks0_sends_complete_only_once_written_and_all_reach_the_peer() -> None:
    received, written, conn, futs = _run_slow_reader(48, "after-flush")
    assert received == written
    assert all(f.done() and f.exception() is None for f in futs)


def test_graceful_close_sends_the_backlog_first() -> None:
    received, written, conn, futs = _run_slow_reader(48, "graceful")
    assert received == written
    assert not conn._backlog and all(f.done() and f.exception() is None for f in futs)


def test_abort_drops_the_backlog_and_fails_the_unsent_acks0_requests() -> None:
    received, written, conn, futs = _run_slow_reader(48, "abort")
    assert received < written
    assert not conn._backlog
    failed = [f for f in futs if f.exception() is not None]
    assert failed and all(isinstance(f.exception(), KafkaConnectionError) for f in failed)
    # the requests that did go out completed, the rest failed: none is reported sent that was not
    assert all(f.exception() is None for f in futs[:len(futs) - len(failed)])


def test_closed_connection_keeps_no_half_received_answer() -> None:
    """N1: a large answer cut off by the peer's close is not kept by the closed connection."""

    async def main() -> BrokerConnection:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(struct.pack(">i", 8 << 20) + b"\x00" * (1 << 20))  # 1 MiB of an 8 MiB answer
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        conn = await _connected(server.sockets[0].getsockname()[1])
        await asyncio.wait_for(conn.closed_future, 10)
        server.close()
        await server.wait_closed()
        return conn

    conn = asyncio.run(main())
    assert conn.closed
    assert conn._reader._big is None and conn._reader.buffered == 0


def test_plaintext_client_on_a_tls_port_gets_a_hint_and_allocates_nothing_large() -> None:
    """F3 (Kafka's KAFKA-4090): a TLS listener answers a plaintext ApiVersions with an alert record, whose
    header reads as a 336 MiB frame: a KafkaConnectionError naming the likely cause, no such allocation."""
    import tracemalloc

    from oncelog.client.errors import KafkaConnectionError as ConnError

    async def main() -> tuple[Exception | None, int]:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read(100)
            writer.write(b"\x15\x03\x03\x00\x02\x02\x32")  # fatal alert, decode_error
            await writer.drain()
            await asyncio.sleep(0.3)
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        conn = BrokerConnection("127.0.0.1", server.sockets[0].getsockname()[1])
        tracemalloc.start()
        error: Exception | None = None
        try:
            await conn.connect()
        except ConnError as exc:
            error = exc
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        server.close()
        await server.wait_closed()
        return error, peak

    error, peak = asyncio.run(main())
    assert error is not None and "TLS listener" in str(error) and "security.protocol" in str(error), error
    assert peak < 64 << 20, peak


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


async def _late_reading_peer() -> tuple[asyncio.Server, asyncio.Event, list[int]]:
    """A peer that starts reading after 0.3 s, counts every byte (``got[0]``) until the client closes,
    then closes and sets ``done``."""
    done = asyncio.Event()
    got = [0]

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(0.3)
        while chunk := await reader.read(1 << 20):
            got[0] += len(chunk)
        writer.close()
        done.set()

    return await asyncio.start_server(serve, "127.0.0.1", 0), done, got


def test_graceful_drain_makes_asyncio_log_nothing() -> None:
    """review3 C3: the connection closed its transport from inside asyncio's ``_write_ready`` (the
    ``resume_writing`` that sent the last of the backlog), and asyncio then called ``connection_lost``
    twice and logged an "Exception in callback ... AttributeError" traceback on every graceful drain."""
    got: list[int] = []

    async def main() -> tuple[asyncio.Future, list[object]]:
        handler_calls: list[object] = []
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: handler_calls.append(ctx))
        server, done, counted = await _late_reading_peer()
        conn = await _connected(server.sockets[0].getsockname()[1])
        fut = conn.send(0, 3, [b"\x01" * (16 << 20)], expect_response=False)
        assert conn._backlog and conn._paused, "the test needs writes waiting in the backlog"
        conn.close()
        await asyncio.wait_for(done.wait(), 20)
        await asyncio.sleep(0.1)  # the callbacks scheduled by the close have run
        server.close()
        await server.wait_closed()
        got[:] = counted
        return fut, handler_calls

    log = logging.getLogger("asyncio")
    records = _Records()
    log.addHandler(records)
    try:
        fut, handler_calls = asyncio.run(main())
    finally:
        log.removeHandler(records)
    assert got == [16 * 2**20 + 15]
    assert fut.done() and fut.exception() is None
    assert handler_calls == []
    assert [r.getMessage() for r in records.records if r.levelno >= logging.WARNING] == []


def _never_reading_peer(close: bool) -> tuple[list[asyncio.Future], BrokerConnection, bool, int]:
    """review3 C1: a peer that accepts and never reads; 48 acks=0 requests of ``PART`` bytes with
    request.timeout.ms=1000, then (``close``) a graceful close at once. Returns the futures, the connection,
    whether its socket is closed 3 s later, and how many futures were still pending then."""

    async def main() -> tuple[list[asyncio.Future], BrokerConnection, bool, int]:
        hold: list[asyncio.StreamWriter] = []

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            hold.append(writer)  # never reads, never closes

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        conn = await _connected(server.sockets[0].getsockname()[1], request_timeout_ms=1000)
        sock = conn._transport.get_extra_info("socket")  # type: ignore[union-attr]
        futs = [conn.send(0, 3, [b"\x01" * PART], expect_response=False) for _ in range(48)]
        assert conn._backlog, "the test needs writes waiting in the backlog"
        if close:
            conn.close()
        await asyncio.wait(futs, timeout=3)
        await asyncio.sleep(0.1)
        pending = sum(not f.done() for f in futs)
        closed = sock.fileno() == -1
        for w in hold:
            w.transport.abort()
        server.close()
        await server.wait_closed()
        conn.close(KafkaConnectionError("test cleanup"))
        return futs, conn, closed, pending

    return asyncio.run(main())


def _check_timed_out(futs: list[asyncio.Future], conn: BrokerConnection, closed: bool, pending: int) -> None:
    assert pending == 0
    assert closed and conn.closed and not conn._backlog
    failed = [f for f in futs if f.exception() is not None]
    assert failed, "a peer that never reads cannot have taken 48 MiB"
    assert all(isinstance(f.exception(), KafkaConnectionError) and "request timeout" in str(f.exception())
               for f in failed), [str(f.exception()) for f in failed]
    # the requests that did go out completed, the rest failed: none is reported sent that was not
    assert all(f.exception() is None for f in futs[:len(futs) - len(failed)])


def test_acks0_sends_the_peer_never_reads_fail_after_the_request_timeout() -> None:
    """As Java's InFlightRequests keeps an unsent acks=0 request and request.timeout.ms closes its
    connection: the futures were pending for as long as the peer did not read."""
    _check_timed_out(*_never_reading_peer(close=False))


def test_graceful_close_drain_is_bounded_by_the_request_timeout() -> None:
    """A graceful close of a connection whose peer never reads: the socket stayed open and the futures
    pending for ever; now the drain is aborted after request.timeout.ms."""
    _check_timed_out(*_never_reading_peer(close=True))


def test_graceful_close_resolves_a_marker_whose_request_the_transport_still_sends() -> None:
    """review3 C4: the backlog holds only the marker of a request the transport took (its tail buffered in
    the transport, which ``transport.close()`` still sends): the request reaches the peer, so its future
    must not report it unsent (a retry would duplicate it)."""
    size = 8 << 20
    got: list[int] = []

    async def main() -> tuple[asyncio.Future, list[object]]:
        server, done, counted = await _late_reading_peer()
        conn = await _connected(server.sockets[0].getsockname()[1])
        fut = conn.send(0, 3, b"\x01" * size, expect_response=False)  # one write: the transport buffers its tail
        assert [type(item).__name__ for item in conn._backlog] == ["_Sent"]
        conn.close()
        await asyncio.wait_for(done.wait(), 20)
        await asyncio.wait_for(asyncio.wait([fut]), 5)
        server.close()
        await server.wait_closed()
        got[:] = counted
        return fut, list(conn._backlog)

    fut, backlog = asyncio.run(main())
    assert got == [size + 15]
    assert fut.done() and fut.exception() is None, fut.exception()
    assert backlog == []
