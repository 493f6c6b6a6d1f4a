"""A small blocking Kafka protocol connection (the read_committed reader behind verify, and tests).

It sends kio request entities and decodes responses; it knows nothing of
the broker's internals, so it works against Apache Kafka too.

``security=`` (a :class:`~oncelog.client.security.Security`, e.g.
``parse_config(conf, "consumer").security``) makes it speak TLS and/or SASL as
the asyncio connection does: the TLS handshake (host name checked unless
``ssl.endpoint.identification.algorithm=none``), then ApiVersions, then
SaslHandshake v1 and SaslAuthenticate (PLAIN, SCRAM-SHA-256/512, OAUTHBEARER; ``oauth_cb`` must be a
plain callable here, run in a worker thread bounded by ``request.timeout.ms`` and refreshed in the
background, :meth:`oncelog.client.oauthbearer.TokenSource.token`). A failed
handshake raises :class:`~oncelog.client.errors.SslAuthenticationError`, a
refused login the SASL error of Kafka's code (``SaslAuthenticationFailedError``,
``UnsupportedSaslMechanismError``): KafkaErrors, not OSErrors, so a caller that
tries the next bootstrap server on an OSError does not hide them. When the
broker gives a SASL session lifetime (KIP-368), the first request after 85-95%
of it logs in again first (requests here are one at a time, so nothing is in
flight then), as :mod:`oncelog.client.aio.connection` does.
"""

from __future__ import annotations

import socket
import ssl
import struct
import time
from typing import Any

from oncelog.protocol.build import materialize
from oncelog.protocol.codec import decode_response, encode_request, is_flexible, request_type
from oncelog.protocol.headers import API_VERSIONS_KEY, skip_tagged_fields
from oncelog.protocol.sasl import SaslError, ScramClient, plain_message

_LEN = struct.Struct(">i")
SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36


