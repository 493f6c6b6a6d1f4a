"""The topic catalog: names, ids, partition counts and config overrides.

Persisted as JSON in ``<data_dir>/meta/topics.json``, rewritten atomically on
every change.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from oncelog.storage.fileutil import atomic_write
from oncelog.storage.log_dir import LogDirFailureChannel, guarded

META_DIR = "meta"
TOPICS_FILE = "topics.json"
_FORMAT_VERSION = 1


class CatalogError(Exception):
    """A catalog operation that cannot be applied."""


class TopicExistsError(CatalogError):
    pass


class UnknownTopicError(CatalogError):
    pass


@dataclass
class TopicMeta:
    name: str
    topic_id: str  # uuid4, canonical string form
    num_partitions: int
    configs: dict[str, str] = field(default_factory=dict)  # topic-level overrides only


def meta_dir(data_dir: Path) -> Path:
    """``<data_dir>/meta``, created if needed (home of broker-level state files)."""
    path = Path(data_dir) / META_DIR
    path.mkdir(parents=True, exist_ok=True)
    return path


class TopicCatalog:
    """In-memory topic table backed by ``meta/topics.json``."""

    def __init__(self, data_dir: Path, topics: dict[str, TopicMeta], existed: bool) -> None:
        self.data_dir = Path(data_dir)
        self._topics = topics
        self.existed = existed  # False when no catalog file was found on load
        # the data directory's failure channel (storage/log_dir.py): an OSError of a write of the
        # catalog takes the directory offline (Kafka's broker stops when its metadata log
        # directory fails), and nothing is written once it is
        self.failure_channel: LogDirFailureChannel | None = None

    @property
    def path(self) -> Path:
        return self.data_dir / META_DIR / TOPICS_FILE

    @classmethod
    def load(cls, data_dir: str | Path) -> TopicCatalog:
        data_dir = Path(data_dir)
        path = meta_dir(data_dir) / TOPICS_FILE
        if not path.exists():
            return cls(data_dir, {}, existed=False)
        doc = json.loads(path.read_text())
        topics = {}
        for t in doc.get("topics", []):
            meta = TopicMeta(t["name"], t["topic_id"], int(t["num_partitions"]), dict(t.get("configs", {})))
            topics[meta.name] = meta
        return cls(data_dir, topics, existed=True)

    def _save(self) -> None:
        doc = {"version": _FORMAT_VERSION, "topics": [asdict(t) for t in self._topics.values()]}
        with guarded(self.failure_channel, "write of the topic catalog"):
            meta_dir(self.data_dir)
            atomic_write(self.path, json.dumps(doc, indent=1, sort_keys=True).encode())
        self.existed = True

    def _require(self, name: str) -> TopicMeta:
        meta = self._topics.get(name)
        if meta is None:
            raise UnknownTopicError(f"unknown topic {name!r}")
        return meta

    def create_topic(
        self, name: str, partitions: int, configs: dict[str, str] | None = None, topic_id: str | None = None
    ) -> TopicMeta:
        if name in self._topics:
            raise TopicExistsError(f"topic {name!r} already exists")
        if partitions <= 0:
            raise CatalogError("a topic needs at least one partition")
        meta = TopicMeta(name, topic_id or str(uuid.uuid4()), partitions, _clean(configs))
        self._topics[name] = meta
        try:
            self._save()
        except BaseException:
            del self._topics[name]
            raise
        return meta

    def delete_topic(self, name: str) -> TopicMeta:
        meta = self._require(name)
        del self._topics[name]
        try:
            self._save()
        except BaseException:
            self._topics[name] = meta
            raise
        return meta

    def add_partitions(self, name: str, new_total: int) -> TopicMeta:
        meta = self._require(name)
        if new_total <= meta.num_partitions:
            raise CatalogError(f"topic {name!r} has {meta.num_partitions} partitions; {new_total} is not an increase")
        old = meta.num_partitions
        meta.num_partitions = new_total
        try:
            self._save()
        except BaseException:
            meta.num_partitions = old
            raise
        return meta

    def set_configs(self, name: str, configs: dict[str, str | None]) -> TopicMeta:
        """Replace the topic's overrides (``None`` values are dropped)."""
        meta = self._require(name)
        old = meta.configs
        meta.configs = _clean(configs)
        try:
            self._save()
        except BaseException:
            meta.configs = old
            raise
        return meta

    def get(self, name: str) -> TopicMeta | None:
        return self._topics.get(name)

    def by_id(self, topic_id: str) -> TopicMeta | None:
        return next((t for t in self._topics.values() if t.topic_id == topic_id), None)

    def topics(self) -> list[TopicMeta]:
        return list(self._topics.values())

    def __contains__(self, name: object) -> bool:
        return name in self._topics

    def __len__(self) -> int:
        return len(self._topics)


def _clean(configs: dict[str, str | None] | dict[str, str] | None) -> dict[str, str]:
    return {k: str(v) for k, v in (configs or {}).items() if v is not None}
