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

**Transactional offset commits (KIP-98/447).** TxnOffsetCommit's offsets go
to the log as a *transactional* batch (the producer's id and epoch, the
transactional attribute) of the same ``"o"`` records. Once durable they are
*pending*: kept per producer id, invisible to OffsetFetch. The transaction
coordinator then has a marker written here (:meth:`OffsetStore.write_marker`,
a COMMIT or ABORT control batch with that producer id); once the marker is
durable the producer's pending offsets become visible (COMMIT) or are dropped
(ABORT). As in Kafka's OffsetMetadataManager, a committed transactional offset
replaces the visible one only if its record is *later in the log* than the
visible one's (a plain OffsetCommit written between the transactional commit
and its marker wins), so the store remembers the record offset of every
visible and pending offset. A tombstone (OffsetDelete, group deletion, topic
deletion, expiry) also drops that partition's pending offsets of every
producer. A marker for a producer without pending offsets changes nothing.
A marker whose epoch is older than the epoch of the producer's pending
offsets is refused with INVALID_PRODUCER_EPOCH, as is a transactional commit
older than the producer's pending one (the checks Kafka's producer state
makes on the offsets partition).

**Durability and visibility.** :meth:`OffsetStore.write` appends one batch
and hands the log to the broker's group committer (the same fsync rounds as
produce requests). The in-memory view is updated only once the batch is
durable, in append order, so an OffsetFetch never returns an offset that a
crash could take back. A write that fails (the append's or the fsync's
OSError) fails its future; the coordinator answers NOT_COORDINATOR
(:func:`~oncelog.broker.group.coordinator.append_error`). Either error takes
the log directory offline (:mod:`oncelog.storage.log_dir`; a failed fsync is
never retried): every later write fails the same way, the failed batch is
never applied (so never served), OffsetFetch answers NOT_COORDINATOR and the
broker stops; the next start replays whatever the file holds. With
``log.flush.interval.messages`` > 1 writes are visible at once, like produced
records.

**Compaction.** Once the log holds more than ``snapshot_bytes`` since the
last snapshot and no write is waiting for fsync, the whole live state is
written to ``<N>.offsets-snapshot`` (atomic, fsynced; N is the log end
offset) and the log segments below N are deleted. Loading reads the newest
snapshot and replays the records after it: plain batches update the visible
offsets, transactional batches the pending ones, control batches resolve
them. Pending offsets are *persisted in the snapshot* (with their producer
epoch and record offsets; format 2), so a transaction that stays open does
not stop compaction and its offsets survive it; format-1 snapshots (no
pending offsets, no record offsets) still load.

The store knows nothing of group rules (the coordinator decides what to
write); storage knows nothing of the store.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from oncelog.broker.durability import LogHandle
from oncelog.protocol.errors import ErrorCode, KafkaError
from oncelog.protocol.records import (
    InvalidRecordError,
    Record,
    encode_control_batch,
    encode_record_batch,
    iter_records,
    read_control_marker,
)
from oncelog.storage.config import internal_log_config
from oncelog.storage.fileutil import offset_named_files, write_offset_named
from oncelog.storage.log import PartitionLog
from oncelog.storage.log_dir import LogDirFailureChannel, log_level

log = logging.getLogger(__name__)

OFFSETS_DIR = "__consumer_offsets-0"
SNAPSHOT_SUFFIX = ".offsets-snapshot"
SNAPSHOTS_KEPT = 2
SNAPSHOT_FORMAT = 2
NO_PRODUCER_ID = -1


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class OffsetAndMetadata(NamedTuple):
    offset: int
    leader_epoch: int = -1
    metadata: str = ""
    commit_timestamp: int = -1
    expire_timestamp: int | None = None  # explicit expiry (OffsetCommit v2-v4 retention time)


# one state change: ("o", group, tp, OffsetAndMetadata | None), ("g", group, dict | None),
# or ("m", commit: bool) for a transaction marker (its producer id travels with the batch)
Op = tuple[Any, ...]

# pending offsets of one producer: {group: {tp: (OffsetAndMetadata, record offset)}}
TxnOffsets = dict[str, dict[TopicPartition, tuple[OffsetAndMetadata, int]]]


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


