"""A minimal admin client over :class:`oncelog.client.connection.Connection`."""

from __future__ import annotations

from typing import Any

from oncelog.client.connection import Connection
from oncelog.protocol.errors import code_name

METADATA, LIST_OFFSETS, CREATE_TOPICS, DELETE_TOPICS, DELETE_RECORDS, DESCRIBE_CONFIGS = 3, 2, 19, 20, 21, 32


class Admin:
    def __init__(self, bootstrap: str) -> None:
        self.conn = Connection(bootstrap, client_id="oncelog-admin")

    def __enter__(self) -> "Admin":
        return self

    def __exit__(self, *exc: object) -> None:
        self.conn.close()

    def _metadata(self, topics: list[str] | None) -> Any:
        v = self.conn.best_version(METADATA, (1, 12))
        body: dict[str, Any] = {
            "topics": None if topics is None else [{"name": t, "topic_id": None} for t in topics],
            "allow_auto_topic_creation": False,
            "include_cluster_authorized_operations": False,
            "include_topic_authorized_operations": False,
        }
        return self.conn.request(METADATA, v, body)

    def list_topics(self) -> list[str]:
        return [t.name for t in self._metadata(None).topics]

    def create_topic(self, name: str, partitions: int = -1, replication: int = -1, configs: dict[str, str] | None = None) -> str | None:
        v = self.conn.best_version(CREATE_TOPICS, (2, 7))
        resp = self.conn.request(
            CREATE_TOPICS,
            v,
            {
                "topics": [
                    {
                        "name": name,
                        "num_partitions": partitions,
                        "replication_factor": replication,
                        "assignments": [],
                        "configs": [{"name": k, "value": val} for k, val in (configs or {}).items()],
                    }
                ],
                "timeout": 30000,
                "validate_only": False,
            },
        )
        r = resp.topics[0]
        return None if r.error_code == 0 else f"{code_name(r.error_code)}: {r.error_message or ''}".strip()

    def delete_topic(self, name: str) -> str | None:
        v = self.conn.best_version(DELETE_TOPICS, (1, 5))
        resp = self.conn.request(DELETE_TOPICS, v, {"topic_names": [name], "timeout": 30000})
        r = resp.responses[0]
        return None if r.error_code == 0 else code_name(r.error_code)

    def describe_topic(self, name: str) -> dict[str, Any] | None:
        md = self._metadata([name])
        topic = md.topics[0]
        if topic.error_code:
            return None
        partitions = sorted(p.partition_index for p in topic.partitions)
        v = self.conn.best_version(LIST_OFFSETS, (1, 8))
        offsets: dict[int, dict[str, int]] = {p: {} for p in partitions}
        for label, ts in (("log_start_offset", -2), ("high_watermark", -1)):
            resp = self.conn.request(
                LIST_OFFSETS,
                v,
                {
                    "replica_id": -1,
                    "isolation_level": 0,
                    "topics": [
                        {"name": name, "partitions": [{"partition_index": p, "current_leader_epoch": -1, "timestamp": ts} for p in partitions]}
                    ],
                },
            )
            for p in resp.topics[0].partitions:
                offsets[p.partition_index][label] = p.offset
        dv = self.conn.best_version(DESCRIBE_CONFIGS, (1, 4))
        cfg = self.conn.request(
            DESCRIBE_CONFIGS,
            dv,
            {
                "resources": [{"resource_type": 2, "resource_name": name, "configuration_keys": None}],
                "include_synonyms": False,
                "include_documentation": False,
            },
        )
        return {
            "name": name,
            "topic_id": str(getattr(topic, "topic_id", "")),
            "configs": {c.name: c.value for c in cfg.results[0].configs},
            "partitions": [
                {"partition": p, "leader": md.brokers[0].node_id, **offsets[p]} for p in partitions
            ],
        }

    def partitions_of(self, name: str) -> list[int] | None:
        """The partition indexes of ``name``, or None when the topic does not exist."""
        topic = self._metadata([name]).topics[0]
        if topic.error_code:
            return None
        return sorted(p.partition_index for p in topic.partitions)

    def delete_records(self, offsets: dict[tuple[str, int], int]) -> dict[tuple[str, int], tuple[str | None, int]]:
        """DeleteRecords: move each (topic, partition)'s log start offset up to its
        offset (-1: the high watermark). Returns (error name or None, low watermark)."""
        v = self.conn.best_version(DELETE_RECORDS, (0, 2))
        by_topic: dict[str, list[dict[str, int]]] = {}
        for (topic, partition), offset in offsets.items():
            by_topic.setdefault(topic, []).append({"partition_index": partition, "offset": offset})
        resp = self.conn.request(DELETE_RECORDS, v, {
            "topics": [{"name": t, "partitions": parts} for t, parts in by_topic.items()],
            "timeout": 30000,
        })
        return {
            (t.name, p.partition_index): (code_name(p.error_code) if p.error_code else None, p.low_watermark)
            for t in resp.topics
            for p in t.partitions
        }
