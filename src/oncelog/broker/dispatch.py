"""From one request frame to one response frame (no socket IO).

:func:`handle_frame` parses the header, checks the API key and version
against the handler table, decodes the body, calls the handler and encodes
the response with the right header version. Protocol violations that Kafka
answers by closing the connection raise :class:`CloseConnection`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from oncelog.broker.context import CloseConnection, RequestContext
from oncelog.broker.handlers import HANDLERS, api_versions, sasl_authenticate, sasl_handshake
from oncelog.protocol.build import error_body, materialize
from oncelog.protocol.codec import DecodeError, decode_request, encode_response, is_flexible, response_type
from oncelog.protocol.headers import (
    API_VERSIONS_KEY,
    HeaderError,
    parse_request_header_prefix,
    response_header,
    skip_tagged_fields,
)

log = logging.getLogger("oncelog.requests")

METADATA_KEY = 3
ILLEGAL_SASL_STATE = 34

__all__ = ["CloseConnection", "handle_frame"]


async def handle_frame(
    broker: Any, frame: bytes, peer: str = "?", applied: Callable[[], None] | None = None, auth: Any = None
) -> list[bytes] | None:
    """Handle one request body; return the response parts, or None for no response.

    ``applied`` is called once the request's effects are applied (by the
    handler, through ``ctx.applied()``, before it waits for durability or a
    long poll); the caller treats the return as applied too. ``auth`` is the
    connection's :class:`~oncelog.broker.security.SaslSession` on a SASL
    listener: until it is complete only ApiVersions, SaslHandshake and
    SaslAuthenticate are served (Kafka's SaslServerAuthenticator): anything
    else before the handshake closes the connection without an answer; after a
    SaslHandshake v1 it is answered with ILLEGAL_SASL_STATE (its own response
    type, :func:`_illegal_sasl_state`), then the connection closes; after a
    SaslHandshake v0 the frames are bare SASL tokens, answered bare. A
    SaslHandshake the server armed for re-authentication (KIP-368) resets
    ``auth`` to the handshake state here, once every request before it has
    been dispatched."""
    if auth is not None and auth.reauth_armed and auth.complete and frame[:2] == b"\x00\x11":
        auth.begin_reauthentication()
    if auth is not None and not auth.complete and auth.raw_tokens:
        return sasl_authenticate.raw_token(auth, frame)
    try:
        header, pos = parse_request_header_prefix(frame)
    except HeaderError as exc:
        raise CloseConnection(f"malformed request header: {exc}") from None
    if auth is not None and not auth.complete:
        allowed = (API_VERSIONS_KEY, sasl_handshake.API_KEY) if auth.state == auth.HANDSHAKE \
            else (sasl_authenticate.API_KEY,)
        if header.api_key not in allowed:
            known = HANDLERS.get(header.api_key)
            unexpected = (f"unexpected request {known.name if known else header.api_key} during SASL "
                          f"{'handshake' if auth.state == auth.HANDSHAKE else 'authentication'}")
            if auth.state != auth.AUTHENTICATE or known is None:
                raise CloseConnection(unexpected)  # refused before it is parsed: no answer
            # Kafka parses it and answers ILLEGAL_SASL_STATE in its own response, then closes
            auth.state = auth.FAILED
            auth.close_after_response = True
        elif header.api_key == API_VERSIONS_KEY and auth.api_versions_done:
            raise CloseConnection("a second ApiVersions request before SASL authentication (Kafka allows one)")
    handler = HANDLERS.get(header.api_key)
    if handler is None:
        raise CloseConnection(f"unknown API key {header.api_key}")
    version = header.api_version
    if not handler.min_version <= version <= handler.max_version:
        if header.api_key == API_VERSIONS_KEY:
            # KIP-511: answer in v0 format with UNSUPPORTED_VERSION and our ranges
            return [response_header(header.correlation_id, False), api_versions.unsupported_v0()]
        raise CloseConnection(
            f"unsupported version {version} of {handler.name} "
            f"(supported {handler.min_version}-{handler.max_version})"
        )
    flexible = is_flexible(header.api_key, version)
    unknown_tags: dict[int, Any] | None = {} if flexible else None
    try:
        if flexible:
            pos = skip_tagged_fields(frame, pos)
        request = decode_request(header.api_key, version, frame, pos, unknown_tags)
    except (HeaderError, DecodeError) as exc:
        raise CloseConnection(f"cannot decode {handler.name} v{version}: {exc}") from None
    if auth is not None and auth.state == auth.FAILED:
        result = _illegal_sasl_state(header.api_key, version, request)
        if result is None:
            raise CloseConnection(f"unexpected request {handler.name} during SASL authentication")
        log.warning("%s sent %s during SASL authentication: answered ILLEGAL_SASL_STATE, closing",
                    peer, handler.name)
        return [response_header(header.correlation_id, flexible and header.api_key != API_VERSIONS_KEY),
                encode_response(materialize(response_type(header.api_key, version), result))]
    ctx = RequestContext(broker, header, peer, applied, unknown_tags or None, auth)
    result = await handler.handle(ctx, request)
    if auth is not None and header.api_key == API_VERSIONS_KEY and not auth.complete:
        auth.api_versions_done = True  # answered: the next request must be SaslHandshake
    if result is None:
        return None
    if isinstance(result, dict):
        result = materialize(response_type(header.api_key, version), result)
    body = result if isinstance(result, (bytes, bytearray, memoryview)) else encode_response(result)
    # ApiVersions responses always carry header v0 (KIP-511)
    resp_flexible = flexible and header.api_key != API_VERSIONS_KEY
    return [response_header(header.correlation_id, resp_flexible), body]



def _illegal_sasl_state(api_key: int, version: int, request: Any) -> dict[str, Any] | None:
    """The answer to a request other than SaslAuthenticate after a SaslHandshake v1, as
    Kafka's SaslServerAuthenticator builds it (the request's error response with
    ILLEGAL_SASL_STATE): the top-level error where the response has one; Metadata's
    has none, so every requested topic carries it. None for the other responses
    without a top-level error (the connection is then closed without an answer)."""
    message = f"Unexpected Kafka request of type {HANDLERS[api_key].name} during SASL authentication."
    if api_key == METADATA_KEY:
        topics = getattr(request, "topics", None) or ()
        return {"throttle_time": 0, "brokers": [], "cluster_id": None, "controller_id": -1,
                "topics": [{"error_code": ILLEGAL_SASL_STATE, "name": t.name or "",
                            "topic_id": getattr(t, "topic_id", None), "is_internal": False, "partitions": []}
                           for t in topics]}
    return error_body(response_type(api_key, version), ILLEGAL_SASL_STATE, message)
