"""A durable key -> value store on one internal PartitionLog, compacted by snapshot.

The same persistence pattern as the offsets store (see
:mod:`oncelog.broker.group.offsets`): records are ordinary v2 batches whose
keys are UTF-8 strings and whose values are UTF-8 JSON (``None`` = a
tombstone); :meth:`DurableKeyedLog.append` appends one batch and hands the
log to the broker's group committer through the ``durability`` callback
(``GroupCommitter.wait_durable``: it takes an object with ``.log`` and
``.advance_high_watermark`` and returns a future, or None when acks do not
wait for fsync). :attr:`DurableKeyedLog.live` is the durable view: an append
is applied to it only once durable, in append order.

Compaction: once the log holds more than ``snapshot_bytes`` and nothing waits
for fsync, ``live`` is written to ``<N><suffix>`` (atomic, fsynced; N = the
log end offset) and the segments below N are deleted. Loading reads the
newest readable snapshot and replays the records after it.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from oncelog.broker.durability import LogHandle
from oncelog.protocol.records import InvalidRecordError, Record, encode_record_batch, iter_records
from oncelog.storage.config import internal_log_config
from oncelog.storage.fileutil import offset_named_files, write_offset_named
from oncelog.storage.log import PartitionLog
from oncelog.storage.log_dir import log_level

log = logging.getLogger(__name__)

SNAPSHOTS_KEPT = 2
SNAPSHOT_FORMAT = 1

Entry = tuple[str, Any]  # (key, JSON value or None for a tombstone)


class DurableKeyedLog:
    def __init__(
        self,
        plog: PartitionLog,
        snapshot_suffix: str,
        durability: Callable[[Any], Any] | None = None,
        clock: Callable[[], int] | None = None,
        snapshot_bytes: int = 8 * 1024 * 1024,
    ) -> None:
        self.log = plog
        self.suffix = snapshot_suffix
        self.live: dict[str, Any] = {}
        self._durable = LogHandle(plog)
        self._durability = durability
        self._clock = clock or (lambda: 0)
        self._pending: deque[tuple[int, list[Entry]]] = deque()
        self.snapshot_bytes = snapshot_bytes
        self.snapshots = 0

    @classmethod
    def open(
        cls,
        directory: Path,
        snapshot_suffix: str,
        durability: Callable[[Any], Any] | None,
        clock: Callable[[], int],
        snapshot_bytes: int = 8 * 1024 * 1024,
        failure_channel: Any = None,
    ) -> "DurableKeyedLog":
        plog = PartitionLog.open(Path(directory), internal_log_config(), clock(), failure_channel)
        store = cls(plog, snapshot_suffix, durability, clock, snapshot_bytes)
        store.load()
        return store

    # -- loading ----------------------------------------------------------------

    def _snapshots(self) -> list[tuple[int, Path]]:
        return offset_named_files(self.log.directory, self.suffix)

    def load(self) -> dict[str, Any]:
        plog = self.log
        end, start = plog.log_end_offset, plog.log_start_offset
        self.live = {}
        replay_from = start
        for offset, path in reversed(self._snapshots()):
            if offset > end:
                log.warning("ignoring snapshot %s beyond the log end %d", path.name, end)
                continue
            try:
                snap = json.loads(path.read_bytes())
                if snap.get("format") != SNAPSHOT_FORMAT:
                    raise ValueError(f"unknown snapshot format {snap.get('format')!r}")
                self.live = dict(snap["entries"])
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("ignoring unreadable snapshot %s: %s", path, exc)
                continue
            replay_from = max(offset, start)
            break
        else:
            if start > 0:
                log.error("%s starts at %d but no snapshot was found; older records are lost", plog.directory, start)
        replayed = 0
        for hdr, data in plog.scan_batches(replay_from):
            if hdr.last_offset < replay_from or hdr.is_control:
                continue
            try:
                for off, _ts, rec in iter_records(data):
                    if off >= replay_from:
                        self._apply([_decode(rec)])
                        replayed += 1
            except (InvalidRecordError, ValueError, UnicodeDecodeError) as exc:
                log.error("skipping unreadable batch at %d in %s: %s", hdr.base_offset, plog.directory, exc)
        log.info("%s: %d live keys (%d records replayed from %d)", plog.directory.name, len(self.live), replayed, replay_from)
        return self.live

    # -- writes -----------------------------------------------------------------

    @property
    def pending_writes(self) -> int:
        return len(self._pending)

    def append(self, entries: list[Entry]) -> Any:
        """Append ``entries`` as one batch; None when durable at once, else a future (fails with the fsync error)."""
        if not entries:
            return None
        now = self._clock()
        self.log.append(encode_record_batch([_encode(e) for e in entries], base_timestamp=now), now)
        end = self.log.log_end_offset
        self._pending.append((end, entries))
        fut = self._durability(self._durable) if self._durability is not None else None
        if fut is None:
            if self._durability is None:
                self.log.sync()
            self._apply_through(end)
            return None
        fut.add_done_callback(self._on_durable)
        return fut

    def _on_durable(self, fut: Any) -> None:
        if fut.cancelled() or fut.exception() is not None:
            return
        self._apply_through(self.log.durable_end_offset)

    def _apply_through(self, end: int) -> None:
        while self._pending and self._pending[0][0] <= end:
            self._apply(self._pending.popleft()[1])

    def _apply(self, entries: list[Entry]) -> None:
        for key, value in entries:
            if value is None:
                self.live.pop(key, None)
            else:
                self.live[key] = value

    # -- compaction -------------------------------------------------------------

    def maybe_snapshot(self, force: bool = False) -> bool:
        plog = self.log
        if self._pending or plog.log_end_offset == plog.log_start_offset:
            return False
        if plog.failure_channel is not None and plog.failure_channel.offline:
            return False
        if not force and plog.size_bytes < self.snapshot_bytes:
            return False
        plog.roll()
        end = plog.log_end_offset
        snap = {"format": SNAPSHOT_FORMAT, "offset": end, "entries": self.live}
        with plog.io("snapshot"):  # an OSError takes the log directory offline
            write_offset_named(plog.directory, end, self.suffix, json.dumps(snap, separators=(",", ":")).encode(),
                               SNAPSHOTS_KEPT)
        plog.delete_records_before(end)
        self.snapshots += 1
        return True

    def close(self) -> None:
        try:
            self.maybe_snapshot(force=True)
        except OSError as exc:
            log.log(log_level(exc, logging.ERROR), "snapshot at shutdown of %s failed: %s", self.log.directory, exc)
        self.log.close()


def _encode(entry: Entry) -> Record:
    key, value = entry
    return Record(key.encode(), None if value is None else json.dumps(value, separators=(",", ":")).encode())


def _decode(rec: Record) -> Entry:
    if rec.key is None:
        raise ValueError("record without a key")
    key = bytes(rec.key).decode()
    return key, (None if rec.value is None else json.loads(bytes(rec.value)))
