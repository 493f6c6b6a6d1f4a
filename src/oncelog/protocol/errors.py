"""Kafka error codes.

kio ships Kafka's full error table as :class:`kio.schema.errors.ErrorCode`
(generated from Kafka's sources, with the retriable flag); we re-export it under
Kafka's upper-case names so handlers read like Kafka's own code.

Below Kafka's table, in a separate section, are oncelog's own codes
(:class:`OncelogErrorCode`): far above Kafka's range (Kafka's codes run from
-1 to about 130 and grow by a few a year), so they cannot be mistaken for a
Kafka code, present or future. See docs/conditional-publish.md.
"""

from __future__ import annotations

import enum

from kio.schema.errors import ErrorCode

__all__ = ["ErrorCode", "KafkaError", "OncelogErrorCode", "code_name"]


class KafkaError(Exception):
    """An error that maps to one Kafka error code (raised inside the broker)."""

    def __init__(self, code: ErrorCode | int, message: str = "") -> None:
        self.code: ErrorCode | OncelogErrorCode = (
            OncelogErrorCode(code) if code >= ONCELOG_CODES_FROM else ErrorCode(code)
        )
        super().__init__(message or self.code.name.upper())


def code_name(code: int) -> str:
    """Kafka's upper-case name for ``code``, e.g. ``UNSUPPORTED_VERSION``."""
    try:
        if code >= ONCELOG_CODES_FROM:
            return OncelogErrorCode(code).name.upper()
        return ErrorCode(code).name.upper()
    except ValueError:
        return f"UNKNOWN_ERROR_{code}"


# -- oncelog's own error codes (not Kafka's) ----------------------------------------
#
# A client that does not know these codes sees an unknown, non-retriable error
# (librdkafka, kafka-python, kafkajs and the Java client all map an unknown
# positive code that way), which is the right reaction: only a client that sent
# a conditional produce can get them. Negative codes would be worse: -1 is
# Kafka's UNKNOWN_SERVER_ERROR and librdkafka uses -1..-199 for its own local
# errors. Codes stay within int16.

ONCELOG_CODES_FROM = 10_000


class OncelogErrorCode(enum.IntEnum):
    """oncelog's own error codes (docs/conditional-publish.md)."""

    oncelog_offset_mismatch = 10_001
    """Conditional produce: the partition's next offset is not the expected offset
    (the response carries the actual next offset). Nothing of the request was appended."""
    oncelog_conditional_produce_refused = 10_002
    """Conditional produce: this partition was fine, but another partition of the same
    request failed its condition, so nothing of the request was appended."""

    @property
    def retriable(self) -> bool:
        return False