def _failed_write(exc: OSError) -> Any:
    """A write that failed before it reached the log, as a failed durability future (what
    callers await and map to their answer, as for a failed fsync); without a running
    event loop (unit tests of the store alone) the error is raised. The error is already
    logged (one line) and marked retrieved, so a caller that drops the future (expiry, topic
    deletion) leaves no "Future exception was never retrieved" traceback; one that awaits it
    still gets the error."""
    try:
        fut = asyncio.get_running_loop().create_future()
    except RuntimeError:
        raise exc from None
    fut.set_exception(exc)
    fut.exception()  # retrieved: logged by the caller of _failed_write
    return fut


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
        # log offset of the record behind each visible offset (Kafka's recordOffset)
        self._record_offsets: dict[str, dict[TopicPartition, int]] = {}
        # durable pending transactional offsets, by producer id, and the epoch that wrote them
        self.txn_offsets: dict[int, TxnOffsets] = {}
        self._txn_epochs: dict[int, int] = {}
        # producer ids with pending offsets, by group and partition (Kafka's openTransactions)
        self._open: dict[str, dict[TopicPartition, set[int]]] = {}
        # producer epochs of appended (maybe not yet durable) transactional commits without a marker yet
        self._appended_epochs: dict[int, int] = {}
        self._log = log
        self._durable = LogHandle(log) if log is not None else None
        self._durability = durability
        self._clock = clock or (lambda: 0)
        # (end offset, base offset, producer id, producer epoch, ops) appended, not yet durable
        self._pending: deque[tuple[int, int, int, int, list[Op]]] = deque()
        self._mem_end = 0  # record offsets of the in-memory store
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
        failure_channel: LogDirFailureChannel | None = None,
    ) -> "OffsetStore":
        directory = Path(data_dir) / OFFSETS_DIR
        plog = PartitionLog.open(directory, internal_log_config(), clock(), failure_channel)
        store = cls(plog, durability, clock, snapshot_bytes)
        store._load()
        return store

    @property
    def offline(self) -> bool:
        """The log directory failed (storage/log_dir.py): nothing is written or served any more."""
        channel = None if self._log is None else self._log.failure_channel
        return channel is not None and channel.offline

    @property
    def directory(self) -> Path | None:
        return None if self._log is None else self._log.directory

    def _snapshots(self) -> list[tuple[int, Path]]:
        assert self._log is not None
        return offset_named_files(self._log.directory, SNAPSHOT_SUFFIX)

    def _clear(self) -> None:
        self.offsets.clear()
        self.group_records.clear()
        self._record_offsets.clear()
        self.txn_offsets.clear()
        self._txn_epochs.clear()
        self._open.clear()

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
                self._clear()
                continue
            replay_from = max(offset, start)
            break
        else:
            if start > 0:
                log.error("offsets log starts at %d but no snapshot was found; older commits are lost", start)
        replayed = 0
        for hdr, data in self._log.scan_batches(replay_from):
            if hdr.last_offset < replay_from:
                continue
            pid = hdr.producer_id if hdr.is_transactional else NO_PRODUCER_ID
            try:
                if hdr.is_control:
                    if hdr.base_offset >= replay_from and pid >= 0:
                        marker = read_control_marker(data)
                        self._apply(("m", marker.commit), hdr.base_offset, pid, hdr.producer_epoch)
                        replayed += 1
                    continue
                for off, _ts, rec in iter_records(data):
                    if off >= replay_from:
                        self._apply(_decode(rec), off, pid, hdr.producer_epoch)
                        replayed += 1
            except (InvalidRecordError, ValueError, KeyError, IndexError, TypeError) as exc:
                log.error("skipping unreadable offsets batch at %d: %s", hdr.base_offset, exc)
        self._appended_epochs = dict(self._txn_epochs)
        log.info(
            "loaded %d groups with offsets, %d group records and %d open transactions "
            "(%d records replayed from offset %d)",
            len(self.offsets),
            len(self.group_records),
            len(self.txn_offsets),
            replayed,
            replay_from,
        )

    @staticmethod
    def _entry(row: list[Any]) -> tuple[TopicPartition, OffsetAndMetadata, int]:
        t, p, o, e, m, ts, exp = row[:7]
        return TopicPartition(t, int(p)), OffsetAndMetadata(o, e, m, ts, exp), int(row[7]) if len(row) > 7 else -1

    @staticmethod
    def _row(tp: TopicPartition, om: OffsetAndMetadata, at: int) -> list[Any]:
        return [tp.topic, tp.partition, *om, at]

    def _restore(self, snap: dict[str, Any]) -> None:
        if snap.get("format") not in (1, SNAPSHOT_FORMAT):
            raise ValueError(f"unknown snapshot format {snap.get('format')!r}")
        self._clear()
        for group, rows in snap["offsets"].items():
            for row in rows:
                tp, om, at = self._entry(row)
                self.offsets.setdefault(group, {})[tp] = om
                self._record_offsets.setdefault(group, {})[tp] = at
        self.group_records = dict(snap["groups"])
        for pid, epoch, groups in snap.get("txns", []):
            pid = int(pid)
            self._txn_epochs[pid] = int(epoch)
            for group, rows in groups.items():
                for row in rows:
                    tp, om, at = self._entry(row)
                    self.txn_offsets.setdefault(pid, {}).setdefault(group, {})[tp] = (om, at)
                    self._open.setdefault(group, {}).setdefault(tp, set()).add(pid)

    # -- reads ------------------------------------------------------------------

    def get(self, group: str, tp: TopicPartition) -> OffsetAndMetadata | None:
        return self.offsets.get(group, {}).get(tp)

    def group_offsets(self, group: str) -> dict[TopicPartition, OffsetAndMetadata]:
        return self.offsets.get(group, {})

    def has_offsets(self, group: str) -> bool:
        return bool(self.offsets.get(group))

    def has_pending(self, group: str, tp: TopicPartition | None = None) -> bool:
        """True while a transaction holds durable pending offsets of ``group`` (for ``tp``)."""
        open_tps = self._open.get(group)
        if not open_tps:
            return False
        return tp is None or bool(open_tps.get(TopicPartition(*tp)))

    def pending_groups(self) -> list[str]:
        return list(self._open)

    def pending_partitions(self, group: str) -> list[TopicPartition]:
        return list(self._open.get(group, {}))

    def pending_offsets(self, producer_id: int) -> dict[str, dict[TopicPartition, OffsetAndMetadata]]:
        """The durable pending offsets of one producer, ``{group: {tp: offset}}`` (a copy)."""
        return {
            group: {tp: om for tp, (om, _at) in tps.items()}
            for group, tps in self.txn_offsets.get(producer_id, {}).items()
        }

    @property
    def pending_writes(self) -> int:
        return len(self._pending)

    # -- writes -----------------------------------------------------------------

    def _ops(self, group: str, offsets: Mapping[TopicPartition, Any]) -> list[Op]:
        now = self._clock()
        ops: list[Op] = []
        for tp, om in offsets.items():
            if not isinstance(om, OffsetAndMetadata):
                om = OffsetAndMetadata(*om)
            if om.commit_timestamp < 0:
                om = om._replace(commit_timestamp=now)
            ops.append(("o", group, TopicPartition(*tp), om))
        return ops

    def commit(self, group: str, offsets: Mapping[TopicPartition, Any]) -> Any:
        """Store ``{tp: (offset, leader_epoch, metadata)}`` (or OffsetAndMetadata).

        Returns None when already applied, else a future that resolves once
        the commit is durable and visible (or fails with the fsync error).
        """
        return self.write(self._ops(group, offsets))

    def txn_commit(self, group: str, producer_id: int, producer_epoch: int, offsets: Mapping[TopicPartition, Any]) -> Any:
        """A transactional commit: one transactional batch; pending (invisible) once durable.

        Returns None when already applied, else the durability future.
        Raises KafkaError(INVALID_PRODUCER_EPOCH) if the producer has pending
        offsets from a newer epoch.
        """
        if producer_id < 0:
            raise ValueError("a transactional commit needs a producer id")
        current = self._appended_epochs.get(producer_id)
        if current is not None and producer_epoch < current:
            raise KafkaError(
                ErrorCode.invalid_producer_epoch,
                f"producer {producer_id} epoch {producer_epoch} is older than its open transaction's {current}",
            )
        ops = self._ops(group, offsets)
        if not ops:
            return None
        epoch = max(producer_epoch, current if current is not None else producer_epoch)

        def appended() -> None:  # only once the batch is in the log: a failed append changes nothing
            self._appended_epochs[producer_id] = epoch

        return self._append(ops, producer_id, producer_epoch, appended=appended)

    def write_marker(
        self,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int = 0,
        transaction_version: int = 0,
    ) -> Any:
        """Append a COMMIT/ABORT control batch for ``producer_id``.

        Once it is durable the producer's pending offsets are made visible
        (commit) or dropped (abort). Returns None when already applied, else
        the durability future. A marker for a producer without pending
        offsets is written and changes nothing. While the producer has
        pending offsets, a marker epoch older than theirs (transaction
        version 0/1), or not newer (version 2, where EndTxn bumps the epoch:
        the KIP-890 defence against a delayed marker), raises
        KafkaError(INVALID_PRODUCER_EPOCH) and nothing is written, as
        Partition.write_marker does.
        """
        current = self._appended_epochs.get(producer_id)
        if current is not None and (
            producer_epoch < current or (transaction_version >= 2 and producer_epoch == current)
        ):
            raise KafkaError(
                ErrorCode.invalid_producer_epoch,
                f"marker epoch {producer_epoch} of producer {producer_id} is stale for its transaction's {current}",
            )
        return self._append([("m", bool(commit))], producer_id, producer_epoch, coordinator_epoch,
                            appended=lambda: self._appended_epochs.pop(producer_id, None))

    def delete_offsets(self, group: str, tps: Iterable[TopicPartition]) -> Any:
        return self.write([("o", group, TopicPartition(*tp), None) for tp in tps])

    def store_group(self, group: str, meta: dict[str, Any] | None) -> Any:
        return self.write([("g", group, meta)])

    def delete_group(self, group: str) -> Any:
        """Tombstones for every offset of ``group`` (visible or pending) and its metadata."""
        tps = dict.fromkeys(self.group_offsets(group))
        tps.update(dict.fromkeys(self.pending_partitions(group)))
        ops: list[Op] = [("o", group, tp, None) for tp in tps]
        if group in self.group_records or not ops:
            ops.append(("g", group, None))
        return self.write(ops)

    def write(self, ops: list[Op]) -> Any:
        if not ops:
            return None
        return self._append(ops, NO_PRODUCER_ID, -1)

    def _append(self, ops: list[Op], producer_id: int, producer_epoch: int, coordinator_epoch: int = 0,
                appended: Callable[[], Any] | None = None) -> Any:
        """Append ``ops`` as one batch; ``appended`` runs once it is in the log (not when the write failed
        before reaching it, e.g. ENOSPC), before it is applied."""
        self.writes += 1
        if self._log is None:
            if appended is not None:
                appended()
            base = self._mem_end
            self._mem_end += len(ops)
            for i, op in enumerate(ops):
                self._apply(op, base + i, producer_id, producer_epoch)
            return None
        now = self._clock()
        if ops[0][0] == "m":
            batch = encode_control_batch(producer_id, producer_epoch, ops[0][1], coordinator_epoch, timestamp_ms=now)
        elif producer_id >= 0:
            batch = encode_record_batch(
                [_encode(op) for op in ops],
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                is_transactional=True,
                base_timestamp=now,
            )
        else:
            batch = encode_record_batch([_encode(op) for op in ops], base_timestamp=now)
        try:
            info = self._log.append(batch, now)
        except OSError as exc:  # nothing was appended (a torn batch is cut off again)
            log.log(log_level(exc, logging.ERROR), "offsets log append failed: %s", exc)
            return _failed_write(exc)
        if appended is not None:
            appended()
        end = self._log.log_end_offset
        self._pending.append((end, info.base_offset, producer_id, producer_epoch, ops))
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
            _end, base, pid, epoch, ops = pending.popleft()
            for i, op in enumerate(ops):
                self._apply(op, base + i, pid, epoch)

    def _apply(self, op: Op, at: int = -1, producer_id: int = NO_PRODUCER_ID, producer_epoch: int = -1) -> None:
        kind = op[0]
        if kind == "o":
            _, group, tp, om = op
            if om is None:
                self._remove(group, tp)
            elif producer_id >= 0:
                self.txn_offsets.setdefault(producer_id, {}).setdefault(group, {})[tp] = (om, at)
                self._txn_epochs[producer_id] = max(producer_epoch, self._txn_epochs.get(producer_id, producer_epoch))
                self._open.setdefault(group, {}).setdefault(tp, set()).add(producer_id)
            else:
                self.offsets.setdefault(group, {})[tp] = om
                self._record_offsets.setdefault(group, {})[tp] = at
        elif kind == "m":
            self._complete_txn(producer_id, op[1])
        else:
            _, group, meta = op
            if meta is None:
                self.group_records.pop(group, None)
            else:
                self.group_records[group] = meta

    def _remove(self, group: str, tp: TopicPartition) -> None:
        """A tombstone: the visible offset and every producer's pending one go."""
        offsets = self.offsets.get(group)
        if offsets is not None and offsets.pop(tp, None) is not None:
            self._record_offsets[group].pop(tp, None)
            if not offsets:
                del self.offsets[group]
                del self._record_offsets[group]
        open_tps = self._open.get(group)
        if open_tps is None:
            return
        for pid in open_tps.pop(tp, ()):
            txn = self.txn_offsets.get(pid)
            if txn is None:
                continue
            tps = txn.get(group)
            if tps is not None:
                tps.pop(tp, None)
                if not tps:
                    del txn[group]
            if not txn:
                del self.txn_offsets[pid]
                self._txn_epochs.pop(pid, None)
        if not open_tps:
            del self._open[group]

    def _complete_txn(self, producer_id: int, commit: bool) -> None:
        txn = self.txn_offsets.pop(producer_id, None)
        self._txn_epochs.pop(producer_id, None)
        if txn is None:
            return  # nothing pending (e.g. a retried marker): harmless
        for group, tps in txn.items():
            open_tps = self._open.get(group, {})
            for tp, (om, at) in tps.items():
                pids = open_tps.get(tp)
                if pids is not None:
                    pids.discard(producer_id)
                    if not pids:
                        del open_tps[tp]
                if not commit:
                    continue
                current_at = self._record_offsets.get(group, {}).get(tp)
                # the most recent record wins over a plain commit written after this one
                if current_at is None or at > current_at:
                    self.offsets.setdefault(group, {})[tp] = om
                    self._record_offsets.setdefault(group, {})[tp] = at
            if not open_tps:
                self._open.pop(group, None)
        log.debug("%s transactional offsets of producer %d", "committed" if commit else "aborted", producer_id)

    # -- compaction -------------------------------------------------------------

    def maybe_snapshot(self, force: bool = False) -> bool:
        """Snapshot the live state and drop the log below it (see module doc)."""
        plog = self._log
        if plog is None or self._pending or self.offline:
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
                group: [self._row(tp, om, self._record_offsets[group].get(tp, -1)) for tp, om in offsets.items()]
                for group, offsets in self.offsets.items()
            },
            "groups": self.group_records,
            "txns": [
                [pid, self._txn_epochs.get(pid, -1),
                 {group: [self._row(tp, om, at) for tp, (om, at) in tps.items()] for group, tps in txn.items()}]
                for pid, txn in self.txn_offsets.items()
            ],  # fmt: skip
        }
        with plog.io("offsets store snapshot"):  # an OSError takes the log directory offline
            write_offset_named(plog.directory, end, SNAPSHOT_SUFFIX, json.dumps(snap, separators=(",", ":")).encode(),
                               SNAPSHOTS_KEPT)
        plog.delete_records_before(end)
        self.snapshots += 1
        log.info(
            "offsets store snapshot at %d (%d groups with offsets, %d open transactions)",
            end,
            len(self.offsets),
            len(self.txn_offsets),
        )
        return True

    def abandon(self) -> None:
        """Close without writing (the log directory failed)."""
        if self._log is not None:
            self._log.abandon()

    def close(self) -> None:
        if self._log is None:
            return
        if self.offline:  # nothing more is written to a failed directory
            self._log.abandon()
            return
        try:
            self.maybe_snapshot(force=True)
        except OSError as exc:
            log.log(log_level(exc, logging.ERROR), "offsets snapshot at shutdown failed: %s", exc)
        self._log.close()
