"""The offsets store's producer-epoch bookkeeping of transactional offset commits (the epoch a later
TxnOffsetCommit or marker is checked against) changes only once the batch is in the log: a write that
fails before reaching it (ENOSPC) leaves it as it was (review L4)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from oncelog.broker.group import OffsetAndMetadata, OffsetStore, TopicPartition
from oncelog.protocol.errors import KafkaError

TP = TopicPartition("t", 0)
PID = 1000


def _store(tmp_path: Path) -> OffsetStore:
    return OffsetStore.open(tmp_path, None, lambda: 1_000)  # no durability hook: each append synced and applied


def _disk_full(store: OffsetStore, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(*_a: Any, **_k: Any) -> Any:
        raise OSError(28, "No space left on device")

    assert store._log is not None
    monkeypatch.setattr(store._log, "append", full)


def test_failed_txn_commit_keeps_the_epoch_a_marker_is_checked_against(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Pending offsets of epoch 4; a TxnOffsetCommit at epoch 5 whose append fails (ENOSPC) wrote nothing, so
    the epoch-4 transaction's marker is still accepted and completes it (the failed append had recorded epoch
    5, and the marker was refused INVALID_PRODUCER_EPOCH, leaving the offsets pending)."""
    store = _store(tmp_path)
    try:
        store.txn_commit("g", PID, 4, {TP: OffsetAndMetadata(7)})
        assert store.has_pending("g", TP)
        _disk_full(store, monkeypatch)
        with pytest.raises(OSError):
            store.txn_commit("g", PID, 5, {TP: OffsetAndMetadata(9)})
        monkeypatch.undo()
        store.write_marker(PID, 4, commit=True)
        assert not store.has_pending("g", TP) and store.get("g", TP).offset == 7
    finally:
        store.close()


def test_failed_marker_keeps_the_epoch_a_stale_commit_is_refused_by(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Pending offsets of epoch 5; their marker's append fails (ENOSPC), so they are still pending and a
    TxnOffsetCommit of an older epoch is still refused (the failed marker had dropped the epoch, and the
    zombie's commit was accepted beside the newer transaction's offsets)."""
    store = _store(tmp_path)
    try:
        store.txn_commit("g", PID, 5, {TP: OffsetAndMetadata(7)})
        _disk_full(store, monkeypatch)
        with pytest.raises(OSError):
            store.write_marker(PID, 5, commit=True)
        monkeypatch.undo()
        assert store.has_pending("g", TP)
        with pytest.raises(KafkaError, match="older than its open transaction's 5"):
            store.txn_commit("g", PID, 3, {TP: OffsetAndMetadata(1)})
        store.write_marker(PID, 5, commit=True)
        assert store.get("g", TP).offset == 7
    finally:
        store.close()
