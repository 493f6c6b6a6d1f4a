"""A log directory that goes offline on its first I/O error (Kafka's LogDirFailureChannel).

A failed ``fdatasync`` cannot be retried: Linux reports a writeback error once
per open file (errseq, since 4.13) and may already have marked the failed pages
clean, so a later ``fdatasync`` can return 0 although the data never reached
the disk. A failed ``write`` (EIO, ENOSPC, EDQUOT, EMFILE while rolling a
segment) leaves the directory in the same doubt. So, as Kafka's
``maybeHandleIOException`` does for every append, roll and flush of a log, the
first ``OSError`` of a write or sync of any log of the directory takes the
whole directory offline, for good (until the broker restarts and recovery reads
back what the files hold): every later append or sync of a log in it raises
:class:`LogDirOfflineError` before touching a file, and the broker (one log
directory, so none left) stops, as Kafka's broker halts when its last log
directory fails.

The channel is thread-safe: fsyncs run in worker threads. Listeners are called
once, on the thread that saw the first error, and must only schedule work.
"""

from __future__ import annotations

import errno
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from oncelog.protocol.errors import ErrorCode, KafkaError


class LogDirOfflineError(OSError):
    """A write or sync in a log directory that is offline (or the error that took it
    offline). An OSError, so every caller that maps a storage error (produce's
    KAFKA_STORAGE_ERROR, the coordinators' NOT_COORDINATOR) maps this one too."""


DESCRIPTOR_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE})


def is_descriptor_shortage(exc: BaseException) -> bool:
    """EMFILE or ENFILE: the process (or system) is out of file descriptors. No disk error:
    oncelog opens descriptors lazily, so a burst of connections can exhaust them."""
    return isinstance(exc, OSError) and exc.errno in DESCRIPTOR_ERRNOS


class DescriptorShortageError(OSError):
    """No descriptor could be had (EMFILE, ENFILE) at a point where nothing was written or
    synced yet, or where what was written is undone: the step can be retried (a sync) or
    rolled back (a topic's creation), and the log directory stays online. An OSError, so the
    request that met it gets the usual storage error code."""


class LogClosedError(KafkaError):
    """A write to a log that is closed (its partition was deleted, or the broker is
    stopping), raised before any file is touched. Not an OSError: nothing failed on
    disk, so the log directory stays online (Kafka's ``checkIfMemoryMappedBufferClosed``,
    whose error is not routed to the LogDirFailureChannel either). The request is
    answered as for a deleted partition: UNKNOWN_TOPIC_OR_PARTITION."""

    def __init__(self, what: str) -> None:
        super().__init__(ErrorCode.unknown_topic_or_partition, f"the log of {what} is closed (deleted)")


class LogDirFailureChannel:
    """The one log directory's state, shared by all its logs: online until :meth:`failed`
    is first called, then offline for good (listeners told once; :meth:`check` raises)."""

    def __init__(self, directory: str | Path | None = None) -> None:
        self.directory = None if directory is None else Path(directory)
        self._lock = threading.Lock()
        self._cause: str | None = None  # what failed first, and how (one line)
        self._errno = errno.EIO
        self._listeners: list[Callable[[str], None]] = []
        self._local = threading.local()  # .spare: this thread's descriptor errors are spared

    @property
    def offline(self) -> bool:
        return self._cause is not None

    @property
    def cause(self) -> str | None:
        return self._cause

    def add_listener(self, listener: Callable[[str], None]) -> None:
        """``listener(cause)`` is called once when the directory goes offline (at once if it is)."""
        with self._lock:
            cause = self._cause
            if cause is None:
                self._listeners.append(listener)
        if cause is not None:
            listener(cause)

    def error(self) -> LogDirOfflineError:
        """The error for a write or sync attempted while offline."""
        where = "" if self.directory is None else f" {self.directory}"
        return LogDirOfflineError(self._errno, f"the log directory{where} is offline ({self._cause})")

    def check(self) -> None:
        """Raise :class:`LogDirOfflineError` if the directory is offline."""
        if self._cause is not None:
            raise self.error()

    @contextmanager
    def sparing_descriptor_errors(self) -> Iterator[None]:
        """In this block (on this thread only) EMFILE/ENFILE does not take the directory offline:
        :meth:`failed` returns a :class:`DescriptorShortageError` instead. For steps that are
        undone whole when they fail (the creation of a topic's logs, rolled back)."""
        prev = getattr(self._local, "spare", False)
        self._local.spare = True
        try:
            yield
        finally:
            self._local.spare = prev

    def failed(self, what: str, exc: OSError) -> OSError:
        """``what`` (e.g. "fsync of t-0") failed with ``exc``: take the directory offline
        (the first failure only; later ones change nothing) and return the error to raise."""
        if isinstance(exc, LogDirOfflineError):
            return exc
        if is_descriptor_shortage(exc) and getattr(self._local, "spare", False):
            if isinstance(exc, DescriptorShortageError):
                return exc
            return DescriptorShortageError(exc.errno, f"{what}: {exc.strerror or exc}")
        with self._lock:
            first = self._cause is None
            if first:
                self._cause = f"{what}: {exc.strerror or exc}"
                self._errno = exc.errno or errno.EIO
                listeners, self._listeners = self._listeners, []
        if first:
            for listener in listeners:
                listener(self._cause or "")
        return self.error()


@contextmanager
def guarded(channel: LogDirFailureChannel | None, what: str,
            unless: Callable[[], bool] | None = None) -> Iterator[None]:
    """Run the block as I/O of the log directory (Kafka's ``maybeHandleIOException``): it
    raises :class:`LogDirOfflineError` at once if the directory is offline, and an
    ``OSError`` in it takes the directory offline (``what`` names it in the one line the
    broker logs), unless ``unless()`` is true when it is raised: then it is raised as is
    (a :class:`LogDirOfflineError` is raised as is anyway). Without a channel (a log
    opened alone, in tests) the error is raised as is."""
    if channel is None:
        yield
        return
    channel.check()
    try:
        yield
    except OSError as exc:
        if unless is not None and unless():
            raise
        raise channel.failed(what, exc) from exc


def log_level(exc: BaseException | None, level: int) -> int:
    """``level`` for logging a failed write, DEBUG if it failed because the log directory
    is (or just went) offline: the broker logs that once, when it stops."""
    if isinstance(exc, LogDirOfflineError) or isinstance(getattr(exc, "__cause__", None), LogDirOfflineError):
        return logging.DEBUG
    return level
