"""Producer id allocation that never reuses an id, plus KIP-360 epoch bumps.

Ids are handed out from blocks of :data:`BLOCK_SIZE`. The end of the current
block is written durably (``meta/producer_id_block``) *before* any id of the
block is handed out, so after a crash the next block starts above every id
ever issued (unused ids of the old block are skipped, as Kafka's
``ProducerIdManager`` skips the rest of its block).

For producers without a transactional id, Kafka keeps no epoch and answers
every InitProducerId with a fresh id. oncelog additionally remembers, in
memory, the current epoch of the ids it issued, so a KIP-360 request that
passes its current (id, epoch) gets an epoch bump: the previous epoch (a
retried bump whose answer was lost) gets the current one back, any other
epoch INVALID_PRODUCER_EPOCH. An id it does not remember (e.g. after a
restart) gets a fresh id, which is Kafka's behaviour.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from oncelog.protocol.errors import ErrorCode, KafkaError
from oncelog.storage.fileutil import atomic_write

BLOCK_SIZE = 1000
MAX_REMEMBERED = 100_000  # epochs remembered for KIP-360 bumps (oldest forgotten first)
# Kafka rotates to a new producer id once the epoch would reach Short.MaxValue
MAX_EPOCH = 32767 - 1


@dataclass(frozen=True, slots=True)
class ProducerIdAndEpoch:
    producer_id: int
    epoch: int


class ProducerIdManager:
    def __init__(self, meta_dir: Path) -> None:
        self.path = meta_dir / "producer_id_block"
        meta_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._next = int(self.path.read_text().strip())
        except (OSError, ValueError):
            self._next = 0
        self._block_end = self._next
        self._epochs: dict[int, int] = {}

    @property
    def next_id(self) -> int:
        return self._next

    def was_issued(self, producer_id: int) -> bool:
        return 0 <= producer_id < self._next

    def generate(self) -> int:
        if self._next >= self._block_end:
            self._block_end = self._next + BLOCK_SIZE
            atomic_write(self.path, str(self._block_end).encode())
        pid = self._next
        self._next += 1
        return pid

    def init_idempotent(self, producer_id: int, epoch: int) -> ProducerIdAndEpoch:
        """InitProducerId without a transactional id (v0-v5)."""
        current = self._epochs.get(producer_id) if producer_id >= 0 else None
        if current is None:
            return self._fresh()
        if epoch == current or (epoch < 0 and producer_id < 0):
            if current >= MAX_EPOCH:
                del self._epochs[producer_id]
                return self._fresh()
            self._epochs[producer_id] = current + 1
            return ProducerIdAndEpoch(producer_id, current + 1)
        if epoch == current - 1:
            return ProducerIdAndEpoch(producer_id, current)
        raise KafkaError(
            ErrorCode.invalid_producer_epoch,
            f"producer {producer_id} passed epoch {epoch}, current is {current}",
        )

    def _fresh(self) -> ProducerIdAndEpoch:
        pid = self.generate()
        self._epochs[pid] = 0
        if len(self._epochs) > MAX_REMEMBERED:
            del self._epochs[next(iter(self._epochs))]
        return ProducerIdAndEpoch(pid, 0)
