"""A loopback TCP fault proxy that understands Kafka framing.

``FaultProxy`` listens on 127.0.0.1, opens one upstream connection to the
broker per client connection and forwards whole frames: request frames from
the client to the broker, response frames back. Between the two it injects
faults chosen by seeded randomness, one decision per frame:

* **drop a response** of the affected APIs (default: Produce only). The
  broker has already applied the request; the client never hears about it
  and must retry, so the broker has to recognise the retry. ``drop_mode``
  says what happens to the connection afterwards:

  - ``"gap"``: only that response frame is missing; later responses keep
    flowing (the client notices by correlation id or by its request timeout);
  - ``"close"``: the response is dropped and the connection closed right
    away, so every in-flight request of the client fails at once (what a
    real network failure after the broker applied the request looks like);
  - ``"stall"``: the response and every later one on the connection are
    swallowed, as on a half-open connection, until the client gives up.

* **close** the client connection and its upstream at a random frame, in
  either direction (a close at a response means the request was applied).
* **delay** a frame by a uniform random time in ``delay_ms`` (both
  directions, order preserved: a connection's frames are forwarded one after
  the other).
* **duplicate a request** of the affected APIs: the same frame is written
  upstream twice and the second response is swallowed.

**Late requests** (Jepsen's Bufstream scenario: a request of transaction *N*
stuck in the network reaches the broker after the client gave up on it and
began transaction *N+1*). Three ways to make one:

* ``late_rate``: each request of the ``late_api_keys`` APIs is, with that
  probability, taken out of its connection (later frames keep flowing, the
  client never gets an answer and times out) and delivered ``late_ms`` later;
* a request delayed past the moment its client closed the connection (the
  client timed out and moved on to a new connection) is still delivered, as
  TCP would deliver bytes already sent;
* ``hold(api_key, count)`` holds the next ``count`` requests of that API: they
  are neither forwarded nor answered (the client times out), until
  ``release_held()`` delivers them.

Either way the late request goes to the broker on a fresh upstream connection
and the broker's answer is decoded and kept as a :class:`LateAnswer` (API,
version, every ``error_code`` in the answer), so a test can prove that the
late request was refused (``late_answers()``).

``blackhole=True`` makes every connection fail: new client connections are
closed as soon as they are accepted and current ones are closed. Use it while
the broker is down, or to cut clients off. A broker restarted on the same
port is picked up automatically because each client connection gets a fresh
upstream connection; if the upstream connect fails, the client connection is
closed.

The proxy runs its own event loop in a daemon thread::

    with FaultProxy(("127.0.0.1", broker_port), seed=1, drop_response_rate=0.05) as proxy:
        client(bootstrap=proxy.bootstrap)
        proxy.set_faults(close_rate=0.01)   # change rates at run time
        proxy.pause()                       # forward untouched
        proxy.resume()                      # back to the configured faults
        print(proxy.stats)

Responses are matched to requests by correlation id (a Kafka broker answers
in request order on a connection, so this equals matching by order; Produce
with ``acks=0`` gets no response and is recognised). Each connection draws
from two ``random.Random`` (one per direction) derived from ``seed`` and the
connection's sequence number, and every frame consumes the same number of
draws whatever the rates, so the n-th request (or response) of the k-th
connection always meets the same fate for a given seed and rates.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import random
import socket
import struct
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from oncelog.protocol.codec import api_name, decode_response, is_flexible
from oncelog.protocol.errors import code_name
from oncelog.protocol.headers import (
    API_VERSIONS_KEY,
    HeaderError,
    parse_request_header_prefix,
    read_uvarint,
    skip_tagged_fields,
)

__all__ = ["FaultProxy", "Faults", "LateAnswer", "ProxyStats", "PRODUCE", "answer_error_codes"]

PRODUCE = 0
_LEN = struct.Struct(">i")
_I16 = struct.Struct(">h")
_PRODUCE_FLEXIBLE_FROM = 9  # Produce v9+ uses request header v2 and compact strings

DropMode = Literal["gap", "close", "stall"]


@dataclass(frozen=True)
class Faults:
    """Fault rates; every rate is a probability per frame in ``[0, 1]``."""

    drop_response_rate: float = 0.0
    close_rate: float = 0.0
    duplicate_rate: float = 0.0
    delay_ms: tuple[float, float] = (0.0, 0.0)
    delay_rate: float = 1.0
    api_keys: frozenset[int] = frozenset({PRODUCE})
    drop_mode: DropMode = "gap"
    blackhole: bool = False
    late_rate: float = 0.0
    late_ms: tuple[float, float] = (0.0, 0.0)
    late_api_keys: frozenset[int] = frozenset({PRODUCE})

    def __post_init__(self) -> None:
        for name in ("drop_response_rate", "close_rate", "duplicate_rate", "delay_rate", "late_rate"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name}={value} is not a probability")
        for name in ("delay_ms", "late_ms"):
            lo, hi = getattr(self, name)
            if lo < 0 or hi < lo:
                raise ValueError(f"{name}={(lo, hi)} must be (lo, hi) with 0 <= lo <= hi")
        if self.drop_mode not in ("gap", "close", "stall"):
            raise ValueError(f"drop_mode={self.drop_mode!r}")
        object.__setattr__(self, "api_keys", frozenset(self.api_keys))
        object.__setattr__(self, "late_api_keys", frozenset(self.late_api_keys))

    @property
    def delays(self) -> bool:
        return self.delay_ms[1] > 0 and self.delay_rate > 0


_NO_FAULTS = Faults()


@dataclass
class ProxyStats:
    """Counters; ``FaultProxy.stats`` returns a copy."""

    connections: int = 0  # client connections accepted and connected upstream
    upstream_connect_failures: int = 0
    blackholed: int = 0  # client connections refused or cut by blackhole mode
    requests: int = 0  # request frames read from clients
    responses: int = 0  # response frames read from upstream
    forwarded_requests: int = 0
    forwarded_responses: int = 0
    dropped_responses: int = 0  # chosen drops (gap/close/stall trigger)
    stalled_responses: int = 0  # later responses swallowed by drop_mode="stall"
    duplicated_requests: int = 0
    swallowed_duplicate_responses: int = 0
    closes: int = 0  # connections closed by the close fault or drop_mode="close"
    delays: int = 0
    delayed_ms: float = 0.0
    held_requests: int = 0  # requests held by hold() (delivered by release_held())
    late_scheduled: int = 0  # requests taken out of their connection by late_rate
    late_requests: int = 0  # late requests delivered (held, late_rate, or delayed past the client's close)
    dropped_by_api: dict[int, int] = field(default_factory=dict)

    @property
    def faults(self) -> int:
        """Total faults injected (delays excluded)."""
        return self.dropped_responses + self.duplicated_requests + self.closes

    def copy(self) -> "ProxyStats":
        for _ in range(100):  # the proxy thread may grow dropped_by_api meanwhile
            try:
                return dataclasses.replace(self, dropped_by_api=dict(self.dropped_by_api))
            except RuntimeError:
                continue
        return dataclasses.replace(self, dropped_by_api={})


@dataclass(frozen=True)
class LateAnswer:
    """The broker's answer to a request delivered late (see the module docs)."""

    api_key: int
    api_version: int
    correlation_id: int
    reason: str  # "held" (hold/release_held), "late" (late_rate) or "client_left" (delayed past the client's close)
    answered: bool  # False: no response expected (acks=0), or the connection failed
    error_codes: tuple[int, ...] = ()  # every error code in the answer (error_code, *_error_code), in order
    error: str = ""  # why there is no decoded answer

    @property
    def api(self) -> str:
        return api_name(self.api_key)

    @property
    def error_names(self) -> tuple[str, ...]:
        return tuple(code_name(c) for c in self.error_codes)

    @property
    def refused(self) -> bool:
        """The broker answered with at least one error code."""
        return any(self.error_codes)


