"""Topic configs (storage/config.py), the broker's recompression and dynamic broker configs, in-process."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import zstandard

from oncelog.broker.broker import Broker
from oncelog.broker.config import BrokerConfig
from oncelog.broker.recompress import compress, decompress
from oncelog.protocol.errors import ErrorCode, KafkaError
from oncelog.protocol.records import (
    COMPRESSION_GZIP,
    HEADER_SIZE,
    Record,
    compute_crc,
    encode_record_batch,
    iter_batch_headers,
    parse_batch_header,
    update_crc,
)
from oncelog.storage.config import TOPIC_CONFIGS, ConfigError, LogConfig
from oncelog.storage.log import PartitionLog

T0 = 1_700_000_000_000


def _gzip_batch(records: list[Record], **kw: object) -> bytes:
    """A v2 batch as a producer with compression.type=gzip sends it (stdlib gzip, not our codec)."""
    plain = bytearray(encode_record_batch(records, **kw))  # type: ignore[arg-type]
    body = gzip.compress(bytes(plain[HEADER_SIZE:]))
    out = bytearray(plain[:HEADER_SIZE]) + body
    out[8:12] = (len(out) - 12).to_bytes(4, "big")
    attrs = int.from_bytes(out[21:23], "big") | COMPRESSION_GZIP
    out[21:23] = attrs.to_bytes(2, "big")
    update_crc(out, 0)
    return bytes(out)


def _broker(tmp_path: Path, **props: str) -> Broker:
    return Broker(BrokerConfig.from_properties(dict(props), data_dir=tmp_path / "data"))


def _stored(tmp_path: Path, topic: str) -> bytes:
    return b"".join(p.read_bytes() for p in sorted((tmp_path / "data" / f"{topic}-0").glob("*.log")))


def _append(broker: Broker, topic: str, batch: bytes) -> int:
    p = broker.partition(topic, 0)
    base, _t = p.append_batch(batch, parse_batch_header(batch), T0, broker.producer_ids)
    p.log.sync()
    return base


# -- storage/config.py ----------------------------------------------------------------------


def test_every_topic_config_has_kafkas_default_and_falls_back_to_its_broker_synonym() -> None:
    c = LogConfig()
    shown = c.to_topic_configs()
    assert shown["cleanup.policy"] == "delete" and shown["compression.type"] == "producer"
    assert shown["min.cleanable.dirty.ratio"] == "0.5" and shown["flush.messages"] == str(2**63 - 1)
    assert "message.format.version" not in shown and len(shown) == len(TOPIC_CONFIGS) - 1
    b = LogConfig.from_properties({"log.cleaner.min.cleanable.ratio": "0.1", "min.insync.replicas": "2",
                                   "log.cleanup.policy": "delete", "compression.type": "lz4",
                                   "log.roll.jitter.hours": "1"})
    assert (b.get("min.cleanable.dirty.ratio"), b.get("min.insync.replicas"), b.compression_type) == (0.1, 2, "lz4")
    assert b.get("segment.jitter.ms") == 3_600_000
    t = LogConfig.from_properties({"min.insync.replicas": "3"}, b)
    assert (t.get("min.insync.replicas"), t.get("min.cleanable.dirty.ratio")) == (3, 0.1)


def test_config_values_are_parsed_as_kafka_types() -> None:
    with pytest.raises(ConfigError, match="Not a number of type LONG"):
        LogConfig.from_properties({"retention.ms": "1_000"})
    with pytest.raises(ConfigError, match="Not a number of type INT"):
        LogConfig.from_properties({"segment.bytes": str(2**31)})
    c = LogConfig.from_properties({"cleanup.policy": " delete ", "preallocate": " TRUE "})
    assert c.get("preallocate") is True and c.cleanup_policy == ["delete"]
    assert LogConfig.from_properties({"cleanup.policy": ""}).cleanup_policy == []


def test_retention_deletes_nothing_without_delete_in_cleanup_policy(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(segment_bytes=400, retention_ms=1000, cleanup_policy=[]), T0)
    for i in range(20):
        log.append(encode_record_batch([Record(b"k", b"v" * 50)], base_timestamp=T0), T0)
    log.sync()
    assert len(log.segments) > 2
    assert log.apply_retention(T0 + 10_000_000) == 0 and log.log_start_offset == 0
    log.set_config(LogConfig(segment_bytes=400, retention_ms=1000))
    assert log.apply_retention(T0 + 10_000_000) > 0
    log.close()


# -- recompression ------------------------------------------------------------------------------


def test_gzip_batch_is_stored_as_zstd_with_the_same_records_and_producer_fields(tmp_path: Path) -> None:
    broker = _broker(tmp_path)
    broker.create_topic("z", 1, 1, {"compression.type": "zstd", "compression.zstd.level": "9"})
    pid = broker.producer_ids.generate()
    records = [Record(b"k%d" % i, b"value %d " % i * 40, [("h", b"%d" % i)], i * 3) for i in range(50)]
    sent = _gzip_batch(records, base_timestamp=T0, producer_id=pid, producer_epoch=3, base_sequence=0)
    assert _append(broker, "z", sent) == 0
    stored = _stored(tmp_path, "z")
    [(hdr, start, end)] = list(iter_batch_headers(stored))
    orig = parse_batch_header(sent)
    assert hdr.compression == 4 and end - start == hdr.size
    assert compute_crc(stored, start) == hdr.crc  # a new, valid CRC
    for f in ("producer_id", "producer_epoch", "base_sequence", "base_timestamp", "max_timestamp",
              "records_count", "last_offset_delta", "timestamp_type", "is_transactional", "is_control"):
        assert getattr(hdr, f) == getattr(orig, f), f
    raw = zstandard.ZstdDecompressor().decompressobj().decompress(stored[start + HEADER_SIZE : end])
    assert raw == gzip.decompress(sent[HEADER_SIZE:])  # every record byte-identical
    broker.close()


def test_producer_compression_keeps_the_batch_bytes(tmp_path: Path) -> None:
    broker = _broker(tmp_path)
    broker.create_topic("p", 1, 1, {})
    sent = _gzip_batch([Record(b"k", b"v" * 100)], base_timestamp=T0)
    _append(broker, "p", sent)
    assert _stored(tmp_path, "p")[8:] == sent[8:]  # only the base offset is the broker's
    broker.close()


def test_corrupt_compressed_records_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    broker = _broker(tmp_path)
    broker.create_topic("u", 1, 1, {"compression.type": "uncompressed"})
    bad = bytearray(_gzip_batch([Record(b"k", b"v" * 100)], base_timestamp=T0))
    bad[HEADER_SIZE + 12] ^= 0xFF  # inside the deflate stream
    update_crc(bad, 0)  # a producer bug, not line noise: the CRC matches
    with pytest.raises(KafkaError) as e:
        _append(broker, "u", bytes(bad))
    assert e.value.code == ErrorCode.corrupt_message
    assert _stored(tmp_path, "u") == b""
    broker.close()


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_codecs_round_trip_large_inputs(codec: int) -> None:
    data = bytes(range(256)) * 1000 + b"x" * 200_000
    assert decompress(codec, compress(codec, data, None)) == data


def test_lz4_frames_are_the_ones_kafka_writes() -> None:
    import lz4.frame

    data = b"abc" * 100_000
    out = compress(3, data, 9)
    assert out[:7] == lz4.frame.compress(b"", block_size=lz4.frame.BLOCKSIZE_MAX64KB, block_linked=False,
                                         content_checksum=False, store_size=False)[:7]
    assert lz4.frame.decompress(out) == data


# -- dynamic broker configs ---------------------------------------------------------------------


def test_dynamic_broker_configs_apply_persist_and_refuse_static_ones(tmp_path: Path) -> None:
    broker = _broker(tmp_path, **{"log.retention.hours": "2"})
    broker.create_topic("d", 1, 1, {})
    broker.create_topic("own", 1, 1, {"retention.ms": "5"})
    broker.alter_broker_configs("1", {"log.retention.ms": "777", "my.custom": "x"})
    assert broker.partition("d", 0).log.config.retention_ms == 777
    assert broker.partition("own", 0).log.config.retention_ms == 5  # a topic override still wins
    broker.alter_broker_configs("", {"message.max.bytes": "1000"})
    assert broker.partition("d", 0).log.config.max_message_bytes == 1000
    with pytest.raises(KafkaError) as e:
        broker.alter_broker_configs("1", {"num.partitions": "4"})
    assert e.value.code == ErrorCode.invalid_request and "Cannot update these configs dynamically" in str(e.value)
    with pytest.raises(KafkaError) as e:
        broker.alter_broker_configs("", {"listeners": "PLAINTEXT://127.0.0.1:1"})
    assert e.value.code == ErrorCode.invalid_request
    broker.alter_broker_configs("1", {"log.cleanup.policy": "compact"}, validate_only=True)  # compaction works
    assert broker.partition("d", 0).log.config.retention_ms == 777  # the refusals changed nothing
    stored = json.loads((tmp_path / "data" / "meta" / "broker_configs.json").read_text())
    assert stored == {"broker": {"log.retention.ms": "777", "my.custom": "x"}, "default": {"message.max.bytes": "1000"}}
    broker.close()

    again = _broker(tmp_path, **{"log.retention.hours": "2"})
    assert again.partition("d", 0).log.config.retention_ms == 777
    assert again.partition("d", 0).log.config.max_message_bytes == 1000
    again.alter_broker_configs("1", {})
    assert again.partition("d", 0).log.config.retention_ms == 2 * 3_600_000
    again.close()