class Connection:
    def __init__(self, bootstrap: str, client_id: str = "oncelog-cli", timeout: float = 30.0,
                 security: Any = None) -> None:
        host, _, port = bootstrap.rpartition(":")
        host = host.strip("[]") or "127.0.0.1"
        sock = socket.create_connection((host, int(port)), timeout=timeout)
        ctx = security.ssl_context if security is not None else None
        if ctx is not None:
            try:
                sock = ctx.wrap_socket(sock, server_hostname=host)
            except ssl.SSLError as exc:
                sock.close()
                if isinstance(exc, (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLSyscallError)):
                    raise  # the broker closed mid-handshake (restarting): an OSError, not an authentication failure
                from oncelog.client.errors import SslAuthenticationError

                reason = getattr(exc, "verify_message", None) or exc.reason or str(exc)
                raise SslAuthenticationError(f"TLS handshake with {host}:{port} failed: {reason}") from None
            except OSError:
                sock.close()
                raise
        self.sock = sock
        self.client_id = client_id
        self.correlation_id = 0
        self.versions: dict[int, tuple[int, int]] = {}
        self._where = f"{host}:{port}"
        self._security = security
        self._reauth_at: float | None = None  # time.monotonic() from which a request re-authenticates first
        # the OAUTHBEARER token source this connection uses: released by close(), so that the source's
        # refresh timer stops with its last connection
        self._oauth: Any = None
        if security is not None and security.sasl:
            if security.sasl_mechanism == "OAUTHBEARER" and security.oauth is not None:
                self._oauth = security.oauth
                self._oauth.acquire()
            try:
                self._authenticate(self._where, security.sasl_mechanism, security.sasl_username,
                                   security.sasl_password)
            except BaseException:
                self.close()
                raise

    def _authenticate(self, where: str, mechanism: str, username: str, password: str,
                      reauthentication: bool = False) -> None:
        """ApiVersions, SaslHandshake v1, then SaslAuthenticate round trips (KIP-152)."""
        from oncelog.client.errors import SaslAuthenticationFailedError, error_for
        from oncelog.client.security import reauthentication_delay
        from oncelog.protocol.build import to_ms

        self._reauth_at = None
        resp = self.request(SASL_HANDSHAKE, self.best_version(SASL_HANDSHAKE, (1, 1)), {"mechanism": mechanism})
        if int(resp.error_code):
            enabled = ", ".join(resp.mechanisms) or "none"
            raise error_for(int(resp.error_code), f"broker {where} does not enable SASL mechanism {mechanism} "
                                                  f"(enabled: {enabled})" if int(resp.error_code) == 33 else
                            f"broker {where} refused the SASL handshake for {mechanism}")
        # the broker refuses a re-authentication begun within a second of the previous one (Kafka's
        # KafkaChannel): after a re-authentication the next one is never sooner than a second after this
        # SaslHandshake was answered (a session shortened by a nearly expired OAUTHBEARER token), as the
        # asyncio connection does
        not_before = time.monotonic() + 1.0 if reauthentication else 0.0
        version = self.best_version(SASL_AUTHENTICATE, (0, 2))
        lifetime_ms = 0

        def step(token: bytes) -> bytes:
            nonlocal lifetime_ms
            r = self.request(SASL_AUTHENTICATE, version, {"auth_bytes": token})
            if int(r.error_code):
                raise error_for(int(r.error_code), f"{where}: {r.error_message or 'authentication failed'}")
            lifetime_ms = to_ms(getattr(r, "session_lifetime", 0))  # v1+
            return bytes(r.auth_bytes)

        if mechanism == "PLAIN":
            step(plain_message(username, password))
        elif mechanism == "OAUTHBEARER":
            from oncelog.client.oauthbearer import TokenError
            from oncelog.protocol.oauthbearer import OAuthBearerClient

            try:
                token = self._security.oauth.token()
            except TokenError as exc:
                raise SaslAuthenticationFailedError(f"{where}: cannot get an OAUTHBEARER token: {exc}") from None
            client = OAuthBearerClient(token.value, token.extensions)
            try:
                reply = client.answer(step(client.first()))
                if reply is not None:
                    step(reply)
            except SaslAuthenticationFailedError as exc:
                raise SaslAuthenticationFailedError(f"{exc.message} (the broker refused the OAUTHBEARER token)") \
                    from None
            if reply is not None:
                raise SaslAuthenticationFailedError(f"{where}: the broker refused the OAUTHBEARER token: "
                                                    f"{client.server_error}")
        else:
            scram = ScramClient(mechanism, username, password)
            try:
                server_first = step(scram.first())
                scram.verify(step(scram.final(server_first)))
            except SaslError as exc:
                raise SaslAuthenticationFailedError(f"{where}: {exc}") from None
        if lifetime_ms > 0:
            self._reauth_at = max(time.monotonic() + reauthentication_delay(lifetime_ms), not_before)

    def close(self) -> None:
        self.sock.close()
        oauth, self._oauth = self._oauth, None
        if oauth is not None:
            oauth.release()

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send_raw(self, payload: bytes) -> bytes:
        """Send one already-framed-less request body; return the raw response body."""
        self.sock.sendall(_LEN.pack(len(payload)) + payload)
        return self.recv_frame()

    def recv_frame(self) -> bytes:
        size = _LEN.unpack(self._recv_exact(4))[0]
        return self._recv_exact(size)

    def _recv_exact(self, n: int) -> bytes:
        chunks = []
        while n:
            chunk = self.sock.recv(min(n, 1 << 20))
            if not chunk:
                raise ConnectionError("connection closed by broker")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def request(self, api_key: int, version: int, body: dict[str, Any] | Any) -> Any:
        """Send a request given as a dict (or kio entity); return the decoded response."""
        if self._reauth_at is not None and time.monotonic() >= self._reauth_at:
            sec = self._security
            try:
                self._authenticate(self._where, sec.sasl_mechanism, sec.sasl_username, sec.sasl_password,
                                   reauthentication=True)
            except BaseException:
                self.sock.close()  # refused (the typed error, as at login) or broken: unusable
                raise
        entity = materialize(request_type(api_key, version), body) if isinstance(body, dict) else body
        flexible = is_flexible(api_key, version)
        self.correlation_id += 1
        client = self.client_id.encode()
        header = struct.pack(">hhih", api_key, version, self.correlation_id, len(client)) + client
        if flexible:
            header += b"\x00"
        raw = self.send_raw(header + encode_request(entity))
        (corr,) = _LEN.unpack_from(raw, 0)
        if corr != self.correlation_id:
            raise ConnectionError(f"correlation id {corr} != {self.correlation_id}")
        pos = 4
        if flexible and api_key != API_VERSIONS_KEY:
            pos = skip_tagged_fields(raw, pos)
        return decode_response(api_key, version, raw, pos)

    def negotiate(self) -> dict[int, tuple[int, int]]:
        resp = self.request(API_VERSIONS_KEY, 3, {"client_software_name": "oncelog", "client_software_version": "0.1"})
        self.versions = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
        return self.versions

    def best_version(self, api_key: int, ours: tuple[int, int]) -> int:
        if not self.versions:
            self.negotiate()
        lo, hi = self.versions.get(api_key, (-1, -1))
        best = min(hi, ours[1])
        if best < max(lo, ours[0]):
            raise ConnectionError(f"no common version for API {api_key}")
        return best