def _error_codes(value: Any) -> Iterator[int]:
    if isinstance(value, tuple):
        for item in value:
            yield from _error_codes(item)
    elif dataclasses.is_dataclass(value):
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            if f.name == "error_code" or f.name.endswith("_error_code"):  # e.g. partition_error_code
                yield int(item)
            elif isinstance(item, tuple) or dataclasses.is_dataclass(item):
                yield from _error_codes(item)


def answer_error_codes(api_key: int, api_version: int, frame_body: bytes) -> tuple[int, ...]:
    """Every ``error_code`` of a response frame body (correlation id first), depth first."""
    pos = 4
    if is_flexible(api_key, api_version) and api_key != API_VERSIONS_KEY:
        pos = skip_tagged_fields(frame_body, pos)
    return tuple(_error_codes(decode_response(api_key, api_version, frame_body, pos)))


@dataclass(frozen=True)
class _Late:
    frame: bytes  # length prefix included
    api_key: int
    api_version: int
    correlation_id: int
    expects_response: bool


@dataclass
class _Pending:
    api_key: int
    copies: int  # 2 when the request was duplicated upstream
    drop: bool
    seen: int = 0


class _Closed(Exception):
    """The connection was closed by a fault."""


def expects_response(api_key: int, api_version: int, body: bytes, pos: int) -> bool:
    """False only for Produce with ``acks=0``; ``pos`` is the end of the header prefix."""
    if api_key != PRODUCE:
        return True
    try:
        if api_version >= _PRODUCE_FLEXIBLE_FROM:
            pos = skip_tagged_fields(body, pos)
            n, pos = read_uvarint(body, pos)  # compact nullable transactional_id: length + 1
            pos += max(n - 1, 0)
        elif api_version >= 3:
            (n,) = _I16.unpack_from(body, pos)
            pos += 2 + max(n, 0)
        (acks,) = _I16.unpack_from(body, pos)
    except (HeaderError, struct.error, IndexError):
        return True
    return acks != 0


