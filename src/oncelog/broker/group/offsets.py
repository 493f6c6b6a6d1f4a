"""Committed offsets and group metadata, kept durably in an internal log.

Kafka keeps both in the compacted topic ``__consumer_offsets``. Here they go
to one :class:`~oncelog.storage.log.PartitionLog` in
``<data-dir>/__consumer_offsets-0`` (a directory the topic catalog does not
know about), as ordinary v2 record batches whose records this module
defines:

* key ``["o", group, topic, partition]``, value
  ``{"offset", "epoch", "metadata", "ts", "expire"}``: a committed offset
  (``expire`` is the explicit expiry of OffsetCommit v2-v4's retention time,
  else absent); a null value deletes it;
* key ``["g", group]``, value: the group's metadata as the coordinator
  persists it (generation, protocol, leader, members with their metadata and
  assignment, state timestamp); a null value deletes the group.

Keys and values are UTF-8 JSON.

**Durability and visibility.** :meth:`OffsetStore.write` appends one batch
and hands the log to the broker's group committer (the same fsync rounds as
produce requests). The in-memory view is updated only once the batch is
durable, in append order, so an OffsetFetch never returns an offset that a
crash could take back. With ``log.flush.interval.messages`` > 1 writes are
visible at once, like produced records.

**Compaction.** Once the log holds more than ``snapshot_bytes`` since the
last snapshot and no write is waiting for fsync, the whole live state is
written to ``<N>.offsets-snapshot`` (atomic, fsynced; N is the log end
offset) and the log segments below N are deleted. Loading reads the newest
snapshot and replays the records after it.

The store knows nothing of group rules (the coordinator decides what to
write); storage knows nothing of the store.
"""

from __future__ import annotations

import json
import logging
import os
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from oncelog.protocol.records import InvalidRecordError, Record, encode_record_batch, iter_records
from oncelog.storage.config import LogConfig
from oncelog.storage.fileutil import atomic_write
from oncelog.storage.log import PartitionLog

log = logging.getLogger(__name__)

OFFSETS_DIR = "__consumer_offsets-0"
SNAPSHOT_SUFFIX = ".offsets-snapshot"
SNAPSHOTS_KEPT = 2
SNAPSHOT_FORMAT = 1


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class OffsetAndMetadata(NamedTuple):
    offset: int
    leader_epoch: int = -1
    metadata: str = ""
    commit_timestamp: int = -1
    expire_timestamp: int | None = None  # explicit expiry (OffsetCommit v2-v4 retention time)


# one state change: ("o", group, tp, OffsetAndMetadata | None) or ("g", group, dict | None)
Op = tuple[Any, ...]


def offsets_log_config() -> LogConfig:
    # Kafka's offsets.topic.segment.bytes default; time never rolls or deletes it
    return LogConfig(segment_bytes=100 * 1024 * 1024, segment_ms=2**62, retention_ms=-1, retention_bytes=-1)


class _Durable:
    """What the broker's GroupCommitter needs from a "partition"."""

    __slots__ = ("log",)

    def __init__(self, log: PartitionLog) -> None:
        self.log = log

    def advance_high_watermark(self, offset: int) -> None:
        pass


def _encode(op: Op) -> Record:
    if op[0] == "o":
        _, group, tp, om = op
        key = json.dumps(["o", group, tp.topic, tp.partition], separators=(",", ":")).encode()
        if om is None:
            return Record(key, None)
        value: dict[str, Any] = {"offset": om.offset, "epoch": om.leader_epoch, "metadata": om.metadata, "ts": om.commit_timestamp}
        if om.expire_timestamp is not None:
            value["expire"] = om.expire_timestamp
        return Record(key, json.dumps(value, separators=(",", ":")).encode())
    _, group, meta = op
    key = json.dumps(["g", group], separators=(",", ":")).encode()
    return Record(key, None if meta is None else json.dumps(meta, separators=(",", ":")).encode())


def _decode(rec: Record) -> Op:
    key = json.loads(bytes(rec.key or b"null"))
    value = None if rec.value is None else json.loads(bytes(rec.value))
    if key[0] == "o":
        tp = TopicPartition(key[2], int(key[3]))
        if value is None:
            return ("o", key[1], tp, None)
        om = OffsetAndMetadata(value["offset"], value["epoch"], value["metadata"], value["ts"], value.get("expire"))
        return ("o", key[1], tp, om)
    if key[0] == "g":
        return ("g", key[1], value)
    raise ValueError(f"unknown offsets record key {key!r}")


