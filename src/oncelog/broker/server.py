"""The asyncio server: the only module that touches sockets.

One :class:`KafkaConnection` per client socket. Frames are split sans-IO by
:class:`oncelog.protocol.framing.FrameDecoder`; each request becomes a task
started in arrival order, and responses are written strictly in request order.
A request starts only once the previous request of its connection has applied
its effects (see :class:`~oncelog.broker.context.RequestContext.applied`):
effects follow request order, as with Kafka's muted channel, while the waits
that come after the effects (fsync, long polls) overlap, so
pipelined produces still share group-commit rounds. A connection that sends a
malformed or oversize frame, or an unknown API, is closed alone and logged in
one line; every other connection keeps being served. A connection the client
closes keeps its requests already read running until each has applied its
effects, in order (only the answers are dropped, as Kafka does).

On an SSL or SASL_SSL listener the socket is wrapped in TLS by asyncio (the
connection is made once the handshake succeeded; a failed handshake, such
as a plaintext client on a TLS port, never reaches it). On a SASL listener
each connection carries a :class:`~oncelog.broker.security.SaslSession`:
until it is complete only ApiVersions, SaslHandshake and SaslAuthenticate are
served (see :func:`oncelog.broker.dispatch.handle_frame`), one request at a
time (reading paused while it is handled, the bytes after it not parsed), and
a refused login is answered and then the connection is closed. With
``connections.max.reauth.ms`` (KIP-368) each request is checked when it
arrives, as Kafka's SocketServer does: a SaslHandshake may start a
re-authentication, anything else on an expired session closes the
connection once the requests before it are answered. A connection idle for
``connections.max.idle.ms`` is closed, authenticated or not.

When the log directory fails (the first I/O error of a log's append or fsync,
:mod:`oncelog.storage.log_dir`) the broker stops, as Kafka's broker halts when
its last log directory goes offline: one CRITICAL line is logged, nothing more
is read or accepted, the requests already read get their answers (they fail at
once: every write and durability wait of the directory does) for up to a
second, the connections are closed, and the files are closed without writing
anything (no snapshot, no clean-shutdown marker: the next start recovers the
logs as after a crash). :func:`serve` then raises :class:`LogDirFailed`
(``oncelog serve`` exits 1).

Responses that become ready in the same event-loop pass (the produces
released by one group-commit round) are written with one ``writelines``,
so one send for all of them instead of one per response; still in order.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import time
from collections import deque
from typing import Any

from oncelog.broker.broker import Broker
from oncelog.broker.config import BrokerConfig, StartupError
from oncelog.broker.dispatch import CloseConnection, handle_frame
from oncelog.broker.log_cleaner import LogCleaner, cleaner_config
from oncelog.broker.security import SaslSession
from oncelog.broker.security import describe as describe_security
from oncelog.broker.security import security_warnings
from oncelog.protocol.framing import FrameDecoder, FrameError, frame
from oncelog.storage.log_dir import is_descriptor_shortage, log_level

log = logging.getLogger("oncelog.server")


class LogDirFailed(Exception):
    """The broker stopped because its log directory failed (already logged, one line)."""

MAX_IN_FLIGHT = 64  # per connection; beyond it we stop reading the socket
# how long a shutdown waits for the last group-commit rounds (GroupCommitter.drain_for): only a
# lasting want of file descriptors (EMFILE/ENFILE retries) makes it wait that long
SHUTDOWN_SYNC_TIMEOUT_S = 5.0


class KafkaConnection(asyncio.Protocol):
    def __init__(self, server: "BrokerServer") -> None:
        self.server = server
        self.broker = server.broker
        self.decoder = FrameDecoder(server.broker.config.socket_request_max_bytes)
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.pending: deque[asyncio.Task[list[bytes] | None]] = deque()
        # resolved once the newest request so far has applied its effects
        self.last_applied: asyncio.Future[None] | None = None
        self.closed = False
        self.reading_paused = False
        self.writable = asyncio.Event()
        self.writable.set()
        self._out: list[bytes | memoryview] = []  # finished responses not yet handed to the transport
        self._flush_scheduled = False
        sec = server.broker.config.security
        self.auth: SaslSession | None = SaslSession(sec.sasl) if sec is not None and sec.sasl is not None else None
        if self.auth is not None:  # an unauthenticated peer may not make the broker buffer more (Kafka's rule)
            self.decoder.max_frame_bytes = min(self.decoder.max_frame_bytes,
                                               server.broker.config.sasl_server_max_receive_size)
        # a refused SASL login: its answer is written, then the connection closed (as Kafka)
        self._closing_task: asyncio.Task[Any] | None = None
        self._close_after_flush = False
        # before SASL authentication one request at a time, reading paused while it is handled (Kafka's
        # SaslServerAuthenticator): the bytes after it stay unparsed, bounded by one read
        self._one_at_a_time = False
        self.last_active = time.monotonic()  # connections.max.idle.ms
        # a request on an expired SASL session: the connection closes once those before it are answered
        self._expired_task: asyncio.Task[Any] | None = None
        # each pending request's "effects applied" future (see connection_lost)
        self._applied: dict[asyncio.Task[Any], asyncio.Future[None]] = {}
        # requests that only wait for a rebalance (ctx.waiting()): cancelled at once when the peer closes
        self._waiting: set[asyncio.Task[Any]] = set()
        self._lost = False  # closed by the peer: the requests read before still apply their effects

    # -- asyncio.Protocol ---------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        if self.auth is not None:
            self.auth.peer = self.peer
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed and self.decoder.buffered:
            log.warning(
                "connection from %s closed by the client with %d bytes of an incomplete request buffered",
                self.peer,
                self.decoder.buffered,
            )
        # closed by the client (or the network), not by us: as Kafka keeps processing the requests it read
        # from a channel that then disconnected (only their responses are dropped), each request read goes
        # on until it has applied its effects (an acks=0 burst followed by a close is appended), in order;
        # what comes after that (a durability wait, a long poll) is cancelled, having no one to answer
        keep = not self.closed and (self.auth is None or self.auth.complete)
        self.closed = True
        self.server.connections.discard(self)
        for task in self.pending:
            applied = self._applied.get(task)
            waits = task in self._waiting  # a JoinGroup's rebalance: the requests behind it need not wait
            if keep and applied is not None and not applied.done() and not task.done() and not waits:
                applied.add_done_callback(lambda _f, t=task: t.cancel())
                self.server.orphans.add(task)
                task.add_done_callback(self.server.orphans.discard)
            else:
                task.cancel()
        self.pending.clear()
        self._applied.clear()
        self._waiting.clear()
        self._lost = keep

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def data_received(self, data: bytes) -> None:
        self.last_active = time.monotonic()
        if getattr(self.server, "failure", None) is not None:  # stopping (log directory failed): nothing more is read
            return
        if self._expired_task is not None:
            return
        auth = self.auth
        if auth is not None and not auth.complete:
            self.decoder.add(data)
            if not self.pending:
                self._next_unauthenticated()
            return
        try:
            frames = self.decoder.feed(data)
        except FrameError as exc:
            self.abort(f"bad frame: {exc}")
            return
        self._start(frames)

    def _next_unauthenticated(self) -> None:
        """Start the next buffered request of a connection not yet authenticated, if it is whole."""
        try:
            body = self.decoder.next_frame()
        except FrameError as exc:
            self.abort(f"bad frame before SASL authentication: {exc} "
                       f"(sasl.server.max.receive.size={self.decoder.max_frame_bytes})")
            return
        if self.transport is None:
            return
        if body is None:
            if self._one_at_a_time:
                self._one_at_a_time = False
                self.transport.resume_reading()
            return
        if not self._one_at_a_time:
            self._one_at_a_time = True
            self.transport.pause_reading()
        self._start([body])

    def _start(self, frames: list[bytes]) -> None:
        loop = asyncio.get_running_loop()
        auth = self.auth
        for body in frames:
            if auth is not None and auth.expires_at is not None and auth.complete and not auth.reauth_armed:
                now = time.monotonic()
                if not (body[:2] == b"\x00\x11" and auth.arm_reauthentication(now)) and auth.expired(now):
                    self._close_expired(loop)
                    return
            applied: asyncio.Future[None] = loop.create_future()
            task = loop.create_task(self._handle(body, self.last_applied, applied))
            self.last_applied = applied
            self.pending.append(task)
            self._applied[task] = applied
            task.add_done_callback(self._on_done)
        if len(self.pending) >= MAX_IN_FLIGHT and not self.reading_paused and self.transport:
            self.transport.pause_reading()
            self.reading_paused = True

    def _close_expired(self, loop: asyncio.AbstractEventLoop) -> None:
        """A request other than a re-authentication on an expired SASL session (Kafka's SocketServer closes
        the channel): nothing more is read, and the connection closes after the answers to the requests
        before it."""
        log.info("closing connection from %s: its SASL session expired (%s) and it did not re-authenticate",
                 self.peer, self.auth.ended_by if self.auth is not None else "connections.max.reauth.ms")
        if self.transport is not None:
            self.transport.pause_reading()

        async def after_earlier() -> None:
            return None

        task = self._expired_task = loop.create_task(after_earlier())
        self.pending.append(task)  # type: ignore[arg-type]
        task.add_done_callback(self._on_done)

    # -- request processing ---------------------------------------------------

    async def _handle(
        self, body: bytes, previous: asyncio.Future[None] | None, applied: asyncio.Future[None]
    ) -> list[bytes] | None:
        """Handle one request once ``previous`` (the request before it on this
        connection) has applied its effects; resolve ``applied`` when this one
        has (the handler says so through ``ctx.applied()``, or by returning)."""

        task = asyncio.current_task()

        def mark_applied(waiting: bool = False) -> None:
            if waiting and not self.closed:  # ctx.waiting(): holds the order while the connection is open
                self._waiting.add(task)  # type: ignore[arg-type]
                return
            if not applied.done():
                applied.set_result(None)

        try:
            if previous is not None and not previous.done():
                await asyncio.shield(previous)
            if (self.closed and not self._lost) or self._closing_task is not None:
                return None
            if self.auth is None:
                parts = await handle_frame(self.broker, body, self.peer, mark_applied)
            else:
                try:
                    parts = await handle_frame(self.broker, body, self.peer, mark_applied, auth=self.auth)
                except CloseConnection:
                    await self._delay_failed_authentication()
                    raise
                await self._delay_failed_authentication()
            if self.auth is not None:
                if self.auth.close_after_response:
                    self._closing_task = asyncio.current_task()
                elif self.auth.complete:
                    self.decoder.max_frame_bytes = self.broker.config.socket_request_max_bytes
            return parts
        except CloseConnection as exc:
            self.abort(str(exc))
            return None
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("request from %s failed; closing the connection", self.peer)
            self.abort("internal error")
            return None
        finally:
            mark_applied()

    async def _delay_failed_authentication(self) -> None:
        """A failed authentication (the auth state FAILED: a refused token, SaslHandshake v0's bare token
        included, an unsupported mechanism, a request other than SaslAuthenticate during authentication, a
        re-authentication that changed mechanism) is answered, or its connection closed without an answer,
        connection.failed.authentication.delay.ms later, as Kafka delays the close of every
        AuthenticationException; a malformed request is not delayed (Kafka neither). The connection reads
        nothing meanwhile and other connections are not affected."""
        auth = self.auth
        delay_ms = self.broker.config.connection_failed_authentication_delay_ms
        if auth is not None and auth.state == auth.FAILED and delay_ms > 0:
            await asyncio.sleep(delay_ms / 1000)

    def _on_done(self, task: asyncio.Task[Any]) -> None:
        """Write every finished response at the head of the queue, in order."""
        self._applied.pop(task, None)
        self._waiting.discard(task)
        self._collect_done()
        pending = self.pending
        if self.reading_paused and len(pending) < MAX_IN_FLIGHT // 2 and self.transport and not self.closed:
            self.transport.resume_reading()
            self.reading_paused = False
        if not pending and self.auth is not None and (self._one_at_a_time or not self.auth.complete) \
                and not self.closed and not self._close_after_flush and self._closing_task is None \
                and self._expired_task is None:
            # the requests after a login or after a re-authentication's SaslHandshake (KIP-368)
            if self.auth.complete:  # the requests that came after the login, under socket.request.max.bytes
                self._one_at_a_time = False
                if self.transport is not None:
                    self.transport.resume_reading()
                self.data_received(b"")
            else:
                self._next_unauthenticated()

    def _collect_done(self) -> None:
        """Queue the responses of the finished requests at the head of ``pending`` for the next flush."""
        pending = self.pending
        while pending and pending[0].done():
            task = pending.popleft()
            if self.closed or task.cancelled():
                continue
            parts = task.result()
            if task is self._closing_task or task is self._expired_task:
                self._close_after_flush = True
            if parts is not None and self.transport is not None:
                self._out += frame(parts)
            if (parts is not None or self._close_after_flush) and self.transport is not None:
                if not self._flush_scheduled:
                    # after the other tasks finished in this pass: one send for all their responses
                    self._flush_scheduled = True
                    asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        out, self._out = self._out, []
        if out and not self.closed and self.transport is not None:
            self.transport.writelines(out)
            self.last_active = time.monotonic()
        if self._close_after_flush and not self.closed and self.transport is not None:
            self.closed = True
            self.transport.close()  # after the buffered answer is written

    def abort(self, reason: str) -> None:
        if self.closed:
            return
        log.warning("closing connection from %s: %s", self.peer, reason)
        # the answers to earlier requests go out first, those finished in this event-loop pass included
        # (their done callbacks have not run yet)
        self._collect_done()
        self._flush()
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class BrokerServer:
    """Owns the listening socket and the background maintenance tasks."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.connections: set[KafkaConnection] = set()
        # requests of connections the client closed, still applying their effects (cancelled at stop)
        self.orphans: set[asyncio.Task[Any]] = set()
        self._server: asyncio.base_events.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.port: int = broker.config.port
        self.cleaner: LogCleaner | None = None
        self._cleaner_task: asyncio.Task[None] | None = None
        self._cleaner_restart: asyncio.Task[None] | None = None
        self.failure: str | None = None  # the log directory failed: why (the broker stops)
        self.stop_requested: asyncio.Event | None = None  # set to make serve() stop

    async def start(self, sock: socket.socket | None = None) -> None:
        """Serve on ``sock`` (bound by :func:`bind_listener` before the broker
        opened its data directory), or bind the configured address now."""
        cfg = self.broker.config
        loop = asyncio.get_running_loop()
        self.stop_requested = asyncio.Event()

        def offline(cause: str) -> None:  # on the thread that saw the error (a worker, for an fsync)
            try:
                loop.call_soon_threadsafe(self._log_dir_failed, cause)
            except RuntimeError:  # the loop is closed: the broker has stopped already
                pass

        self.broker.log_dir.add_listener(offline)
        if sock is None:
            sock = bind_listener(cfg.host, cfg.port)
        sec = cfg.security
        tls = {} if sec is None or sec.ssl_context is None else {"ssl": sec.ssl_context}
        self._server = await loop.create_server(lambda: KafkaConnection(self), sock=sock, backlog=1024, **tls)
        if sec is not None:
            log.info("listener %s", describe_security(sec))
            for warning in security_warnings(sec):
                log.warning("%s", warning)
        self.port = sock.getsockname()[1]
        if cfg.port == 0:
            cfg.port = self.port
        self._tasks.append(loop.create_task(self._every(cfg.log_retention_check_interval_ms, self.broker.retention_pass)))
        self._tasks.append(
            loop.create_task(self._every(cfg.producer_id_expiration_check_interval_ms, self.broker.expire_producers))
        )
        groups = self.broker.groups
        self._tasks.append(loop.create_task(self._every(cfg.group_coordinator_tick_ms, groups.tick)))
        self._tasks.append(loop.create_task(self._every(cfg.offsets_retention_check_interval_ms, groups.expire_offsets)))
        self._tasks.append(loop.create_task(self._every(1000, groups.store.maybe_snapshot)))
        self.cleaner = LogCleaner(self.broker, cleaner_config(cfg, self.broker.dynamic.overlay({})))
        self.broker.cleaner_threads = self.cleaner.config.threads
        self._cleaner_task = loop.create_task(self.cleaner.run())
        self.broker.config_listeners.append(self._cleaner_settings_changed)
        txn = self.broker.txn
        await txn.start()  # completes transactions left in PrepareCommit/PrepareAbort by a crash
        self._tasks.append(loop.create_task(self._every(self.broker.txn_tick_ms, txn.tick)))
        if not cfg.fsync_on_ack:
            self._tasks.append(loop.create_task(self.broker.committer.periodic_flush()))
        if cfg.connections_max_idle_ms >= 0:
            check_ms = max(10, min(cfg.connections_max_idle_ms // 4, 10000))
            self._tasks.append(loop.create_task(self._every(check_ms, self._expire_idle)))

    def _log_dir_failed(self, cause: str) -> None:
        """The log directory went offline: log it (the one line), stop accepting and reading, and
        have :func:`serve` halt the broker (:meth:`halt`)."""
        if self.failure is not None:
            return
        self.failure = (
            f"log directory {self.broker.config.data_dir} failed ({cause}); no online log directory is left, "
            f"so the broker stops (the next start recovers the logs)"
        )
        log.critical("%s", self.failure)
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            if conn.transport is not None and not conn.closed:
                conn.transport.pause_reading()
        if self.stop_requested is not None:
            self.stop_requested.set()

    async def halt(self) -> None:
        """Stop after the log directory failed (see the module docstring): the requests
        already read are answered for up to a second, then everything is closed without
        writing to the directory."""
        if self._server is not None:
            self._server.close()
        for task in self._tasks:
            task.cancel()
        if self.cleaner is not None:
            try:  # bounded: a step stuck in an fsync is left to its (daemon) thread
                await self.cleaner.stop(self._cleaner_task, timeout=1, quiet=True)
            except Exception:  # noqa: BLE001 - halting anyway; recovery rolls a half-done swap back or forward
                pass
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 1.0
        while loop.time() < deadline and any(c.pending for c in self.connections):
            await asyncio.sleep(0.01)
        for conn in list(self.connections):
            if conn.transport is not None:
                conn._collect_done()
                conn._flush()
                conn.closed = True
                conn.transport.close()
            for task in conn.pending:
                task.cancel()
        for task in list(self.orphans):
            task.cancel()
        self.broker.txn.close()
        await asyncio.sleep(0)  # the cancelled requests and marker tasks end
        self.broker.abandon()

    def _expire_idle(self) -> None:
        """Close the connections that read and wrote nothing for connections.max.idle.ms and wait for no
        answer (Kafka's Selector idle expiry), an unauthenticated one included."""
        limit = time.monotonic() - self.broker.config.connections_max_idle_ms / 1000
        for conn in list(self.connections):
            if conn.last_active < limit and not conn.pending and not conn.closed and conn.transport is not None:
                log.info("closing connection from %s: idle for connections.max.idle.ms=%d%s", conn.peer,
                         self.broker.config.connections_max_idle_ms,
                         "" if conn.auth is None or conn.auth.complete else " (not authenticated)")
                conn.closed = True
                conn.transport.close()

    def _cleaner_settings_changed(self) -> None:
        """Dynamic ``log.cleaner.*`` broker configs changed: restart the cleaners with the new
        settings, as Kafka's LogCleaner.reconfigure does (shut the cleaner threads down, start
        them again). A pass in progress stops after its current step (its cleaned files are
        removed, nothing is swapped in), and the new cleaners pick the filthiest log again."""
        if self.cleaner is None:
            return
        # what the next change is checked against: the count just asked for
        self.broker.cleaner_threads = cleaner_config(self.broker.config, self.broker.dynamic.overlay({})).threads
        self._cleaner_restart = asyncio.get_running_loop().create_task(self._restart_cleaner(self._cleaner_restart))

    async def _restart_cleaner(self, previous: asyncio.Task[None] | None) -> None:
        if previous is not None:  # one restart at a time, in the order the changes were made
            await asyncio.gather(previous, return_exceptions=True)
        # the settings stored now (a later change may have come while the previous restart ran)
        new = cleaner_config(self.broker.config, self.broker.dynamic.overlay({}))
        old, task = self.cleaner, self._cleaner_task
        if old is None or new == old.config:
            return
        await old.stop(task, keep_deleter=True)
        if task is not None:  # never two cleaners on one partition: the old one has ended
            await asyncio.gather(task, return_exceptions=True)
        if self._server is None or not self._server.is_serving():
            old.deleter.stop()
            return  # shutting down
        self.cleaner = LogCleaner(self.broker, new, old.deleter)
        self._cleaner_task = asyncio.get_running_loop().create_task(self.cleaner.run())
        log.info("log cleaner restarted with %d thread(s) (dynamic config)", new.threads)

    async def _every(self, interval_ms: int, job: Any) -> None:
        while True:
            await asyncio.sleep(max(interval_ms, 10) / 1000)
            try:
                result = job()
                if asyncio.iscoroutine(result):
                    await result
            except Exception as exc:
                if log_level(exc, logging.ERROR) == logging.DEBUG:  # the log directory is offline: the
                    log.debug("%s failed: %s", job.__name__, exc)  # broker stops and says why, once
                else:
                    log.exception("%s failed", job.__name__)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._cleaner_restart is not None:
            await asyncio.gather(self._cleaner_restart, return_exceptions=True)
        if self.cleaner is not None:
            await self.cleaner.stop(self._cleaner_task)
        for task in self._tasks:
            task.cancel()
        for conn in list(self.connections):
            if conn.transport is not None:
                conn._flush()
                conn.closed = True  # our close: its requests not yet handled are dropped
                conn.transport.close()
        for task in list(self.orphans):
            task.cancel()
        try:
            await asyncio.wait_for(self.broker.txn.drain(), 5)
        except asyncio.TimeoutError:
            log.warning("transaction markers still pending at shutdown; recovery completes them")
        # bounded: while no descriptor can be had the retries would go on for ever (SIGTERM hangs)
        await self.broker.committer.drain_for(SHUTDOWN_SYNC_TIMEOUT_S)
        if self._server is not None:
            await self._server.wait_closed()
        self.broker.close()


def _install_loop() -> None:
    try:
        import uvloop  # type: ignore[import-not-found]

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        pass


def bind_listener(host: str, port: int) -> socket.socket:
    """Bind and listen on ``host:port``; StartupError (one line) if that fails.

    The broker binds its port before it creates or locks its data directory, so
    a broker started on a taken port changes nothing on disk."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        raise StartupError(f"cannot listen on {host}:{port}: {getattr(exc, 'strerror', None) or exc}") from None
    family, kind, proto, _name, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
        sock.listen(1024)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise StartupError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


async def serve(config: BrokerConfig, ready: Any = None) -> None:
    """Run the broker until SIGTERM/SIGINT (or until ``ready``'s stop event).

    Startup order: bind the port, then lock and open the data directory (both
    raise StartupError), then serve."""
    started = time.monotonic()
    sock = bind_listener(config.host, config.port)
    try:
        broker = Broker(config)
    except OSError as exc:  # loading the logs (recovery) or meta/ failed: one line, exit 1
        sock.close()
        raise StartupError(start_failure(config, exc)) from None
    except BaseException:
        sock.close()
        raise
    server = BrokerServer(broker)
    await server.start(sock)
    stop = server.stop_requested
    assert stop is not None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread (uvloop: ValueError)
            pass
    log.info("started in %.0f ms", (time.monotonic() - started) * 1000)
    print(f"oncelog listening on {config.host}:{server.port}", flush=True)
    if ready is not None:
        ready(server, stop, loop)
    await stop.wait()
    if server.failure is not None:
        await server.halt()
        raise LogDirFailed(server.failure)
    log.info("shutting down")
    await server.stop()
    if broker.log_dir.offline:
        # the directory failed during the shutdown (the drain's fsyncs, or the logs' last ones at
        # close): the channel's listener may not have run yet; log the one line now (it runs once)
        server._log_dir_failed(broker.log_dir.cause or "")
        raise LogDirFailed(server.failure)


def start_failure(config: BrokerConfig, exc: OSError) -> str:
    """The one line for a start that failed on the data directory; for EMFILE/ENFILE it names
    the limit to raise (each partition's log needs descriptors; the catalog lists them all)."""
    detail = exc.strerror or str(exc)
    if exc.strerror and exc.filename is not None:  # a raw OSError (no guard named the step): which file
        detail += f": {exc.filename}"
    text = f"cannot load the data directory {config.data_dir}: {detail}"
    if is_descriptor_shortage(exc):
        soft = -1
        try:
            import resource

            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        except (ImportError, ValueError, OSError):  # pragma: no cover - not POSIX
            pass
        text += (
            f" (open files limit {soft}: raise the hard RLIMIT_NOFILE, e.g. ulimit -n or LimitNOFILE, above"
            " what the topics' partitions need; every start fails the same way until then)"
        )
    return text


def raise_open_files_limit() -> tuple[int, int]:
    """Each partition keeps a few files open (segment, indexes): lift the soft
    RLIMIT_NOFILE to the hard limit, as Kafka's docs tell operators to do."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or soft < hard:
            target = hard if hard != resource.RLIM_INFINITY else max(soft, 1_048_576)
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        return soft, hard
    except (ImportError, ValueError, OSError):  # pragma: no cover - not POSIX, or not allowed
        return -1, -1


def run(config: BrokerConfig) -> None:
    raise_open_files_limit()
    _install_loop()
    asyncio.run(serve(config))
