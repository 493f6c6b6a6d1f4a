"""What a handler gets besides the decoded request."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from oncelog.protocol.headers import RequestHeader

if TYPE_CHECKING:
    from oncelog.broker.broker import Broker
    from oncelog.protocol.codec import UnknownTags


class CloseConnection(Exception):
    """Kafka closes the connection: a protocol violation, or an acks=0 produce that failed."""


@dataclass(slots=True)
class RequestContext:
    broker: "Broker"
    header: RequestHeader
    peer: str = "?"
    on_applied: Callable[..., None] | None = None
    # tags the codec did not know, by entity (see protocol.codec): empty unless the
    # request carried one (conditional produce reads its tag from here)
    unknown_tags: "UnknownTags | None" = None
    # the connection's SASL state (broker.security.SaslSession) on a SASL listener, else None
    auth: Any = None

    @property
    def version(self) -> int:
        return self.header.api_version

    def applied(self) -> None:
        """Say that this request's effects are all applied.

        The next request of the same connection starts only after this (or
        after the handler returned): effects follow request order, as with
        Kafka's one-request-at-a-time channel. A handler calls it before an
        ``await`` that only waits (for fsync, a long poll, a rebalance) and
        never before one that precedes a state change of its own."""
        if self.on_applied is not None:
            self.on_applied()

    def waiting(self) -> None:
        """Say that this request's effects are applied and that it now only waits (for a rebalance),
        but still holds the connection: while the connection is open the next request waits for it,
        as behind Kafka's muted channel; once the client has closed the connection nothing waits
        behind it (it is cancelled, as its answer has no one to go to)."""
        if self.on_applied is not None:
            self.on_applied(True)
