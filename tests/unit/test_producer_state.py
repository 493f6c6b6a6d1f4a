"""The pure idempotence and transaction rules (check_batch, check_marker), the table, ids and snapshots."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from oncelog.broker.partition import Partition
from oncelog.broker.producer_ids import ProducerIdManager
from oncelog.broker.producer_state import (
    BATCH_WINDOW,
    INT32_MAX,
    Accept,
    BatchMeta,
    CompletedTxn,
    Duplicate,
    Incoming,
    MarkerAccept,
    ProducerEntry,
    ProducerStateTable,
    Reject,
    check_batch,
    check_marker,
    has_ongoing_txn,
    last_sequence,
)
from oncelog.protocol.errors import ErrorCode, KafkaError
from oncelog.protocol.records import Record, encode_record_batch, parse_batch_header
from oncelog.storage.config import LogConfig
from oncelog.storage.log import PartitionLog

PID = 7


def _run(batches: list[tuple[int, int, int]], entry: ProducerEntry | None = None) -> tuple[ProducerEntry | None, list]:
    """Feed (epoch, first_seq, count) batches; commit accepted ones at growing offsets."""
    offset = 0 if entry is None else entry.last_offset + 1
    out = []
    for epoch, seq, count in batches:
        d = check_batch(entry, Incoming(PID, epoch, seq, count))
        out.append(d)
        if isinstance(d, Accept):
            entry = d.entry_after(offset, offset + count - 1, now_ms=1000 + offset)
            offset += count
    return entry, out


def test_in_order_batches_are_accepted_and_window_keeps_last_five() -> None:
    entry, out = _run([(0, i * 2, 2) for i in range(8)])
    assert all(isinstance(d, Accept) for d in out)
    assert entry is not None and entry.last_seq == 15
    assert len(entry.batches) == BATCH_WINDOW
    assert [b.first_seq for b in entry.batches] == [6, 8, 10, 12, 14]


def test_duplicate_of_each_of_last_five_returns_original_offsets() -> None:
    entry, _ = _run([(0, i * 2, 2) for i in range(8)])
    for b in entry.batches:
        d = check_batch(entry, Incoming(PID, 0, b.first_seq, 2))
        assert isinstance(d, Duplicate)
        assert d.batch.first_offset == b.first_offset == b.first_seq  # offsets follow seqs here


def test_sixth_oldest_batch_is_no_longer_a_duplicate() -> None:
    entry, _ = _run([(0, i * 2, 2) for i in range(6)])
    assert [b.first_seq for b in entry.batches] == [2, 4, 6, 8, 10]
    d = check_batch(entry, Incoming(PID, 0, 0, 2))  # the evicted first batch
    assert isinstance(d, Reject) and d.code == ErrorCode.out_of_order_sequence_number
    d = check_batch(entry, Incoming(PID, 0, 2, 2))  # oldest still cached
    assert isinstance(d, Duplicate)


def test_sequence_gap_is_out_of_order() -> None:
    entry, _ = _run([(0, 0, 3)])
    d = check_batch(entry, Incoming(PID, 0, 4, 1))
    assert isinstance(d, Reject) and d.code == ErrorCode.out_of_order_sequence_number
    assert "expected 3" in d.message


def test_partial_overlap_is_out_of_order_not_duplicate() -> None:
    entry, _ = _run([(0, 0, 3)])
    d = check_batch(entry, Incoming(PID, 0, 0, 2))
    assert isinstance(d, Reject) and d.code == ErrorCode.out_of_order_sequence_number


def test_older_epoch_is_fenced() -> None:
    entry, _ = _run([(3, 0, 1)])
    d = check_batch(entry, Incoming(PID, 2, 1, 1))
    assert isinstance(d, Reject) and d.code == ErrorCode.invalid_producer_epoch


def test_new_epoch_must_start_at_zero() -> None:
    entry, _ = _run([(0, 0, 5)])
    bad = check_batch(entry, Incoming(PID, 1, 5, 1))
    assert isinstance(bad, Reject) and bad.code == ErrorCode.out_of_order_sequence_number
    good = check_batch(entry, Incoming(PID, 1, 0, 1))
    assert isinstance(good, Accept)
    bumped = good.entry_after(10, 10, 0)
    assert bumped.epoch == 1 and [b.first_seq for b in bumped.batches] == [0]


@pytest.mark.parametrize("epoch, seq", [(0, 0), (0, 12345), (7, 3), (32766, INT32_MAX)])
def test_unknown_producer_accepts_any_epoch_and_sequence(epoch: int, seq: int) -> None:
    # Kafka's checkSequence: no state (new, expired, or a data dir replaced) ->
    # any epoch and sequence are accepted, and the batch starts the entry
    d = check_batch(None, Incoming(PID, epoch, seq, 2))
    assert isinstance(d, Accept)
    entry = d.entry_after(0, 1, 0)
    assert entry.epoch == epoch and entry.last_seq == last_sequence(seq, 2)


def test_sequence_wraps_at_int32_max() -> None:
    first = INT32_MAX - 1
    assert last_sequence(first, 2) == INT32_MAX
    assert last_sequence(first, 4) == 1
    entry, out = _run([(0, first, 2), (0, 0, 3)])
    assert all(isinstance(d, Accept) for d in out)
    assert entry.last_seq == 2
    entry2, out2 = _run([(0, first, 4)])
    assert entry2.last_seq == 1
    assert isinstance(check_batch(entry2, Incoming(PID, 0, 2, 1)), Accept)
    assert isinstance(check_batch(entry2, Incoming(PID, 0, first, 4)), Duplicate)


def test_table_bounds_memory_lru_and_expires_idle() -> None:
    table = ProducerStateTable(max_producers=3)
    for pid in range(5):
        table.put(ProducerEntry(pid, 0, (), last_timestamp=pid * 100))
    assert [e.producer_id for e in table] == [2, 3, 4]
    gone = table.expire(now_ms=450, expiration_ms=100)
    assert gone == [2, 3]
    assert [e.producer_id for e in table] == [4]


def test_snapshot_roundtrip() -> None:
    entry, _ = _run([(2, i, 1) for i in range(7)])
    table = ProducerStateTable()
    table.put(entry)
    again = ProducerStateTable.from_bytes(table.to_bytes())
    assert again.get(PID) == entry
    with pytest.raises(ValueError):
        ProducerStateTable.from_bytes(b'{"version": 99, "producers": []}')


def test_producer_ids_are_never_reused_across_restarts(tmp_path: Path) -> None:
    m = ProducerIdManager(tmp_path)
    first = [m.generate() for _ in range(5)]
    assert first == [0, 1, 2, 3, 4]
    assert m.was_issued(4) and not m.was_issued(5)
    m2 = ProducerIdManager(tmp_path)  # "crash": the rest of the block is skipped
    nxt = m2.generate()
    assert nxt > max(first)
    assert m2.was_issued(4) and m2.was_issued(nxt)


def test_init_idempotent_always_a_fresh_id_with_epoch_0(tmp_path: Path) -> None:
    # Kafka's coordinator answers an InitProducerId without transactional id
    # with a new producer id, whatever (id, epoch) the producer still holds
    m = ProducerIdManager(tmp_path)
    a = m.init_idempotent()
    b = m.init_idempotent()
    assert a.epoch == 0 and b.epoch == 0
    assert b.producer_id > a.producer_id


def _batch(pid: int, epoch: int, seq: int, n: int) -> bytes:
    return encode_record_batch(
        [Record(key=None, value=b"v%d" % i) for i in range(n)], producer_id=pid, producer_epoch=epoch, base_sequence=seq
    )


def test_partition_dedup_survives_unclean_restart_by_replay(tmp_path: Path) -> None:
    ids = ProducerIdManager(tmp_path / "meta")
    pid = ids.generate()
    cfg = LogConfig(segment_bytes=400)  # several rolls -> snapshots at rolls
    log = PartitionLog.open(tmp_path / "t-0", cfg, 0)
    part = Partition("t", 0, None, log)
    offsets = []
    for i in range(12):
        raw = _batch(pid, 0, i * 3, 3)
        base, _ = part.append_batch(raw, parse_batch_header(raw), 1000, ids)
        offsets.append(base)
    assert offsets == [i * 3 for i in range(12)]
    assert list((tmp_path / "t-0").glob("*.snapshot")), "a roll writes a producer snapshot"
    log.sync()
    # no clean close: reopen from disk (snapshot at last roll + replay of the tail)
    log2 = PartitionLog.open(tmp_path / "t-0", cfg, 0)
    part2 = Partition("t", 0, None, log2)
    retry = _batch(pid, 0, 33, 3)  # the last acknowledged batch, retried
    base, _ = part2.append_batch(retry, parse_batch_header(retry), 2000, ids)
    assert base == 33
    assert log2.log_end_offset == 36, "a duplicate writes nothing"
    nxt = _batch(pid, 0, 36, 1)
    assert part2.append_batch(nxt, parse_batch_header(nxt), 2000, ids)[0] == 36
    gap = _batch(pid, 0, 40, 1)
    with pytest.raises(KafkaError) as exc:
        part2.append_batch(gap, parse_batch_header(gap), 2000, ids)
    assert exc.value.code == ErrorCode.out_of_order_sequence_number
    assert log2.log_end_offset == 37, "a rejected batch writes nothing"


def test_partition_accepts_a_producer_id_it_never_issued_at_any_sequence(tmp_path: Path) -> None:
    # Kafka never answers UNKNOWN_PRODUCER_ID for a producer it has no state for:
    # a client still holding an id after the data dir was replaced keeps working
    ids = ProducerIdManager(tmp_path / "meta")
    part = Partition("t", 0, None, PartitionLog.open(tmp_path / "t-0", LogConfig(), 0))
    raw = _batch(424242, 3, 17, 2)
    assert part.append_batch(raw, parse_batch_header(raw), 0, ids)[0] == 0
    nxt = _batch(424242, 3, 19, 1)  # then the usual rules: in sequence...
    assert part.append_batch(nxt, parse_batch_header(nxt), 0, ids)[0] == 2
    assert part.append_batch(raw, parse_batch_header(raw), 0, ids)[0] == 0  # ...duplicates...
    gap = _batch(424242, 3, 25, 1)
    with pytest.raises(KafkaError) as exc:  # ...and gaps
        part.append_batch(gap, parse_batch_header(gap), 0, ids)
    assert exc.value.code == ErrorCode.out_of_order_sequence_number
    assert part.log.log_end_offset == 3


# --- transactions (pure rules) ---------------------------------------------------------


def _txn(entry: ProducerEntry | None, epoch: int, seq: int, n: int, offset: int, txn: bool = True):
    d = check_batch(entry, Incoming(PID, epoch, seq, n, txn))
    return d, (d.entry_after(offset, offset + n - 1, 0) if isinstance(d, Accept) else entry)


def test_first_transactional_batch_opens_txn_and_later_ones_join() -> None:
    _, e = _txn(None, 0, 0, 2, offset=10)
    assert e.current_txn_first_offset == 10
    _, e = _txn(e, 0, 2, 3, offset=20)
    assert e.current_txn_first_offset == 10 and e.last_seq == 4
    assert has_ongoing_txn(e, 0) and not has_ongoing_txn(e, 1) and not has_ongoing_txn(None, 0)


def test_non_transactional_batch_during_open_txn_is_invalid_txn_state() -> None:
    _, e = _txn(None, 0, 0, 2, offset=0)
    d = check_batch(e, Incoming(PID, 0, 2, 1, is_transactional=False))
    assert isinstance(d, Reject) and d.code == ErrorCode.invalid_txn_state
    idem, _ = _run([(0, 0, 2)])  # no open txn: idempotent batches are fine
    assert isinstance(check_batch(idem, Incoming(PID, 0, 2, 1)), Accept)


def _open_entry(epoch: int = 3, coordinator_epoch: int = 5) -> ProducerEntry:
    _, e = _txn(None, epoch, 0, 2, offset=100)
    return replace(e, coordinator_epoch=coordinator_epoch)


@pytest.mark.parametrize("tv", [0, 1])
def test_classic_marker_epoch_rule(tv: int) -> None:
    e = _open_entry(epoch=3)
    bad = check_marker(e, 2, 5, tv)
    assert isinstance(bad, Reject) and bad.code == ErrorCode.invalid_producer_epoch
    ok = check_marker(e, 3, 5, tv)
    assert isinstance(ok, MarkerAccept) and ok.open_txn_first_offset == 100
    after = ok.entry_after(now_ms=9)
    assert after.current_txn_first_offset == -1 and after.epoch == 3
    assert after.batches == e.batches, "the same epoch keeps the duplicate window"
    assert ok.completed(110, commit=False) == CompletedTxn(PID, 100, 110, aborted=True)
    assert isinstance(check_marker(e, 4, 5, tv), MarkerAccept)  # a newer epoch is accepted


def test_tv2_marker_needs_a_bumped_epoch_except_an_idempotent_retry() -> None:
    e = _open_entry(epoch=3)
    for epoch in (2, 3):  # <= current while the txn is open
        d = check_marker(e, epoch, 5, 2)
        assert isinstance(d, Reject) and d.code == ErrorCode.invalid_producer_epoch
    ok = check_marker(e, 4, 5, 2)
    assert isinstance(ok, MarkerAccept)
    done = ok.entry_after(now_ms=9)
    assert done.epoch == 4 and done.batches == () and done.coordinator_epoch == 5
    retry = check_marker(done, 4, 5, 2)  # same epoch, nothing open: written again
    assert isinstance(retry, MarkerAccept) and retry.completed(120, True) is None
    stale = check_marker(done, 3, 5, 2)
    assert isinstance(stale, Reject) and stale.code == ErrorCode.invalid_producer_epoch


def test_marker_from_older_coordinator_epoch_is_fenced() -> None:
    e = _open_entry(epoch=3, coordinator_epoch=5)
    d = check_marker(e, 3, 4, 0)
    assert isinstance(d, Reject) and d.code == ErrorCode.transaction_coordinator_fenced
    assert isinstance(check_marker(e, 3, 5, 0), MarkerAccept)
    assert isinstance(check_marker(e, 3, 6, 0), MarkerAccept)


def test_marker_for_unknown_producer_creates_an_entry_expecting_sequence_zero() -> None:
    ok = check_marker(None, 2, 1, 2, producer_id=PID)
    assert isinstance(ok, MarkerAccept) and ok.completed(5, False) is None
    e = ok.entry_after(now_ms=1)
    assert (e.producer_id, e.epoch, e.coordinator_epoch) == (PID, 2, 1)
    bad = check_batch(e, Incoming(PID, 2, 7, 1, True))
    assert isinstance(bad, Reject) and bad.code == ErrorCode.out_of_order_sequence_number
    assert isinstance(check_batch(e, Incoming(PID, 2, 0, 1, True)), Accept)


def test_table_tracks_open_and_undecided_transactions() -> None:
    t = ProducerStateTable()
    for pid, first in ((1, 10), (2, 5), (3, 20)):
        t.put(ProducerEntry(pid, 0, (BatchMeta(0, 0, first, first, 0),), current_txn_first_offset=first))
    assert t.open_transactions() == [(2, 5), (1, 10), (3, 20)]
    assert t.first_undecided_offset() == 5
    assert t.next_incomplete_first_offset(2) == 10
    done = t.complete(check_marker(t.get(2), 0, 0, 0), 30, commit=True, now_ms=0)
    assert done == CompletedTxn(2, 5, 30, aborted=False)
    assert t.open_transactions() == [(1, 10), (3, 20)]
    assert t.first_undecided_offset() == 5, "the marker is not below the high watermark yet"
    t.on_high_watermark(30)
    assert t.first_undecided_offset() == 5
    t.on_high_watermark(31)
    assert t.first_undecided_offset() == 10


def test_lru_never_evicts_a_producer_with_an_open_txn() -> None:
    t = ProducerStateTable(max_producers=2)
    t.put(ProducerEntry(1, 0, (), current_txn_first_offset=0))
    for pid in (2, 3, 4):
        t.put(ProducerEntry(pid, 0, ()))
    assert sorted(e.producer_id for e in t) == [1, 4]
    assert t.open_transactions() == [(1, 0)]
    assert t.expire(now_ms=10**12, expiration_ms=1) == [4]


def test_snapshot_keeps_open_txns_and_reads_version_1_without_txn_fields() -> None:
    t = ProducerStateTable()
    t.put(ProducerEntry(1, 0, (BatchMeta(0, 1, 40, 41, 0),), 7, coordinator_epoch=3, current_txn_first_offset=40))
    t.put(ProducerEntry(2, 0, (BatchMeta(0, 1, 10, 11, 0),), 7, current_txn_first_offset=10))
    again = ProducerStateTable.from_bytes(t.to_bytes())
    assert again.open_transactions() == [(2, 10), (1, 40)]
    assert again.get(1) == t.get(1)
    old = json.dumps({"version": 1, "producers": [{"pid": 5, "epoch": 1, "ts": 3, "batches": [[0, 0, 0, 0, 3]]}]})
    legacy = ProducerStateTable.from_bytes(old.encode())
    assert legacy.get(5) == ProducerEntry(5, 1, (BatchMeta(0, 0, 0, 0, 3),), 3)
    assert legacy.open_transactions() == []


# --- snapshots across rolls, retention and the log start offset -------------------------------


def _snapshot_offsets(d: Path) -> list[int]:
    return sorted(int(p.name.split(".")[0]) for p in d.glob("*.snapshot"))


class _Writer:
    """A partition in ``root/t-0`` written by one transactional and one idempotent producer."""

    def __init__(self, root: Path, cfg: LogConfig) -> None:
        self.root, self.cfg = root, cfg
        self.ids = ProducerIdManager(root / "meta")
        self.part = Partition("t", 0, None, PartitionLog.open(root / "t-0", cfg, 0))
        self.txn_pid, self.idem_pid = self.ids.generate(), self.ids.generate()
        self.seq = {self.txn_pid: 0, self.idem_pid: 0}

    def send(self, pid: int, now: int, txn: bool = False) -> int:
        raw = encode_record_batch([Record(key=None, value=b"x" * 40)], producer_id=pid, producer_epoch=0,
                                  base_sequence=self.seq[pid], is_transactional=txn, base_timestamp=now)
        base, _ = self.part.append_batch(raw, parse_batch_header(raw), now, self.ids)
        self.seq[pid] += 1
        return base

    def durable(self) -> None:
        self.part.log.sync()
        self.part.advance_high_watermark(self.part.log.log_end_offset)

    def crash_and_reopen(self) -> Partition:
        for seg in self.part.log.segments:
            seg.close()
        self.part = Partition("t", 0, None, PartitionLog.open(self.root / "t-0", self.cfg, 0))
        return self.part


def _stale_setup(tmp_path: Path, cfg: LogConfig) -> tuple[_Writer, int]:
    """A transaction opens at 0 and stays open across an append roll (its snapshot), then
    commits; the idempotent producer writes after the last snapshot. Returns (writer, log end)."""
    w = _Writer(tmp_path, cfg)
    w.send(w.txn_pid, 1000, txn=True)
    while not _snapshot_offsets(tmp_path / "t-0"):
        w.send(w.idem_pid, 1000)
    w.part.write_marker(w.txn_pid, 0, 0, True, 1000)
    w.send(w.idem_pid, 1000)
    w.durable()
    assert w.part.open_transactions() == [] and w.part.last_stable_offset == w.part.log.log_end_offset
    assert max(_snapshot_offsets(tmp_path / "t-0")) < w.part.log.log_end_offset - 2  # before the marker
    return w, w.part.log.log_end_offset


def test_retention_roll_snapshots_producer_state_and_drops_deleted_segments_snapshots(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    w, end = _stale_setup(tmp_path, LogConfig(segment_bytes=300, retention_ms=1000))
    before = _snapshot_offsets(d)
    bases = [s.base_offset for s in w.part.log.segments]
    assert set(before) <= set(bases)
    assert w.part.log.apply_retention(10_000) == len(bases)  # every segment expired: roll, then delete
    assert [s.base_offset for s in w.part.log.segments] == [end] == [w.part.log_start_offset]
    # the retention roll wrote a snapshot at the new segment; those of the deleted segments are gone
    assert _snapshot_offsets(d) == [end]
    snap = ProducerStateTable.from_bytes((d / f"{end:020d}.snapshot").read_bytes())
    assert snap.get(w.txn_pid).current_txn_first_offset == -1
    assert snap.get(w.idem_pid).last_seq == w.seq[w.idem_pid] - 1


def test_segment_ms_roll_snapshots_producer_state(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    w = _Writer(tmp_path, LogConfig(segment_ms=1000))
    w.send(w.idem_pid, 0)
    w.send(w.idem_pid, 0)
    assert _snapshot_offsets(d) == []
    assert w.part.log.maybe_roll(5000)
    assert _snapshot_offsets(d) == [2]
    assert ProducerStateTable.from_bytes((d / f"{2:020d}.snapshot").read_bytes()).get(w.idem_pid).last_seq == 1


def test_delete_records_drops_the_snapshots_of_deleted_segments(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    w = _Writer(tmp_path, LogConfig(segment_bytes=300))
    for _ in range(12):
        w.send(w.idem_pid, 1000)
    snaps = _snapshot_offsets(d)
    assert len(snaps) == 2  # the newest two are kept
    w.part.log.delete_records_before(snaps[1])  # deletes the segment starting at snaps[0]
    assert _snapshot_offsets(d) == [snaps[1]]


@pytest.mark.parametrize("at", ["below", "at"])
def test_snapshot_at_or_below_log_start_is_ignored_on_load(tmp_path: Path, at: str) -> None:
    """A stale snapshot (open transaction, old sequence) left at or below the log start is not
    loaded: the finished transaction does not come back and the sequence goes on."""
    d = tmp_path / "t-0"
    w, end = _stale_setup(tmp_path, LogConfig(segment_bytes=300, retention_ms=1000))
    stale_offset = min(_snapshot_offsets(d))
    stale = (d / f"{stale_offset:020d}.snapshot").read_bytes()
    assert ProducerStateTable.from_bytes(stale).get(w.txn_pid).current_txn_first_offset == 0
    w.part.log.apply_retention(10_000)
    # what an older version left behind: the stale snapshot, below or exactly at the log start
    target = stale_offset if at == "below" else end
    (d / f"{target:020d}.snapshot").write_bytes(stale)
    part = w.crash_and_reopen()
    assert part.open_transactions() == []
    assert part.last_stable_offset == part.high_watermark == end
    assert [o for o in _snapshot_offsets(d) if o <= end] == []
    w.part = part
    assert w.send(w.txn_pid, 20_000, txn=True) == end  # a new transaction ...
    part.write_marker(w.txn_pid, 0, 0, True, 20_000)
    assert w.send(w.idem_pid, 20_000) == end + 2  # ... and the idempotent producer's next sequence
    w.durable()
    assert part.last_stable_offset == part.high_watermark == end + 3


def test_recovery_cutting_a_middle_segment_keeps_producer_state_consistent(tmp_path: Path) -> None:
    """Recovery cuts a middle segment and deletes those after it: the snapshots and the aborted
    transactions beyond the new end go too, and the producer state is the one at the cut."""
    d = tmp_path / "t-0"
    w = _Writer(tmp_path, LogConfig(segment_bytes=300))
    w.send(w.txn_pid, 1000, txn=True)  # offset 0: a transaction opens
    for _ in range(8):
        w.send(w.idem_pid, 1000)
    abort_at = w.part.write_marker(w.txn_pid, 0, 0, False, 1000)
    for _ in range(8):
        w.send(w.idem_pid, 1000)
    w.durable()
    assert w.part.aborted_transactions(0, 1 << 60) == [(w.txn_pid, 0)]
    segs = w.part.log.segments
    assert len(segs) >= 4 and segs[1].base_offset < abort_at
    middle = segs[1]
    assert _snapshot_offsets(d) and min(_snapshot_offsets(d)) > middle.base_offset
    first_size = parse_batch_header(middle.read_batch(0, 61)).size
    for seg in segs:
        seg.close()
    with open(middle.log_path, "r+b") as f:  # corrupt its second batch
        f.seek(first_size + 70)
        f.write(b"\xff\xff\xff\xff")
    part = Partition("t", 0, None, PartitionLog.open(d, w.cfg, 0))
    cut = middle.base_offset + 1
    assert [s.base_offset for s in part.log.segments] == [0, middle.base_offset]
    assert part.log.log_end_offset == cut
    assert [o for o in _snapshot_offsets(d) if o > cut] == []
    assert part.aborted_transactions(0, 1 << 60) == []  # the ABORT marker was cut off
    assert part.open_transactions() == [(w.txn_pid, 0)]  # so the transaction is open again
    assert part.producers.get(w.idem_pid).last_seq == cut - 2  # offsets 1..cut-1 are its batches 0..
    w.part = part
    w.seq[w.idem_pid] = cut - 1
    assert w.send(w.idem_pid, 2000) == cut  # the next sequence after the cut is accepted there
