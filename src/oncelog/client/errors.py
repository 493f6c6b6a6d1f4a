"""Typed client exceptions carrying Kafka's error name and code.

Every Kafka error code in :class:`oncelog.protocol.errors.ErrorCode` (Kafka's
full table, with its retriable flag) has a subclass of :class:`KafkaError`
named after it in CamelCase with an ``Error`` suffix, e.g. code 6
``NOT_LEADER_OR_FOLLOWER`` -> :class:`NotLeaderOrFollowerError`, code 45
``OUT_OF_ORDER_SEQUENCE_NUMBER`` -> ``OutOfOrderSequenceNumberError``. Catch
the base class, a specific subclass, or check ``.code`` / ``.name`` /
``.retriable``.

Client-side conditions that have no Kafka code (the client was closed, a
record waited longer than ``delivery.timeout.ms``) are subclasses too and
carry ``code = -1`` with their own ``name`` (librdkafka does the same with its
negative "local" codes).

Internal API: :func:`error_for(code, message)` builds the exception for a
response's error code; :func:`error_class(code)` returns its class.
"""

from __future__ import annotations

from oncelog.protocol.errors import ErrorCode

__all__ = [
    "ClientClosedError",
    "DeliveryTimeoutError",
    "KafkaError",
    "KafkaConnectionError",
    "SslAuthenticationError",
    "error_class",
    "error_for",
]


class KafkaError(Exception):
    """A Kafka error: ``code`` (Kafka's int), ``name`` (Kafka's upper-case name), ``retriable``.

    A transactional producer also classifies the errors it raises, as Java's
    ``TransactionManager`` does (confluent-kafka has the same two flags):
    ``txn_requires_abort`` is true for an *abortable* error (call
    ``abort_transaction()``, then go on), ``fatal`` for a *fatal* one (the
    producer can only be closed).
    """

    code: int = -1
    name: str = "UNKNOWN_SERVER_ERROR"
    retriable: bool = False
    txn_requires_abort: bool = False
    fatal: bool = False

    def __init__(self, message: str = "") -> None:
        self.message = message
        super().__init__(f"{self.name}: {message}" if message else self.name)

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.message,))


_BY_CODE: dict[int, type[KafkaError]] = {}


