"""The blocking admin client: :class:`Admin`, the asyncio :class:`oncelog.client.aio.Admin` on a loop thread.

``Admin({"bootstrap.servers": "127.0.0.1:9092"})`` (a bare ``"host:port"``
string is accepted as the bootstrap server); every method of the asyncio
admin is here with the same name, arguments and result, blocking until it
completes (each operation is bounded by ``default.api.timeout.ms``). The CLI
(``oncelog topics|groups|txns``) and ``oncelog verify`` use it.

:class:`GroupAdmin` and :class:`TxnAdmin` keep the names of the former
one-socket group and transaction admin clients for existing callers; they
are this same client with a few old method names.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from oncelog.client._loop import LoopThread
from oncelog.client.aio.admin import (
    Admin as AioAdmin,
)
from oncelog.client.aio.admin import (
    AlterConfigOp,
    ConfigEntry,
    ConfigResource,
    ListedGroup,
    NewTopic,
    OffsetSpec,
    Results,
    TopicDescription,
    TransactionListing,
)

__all__ = ["Admin", "AlterConfigOp", "ConfigEntry", "ConfigResource", "GroupAdmin", "ListedGroup", "NewTopic",
           "OffsetSpec", "Results", "TopicDescription", "TransactionListing", "TxnAdmin"]


class Admin:
    """The blocking admin client (see docs/client.md). Thread-safe; ``with Admin(conf) as admin: ...``."""

    def __init__(self, config: Mapping[str, Any] | str, *, clock: Callable[[], int] | None = None) -> None:
        self._a = AioAdmin(config, clock=clock)
        self.config = self._a.config
        self.clock = self._a.clock
        self._lt = LoopThread("oncelog-admin")
        self._closed = False
        try:
            self._lt.run(self._a.start())
        except BaseException:
            self._lt.run(self._a.close())
            self._lt.stop()
            raise

    def __enter__(self) -> "Admin":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every connection and the loop thread."""
        if self._closed:
            return
        self._closed = True
        try:
            self._lt.run(self._a.close(), 30)
        finally:
            self._lt.stop()


def _blocking(name: str) -> Callable[..., Any]:
    coro = getattr(AioAdmin, name)

    @functools.wraps(coro)
    def method(self: Admin, *args: Any, **kwargs: Any) -> Any:
        return self._lt.run(getattr(self._a, name)(*args, **kwargs))
    return method


for _name, _fn in inspect.getmembers(AioAdmin, inspect.iscoroutinefunction):
    if not _name.startswith("_") and _name not in ("start", "close"):
        setattr(Admin, _name, _blocking(_name))


class GroupAdmin(Admin):
    """The former group admin's names: ``GroupAdmin(bootstrap)``, ``describe``, ``committed``, ``commit``."""

    def describe(self, group: str) -> Any:
        """:meth:`Admin.describe_group`."""
        return self.describe_group(group)  # type: ignore[attr-defined]

    def committed(self, group: str) -> dict[tuple[str, int], int]:
        """:meth:`Admin.list_group_offsets` (every committed partition)."""
        return self.list_group_offsets(group)  # type: ignore[attr-defined,no-any-return]

    def commit(self, group: str, offsets: dict[tuple[str, int], int]) -> dict[tuple[str, int], str]:
        """:meth:`Admin.alter_group_offsets`; returns the failed partitions' error names."""
        res = self.alter_group_offsets(group, offsets)  # type: ignore[attr-defined]
        return {tp: e.name for tp, e in res.errors.items()}


class TxnAdmin(Admin):
    """The former transaction admin's constructor: ``TxnAdmin(bootstrap, timeout=30.0, clock=None)``."""

    def __init__(self, bootstrap: str, timeout: float = 30.0, clock: Callable[[], int] | None = None) -> None:
        super().__init__({"bootstrap.servers": bootstrap, "request.timeout.ms": int(timeout * 1000),
                          "default.api.timeout.ms": int(timeout * 1000)}, clock=clock)
