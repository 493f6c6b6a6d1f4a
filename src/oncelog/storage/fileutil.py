"""Small durable-file helpers."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def fsync_dir(path: str | Path) -> None:
    """fsync a directory so that renames/creations inside it are durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically and durably.

    Writes a temp file in the same directory, fsyncs it, renames it over the
    target and fsyncs the directory.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """os.write until every byte is written."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def read_all(fd: int, size: int, pos: int) -> bytes:
    """os.pread ``size`` bytes at ``pos`` (fewer only at end of file)."""
    data = os.pread(fd, size, pos)
    if len(data) == size or not data:
        return data
    parts = [data]
    got = len(data)
    while got < size:
        more = os.pread(fd, size - got, pos + got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def offset_named_files(directory: str | Path, suffix: str) -> list[tuple[int, Path]]:
    """Files named ``<digits><suffix>`` in ``directory`` (snapshots named by a
    log offset) with their offsets, oldest first."""
    found = []
    for path in Path(directory).glob("*" + suffix):
        stem = path.name[: -len(suffix)]
        if stem.isdigit():
            found.append((int(stem), path))
    return sorted(found)


def write_offset_named(directory: str | Path, offset: int, suffix: str, data: bytes, keep: int) -> Path:
    """Write ``<offset:020d><suffix>`` atomically, then delete all but the newest ``keep`` such files."""
    path = Path(directory) / f"{offset:020d}{suffix}"
    atomic_write(path, data)
    for _, old in offset_named_files(directory, suffix)[:-keep]:
        try:
            os.unlink(old)
        except FileNotFoundError:
            pass
    return path


LOCK_FILE = ".lock"


class DirLockedError(OSError):
    """Another broker (process or thread) holds the directory's ``.lock``."""


class DirLock:
    """An exclusive ``flock`` on ``<directory>/.lock``, held while the broker runs.

    As in Kafka, every log directory is locked before anything in it is read or
    written, so a second broker on the same directory refuses to start. The
    file is opened without truncation and never written, so a refused attempt
    changes nothing in the directory. The kernel drops the lock when the
    process dies (also on kill -9), so a restart after a crash is not blocked.
    ``flock`` locks belong to the open file, so two brokers in one process
    (thread mode) also exclude each other.
    """

    def __init__(self, directory: Path, fd: int) -> None:
        self.directory = directory
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, directory: str | Path) -> "DirLock":
        import fcntl

        directory = Path(directory)
        fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DirLockedError(
                f"data directory {directory} is in use by another broker (lock {directory / LOCK_FILE} is held)"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        return cls(directory, fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the last descriptor drops the flock


def remove_gradually(path: str | Path, chunk_bytes: int, pause: Callable[[], object]) -> int:
    """Delete a file by cutting it down ``chunk_bytes`` at a time from its end, calling
    ``pause()`` after each cut and after unlinking it; returns the bytes freed (0 if it was
    gone). Freeing a large file at once is one burst of metadata work (and, on a file system
    mounted with online ``discard``, of TRIMs) inside one journal commit, which every
    ``fsync`` on that file system then waits for; in steps, each commit carries a share."""
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        return 0
    freed = 0
    try:
        while size > chunk_bytes:
            size -= chunk_bytes
            os.truncate(path, size)
            freed += chunk_bytes
            pause()
        os.unlink(path)
        pause()
    except FileNotFoundError:  # removed meanwhile (recovery, a topic deletion)
        return freed
    return freed + size
