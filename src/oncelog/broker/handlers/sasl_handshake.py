"""SaslHandshake (key 17).

Behavior: on a SASL listener, before authentication, the client names its
mechanism; an enabled one gets NONE and the list of enabled mechanisms, any
other UNSUPPORTED_SASL_MECHANISM (33) with that list, and the connection is
closed after the answer (Kafka's SaslServerAuthenticator). On an
authenticated connection whose session has a lifetime
(``connections.max.reauth.ms``), it starts a re-authentication (KIP-368; the
dispatcher resets the session first, see
:meth:`oncelog.broker.security.SaslSession.arm_reauthentication`); otherwise,
or on a listener without SASL, the answer is ILLEGAL_SASL_STATE (34), as
Kafka's KafkaApis gives.

Version notes:
- v0: the SASL tokens that follow are sent bare (a 4-byte length, no Kafka
  header) and answered bare; v1 (KIP-152): they come in SaslAuthenticate
  requests. The dispatcher routes bare tokens to
  :func:`oncelog.broker.handlers.sasl_authenticate.raw_token`.
"""

from __future__ import annotations

from typing import Any

from oncelog.broker.context import RequestContext

API_KEY = 17
MIN_VERSION = 0
MAX_VERSION = 1
ILLEGAL_SASL_STATE = 34


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    auth = ctx.auth
    if auth is None or auth.complete:
        return {"error_code": ILLEGAL_SASL_STATE, "mechanisms": []}
    code = auth.handshake(str(request.mechanism), ctx.version)
    return {"error_code": code, "mechanisms": list(auth.settings.mechanisms)}
