"""Kafka error codes.

kio ships Kafka's full error table as :class:`kio.schema.errors.ErrorCode`
(generated from Kafka's sources, with the retriable flag); we re-export it under
Kafka's upper-case names so handlers read like Kafka's own code.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

__all__ = ["ErrorCode", "KafkaError", "code_name"]


class KafkaError(Exception):
    """An error that maps to one Kafka error code (raised inside the broker)."""

    def __init__(self, code: ErrorCode | int, message: str = "") -> None:
        self.code = ErrorCode(code)
        super().__init__(message or self.code.name.upper())


def code_name(code: int) -> str:
    """Kafka's upper-case name for ``code``, e.g. ``UNSUPPORTED_VERSION``."""
    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return f"UNKNOWN_ERROR_{code}"
