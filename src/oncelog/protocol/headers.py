"""Request header v0-v2 and response header v0/v1, hand-coded (hot path).

Request header: api_key i16, api_version i16, correlation_id i32, client_id
(nullable *non-compact* string, even in v2), then in v2 a tagged-field block.
Response header v1 is the correlation id plus an empty tagged-field block.
ApiVersions responses always use header v0 so a client can parse them before
it knows which versions we speak.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from oncelog.protocol.varint import varint_readers

_FIXED = struct.Struct(">hhih")
_CORR = struct.Struct(">i")

API_VERSIONS_KEY = 18


class HeaderError(Exception):
    """The request header cannot be parsed."""


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


def parse_request_header_prefix(buf: bytes) -> tuple[RequestHeader, int]:
    """Parse the v1 part common to every request; return header and end offset."""
    if len(buf) < _FIXED.size:
        raise HeaderError(f"request of {len(buf)} bytes is shorter than a header")
    api_key, api_version, correlation_id, client_len = _FIXED.unpack_from(buf, 0)
    pos = _FIXED.size
    client_id = None
    if client_len >= 0:
        if pos + client_len > len(buf):
            raise HeaderError("client_id runs past the end of the request")
        client_id = buf[pos : pos + client_len].decode("utf-8", "replace")
        pos += client_len
    elif client_len != -1:
        raise HeaderError(f"invalid client_id length {client_len}")
    return RequestHeader(api_key, api_version, correlation_id, client_id), pos


read_uvarint, skip_tagged_fields = varint_readers(HeaderError)
"""``read_uvarint(buf, pos)``: an unsigned varint (at most 5 bytes);
``skip_tagged_fields(buf, pos)``: past a tagged-field block (header v2 carries
only tags we ignore). Both raise :class:`HeaderError` (:mod:`.varint`)."""


def response_header(correlation_id: int, flexible: bool) -> bytes:
    """Response header v1 (flexible) or v0."""
    if flexible:
        return _CORR.pack(correlation_id) + b"\x00"
    return _CORR.pack(correlation_id)
