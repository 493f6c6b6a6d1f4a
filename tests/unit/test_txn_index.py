"""The per-segment aborted-transaction index (.txnindex) and its place in the log."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from oncelog.protocol.records import Record, encode_control_batch, encode_record_batch
from oncelog.storage.config import LogConfig
from oncelog.storage.log import PartitionLog
from oncelog.storage.txn_index import ENTRY_SIZE, TXNINDEX_SUFFIX, AbortedTxn, TransactionIndex

T0 = 1_700_000_000_000


def _names(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.endswith(TXNINDEX_SUFFIX))


def test_entry_layout_is_kafkas_34_bytes(tmp_path: Path) -> None:
    idx = TransactionIndex(tmp_path / "00000000000000000000.txnindex", 0)
    idx.append(AbortedTxn(producer_id=7, first_offset=3, last_offset=10, last_stable_offset=11))
    raw = (tmp_path / "00000000000000000000.txnindex").read_bytes()
    assert ENTRY_SIZE == 34
    assert raw == struct.pack(">hqqqq", 0, 7, 3, 10, 11)


def test_file_is_created_lazily_and_reloads(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000100.txnindex"
    idx = TransactionIndex(path, 100)
    assert not path.exists() and idx.collect(0, 1000) == ([], False)
    entries = [AbortedTxn(1, 90, 100, 95), AbortedTxn(2, 95, 120, 121), AbortedTxn(1, 125, 130, 131)]
    for e in entries:
        idx.append(e)
    idx.sync()
    idx.close()
    assert path.stat().st_size == 3 * ENTRY_SIZE
    again = TransactionIndex(path, 100)
    assert again.entries == entries


def test_append_needs_increasing_last_offsets_and_changes_nothing_when_refused(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.txnindex"
    idx = TransactionIndex(path, 0)
    idx.append(AbortedTxn(1, 0, 10, 11))
    for bad in (AbortedTxn(2, 5, 10, 11), AbortedTxn(2, 5, 9, 11)):
        with pytest.raises(ValueError):
            idx.append(bad)
    assert len(idx) == 1 and path.stat().st_size == ENTRY_SIZE


def test_collect_overlap_and_completion(tmp_path: Path) -> None:
    idx = TransactionIndex(tmp_path / "x.txnindex", 0)
    # (pid, first, last, lso): lso = first offset of the oldest other open txn at abort time
    idx.append(AbortedTxn(1, 0, 5, 3))
    idx.append(AbortedTxn(2, 3, 8, 9))
    idx.append(AbortedTxn(3, 9, 12, 13))
    found, complete = idx.collect(6, 9)
    assert [t.producer_id for t in found] == [2] and complete  # lso 9 >= upper 9: stop
    found, complete = idx.collect(0, 4)
    assert [t.producer_id for t in found] == [1, 2] and complete
    found, complete = idx.collect(0, 100)
    assert [t.producer_id for t in found] == [1, 2, 3] and not complete
    found, _ = idx.collect(13, 100)  # every marker is below the fetch offset
    assert found == []


def test_truncate_drops_entries_at_or_above_offset(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.txnindex"
    idx = TransactionIndex(path, 0)
    for i in range(4):
        idx.append(AbortedTxn(i, i * 10, i * 10 + 5, i * 10 + 6))
    assert idx.truncate(15) == 3  # last offsets 15, 25 and 35 go
    assert [t.last_offset for t in idx.entries] == [5]
    assert path.stat().st_size == ENTRY_SIZE
    idx.append(AbortedTxn(9, 16, 17, 18))  # appends continue after the cut
    idx.close()
    assert [t.last_offset for t in TransactionIndex(path, 0).entries] == [5, 17]
    assert TransactionIndex(path, 0).truncate(100) == 0


def test_torn_or_zero_filled_tail_is_cut_on_load(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000010.txnindex"
    good = [AbortedTxn(1, 10, 12, 13), AbortedTxn(2, 11, 14, 15)]
    path.write_bytes(b"".join(t.pack() for t in good) + bytes(ENTRY_SIZE) + b"\x00\x01\x02")
    idx = TransactionIndex(path, 10)
    assert idx.entries == good  # the zero entry (last offset 0 < base 10) and the partial bytes are dropped
    assert path.stat().st_size == 2 * ENTRY_SIZE
    path.write_bytes(good[1].pack() + good[0].pack())  # decreasing last offsets: cut after the first
    assert TransactionIndex(path, 10).entries == [good[1]]


# --- in the log ------------------------------------------------------------------------


def _data(n: int = 2) -> bytes:
    return encode_record_batch([Record(b"k", b"v" * 40) for _ in range(n)], base_timestamp=T0)


def _marker(pid: int) -> bytes:
    return encode_control_batch(pid, 0, False, 0, timestamp_ms=T0)


def _log_with_aborts(d: Path, roll_last: bool = True, **cfg: object) -> tuple[PartitionLog, list[AbortedTxn]]:
    """Three segments (then an empty active one), an abort marker in each; returns the log and its entries."""
    log = PartitionLog.open(d, LogConfig(segment_bytes=1000, **cfg), T0)  # type: ignore[arg-type]
    entries = []
    for pid in range(3):
        first = log.append(_data(), T0).base_offset
        log.append(_data(), T0)
        m = log.append_control(_marker(pid), T0).base_offset
        entries.append(AbortedTxn(pid, first, m, m + 1))
        log.append_aborted_txn(entries[-1])
        if pid < 2 or roll_last:
            log.roll()
    return log, entries


def test_log_collects_from_the_fetch_segment_on(tmp_path: Path) -> None:
    log, entries = _log_with_aborts(tmp_path / "t-0")
    assert len(log.segments) == 4 and len(_names(tmp_path / "t-0")) == 3
    assert log.collect_aborted_txns(0, 1 << 40) == entries
    second = entries[1]
    assert log.collect_aborted_txns(second.first_offset, second.last_offset) == [second]
    assert log.collect_aborted_txns(entries[2].last_offset + 1, 1 << 40) == []
    # the search stops at the first entry whose last stable offset reaches the upper bound
    assert log.collect_aborted_txns(0, entries[0].last_offset) == [entries[0]]


def test_entries_go_to_the_segment_holding_the_marker(tmp_path: Path) -> None:
    log, entries = _log_with_aborts(tmp_path / "t-0")
    for seg, entry in zip(log.segments, entries):
        assert seg.txn_index.entries == [entry]
    with pytest.raises(ValueError):
        log.append_aborted_txn(AbortedTxn(9, 0, log.log_end_offset + 5, 0))


def test_truncate_across_segments_and_reload_after_clean_close(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    log, entries = _log_with_aborts(d)
    assert log.truncate_txn_indexes(entries[1].last_offset) == 2
    log.close()
    log2 = PartitionLog.open(d, LogConfig(segment_bytes=1000), T0)
    assert log2.collect_aborted_txns(0, 1 << 40) == entries[:1]


def test_txnindex_deleted_with_segment_by_retention(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    log, entries = _log_with_aborts(d, retention_bytes=0)
    log.sync()
    before = _names(d)
    assert len(before) == 3
    assert log.apply_retention(T0) >= 3
    assert _names(d) == []
    assert log.collect_aborted_txns(log.log_start_offset, 1 << 40) == []


def test_delete_records_before_drops_whole_segments_with_their_txnindex(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    log, entries = _log_with_aborts(d)
    log.delete_records_before(log.segments[2].base_offset)
    assert len(_names(d)) == 1
    assert log.collect_aborted_txns(log.log_start_offset, 1 << 40) == entries[2:]


def test_open_drops_entries_past_recovered_end_and_orphans(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    log, entries = _log_with_aborts(d, roll_last=False)
    last_seg = log.segments[2]
    log.sync()
    for seg in log.segments:  # crash: no clean shutdown
        seg.close()
    # the last marker's bytes never reached the disk, but its index entry did
    os.truncate(last_seg.log_path, last_seg.size - len(_marker(2)))
    (d / "00000000000000099999.txnindex").write_bytes(entries[0].pack())  # no such segment
    log2 = PartitionLog.open(d, LogConfig(segment_bytes=1000), T0)
    assert log2.log_end_offset == entries[2].last_offset
    assert log2.collect_aborted_txns(0, 1 << 40) == entries[:2]
    assert not (d / "00000000000000099999.txnindex").exists()


def test_sync_txn_indexes_clears_dirty_state(tmp_path: Path) -> None:
    log, _entries = _log_with_aborts(tmp_path / "t-0")
    assert any(seg.txn_index.dirty for seg in log.segments)
    log.sync_txn_indexes()
    assert not any(seg.txn_index.dirty for seg in log.segments)
    log.truncate_txn_indexes(0)
    assert any(seg.txn_index.dirty for seg in log.segments)
