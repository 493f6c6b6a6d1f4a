"""A PartitionLog.sync() held inside fdatasync while a test drops segments under it.

Shared by the storage tests (DeleteRecords, retention) and the cleaner tests (a swap
installed meanwhile): segments a running sync uses must be closed by that sync only
after its fdatasync, so no file opened meanwhile takes a descriptor number the worker
is about to use.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest

from oncelog.storage.log import PartitionLog


def open_fds() -> set[str]:
    """The process's open descriptor numbers (to check that nothing leaked)."""
    return set(os.listdir("/proc/self/fd"))


class HeldSync:
    """``log.sync()`` in a thread that stops inside its first ``os.fdatasync`` (patched for
    that thread only) until :meth:`release`; it is there when the constructor returns."""

    def __init__(self, log: PartitionLog, monkeypatch: pytest.MonkeyPatch) -> None:
        self.synced: list[int] = []  # the descriptors the held thread fdatasynced
        self.result: list[Any] = []  # what its sync() returned (or raised)
        real = os.fdatasync
        started, self._go = threading.Event(), threading.Event()

        def fdatasync(fd: int) -> None:
            if threading.current_thread() is self._thread:
                started.set()
                assert self._go.wait(5)
                self.synced.append(fd)
            real(fd)

        def run() -> None:
            try:
                self.result.append(log.sync())
            except BaseException as exc:  # pragma: no cover - asserted by release()
                self.result.append(exc)

        monkeypatch.setattr(os, "fdatasync", fdatasync)
        self._thread = threading.Thread(target=run, name="held-sync")
        self._thread.start()
        assert started.wait(5)

    def release(self, durable_end: int) -> None:
        """Let the sync go on while new files hold every freed number, then check that it
        returned ``durable_end`` and never fdatasynced a number another file took meanwhile."""
        reused = [os.open(os.devnull, os.O_RDONLY) for _ in range(8)]
        try:
            self._go.set()
            self._thread.join(10)
            assert self.result == [durable_end]
            assert not set(self.synced) & set(reused)
        finally:
            for fd in reused:
                os.close(fd)
