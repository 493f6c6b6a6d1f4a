"""`oncelog topics create|list|describe|delete` against a real broker, and
`oncelog serve --config` with Kafka property names."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from oncelog.client.connection import Connection
from oncelog.testing import EmbeddedBroker


def _cli(bootstrap: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "oncelog.cli", "topics", *args, "--bootstrap", bootstrap],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_topics_cli_create_list_describe_delete(tmp_path: Path) -> None:
    with EmbeddedBroker(data_dir=tmp_path / "data", log_path=tmp_path / "b.log") as b:
        r = _cli(b.bootstrap, "create", "cli-t", "--partitions", "3", "--config", "retention.ms=123456")
        assert r.returncode == 0, r.stderr
        assert "created topic cli-t" in r.stdout
        again = _cli(b.bootstrap, "create", "cli-t", "--partitions", "3")
        assert again.returncode == 1 and "TOPIC_ALREADY_EXISTS" in again.stderr
        bad = _cli(b.bootstrap, "create", "bad/name")
        assert bad.returncode == 1 and "INVALID_TOPIC_EXCEPTION" in bad.stderr

        listed = _cli(b.bootstrap, "list")
        assert listed.returncode == 0 and listed.stdout.split() == ["cli-t"]

        desc = _cli(b.bootstrap, "describe", "cli-t")
        assert desc.returncode == 0, desc.stderr
        assert "PartitionCount: 3" in desc.stdout
        assert "retention.ms=123456" in desc.stdout
        assert desc.stdout.count("Partition: ") == 3
        assert "HighWatermark: 0" in desc.stdout

        gone = _cli(b.bootstrap, "delete", "cli-t")
        assert gone.returncode == 0 and "deleted topic cli-t" in gone.stdout
        assert _cli(b.bootstrap, "list").stdout.split() == []
        missing = _cli(b.bootstrap, "describe", "cli-t")
        assert missing.returncode == 1


def test_serve_reads_kafka_properties_file(tmp_path: Path) -> None:
    proxy_port = 19999  # only advertised, never connected to
    config = {
        "num.partitions": "5",
        "log.segment.bytes": "65536",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{proxy_port}",
    }
    with EmbeddedBroker(data_dir=tmp_path / "data", config=config, log_path=tmp_path / "b.log") as b:
        with Connection(b.bootstrap) as conn:
            md = conn.request(
                3,
                12,
                {"topics": [{"name": "auto-t", "topic_id": None}], "allow_auto_topic_creation": True,
                 "include_topic_authorized_operations": False},
            )
        assert [(x.host, x.port) for x in md.brokers] == [("127.0.0.1", proxy_port)]
        assert len(md.topics[0].partitions) == 5  # num.partitions applies to auto-creation
        # third-party clients would follow the advertised (unused) address; ask directly
        with Connection(b.bootstrap) as conn:
            cfg = conn.request(
                32, 4,
                {"resources": [{"resource_type": 2, "resource_name": "auto-t", "configuration_keys": ["segment.bytes"]}],
                 "include_synonyms": False, "include_documentation": False},
            )
        entry = cfg.results[0].configs[0]
        assert (entry.name, entry.value, entry.config_source) == ("segment.bytes", "65536", 4)