class _Conn:
    """One proxied client connection and its upstream connection."""

    def __init__(self, proxy: "FaultProxy", number: int, client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                 upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
        self.proxy = proxy
        # one generator per direction: the two pumps interleave unpredictably
        base = proxy.seed * 1_000_003 + number * 2
        self.req_rng = random.Random(base)
        self.resp_rng = random.Random(base + 1)
        self.late_rng = random.Random(f"late-{base}")  # its own stream: other faults keep their fates
        self.creader, self.cwriter = client
        self.ureader, self.uwriter = upstream
        self.pending: dict[int, _Pending] = {}
        self.stalled = False
        self.closed = False

    def abort(self) -> None:
        if self.closed:
            return
        self.closed = True
        for w in (self.cwriter, self.uwriter):
            w.transport.abort()

    async def _delay(self, faults: Faults, r: float, d: float) -> None:
        if faults.delays and r < faults.delay_rate:
            ms = faults.delay_ms[0] + d * (faults.delay_ms[1] - faults.delay_ms[0])
            st = self.proxy._stats
            st.delays += 1
            st.delayed_ms += ms
            await asyncio.sleep(ms / 1000)

    def _client_left(self) -> bool:
        """The client closed its side (EOF or reset) and nothing it sent is left unread."""
        return self.creader.at_eof() or self.creader.exception() is not None

    @staticmethod
    def _late(frame: bytes, header: Any, body: bytes, pos: int) -> _Late:
        return _Late(frame, header.api_key, header.api_version, header.correlation_id,
                     expects_response(header.api_key, header.api_version, body, pos))

    def _fault_close(self) -> None:
        self.proxy._stats.closes += 1
        self.abort()
        raise _Closed

    async def pump_requests(self) -> None:
        st = self.proxy._stats
        while True:
            body = await _read_frame(self.creader)
            st.requests += 1
            # fixed number of draws per frame: close, delay, delay amount, drop, duplicate
            r_close, r_delay, d, r_drop, r_dup = (self.req_rng.random() for _ in range(5))
            faults = self.proxy._active
            try:
                header, pos = parse_request_header_prefix(body)
            except HeaderError:
                header = None
            r_late, d_late = self.late_rng.random(), self.late_rng.random()
            frame = _LEN.pack(len(body)) + body
            if header is not None and self.proxy._take_hold(header.api_key):
                st.held_requests += 1
                self.proxy._held.append(self._late(frame, header, body, pos))
                continue
            if header is not None and header.api_key in faults.late_api_keys and r_late < faults.late_rate:
                st.late_scheduled += 1
                lo, hi = faults.late_ms
                self.proxy._spawn_late(self._late(frame, header, body, pos), "late", (lo + d_late * (hi - lo)) / 1000)
                continue
            if r_close < faults.close_rate:
                self._fault_close()
            await self._delay(faults, r_delay, d)
            if header is not None and self._client_left():
                # the client gave up while the request was delayed: it still reaches the broker
                self.proxy._spawn_late(self._late(frame, header, body, pos), "client_left")
                continue
            copies = 1
            if header is not None and expects_response(header.api_key, header.api_version, body, pos):
                affected = header.api_key in faults.api_keys
                drop = affected and r_drop < faults.drop_response_rate
                if affected and r_dup < faults.duplicate_rate:
                    copies = 2
                self.pending[header.correlation_id] = _Pending(header.api_key, copies, drop)
            self.uwriter.write(frame * copies)
            if copies == 2:
                st.duplicated_requests += 1
            st.forwarded_requests += 1
            await self.uwriter.drain()

    async def pump_responses(self) -> None:
        st = self.proxy._stats
        while True:
            body = await _read_frame(self.ureader)
            st.responses += 1
            r_close, r_delay, d = (self.resp_rng.random() for _ in range(3))
            faults = self.proxy._active
            entry = None
            if len(body) >= 4:
                (corr,) = _LEN.unpack_from(body, 0)
                entry = self.pending.get(corr)
                if entry is not None:
                    entry.seen += 1
                    if entry.seen >= entry.copies:
                        del self.pending[corr]
            if entry is not None and entry.seen >= 2:
                st.swallowed_duplicate_responses += 1
                continue
            if entry is not None and entry.drop and entry.seen == 1:
                st.dropped_responses += 1
                st.dropped_by_api[entry.api_key] = st.dropped_by_api.get(entry.api_key, 0) + 1
                if faults.drop_mode == "close":
                    self._fault_close()
                if faults.drop_mode == "stall":
                    self.stalled = True
                continue
            if self.stalled:
                st.stalled_responses += 1
                continue
            if r_close < faults.close_rate:
                self._fault_close()
            await self._delay(faults, r_delay, d)
            self.cwriter.write(_LEN.pack(len(body)) + body)
            st.forwarded_responses += 1
            await self.cwriter.drain()


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (size,) = _LEN.unpack(await reader.readexactly(4))
    if size < 0:
        raise ConnectionError(f"negative frame size {size}")
    return await reader.readexactly(size)


class FaultProxy:
    """Kafka-framed loopback proxy with seeded fault injection (see module docs).

    ``upstream`` is the broker's ``(host, port)``. ``port=0`` picks a free
    port; it is known once the constructor returns (the listening socket is
    bound then), so a broker can be started afterwards with
    ``advertised.listeners=PLAINTEXT://127.0.0.1:<proxy.port>``. Every other
    keyword is a :class:`Faults` field.
    """

    def __init__(self, upstream: tuple[str, int], *, seed: int = 0, host: str = "127.0.0.1", port: int = 0,
                 connect_timeout: float = 5.0, **faults: Any) -> None:
        self.upstream = upstream
        self.seed = seed
        self.host = host
        self.connect_timeout = connect_timeout
        self._faults = Faults(**faults)
        self._paused = False
        self._stats = ProxyStats()
        self._conns: set[_Conn] = set()
        self._next_conn = 0
        self._hold: dict[int, int] = {}  # api key -> requests still to hold
        self._hold_lock = threading.Lock()
        self._held: list[_Late] = []
        self._late_answers: list[LateAnswer] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.base_events.Server | None = None
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.port: int = self._sock.getsockname()[1]

    # -- public API ---------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def faults(self) -> Faults:
        return self._faults

    @property
    def stats(self) -> ProxyStats:
        """A snapshot of the counters."""
        return self._stats.copy()

    @property
    def _active(self) -> Faults:
        if self._paused:
            return dataclasses.replace(_NO_FAULTS, blackhole=self._faults.blackhole)
        return self._faults

    def set_faults(self, **changes: Any) -> Faults:
        """Change some :class:`Faults` fields at run time; returns the new faults."""
        self._faults = dataclasses.replace(self._faults, **changes)
        if self._faults.blackhole:
            self._call_soon(self._abort_all, True)
        return self._faults

    def pause(self) -> None:
        """Forward everything untouched (blackhole still applies) until :meth:`resume`."""
        self._paused = True

    def resume(self) -> None:
        self._paused = False

    def hold(self, api_key: int, count: int = 1) -> None:
        """Hold the next ``count`` requests of ``api_key`` until :meth:`release_held`.

        A held request is neither forwarded nor answered, so its client times
        out and moves on while the request stays "in the network".
        """
        with self._hold_lock:
            self._hold[api_key] = self._hold.get(api_key, 0) + count

    def held(self) -> int:
        """How many requests are held now."""
        return len(self._held)

    def release_held(self, timeout: float = 30.0) -> list[LateAnswer]:
        """Deliver every held request now (each on a fresh upstream connection); the broker's answers."""
        with self._hold_lock:
            self._hold.clear()
        loop = self._loop
        if loop is None or not loop.is_running():
            raise RuntimeError("the proxy is not running")
        return asyncio.run_coroutine_threadsafe(self._release_held(), loop).result(timeout)

    def late_answers(self) -> list[LateAnswer]:
        """The answers to every late request delivered so far (held or delayed past the client's close)."""
        return list(self._late_answers)

    def close_connections(self) -> None:
        """Close every current client connection (and its upstream)."""
        self._call_soon(self._abort_all, False)

    def _call_soon(self, fn: Any, *args: Any) -> None:
        loop = self._loop
        if loop is not None and loop.is_running():
            loop.call_soon_threadsafe(fn, *args)

    def start(self, timeout: float = 10.0) -> "FaultProxy":
        ready = threading.Event()
        error: list[BaseException] = []

        def main() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                self._server = loop.run_until_complete(
                    asyncio.start_server(self._on_client, sock=self._sock, backlog=256))
            except BaseException as exc:  # pragma: no cover - reported to start()
                error.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(self._shutdown())
                loop.close()

        self._thread = threading.Thread(target=main, name=f"fault-proxy-{self.port}", daemon=True)
        self._thread.start()
        if not ready.wait(timeout):
            raise TimeoutError("fault proxy did not start")
        if error:
            raise error[0]
        return self

    def stop(self, timeout: float = 10.0) -> None:
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None and thread.is_alive():
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout)
        self._thread = None
        self._sock.close()

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- event loop side ------------------------------------------------------

    def _take_hold(self, api_key: int) -> bool:
        if not self._hold:
            return False
        with self._hold_lock:
            left = self._hold.get(api_key, 0)
            if left <= 0:
                return False
            self._hold[api_key] = left - 1
            return True

    async def _release_held(self) -> list[LateAnswer]:
        held, self._held = self._held, []
        return list(await asyncio.gather(*(self._deliver_late(h, "held") for h in held)))

    def _spawn_late(self, late: _Late, reason: str, after: float = 0.0) -> None:
        async def deliver() -> None:
            await asyncio.sleep(after)
            await self._deliver_late(late, reason)

        asyncio.ensure_future(deliver())

    async def _deliver_late(self, late: _Late, reason: str) -> LateAnswer:
        """Send ``late`` to the broker on a new connection and decode its answer."""
        self._stats.late_requests += 1
        answer = functools.partial(LateAnswer, late.api_key, late.api_version, late.correlation_id, reason)
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(*self.upstream), self.connect_timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            result = answer(False, error=f"upstream connect failed: {exc!r}")
        else:
            try:
                writer.write(late.frame)
                await writer.drain()
                if not late.expects_response:
                    result = answer(False, error="no response expected (acks=0)")
                else:
                    body = await asyncio.wait_for(_read_frame(reader), 60)
                    try:
                        result = answer(True, answer_error_codes(late.api_key, late.api_version, body))
                    except Exception as exc:  # noqa: BLE001 - an answer we cannot decode is still an answer
                        result = answer(True, error=f"undecodable answer: {exc}")
            except (OSError, EOFError, asyncio.IncompleteReadError, asyncio.TimeoutError) as exc:
                result = answer(False, error=f"no answer: {exc!r}")
            finally:
                writer.transport.abort()
        self._late_answers.append(result)
        return result

    def _abort_all(self, blackhole: bool = False) -> None:
        for conn in list(self._conns):
            if blackhole and not conn.closed:
                self._stats.blackholed += 1
            conn.abort()

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        self._abort_all()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _on_client(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        try:
            await self._serve_client(creader, cwriter)
        except asyncio.CancelledError:  # proxy shutting down
            cwriter.transport.abort()

    async def _serve_client(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        st = self._stats
        if self._faults.blackhole:
            st.blackholed += 1
            cwriter.transport.abort()
            return
        try:
            upstream = await asyncio.wait_for(asyncio.open_connection(*self.upstream), self.connect_timeout)
        except (OSError, asyncio.TimeoutError):
            st.upstream_connect_failures += 1
            cwriter.transport.abort()
            return
        if self._faults.blackhole:  # turned on while connecting
            st.blackholed += 1
            cwriter.transport.abort()
            upstream[1].transport.abort()
            return
        st.connections += 1
        number = self._next_conn
        self._next_conn += 1
        conn = _Conn(self, number, (creader, cwriter), upstream)
        self._conns.add(conn)
        pumps = [asyncio.ensure_future(conn.pump_requests()), asyncio.ensure_future(conn.pump_responses())]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            conn.abort()
            for p in pumps:
                p.cancel()
            await _quiet(pumps)
            self._conns.discard(conn)


async def _quiet(tasks: Iterable[asyncio.Future[Any]]) -> None:
    """Wait for tasks, ignoring their (connection) errors."""
    await asyncio.gather(*tasks, return_exceptions=True)
