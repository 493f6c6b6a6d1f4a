"""Producer id allocation that never reuses an id.

Ids are handed out from blocks of :data:`BLOCK_SIZE`. The end of the current
block is written durably (``meta/producer_id_block``) *before* any id of the
block is handed out, so after a crash the next block starts above every id
ever issued (unused ids of the old block are skipped, as Kafka's
``ProducerIdManager`` skips the rest of its block).

For producers without a transactional id, Kafka keeps no epoch: every
InitProducerId gets a fresh id with epoch 0, whatever (id, epoch) it passes
(KIP-360 bumps of an idempotent producer are thus a new id), and so does
oncelog (:meth:`ProducerIdManager.init_idempotent`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from oncelog.broker.config import StartupError
from oncelog.storage.fileutil import atomic_write
from oncelog.storage.log_dir import LogDirFailureChannel, guarded

BLOCK_SIZE = 1000


@dataclass(frozen=True, slots=True)
class ProducerIdAndEpoch:
    producer_id: int
    epoch: int


class ProducerIdManager:
    def __init__(self, meta_dir: Path, failure_channel: LogDirFailureChannel | None = None) -> None:
        self.path = meta_dir / "producer_id_block"
        # an OSError of the block's write takes the data directory offline (storage/log_dir.py)
        self.failure_channel = failure_channel
        meta_dir.mkdir(parents=True, exist_ok=True)
        self._next = self._read_block_end()
        self._block_end = self._next

    def _read_block_end(self) -> int:
        """The end of the last block written: 0 only if no block was ever written (no file).
        A file that cannot be read or parsed fails the start (StartupError, one line): starting
        from 0 would hand out ids issued before."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return 0
        except OSError as exc:
            raise StartupError(f"cannot read {self.path}: {exc.strerror or exc}") from None
        try:
            end = int(text.strip())
        except ValueError:
            end = -1
        if end < 0:
            raise StartupError(
                f"{self.path} is corrupt ({text.strip()[:40]!r} is no producer id); ids issued before it would"
                " be handed out again: restore it, or write an id above every id issued"
            )
        return end

    @property
    def next_id(self) -> int:
        return self._next

    def was_issued(self, producer_id: int) -> bool:
        return 0 <= producer_id < self._next

    def generate(self) -> int:
        if self._next >= self._block_end:
            end = self._next + BLOCK_SIZE
            with guarded(self.failure_channel, "write of the producer-id block"):
                atomic_write(self.path, str(end).encode())
            self._block_end = end  # only once durable: no id of an unwritten block is handed out
        pid = self._next
        self._next += 1
        return pid

    def init_idempotent(self) -> ProducerIdAndEpoch:
        """InitProducerId without a transactional id: a fresh id, epoch 0 (as Kafka)."""
        return ProducerIdAndEpoch(self.generate(), 0)
