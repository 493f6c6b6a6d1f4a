"""ApiVersions (key 18).

Behavior: lists every API this broker handles with the exact version range
its handler implements, plus the features (v3+): ``transaction.version`` is supported at levels
0-2 and finalized at ``oncelog.transaction.version`` (default 2, KIP-890's
transactions v2; 0 turns the v2 protocol off). ``oncelog.conditional.produce``
is supported at level 1 (conditional produce, docs/conditional-publish.md; a
supported feature only: a client checks it there, and Kafka's clients skip
feature names they don't know).

Version notes:
- v0-v4 are handled. v3+ is flexible and carries the client's software
  name/version, which we ignore.
- A version above 4 is answered in v0 format with UNSUPPORTED_VERSION (35) and
  the API list, so the client can retry with a version we speak (KIP-511);
  the dispatcher calls :func:`unsupported_v0` for that.
- The response header is always v0, even for flexible versions.
"""

from __future__ import annotations

import struct
from typing import Any

from oncelog.broker.context import RequestContext
from oncelog.protocol.conditional import FEATURE_NAME, FEATURE_VERSION

API_KEY = 18
MIN_VERSION = 0
MAX_VERSION = 4


def _api_keys() -> list[dict[str, int]]:
    from oncelog.broker.handlers import HANDLERS

    return [
        {"api_key": h.api_key, "min_version": h.min_version, "max_version": h.max_version}
        for h in sorted(HANDLERS.values(), key=lambda h: h.api_key)
    ]


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    level = ctx.broker.config.transaction_version
    finalized = [{"name": "transaction.version", "max_version_level": level, "min_version_level": level}] if level > 0 else []
    return {
        "error_code": 0,
        "api_keys": _api_keys(),
        "throttle_time": 0,
        "supported_features": [
            {"name": "transaction.version", "min_version": 0, "max_version": 2},
            {"name": FEATURE_NAME, "min_version": FEATURE_VERSION, "max_version": FEATURE_VERSION},
        ],
        "finalized_features_epoch": 1,
        "finalized_features": finalized,
    }


def unsupported_v0() -> bytes:
    """ApiVersions v0 body with error 35 and our API list."""
    keys = _api_keys()
    parts = [struct.pack(">hi", 35, len(keys))]
    parts += [struct.pack(">hhh", k["api_key"], k["min_version"], k["max_version"]) for k in keys]
    return b"".join(parts)
