"""One asyncio connection to one broker: pipelined requests, correlation ids, timeouts.

Internal API (used by :mod:`oncelog.client.aio.cluster` and the clients):

* ``conn = BrokerConnection(host, port, node_id=..., client_id=..., request_timeout_ms=...,
  connect_timeout_ms=...)``; ``await conn.connect()`` opens the socket and
  negotiates versions with ApiVersions (v3, falling back to v0 when the
  broker answers UNSUPPORTED_VERSION, as KIP-511 specifies).
* ``security=`` (a :class:`~oncelog.client.security.Security`, from the
  client's config): TLS through asyncio's ``ssl`` support, the host name
  checked against the broker's certificate (the bootstrap host, then the
  host each broker advertises in Metadata) unless
  ``ssl.endpoint.identification.algorithm=none``; then, after ApiVersions,
  SASL: SaslHandshake v1 and SaslAuthenticate (PLAIN, SCRAM-SHA-256/512, OAUTHBEARER with the
  client's current token, :mod:`oncelog.client.oauthbearer`).
  A failed TLS handshake raises
  :class:`~oncelog.client.errors.SslAuthenticationError`, a refused login
  :class:`~oncelog.client.errors.SaslAuthenticationFailedError` (or
  ``UnsupportedSaslMechanismError``), neither retriable. When SaslAuthenticate
  (v1+) gives a ``session_lifetime_ms`` (the broker's
  ``connections.max.reauth.ms``, KIP-368), the first request sent after a
  random point between 85% and 95% of that lifetime (as the Java client)
  starts a re-authentication (SaslHandshake and SaslAuthenticate again,
  without a new ApiVersions): the requests already in flight are answered as
  usual, those sent meanwhile are held and written after it in their order,
  and a refused re-authentication closes the connection with the same typed
  error as a refused login, which every in-flight and held request fails with.
* ``conn.features``: the finalized features from ApiVersions v3+ (name ->
  max version level), e.g. ``transaction.version`` (KIP-890).
* ``conn.conditional_produce``: whether ApiVersions v3+ advertised the supported
  feature ``oncelog.conditional.produce`` (docs/conditional-publish.md).
* ``conn.version(api_key, (lo, hi))``: the version to use, min(ours, theirs);
  raises :class:`~oncelog.client.errors.UnsupportedApiError` when the ranges
  do not meet.
* ``await conn.request(api_key, version, body)``: ``body`` is a dict with
  Kafka's field names (built into the kio entity of that version), a kio
  entity, or already-encoded body bytes (or a list of byte parts, written
  without joining the large ones); returns the decoded response entity.
* ``conn.send(api_key, version, body, expect_response=True)``: the same
  without awaiting; the request is written *now* (during a re-authentication,
  right after it), so requests issued one after another go out, and are
  answered, in that order (the idempotent
  producer relies on it). Returns a future of the decoded response (``None``
  for ``expect_response=False``, i.e. Produce with acks=0, resolved once the request has been
  handed to the socket, as the Java client completes an acks=0 send: so ``flush()`` returns only
  after the records went out). ``close()`` without an error sends the requests already written
  before it closes the socket; ``close(error)`` aborts. An acks=0 request not handed to the socket
  within request.timeout.ms, and a graceful close's sending, are bounded by it: the connection is
  then aborted and the unsent requests fail (:meth:`BrokerConnection._unsent_timed_out`).

Answers are received straight into buffers (``asyncio.BufferedProtocol`` and
:class:`~oncelog.protocol.framing.FrameReader`, plain TCP and TLS alike): a
large one into a ``bytearray`` of its size, decoded from there (no pieces
joined); ``send(..., raw_buffer=True)`` hands that buffer out as it is (the
consumer's Fetch), any other caller gets ``bytes``.

Any number of requests may be in flight; responses are matched to them by
correlation id (Kafka answers in order, so a response for anything but the
oldest in-flight request is a protocol error that closes the connection).
A request not answered within ``request.timeout.ms`` fails with
:class:`~oncelog.client.errors.RequestTimeoutError` and, as in the Java
client, closes the connection: every other in-flight request fails with
:class:`~oncelog.client.errors.KafkaConnectionError` (both retriable). The
connection does not reconnect itself; the cluster opens a new one.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import struct
from collections import OrderedDict, deque
from typing import Any

from oncelog.client.errors import (
    KafkaConnectionError,
    KafkaError,
    RequestTimeoutError,
    SaslAuthenticationFailedError,
    SslAuthenticationError,
    UnsupportedApiError,
    error_for,
)
from oncelog.client.security import reauthentication_delay
from oncelog.protocol.build import materialize, to_ms
from oncelog.protocol.codec import decode_response, encode_request, is_flexible, request_type
from oncelog.protocol.conditional import feature_supported
from oncelog.protocol.framing import FrameError, FrameReader
from oncelog.protocol.headers import API_VERSIONS_KEY, skip_tagged_fields
from oncelog.protocol.oauthbearer import OAuthBearerClient
from oncelog.protocol.sasl import SaslError, ScramClient, plain_message

__all__ = ["BrokerConnection"]

_LEN = struct.Struct(">i")
_HDR = struct.Struct(">ihhih")  # size, api key, version, correlation id, client id length
UNSUPPORTED_VERSION = 35
SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36


def _is_alert(exc: ssl.SSLError) -> bool:
    """A fatal TLS alert from the peer (OpenSSL names them SSLV3_ALERT_*, TLSV1_ALERT_*, TLSV13_ALERT_*)."""
    return "_ALERT_" in str(getattr(exc, "reason", None) or "")


def _tls_failure(exc: ssl.SSLError, where: str) -> KafkaError:
    """The client error for a failed TLS handshake, as the Java client's SslTransportLayer sorts them: the
    peer closing the connection mid-handshake (a broker restarting) is a retriable connection error;
    a certificate that does not verify, a fatal alert from the broker (our certificate refused) or a
    peer that does not speak TLS is SslAuthenticationError, which is not retried."""
    if isinstance(exc, (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLSyscallError)):
        return KafkaConnectionError(f"connection to {where} closed during the TLS handshake "
                                    f"({getattr(exc, 'reason', None) or exc})")
    reason = getattr(exc, "verify_message", None) or getattr(exc, "reason", None) or str(exc)
    return SslAuthenticationError(f"TLS handshake with {where} failed: {reason}")


_BIG_PART = 65536
_CHUNK = 262144


def _write_parts(write: Any, small: list[Any], parts: list[Any]) -> None:
    """Write ``small`` then ``parts`` in order, copying large parts once at most.

    ``writelines`` (Python 3.11) joins everything into one ``bytes`` (a copy), and a partial ``send``
    then slices the rest (a second copy) before the transport buffers it (a third). Here runs of small
    parts are joined, and each part of ``_BIG_PART`` bytes or more (a large batch's records) is written
    as ``memoryview`` chunks of up to ``_CHUNK`` bytes: sent from where they are; the connection's
    :meth:`BrokerConnection._write` keeps chunks the transport has no room for (see there)."""
    for part in parts:
        n = len(part)
        if n >= _BIG_PART:
            if small:
                write(b"".join(small))
                small = []
            view = memoryview(part)
            for i in range(0, n, _CHUNK):
                write(view[i:i + _CHUNK])
        else:
            small.append(part)
    if small:
        write(b"".join(small))


class _Sent:
    """A mark in the write backlog: ``future`` (of a request that gets no response) resolves once
    everything before the mark has been handed to the socket. ``timer``: request.timeout.ms from the
    write (as Java's InFlightRequests times out an acks=0 request not yet sent), which aborts the
    connection."""

    __slots__ = ("future", "timer")

    def __init__(self, future: asyncio.Future[Any], timer: asyncio.TimerHandle | None = None) -> None:
        self.future = future
        self.timer = timer


class _Pending:
    __slots__ = ("api_key", "version", "future", "timer", "raw", "buffer")

    def __init__(self, api_key: int, version: int, future: asyncio.Future[Any], raw: bool, buffer: bool) -> None:
        self.api_key = api_key
        self.version = version
        self.future = future
        self.timer: asyncio.TimerHandle | None = None
        self.raw = raw
        self.buffer = buffer


class BrokerConnection(asyncio.BufferedProtocol):
    """See the module docstring."""

    def __init__(self, host: str, port: int, *, node_id: int = -1, client_id: str = "oncelog-python",
                 request_timeout_ms: int = 30000, connect_timeout_ms: int = 10000, security: Any = None) -> None:
        self.security = security
        self.host = host
        self.port = port
        self.node_id = node_id
        self._client_id = client_id.encode()
        self.request_timeout = request_timeout_ms / 1000
        self.connect_timeout = connect_timeout_ms / 1000
        self.versions: dict[int, tuple[int, int]] = {}
        self.conditional_produce = False
        self.features: dict[str, int] = {}  # finalized feature -> max version level (ApiVersions v3+)
        self._transport: asyncio.Transport | None = None
        # answers are received straight into buffers (a large one into its own, of its size: no
        # pieces joined, no fresh read buffer per socket read), plain TCP and TLS alike
        self._reader = FrameReader(max_frame_bytes=1 << 30)
        self._inflight: OrderedDict[int, _Pending] = OrderedDict()
        self._corr = 0
        self._closed = False
        self._close_error: KafkaError | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drained: asyncio.Event | None = None
        # writes the transport has no room for yet, uncopied, in order (see _put)
        self._backlog: deque[Any] = deque()
        self._paused = False
        self._draining = False  # closed gracefully, the backlog still being sent (see close())
        self._drain_timer: asyncio.TimerHandle | None = None  # bounds that drain (request.timeout.ms)
        self.closed_future: asyncio.Future[None] | None = None
        # KIP-368: the loop time from which the next request re-authenticates first, and the requests sent
        # during a re-authentication (written after it)
        self._reauth_at: float | None = None
        self._held: list[tuple[Any, ...]] | None = None
        self._reauth_task: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"<BrokerConnection node {self.node_id} {self.host}:{self.port}{' closed' if self._closed else ''}>"

    # -- lifecycle ----------------------------------------------------------------

    async def connect(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.closed_future = self._loop.create_future()
        sec = self.security
        ctx = sec.ssl_context if sec is not None else None
        tls = {} if ctx is None else {"ssl": ctx, "server_hostname": self.host,
                                      "ssl_handshake_timeout": self.connect_timeout}
        try:
            await asyncio.wait_for(self._loop.create_connection(lambda: self, self.host, self.port, **tls),
                                   self.connect_timeout)
        except ssl.SSLError as exc:  # before OSError: SSLError is one
            self._closed = True
            raise _tls_failure(exc, f"{self.host}:{self.port}") from None
        except (OSError, asyncio.TimeoutError) as exc:
            self._closed = True
            reason = (os.strerror(exc.errno) if isinstance(exc, OSError) and exc.errno else str(exc)) or \
                ("closed by the peer" if isinstance(exc, ConnectionError) else "timed out")
            raise KafkaConnectionError(f"cannot connect to {self.host}:{self.port}: {reason}") from None
        await self._negotiate()
        if sec is not None and sec.sasl:
            await self._authenticate(sec.sasl_mechanism, sec.sasl_username, sec.sasl_password)

    async def _authenticate(self, mechanism: str, username: str, password: str,
                            reauthentication: bool = False) -> None:
        """SaslHandshake v1, then SaslAuthenticate round trips (KIP-152); written at once, even during a
        re-authentication; then the session lifetime (KIP-368) decides when the next one is due."""
        where = f"{self.host}:{self.port}"
        resp = await self._write(SASL_HANDSHAKE, self.version(SASL_HANDSHAKE, (1, 1)), {"mechanism": mechanism})
        if int(resp.error_code):
            enabled = ", ".join(resp.mechanisms) or "none"
            raise error_for(int(resp.error_code), f"broker {where} does not enable SASL mechanism {mechanism} "
                            f"(enabled: {enabled})" if int(resp.error_code) == 33 else
                            f"broker {where} refused the SASL handshake for {mechanism}")
        # the broker refuses a re-authentication begun within a second of the previous one (Kafka's KafkaChannel):
        # after a re-authentication, the next one is never sooner than a second after this SaslHandshake was
        # answered (a session shortened by a nearly expired OAUTHBEARER token)
        not_before = (self._loop or asyncio.get_running_loop()).time() + 1.0 if reauthentication else 0.0
        version = self.version(SASL_AUTHENTICATE, (0, 2))
        lifetime_ms = 0

        async def step(token: bytes) -> bytes:
            nonlocal lifetime_ms
            r = await self._write(SASL_AUTHENTICATE, version, {"auth_bytes": token})
            if int(r.error_code):
                raise error_for(int(r.error_code), f"{where}: {r.error_message or 'authentication failed'}")
            lifetime_ms = to_ms(getattr(r, "session_lifetime", 0))  # v1+ (Kafka's session_lifetime_ms)
            return bytes(r.auth_bytes)

        if mechanism == "PLAIN":
            await step(plain_message(username, password))
        elif mechanism == "OAUTHBEARER":
            await self._oauthbearer(step, where)
        else:
            scram = ScramClient(mechanism, username, password)
            try:
                server_first = await step(scram.first())
                server_final = await step(scram.final(server_first))
                scram.verify(server_final)
            except SaslError as exc:
                raise SaslAuthenticationFailedError(f"{where}: {exc}") from None
        loop = self._loop or asyncio.get_running_loop()
        self._reauth_at = max(loop.time() + reauthentication_delay(lifetime_ms), not_before) if lifetime_ms > 0 \
            else None

    async def _oauthbearer(self, step: Any, where: str) -> None:
        """RFC 7628: the initial response with the client's current token (a fresh one once 80% of its
        lifetime has passed); a refused token is answered with the JSON error, to which we send \\x01 and
        the broker then fails the exchange (SASL_AUTHENTICATION_FAILED, its message that JSON)."""
        from oncelog.client.oauthbearer import TokenError

        try:
            token = await self.security.oauth.atoken()
        except TokenError as exc:
            raise SaslAuthenticationFailedError(f"{where}: cannot get an OAUTHBEARER token: {exc}") from None
        client = OAuthBearerClient(token.value, token.extensions)
        try:
            reply = client.answer(await step(client.first()))
            if reply is not None:
                await step(reply)
        except SaslAuthenticationFailedError as exc:
            raise SaslAuthenticationFailedError(f"{exc.message} (the broker refused the OAUTHBEARER token)") from None
        if reply is not None:  # the broker accepted the \x01: not a Kafka broker's behaviour
            raise SaslAuthenticationFailedError(f"{where}: the broker refused the OAUTHBEARER token: "
                                                f"{client.server_error}")

    async def _reauthenticate(self) -> None:
        """KIP-368: log in again on this connection, then write the requests held meanwhile, in order; a
        failure closes the connection with its error (the held requests fail with it too)."""
        sec = self.security
        error: KafkaError | None = None
        ok = False
        try:
            await self._authenticate(sec.sasl_mechanism, sec.sasl_username, sec.sasl_password, reauthentication=True)
            ok = True
        except KafkaError as exc:
            error = exc
        except Exception as exc:  # noqa: BLE001 - anything else leaves the connection unusable too
            error = KafkaConnectionError(f"re-authentication with {self.host}:{self.port} failed: {exc}")
        finally:
            held, self._held = self._held or [], None
            if not ok or self._closed:
                error = error or self._close_error or KafkaConnectionError(
                    f"connection to {self.host}:{self.port} closed during re-authentication")
                self.close(error)
                for item in held:
                    if not item[0].done():
                        item[0].set_exception(type(error)(error.message))
            else:
                for fut, args, kwargs in held:
                    if not fut.done():
                        self._write(*args, fut=fut, **kwargs)

    async def _negotiate(self) -> None:
        body = {"client_software_name": "oncelog-python", "client_software_version": "0.1"}
        resp = await self.request(API_VERSIONS_KEY, 3, body)
        if int(resp.error_code) == UNSUPPORTED_VERSION:
            resp = await self.request(API_VERSIONS_KEY, 0, {})
        if int(resp.error_code):
            raise KafkaConnectionError(f"ApiVersions failed with error {int(resp.error_code)}")
        self.versions = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in resp.api_keys}
        self.features = {str(f.name): int(f.max_version_level) for f in getattr(resp, "finalized_features", ())}
        self.conditional_produce = feature_supported(getattr(resp, "supported_features", None))

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def in_flight(self) -> int:
        """Requests not yet answered, those held during a re-authentication included."""
        return len(self._inflight) + (len(self._held) if self._held else 0)

    def close(self, error: KafkaError | None = None) -> None:
        """Close now; every in-flight request fails with ``error`` (default: connection closed).

        Without ``error`` (a graceful close) the requests already written but still waiting in
        ``_backlog`` are sent first (as ``transport.close()`` sends what the transport buffers): the
        socket is closed once they are out (see :meth:`resume_writing`). With an error the connection
        is aborted and they are dropped (an ``expect_response=False`` request among them fails)."""
        if self._closed:
            return
        self._closed = True
        self._close_error = error or KafkaConnectionError(f"connection to {self.host}:{self.port} closed")
        transport = self._transport
        if transport is not None:
            if error is not None:
                transport.abort()
                self._drop_backlog()
            elif self._backlog:
                # resume_writing() sends the rest (resolving the acks=0 marks as it reaches them), then
                # closes the transport; with only marks left, the transport still sends the tail it
                # buffered (close() flushes it) and resume_writing() resolves them then. Bounded by
                # request.timeout.ms, as a request waiting for its answer is
                self._draining = True
                loop = self._loop or asyncio.get_running_loop()
                self._drain_timer = loop.call_later(self.request_timeout, self._unsent_timed_out)
                if all(type(item) is _Sent for item in self._backlog):
                    transport.close()
            else:
                transport.close()
        else:
            self._drop_backlog()
        self._reader.release()
        self._fail_all(self._close_error)
        if self.closed_future is not None and not self.closed_future.done():
            self.closed_future.set_result(None)

    def _drop_backlog(self) -> None:
        """Forget the unsent writes; an ``expect_response=False`` request among them fails (it never went out)."""
        backlog, self._backlog = self._backlog, deque()
        self._draining = False
        if self._drain_timer is not None:
            self._drain_timer.cancel()
            self._drain_timer = None
        error = self._close_error or KafkaConnectionError(f"connection to {self.host}:{self.port} closed")
        for item in backlog:
            if type(item) is _Sent:
                if item.timer is not None:
                    item.timer.cancel()
                if not item.future.done():
                    item.future.set_exception(type(error)(error.message))

    def _unsent_timed_out(self, mark: _Sent | None = None) -> None:
        """An acks=0 request (``mark``) or a graceful close's drain not sent within request.timeout.ms
        (the peer does not read): abort the connection, drop the backlog, fail the unsent requests."""
        if mark is not None and mark.future.done():
            return
        error = KafkaConnectionError(f"connection to {self.host}:{self.port} closed after a request timeout "
                                     f"({self.request_timeout:g}s without sending)")
        if not self._closed:
            self.close(error)
            return
        self._close_error = error  # a graceful close still draining: aborted now
        if self._transport is not None:
            self._transport.abort()
        self._drop_backlog()

    def _fail_all(self, error: KafkaError) -> None:
        pending = list(self._inflight.values())
        self._inflight.clear()
        for p in pending:
            if p.timer is not None:
                p.timer.cancel()
            if not p.future.done():
                p.future.set_exception(type(error)(error.message))

    # -- versions -------------------------------------------------------------------

    def version(self, api_key: int, ours: tuple[int, int]) -> int:
        theirs = self.versions.get(api_key)
        if theirs is None:
            raise UnsupportedApiError(f"broker {self.host}:{self.port} does not support API {api_key}")
        best = min(ours[1], theirs[1])
        if best < max(ours[0], theirs[0]):
            raise UnsupportedApiError(f"API {api_key}: broker speaks v{theirs[0]}-{theirs[1]}, "
                                      f"client v{ours[0]}-{ours[1]}")
        return best

    # -- requests ---------------------------------------------------------------------

    def send(self, api_key: int, version: int, body: Any, *, expect_response: bool = True,
             timeout: float | None = None, raw_response: bool = False, raw_buffer: bool = False
             ) -> asyncio.Future[Any]:
        """Write one request now; see the module docstring. ``raw_response``: the future's result
        is ``(frame, position after the response header)``, the frame as ``bytes``; ``raw_buffer``:
        the same, but a large frame is the ``bytearray`` it was received into (no copy)."""
        if self._held is not None or (self._reauth_at is not None and not self._closed
                                      and (self._loop or asyncio.get_running_loop()).time() >= self._reauth_at):
            # KIP-368: (re-)authenticate first; this request goes out right after, in order
            loop = self._loop or asyncio.get_running_loop()
            fut: asyncio.Future[Any] = loop.create_future()
            if self._held is None:
                self._held = []
                self._reauth_at = None
                self._reauth_task = loop.create_task(self._reauthenticate())
            if type(body) is list or isinstance(body, (bytearray, memoryview)):
                # written later: a copy, as the caller may reuse its buffers once send() returns
                body = [bytes(part) for part in body] if type(body) is list else bytes(body)
            self._held.append((fut, (api_key, version, body),
                               {"expect_response": expect_response, "timeout": timeout, "raw_response": raw_response,
                                "raw_buffer": raw_buffer}))
            return fut
        return self._write(api_key, version, body, expect_response=expect_response, timeout=timeout,
                           raw_response=raw_response, raw_buffer=raw_buffer)

    def _write(self, api_key: int, version: int, body: Any, *, expect_response: bool = True,
               timeout: float | None = None, raw_response: bool = False, raw_buffer: bool = False,
               fut: asyncio.Future[Any] | None = None) -> asyncio.Future[Any]:
        loop = self._loop or asyncio.get_running_loop()
        if fut is None:
            fut = loop.create_future()
        if self._closed or self._transport is None:
            fut.set_exception(KafkaConnectionError(f"connection to {self.host}:{self.port} is closed"))
            return fut
        if isinstance(body, dict):
            body = materialize(request_type(api_key, version), body)
        parts = body if type(body) is list else None
        payload = body if parts is not None or isinstance(body, (bytes, bytearray, memoryview)) \
            else encode_request(body)
        self._corr = corr = (self._corr + 1) & 0x7FFFFFFF
        flexible = api_key != API_VERSIONS_KEY and is_flexible(api_key, version) or \
            (api_key == API_VERSIONS_KEY and version >= 3)
        cid = self._client_id
        size = sum(map(len, parts)) if parts is not None else len(payload)
        head = _HDR.pack(10 + len(cid) + (1 if flexible else 0) + size, api_key, version, corr, len(cid))
        if parts is not None:
            _write_parts(self._put, [head, cid, b"\x00" if flexible else b""], parts)
        else:
            self._put(b"".join((head, cid, b"\x00" if flexible else b"", payload)))
        if not expect_response:
            if self._paused or self._backlog:
                # as the Java client, a request without a response is complete once it is written to the
                # socket: when resume_writing() reaches this mark (the transport has sent what was before it)
                mark = _Sent(fut)
                mark.timer = loop.call_later(self.request_timeout, self._unsent_timed_out, mark)
                self._backlog.append(mark)
            else:
                fut.set_result(None)
            return fut
        p = _Pending(api_key, version, fut, raw_response or raw_buffer, raw_buffer)
        p.timer = loop.call_later(self.request_timeout if timeout is None else timeout, self._timed_out, corr)
        self._inflight[corr] = p
        return fut

    async def request(self, api_key: int, version: int, body: Any, *, timeout: float | None = None) -> Any:
        return await self.send(api_key, version, body, timeout=timeout)

    def _timed_out(self, corr: int) -> None:
        p = self._inflight.pop(corr, None)
        if p is None:
            return
        if not p.future.done():
            p.future.set_exception(RequestTimeoutError(
                f"no response from {self.host}:{self.port} to API {p.api_key} within {self.request_timeout:g}s"))
        self.close(KafkaConnectionError(f"connection to {self.host}:{self.port} closed after a request timeout"))

    # -- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        if transport.get_extra_info("sslcontext") is None:
            # a plain socket's transport pauses us as soon as it buffers anything and resumes us once it
            # has sent it all: meanwhile writes wait in _backlog as they are, so the transport copies at
            # most the unsent rest of one chunk (with 1 MB batches it copied most of every 8 MB request
            # into its buffer). TLS keeps asyncio's limits (its writes are encrypted copies anyway).
            transport.set_write_buffer_limits(high=0, low=0)  # type: ignore[attr-defined]

    def _put(self, data: Any) -> None:
        """Hand ``data`` to the transport, or keep it (in order, uncopied) while the transport is paused."""
        if self._paused or self._backlog:
            self._backlog.append(data)
        else:
            self._transport.write(data)  # type: ignore[union-attr]

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        backlog = self._backlog
        if self._closed and not self._draining:  # aborted meanwhile: nothing more goes out
            self._drop_backlog()
            return
        write = self._transport.write  # type: ignore[union-attr]
        while backlog and not self._paused:  # write() pauses us again when the socket takes only part
            item = backlog.popleft()
            if type(item) is _Sent:  # everything written before it has been sent
                if item.timer is not None:
                    item.timer.cancel()
                if not item.future.done():
                    item.future.set_result(None)
            else:
                write(item)
        if self._draining and not self._paused and not backlog:  # a graceful close: all sent, now close
            # on the next loop pass: this runs inside the transport's _write_ready, which goes on to
            # tear the transport down itself if it is closing (a close() here made asyncio run
            # connection_lost twice and log an "Exception in callback" traceback)
            (self._loop or asyncio.get_running_loop()).call_soon(self._close_drained)

    def _close_drained(self) -> None:
        transport = self._transport
        if self._draining and not self._backlog and transport is not None:
            self._draining = False
            if self._drain_timer is not None:
                self._drain_timer.cancel()
                self._drain_timer = None
            if not transport.is_closing():
                transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._drop_backlog()  # a graceful close that was still sending them: the socket is gone
        self._reader.release()
        if isinstance(exc, ssl.SSLError) and not self.versions and _is_alert(exc):
            # TLS 1.3: the client's side of the handshake completes before the broker checks the client's
            # certificate; its refusal (an alert) arrives as the answer to the first request
            self.close(_tls_failure(exc, f"{self.host}:{self.port}"))
            return
        self.close(KafkaConnectionError(f"connection to {self.host}:{self.port} lost"
                                        f"{': ' + str(exc) if exc else ''}"))

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._reader.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        if self._closed:  # answers to requests that have failed (a graceful close still sending): ignored
            return
        try:
            frames = self._reader.updated(nbytes)
        except FrameError as exc:
            self.close(KafkaConnectionError(f"bad frame from {self.host}:{self.port}: {exc}"))
            return
        if frames:
            self._answers(frames)

    def _answers(self, frames: list[bytes | bytearray]) -> None:
        for frame in frames:
            if len(frame) < 4:
                self.close(KafkaConnectionError("response shorter than its header"))
                return
            (corr,) = _LEN.unpack_from(frame, 0)
            if not self._inflight:
                self.close(KafkaConnectionError(f"response with correlation id {corr} to no request"))
                return
            first = next(iter(self._inflight))
            if corr != first:
                self.close(KafkaConnectionError(f"response correlation id {corr}, expected {first}"))
                return
            p = self._inflight.pop(corr)
            if p.timer is not None:
                p.timer.cancel()
            if p.future.done():
                continue
            if type(frame) is not bytes and not p.buffer:
                frame = bytes(frame)  # a large answer's own buffer: kio and raw readers get bytes
            try:
                pos = 4
                if p.api_key != API_VERSIONS_KEY and is_flexible(p.api_key, p.version):
                    pos = skip_tagged_fields(frame, pos)
                result = (frame, pos) if p.raw else decode_response(p.api_key, p.version, frame, pos)
            except Exception as exc:  # a response we cannot parse: the connection is unusable
                p.future.set_exception(KafkaConnectionError(f"cannot decode response to API {p.api_key} "
                                                            f"v{p.version}: {exc}"))
                self.close()
                return
            p.future.set_result(result)
