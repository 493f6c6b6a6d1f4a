"""What a handler gets besides the decoded request."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from oncelog.protocol.headers import RequestHeader

if TYPE_CHECKING:
    from oncelog.broker.broker import Broker


@dataclass(slots=True)
class RequestContext:
    broker: "Broker"
    header: RequestHeader
    peer: str = "?"

    @property
    def version(self) -> int:
        return self.header.api_version
