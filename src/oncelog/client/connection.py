"""A small blocking Kafka protocol connection (the read_committed reader behind verify, and tests).

It sends kio request entities and decodes responses; it knows nothing of
the broker's internals, so it works against Apache Kafka too.
"""

from __future__ import annotations

import socket
import struct
from typing import Any

from oncelog.protocol.build import materialize
from oncelog.protocol.codec import decode_response, encode_request, is_flexible, request_type
from oncelog.protocol.headers import API_VERSIONS_KEY, skip_tagged_fields

_LEN = struct.Struct(">i")


class Connection:
    def __init__(self, bootstrap: str, client_id: str = "oncelog-cli", timeout: float = 30.0) -> None:
        host, _, port = bootstrap.rpartition(":")
        self.sock = socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout)
        self.client_id = client_id
        self.correlation_id = 0
        self.versions: dict[int, tuple[int, int]] = {}

    def close(self) -> None:
        self.sock.close()

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
