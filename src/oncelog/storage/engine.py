"""LogManager: every partition log of the broker, laid out as ``<data_dir>/<topic>-<partition>/``."""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path

from oncelog.storage.catalog import TopicCatalog
from oncelog.storage.config import LogConfig
from oncelog.storage.fileutil import atomic_write
from oncelog.storage.log import DELETE_SUFFIX, PartitionLog
from oncelog.storage.log_dir import LogDirFailureChannel, guarded

log = logging.getLogger(__name__)

PARTITION_METADATA = "partition.metadata"
_PARTITION_DIR = re.compile(r"^(.+)-(\d+)$")


def partition_dir_name(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


def read_partition_topic_id(directory: Path) -> str | None:
    """The topic id recorded in ``partition.metadata`` (Kafka's format), if any."""
    try:
        text = (directory / PARTITION_METADATA).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "topic_id":
            return value.strip()
    return None


class LogManager:
    """Owns the open :class:`PartitionLog` of every (topic, partition)."""

    def __init__(
        self, data_dir: str | Path, defaults: LogConfig, failure_channel: LogDirFailureChannel | None = None
    ) -> None:
        self.data_dir = Path(data_dir)
        self.defaults = defaults
        self.failure_channel = failure_channel  # given to every log (see storage/log_dir.py)
        self._logs: dict[tuple[str, int], PartitionLog] = {}
        self._catalog: TopicCatalog | None = None

    def open_all(self, catalog: TopicCatalog, now_ms: int) -> None:
        """Open (recovering if needed) every partition in ``catalog``; clear leftovers."""
        self._catalog = catalog
        self.data_dir.mkdir(parents=True, exist_ok=True)
        wanted: set[str] = set()
        for meta in catalog.topics():
            for p in range(meta.num_partitions):
                wanted.add(partition_dir_name(meta.name, p))
        for child in sorted(self.data_dir.iterdir()):
            if not child.is_dir():
                continue
            if child.name.endswith(DELETE_SUFFIX):
                shutil.rmtree(child, ignore_errors=True)
            elif _PARTITION_DIR.match(child.name) and (child / PARTITION_METADATA).exists():
                if child.name not in wanted and catalog.existed:
                    log.warning("removing log directory %s of a topic no longer in the catalog", child)
                    _remove_dir(child)
        for meta in catalog.topics():
            self.create_partitions(meta.name, 0, meta.num_partitions, now_ms)

    def _open(self, topic: str, partition: int, topic_id: str | None, config: LogConfig, now_ms: int) -> PartitionLog:
        """Open (or create) one log. An OSError takes the log directory offline, as Kafka's
        ``getOrCreateLog`` does (and loading a log at start up)."""
        directory = self.data_dir / partition_dir_name(topic, partition)
        what = "loading" if directory.is_dir() else "creation"
        with guarded(self.failure_channel, f"{what} of the log {directory.name}"):
            return self._open_log(directory, topic_id, config, now_ms)

    def _open_log(self, directory: Path, topic_id: str | None, config: LogConfig, now_ms: int) -> PartitionLog:
        if directory.exists() and topic_id is not None:
            found = read_partition_topic_id(directory)
            if found is not None and found != topic_id:
                log.warning("removing stale log directory %s (topic id %s, expected %s)", directory, found, topic_id)
                _remove_dir(directory)
        plog = PartitionLog.open(directory, config, now_ms, self.failure_channel)
        if topic_id is not None and read_partition_topic_id(directory) != topic_id:
            atomic_write(directory / PARTITION_METADATA, f"version: 0\ntopic_id: {topic_id}\n".encode())
        return plog

    def get(self, topic: str, partition: int) -> PartitionLog:
        """The open log; KeyError if it does not exist."""
        return self._logs[(topic, partition)]

    def find(self, topic: str, partition: int) -> PartitionLog | None:
        return self._logs.get((topic, partition))

    def items(self) -> list[tuple[tuple[str, int], PartitionLog]]:
        return list(self._logs.items())

    def create_partitions(
        self, topic: str, n_from: int, n_to: int, now_ms: int, config: LogConfig | None = None
    ) -> list[PartitionLog]:
        """Open or create partitions ``n_from .. n_to-1`` of ``topic``."""
        cfg = config or self.effective_config(topic)
        meta = self._catalog.get(topic) if self._catalog is not None else None
        topic_id = meta.topic_id if meta is not None else None
        out = []
        for p in range(n_from, n_to):
            key = (topic, p)
            if key not in self._logs:
                self._logs[key] = self._open(topic, p, topic_id, cfg, now_ms)
            out.append(self._logs[key])
        return out

    def discard(self, topic: str, n_from: int, n_to: int) -> None:
        """Undo the creation of partitions ``n_from .. n_to-1`` of ``topic`` that failed for want
        of descriptors: close and remove their logs, a half-created one's directory too. An
        OSError here takes the log directory offline (the undo could not be done)."""
        for p in range(n_from, n_to):
            directory = self.data_dir / partition_dir_name(topic, p)
            with guarded(self.failure_channel, f"deletion of the log {directory.name}"):
                plog = self._logs.pop((topic, p), None)
                if plog is not None:
                    plog.delete()
                elif directory.is_dir():
                    _remove_dir(directory)

    def delete_topic(self, topic: str) -> int:
        """Close and remove every partition log of ``topic``; returns how many."""
        keys = [k for k in self._logs if k[0] == topic]
        for key in keys:
            # an OSError takes the log directory offline (Kafka's renameDir of a deleted log)
            with guarded(self.failure_channel, f"deletion of the log {key[0]}-{key[1]}"):
                self._logs.pop(key).delete()
        return len(keys)

    def effective_config(self, topic: str) -> LogConfig:
        """Broker defaults overlaid with the topic's overrides from the catalog."""
        meta = self._catalog.get(topic) if self._catalog is not None else None
        if meta is None or not meta.configs:
            return LogConfig.from_properties({}, self.defaults)
        return LogConfig.from_properties(meta.configs, self.defaults)

    def reconfigure(self, topic: str) -> None:
        """Push the topic's current effective config to its open logs."""
        cfg = self.effective_config(topic)
        for (t, _p), plog in self._logs.items():
            if t == topic:
                plog.set_config(cfg)

    def retention_pass(self, now_ms: int) -> int:
        """Time-roll and apply retention to every log; returns segments deleted. An OSError
        takes the log directory offline (:meth:`PartitionLog.io`) and ends the pass: it is
        raised, and nothing more is deleted."""
        deleted = 0
        for plog in list(self._logs.values()):
            plog.maybe_roll(now_ms)
            deleted += plog.apply_retention(now_ms)
        return deleted

    def sync_all(self) -> None:
        for plog in self._logs.values():
            plog.sync()

    def close(self) -> None:
        for plog in self._logs.values():
            plog.close()
        self._logs.clear()

    def abandon(self) -> None:
        """Close every log without writing (the log directory failed; see PartitionLog.abandon)."""
        for plog in self._logs.values():
            plog.abandon()
        self._logs.clear()


def _remove_dir(directory: Path) -> None:
    PartitionLog.remove_directory(directory)