class OffsetStore:
    """The durable view of committed offsets and persisted group metadata.

    Without a log (``log=None``) it is purely in memory and every write is
    applied at once: the coordinator's unit tests use that.
    """

    def __init__(
        self,
        log: PartitionLog | None = None,
        durability: Callable[[Any], Any] | None = None,
        clock: Callable[[], int] | None = None,
        snapshot_bytes: int = 8 * 1024 * 1024,
    ) -> None:
        self.offsets: dict[str, dict[TopicPartition, OffsetAndMetadata]] = {}
        self.group_records: dict[str, dict[str, Any]] = {}
        self._log = log
        self._durable = _Durable(log) if log is not None else None
        self._durability = durability
        self._clock = clock or (lambda: 0)
        self._pending: deque[tuple[int, list[Op]]] = deque()
        self.snapshot_bytes = snapshot_bytes
        self.writes = 0
        self.snapshots = 0

    # -- opening ----------------------------------------------------------------

    @classmethod
    def open(
        cls,
        data_dir: Path,
        durability: Callable[[Any], Any] | None,
        clock: Callable[[], int],
        snapshot_bytes: int = 8 * 1024 * 1024,
    ) -> "OffsetStore":
        directory = Path(data_dir) / OFFSETS_DIR
        plog = PartitionLog.open(directory, offsets_log_config(), clock())
        store = cls(plog, durability, clock, snapshot_bytes)
        store._load()
        return store

    @property
    def directory(self) -> Path | None:
        return None if self._log is None else self._log.directory

    def _snapshots(self) -> list[tuple[int, Path]]:
        assert self._log is not None
        out = []
        for p in self._log.directory.glob("*" + SNAPSHOT_SUFFIX):
            stem = p.name[: -len(SNAPSHOT_SUFFIX)]
            if stem.isdigit():
                out.append((int(stem), p))
        return sorted(out)

    def _load(self) -> None:
        assert self._log is not None
        end = self._log.log_end_offset
        start = self._log.log_start_offset
        replay_from = start
        for offset, path in reversed(self._snapshots()):
            if offset > end:
                log.warning("ignoring offsets snapshot %s beyond the log end %d", path.name, end)
                continue
            try:
                self._restore(json.loads(path.read_bytes()))
            except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
                log.warning("ignoring unreadable offsets snapshot %s: %s", path, exc)
                self.offsets.clear()
                self.group_records.clear()
                continue
            replay_from = max(offset, start)
            break
        else:
            if start > 0:
                log.error("offsets log starts at %d but no snapshot was found; older commits are lost", start)
        replayed = 0
        for hdr, data in self._log.scan_batches(replay_from):
            if hdr.last_offset < replay_from or hdr.is_control:
                continue
            try:
                for off, _ts, rec in iter_records(data):
                    if off >= replay_from:
                        self._apply(_decode(rec))
                        replayed += 1
            except (InvalidRecordError, ValueError, KeyError, IndexError, TypeError) as exc:
                log.error("skipping unreadable offsets batch at %d: %s", hdr.base_offset, exc)
        log.info(
            "loaded %d groups with offsets and %d group records (%d records replayed from offset %d)",
            len(self.offsets),
            len(self.group_records),
            replayed,
            replay_from,
        )

    def _restore(self, snap: dict[str, Any]) -> None:
        if snap.get("format") != SNAPSHOT_FORMAT:
            raise ValueError(f"unknown snapshot format {snap.get('format')!r}")
        self.offsets = {
            group: {
                TopicPartition(t, int(p)): OffsetAndMetadata(o, e, m, ts, exp) for t, p, o, e, m, ts, exp in entries
            }
            for group, entries in snap["offsets"].items()
        }
        self.group_records = dict(snap["groups"])

    # -- reads ------------------------------------------------------------------

    def get(self, group: str, tp: TopicPartition) -> OffsetAndMetadata | None:
        return self.offsets.get(group, {}).get(tp)

    def group_offsets(self, group: str) -> dict[TopicPartition, OffsetAndMetadata]:
        return self.offsets.get(group, {})

    def has_offsets(self, group: str) -> bool:
        return bool(self.offsets.get(group))

    @property
    def pending_writes(self) -> int:
        return len(self._pending)

    # -- writes -----------------------------------------------------------------

    def commit(self, group: str, offsets: Mapping[TopicPartition, Any]) -> Any:
        """Store ``{tp: (offset, leader_epoch, metadata)}`` (or OffsetAndMetadata).

        Returns None when already applied, else a future that resolves once
        the commit is durable and visible (or fails with the fsync error).
        """
        now = self._clock()
        ops: list[Op] = []
        for tp, om in offsets.items():
            if not isinstance(om, OffsetAndMetadata):
                om = OffsetAndMetadata(*om)
            if om.commit_timestamp < 0:
                om = om._replace(commit_timestamp=now)
            ops.append(("o", group, TopicPartition(*tp), om))
        return self.write(ops)

    def delete_offsets(self, group: str, tps: Iterable[TopicPartition]) -> Any:
        return self.write([("o", group, TopicPartition(*tp), None) for tp in tps])

    def store_group(self, group: str, meta: dict[str, Any] | None) -> Any:
        return self.write([("g", group, meta)])

    def delete_group(self, group: str) -> Any:
        """Tombstones for every offset of ``group`` and its metadata."""
        ops: list[Op] = [("o", group, tp, None) for tp in self.group_offsets(group)]
        if group in self.group_records or not ops:
            ops.append(("g", group, None))
        return self.write(ops)

    def write(self, ops: list[Op]) -> Any:
        if not ops:
            return None
        self.writes += 1
        if self._log is None:
            for op in ops:
                self._apply(op)
            return None
        now = self._clock()
        batch = encode_record_batch([_encode(op) for op in ops], base_timestamp=now)
        self._log.append(batch, now)
        end = self._log.log_end_offset
        self._pending.append((end, ops))
        fut = self._durability(self._durable) if self._durability is not None else None
        if fut is None:
            if self._durability is None:
                self._log.sync()
            self._apply_through(end)
            return None
        fut.add_done_callback(self._on_durable)
        return fut

    def _on_durable(self, fut: Any) -> None:
        if fut.cancelled() or fut.exception() is not None or self._log is None:
            return
        self._apply_through(self._log.durable_end_offset)

    def _apply_through(self, end: int) -> None:
        pending = self._pending
        while pending and pending[0][0] <= end:
            for op in pending.popleft()[1]:
                self._apply(op)

    def _apply(self, op: Op) -> None:
        if op[0] == "o":
            _, group, tp, om = op
            if om is None:
                offsets = self.offsets.get(group)
                if offsets is not None:
                    offsets.pop(tp, None)
                    if not offsets:
                        del self.offsets[group]
            else:
                self.offsets.setdefault(group, {})[tp] = om
        else:
            _, group, meta = op
            if meta is None:
                self.group_records.pop(group, None)
            else:
                self.group_records[group] = meta

    # -- compaction -------------------------------------------------------------

    def maybe_snapshot(self, force: bool = False) -> bool:
        """Snapshot the live state and drop the log below it (see module doc)."""
        plog = self._log
        if plog is None or self._pending:
            return False
        if plog.log_end_offset == plog.log_start_offset:
            return False
        if not force and plog.size_bytes < self.snapshot_bytes:
            return False
        plog.roll()
        end = plog.log_end_offset
        snap = {
            "format": SNAPSHOT_FORMAT,
            "offset": end,
            "offsets": {
                group: [[tp.topic, tp.partition, *om] for tp, om in offsets.items()]
                for group, offsets in self.offsets.items()
            },
            "groups": self.group_records,
        }
        atomic_write(plog.directory / f"{end:020d}{SNAPSHOT_SUFFIX}", json.dumps(snap, separators=(",", ":")).encode())
        plog.delete_records_before(end)
        for _, old in self._snapshots()[:-SNAPSHOTS_KEPT]:
            try:
                os.unlink(old)
            except FileNotFoundError:
                pass
        self.snapshots += 1
        log.info("offsets store snapshot at %d (%d groups with offsets)", end, len(self.offsets))
        return True

    def close(self) -> None:
        if self._log is None:
            return
        try:
            self.maybe_snapshot(force=True)
        except OSError as exc:
            log.error("offsets snapshot at shutdown failed: %s", exc)
        self._log.close()
