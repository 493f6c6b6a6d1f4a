"""SaslAuthenticate (key 36).

Behavior: carries one SASL token each way (KIP-152) after SaslHandshake v1.
PLAIN takes one round trip, SCRAM-SHA-256/512 two (client-first and
client-final; :mod:`oncelog.protocol.sasl`), OAUTHBEARER one, or two for a
refused token: the RFC 7628 JSON error answered with error code 0, then the
client's ``\x01`` refused with that JSON (:mod:`oncelog.protocol.oauthbearer`). A refused login gets
SASL_AUTHENTICATION_FAILED (58) with an error message (PLAIN's own; for SCRAM
Kafka's fixed text, which does not say whether the user exists), sent
``connection.failed.authentication.delay.ms`` (100) after the failing token, and the
connection is closed after that answer, as Kafka does; other connections are
not affected. ``session_lifetime_ms`` is the listener's
``connections.max.reauth.ms`` for the mechanism, 0 (no re-authentication) by
default, bounded by an OAUTHBEARER token's expiry (KIP-368; :class:`oncelog.broker.security.SaslSession`). A
re-authentication that changes the principal is refused the same way, with
Kafka's "Cannot change principals during re-authentication" message; one
that changed mechanism in its SaslHandshake is closed at its first token
without an answer, as Kafka does. After authentication, or on a listener
without SASL, the answer is ILLEGAL_SASL_STATE (34) (Kafka's KafkaApis).

Version notes:
- v0-v2 are handled; v1 adds ``session_lifetime_ms``, v2 is flexible.
"""

from __future__ import annotations

import logging
from typing import Any

from oncelog.broker.context import RequestContext
from oncelog.broker.security import failure_message
from oncelog.protocol.sasl import SaslError

API_KEY = 36
MIN_VERSION = 0
MAX_VERSION = 2
ILLEGAL_SASL_STATE = 34
SASL_AUTHENTICATION_FAILED = 58

log = logging.getLogger("oncelog.security")


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    auth = ctx.auth
    if auth is None or auth.complete:
        return {"error_code": ILLEGAL_SASL_STATE, "error_message": "SaslAuthenticate request received after "
                "successful authentication" if auth is not None else "SASL is not enabled on this listener",
                "auth_bytes": b"", "session_lifetime": 0}
    try:
        answer = auth.evaluate(bytes(request.auth_bytes))
    except SaslError as exc:
        # as Kafka, the failure is answered (and the connection then closed) connection.failed.authentication.delay.ms
        # later, which slows down guessing: the server's _delay_failed_authentication (auth.state is FAILED)
        return {"error_code": SASL_AUTHENTICATION_FAILED,
                "error_message": failure_message(auth.mechanism, exc, auth.reauthenticating),
                "auth_bytes": b"", "session_lifetime": 0}
    return {"error_code": 0, "error_message": None, "auth_bytes": answer,
            "session_lifetime": auth.session_lifetime_ms if auth.complete else 0}


def raw_token(auth: Any, token: bytes) -> list[bytes] | None:
    """A bare token after SaslHandshake v0: answered bare; a failure closes the connection with no answer
    (there is no field to carry an error in), connection.failed.authentication.delay.ms later, as Kafka does."""
    from oncelog.broker.context import CloseConnection

    try:
        answer = auth.evaluate(token)
    except SaslError as exc:
        raise CloseConnection(f"SASL authentication failed: {exc}") from None
    if auth.complete:
        auth.raw_tokens = False  # Kafka requests from here on
    return [answer]  # an empty token is answered too (PLAIN's empty challenge), as Kafka does