def _class_name(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_")) + "Error"


def _build() -> None:
    for ec in ErrorCode:
        code = int(ec.value)
        if code == 0:
            continue
        cls = type(_class_name(ec.name), (KafkaError,), {
            "code": code, "name": ec.name.upper(), "retriable": bool(ec.retriable),
            "__doc__": f"Kafka error {code} {ec.name.upper()}"
                       f"{' (retriable)' if ec.retriable else ''}.",
            "__module__": __name__,
        })
        _BY_CODE[code] = cls
        globals()[cls.__name__] = cls
        __all__.append(cls.__name__)


_build()


def error_class(code: int) -> type[KafkaError]:
    """The exception class for Kafka error ``code`` (a generic one for codes Kafka added later)."""
    cls = _BY_CODE.get(code)
    if cls is None:
        cls = type(f"KafkaError{code}", (KafkaError,), {"code": code, "name": f"UNKNOWN_ERROR_{code}",
                                                        "__module__": __name__})
        _BY_CODE[code] = cls
    return cls


def error_for(code: int, message: str | None = None) -> KafkaError:
    """The exception for a response's error ``code`` and optional error message."""
    return error_class(int(code))(message or "")


def is_retriable(code: int) -> bool:
    return error_class(code).retriable


class KafkaConnectionError(_BY_CODE[ErrorCode.network_exception.value]):  # type: ignore[misc]
    """The connection to a broker failed or closed (NETWORK_EXCEPTION, retriable)."""


class RequestTimeoutError(_BY_CODE[ErrorCode.request_timed_out.value]):  # type: ignore[misc]
    """No response within ``request.timeout.ms`` (REQUEST_TIMED_OUT, retriable); the connection is closed."""


class DeliveryTimeoutError(KafkaError):
    """A record was not acknowledged within ``delivery.timeout.ms`` (the Java client's TimeoutException).

    If its Produce request was in flight at the deadline, the record may still have been written (the
    request can succeed later, as with Java's producer); with idempotence it is never written twice."""

    name = "DELIVERY_TIMEOUT"
    retriable = False


class ClientClosedError(KafkaError):
    """The client was closed before the operation completed."""

    name = "CLIENT_CLOSED"


class UnsupportedApiError(_BY_CODE[ErrorCode.unsupported_version.value]):  # type: ignore[misc]
    """The broker and this client share no version of an API (UNSUPPORTED_VERSION)."""


class SslAuthenticationError(KafkaError):
    """The TLS handshake with a broker failed: an untrusted or expired certificate, a host name
    the certificate does not name, no common protocol (the Java client's SslAuthenticationException,
    librdkafka's local ``_SSL`` error). Not retriable: the client does not retry it."""

    name = "SSL_AUTHENTICATION_FAILED"


# authentication failures: the client reports them at once instead of retrying (as the Java client)
AUTHENTICATION_ERRORS: tuple[type[KafkaError], ...] = (
    SslAuthenticationError,
    _BY_CODE[ErrorCode.sasl_authentication_failed.value],
    _BY_CODE[ErrorCode.illegal_sasl_state.value],
    _BY_CODE[ErrorCode.unsupported_sasl_mechanism.value],
)


class IllegalStateError(KafkaError):
    """A call that the producer's transaction state does not allow (Java's IllegalStateException),
    e.g. ``produce()`` before ``init_transactions()`` or outside a transaction."""

    name = "ILLEGAL_STATE"


class TransactionAbortedError(KafkaError):
    """A record that was not sent because its transaction was aborted (Java's TransactionAbortedException)."""

    name = "TRANSACTION_ABORTED"


class KafkaTimeoutError(KafkaError):
    """A blocking operation did not finish within ``max.block.ms`` (Java's TimeoutException).

    Transactional calls may be called again after it: they resume where they stopped.
    """

    name = "TIMED_OUT"
    retriable = True


class OffsetMismatch(KafkaError):
    """Conditional produce refused (10001 ``ONCELOG_OFFSET_MISMATCH``): the partition's next offset is not
    the record's expected offset; nothing of the request was appended (docs/conditional-publish.md).

    ``actual_offset`` is the partition's next offset at the broker's check, ``expected_offset`` the
    batch's, ``topic`` / ``partition`` the partition. Not retriable."""

    code = 10_001
    name = "ONCELOG_OFFSET_MISMATCH"

    def __init__(self, message: str = "", actual_offset: int = -1, expected_offset: int = -1,
                 topic: str | None = None, partition: int = -1) -> None:
        super().__init__(message)
        self.actual_offset = actual_offset
        self.expected_offset = expected_offset
        self.topic = topic
        self.partition = partition

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.message, self.actual_offset, self.expected_offset, self.topic, self.partition))


class ConditionalProduceRefused(OffsetMismatch):
    """Conditional produce refused because *another* partition of the same request failed its condition
    (10002 ``ONCELOG_CONDITIONAL_PRODUCE_REFUSED``); ``actual_offset`` is this partition's next offset."""

    code = 10_002
    name = "ONCELOG_CONDITIONAL_PRODUCE_REFUSED"


class ConditionalProduceNotSupported(KafkaError):
    """``expected_offset`` was given but the broker does not advertise the ``oncelog.conditional.produce``
    feature (or speaks no Produce v9+): the record is not sent, never without its condition."""

    name = "CONDITIONAL_PRODUCE_NOT_SUPPORTED"


_BY_CODE[OffsetMismatch.code] = OffsetMismatch
_BY_CODE[ConditionalProduceRefused.code] = ConditionalProduceRefused

__all__ += ["ConditionalProduceNotSupported", "ConditionalProduceRefused", "OffsetMismatch"]

__all__ += ["IllegalStateError", "KafkaTimeoutError", "RequestTimeoutError", "TransactionAbortedError",
            "UnsupportedApiError", "is_retriable"]
