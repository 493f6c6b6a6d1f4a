"""kafkajs 2.2.4 (Node) against the broker, driven through tests/js/roundtrip.js.

Records are read back without a consumer group (test_kafkajs_groups.py covers
groups): (a) by kafkajs's own Fetch path (see roundtrip.js) and (b) by
confluent-kafka from Python; kafkajs's ``admin.fetchTopicOffsets`` must report
the high watermarks. Both ways with oncelog's own client: kafkajs-produced
records read by ``oncelog.client`` (blocking and asyncio), and records from
``oncelog.client``'s producer read by kafkajs, in every codec kafkajs decodes
here (none, gzip, snappy; no lz4 or zstd, see docs/client.md).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from oncelog.testing import EmbeddedBroker

pytestmark = pytest.mark.timeout(180)

JS_DIR = Path(__file__).resolve().parent.parent / "js"
SCRIPT = JS_DIR / "roundtrip.js"
NODE_TIMEOUT = 90


KAFKAJS_CODECS = ("none", "gzip", "snappy")  # kafkajs's CompressionTypes 0..2 (lz4 is 3: no codec here)
CODEC_NAMES = dict(enumerate(KAFKAJS_CODECS + ("lz4",)))


def run_js(node: str, *args: str) -> dict[str, Any]:
    proc = subprocess.run(
        [node, str(SCRIPT), *args],
        cwd=JS_DIR, capture_output=True, text=True, timeout=NODE_TIMEOUT,
        env={**os.environ, "KAFKAJS_NO_PARTITIONER_WARNING": "1",
             "ROUNDTRIP_DEADLINE_MS": str((NODE_TIMEOUT - 10) * 1000)},
    )
    lines = proc.stdout.strip().splitlines()
    assert lines, f"no output from roundtrip.js (rc={proc.returncode}); stderr:\n{proc.stderr[-4000:]}"
    summary = json.loads(lines[-1])
    assert proc.returncode == 0 and summary.get("ok") is True, (
        f"roundtrip.js failed (rc={proc.returncode}): {summary.get('error')}\nstderr:\n{proc.stderr[-4000:]}"
    )
    return summary


def unb64(s: str | None) -> bytes | None:
    return None if s is None else base64.b64decode(s)


def rec_view(r: dict[str, Any]) -> tuple[Any, ...]:
    """The comparable content of a record from roundtrip.js's JSON."""
    return (r["partition"], r["offset"], unb64(r["key"]), unb64(r["value"]), r["timestamp"],
            tuple((k, unb64(v)) for k, v in r["headers"]))


@pytest.fixture
def js_broker(tmp_path: Path, kit: Any) -> Any:
    b = kit.start_broker(tmp_path)
    try:
        yield b
    finally:
        b.close()


def test_kafkajs_admin_produce_and_read_back(node: str, js_broker: EmbeddedBroker, kit: Any) -> None:
    count, partitions, topic = 100, 3, "kafkajs-roundtrip"
    s = run_js(node, "produce", js_broker.bootstrap, topic, str(count), str(partitions))

    # admin: topic created and visible
    assert s["created"] is True
    assert s["listed"] is True
    assert s["metadataPartitions"] == partitions

    # producer: every message acknowledged at a dense offset per partition
    produced = s["produced"]
    assert len(produced) == count
    assert sorted(r["id"] for r in produced) == list(range(count))
    per_part: dict[int, list[int]] = {p: [] for p in range(partitions)}
    for r in produced:
        per_part[r["partition"]].append(r["offset"])
    for p, offs in per_part.items():
        assert offs == list(range(len(offs))), f"partition {p}: offsets {offs}"
    assert sum(1 for p in per_part.values() if p) >= 2, "keys should spread over partitions"

    # admin.fetchTopicOffsets: high watermark = records per partition, log start 0
    offsets = {o["partition"]: o for o in s["offsets"]}
    assert sorted(offsets) == list(range(partitions))
    for p in range(partitions):
        assert offsets[p]["high"] == len(per_part[p])
        assert offsets[p]["low"] == 0
    assert s["highWatermarkTotal"] == count

    # kafkajs reads back exactly what it produced (its own Fetch path, no group)
    assert s["fetchErrors"] == []
    want = sorted(rec_view(r) for r in produced)
    got = [rec_view(r) for r in s["records"]]
    assert got == want

    # the broker stored kafkajs's gzip batches as gzip (kafkajs's decoder does
    # not expose batch attributes, so look at the segment files)
    compression = {(r["partition"], r["offset"]): r["compression"] for r in produced}
    assert set(compression.values()) == {0, 1}, "expected uncompressed and gzip batches"
    stored = kit.stored_codecs(js_broker.data_dir, topic, partitions)
    gz = sum(1 for c in compression.values() if c == 1)
    assert stored == {"gzip": gz, "none": count - gz}

    # confluent-kafka (librdkafka) reads the same records
    ends = {p: len(per_part[p]) for p in range(partitions)}
    msgs = kit.confluent_consume_all(js_broker.bootstrap, topic, ends, timeout=30)
    from_py = sorted(
        (m.partition(), m.offset(), m.key(), m.value(), m.timestamp()[1], tuple(m.headers() or ()))
        for lst in msgs.values() for m in lst
    )
    assert from_py == want


def _produce_confluent(bootstrap: str, topic: str, codec: str,
                       records: list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes]], int]],
                       acked: dict[tuple[int, int], tuple[Any, ...]], errors: list[str]) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "compression.type": codec, "linger.ms": 5})
    for part, key, value, headers, ts in records:
        def on_delivery(err, msg, _k=key, _v=value, _h=headers, _ts=ts):  # type: ignore[no-untyped-def]
            if err is not None:
                errors.append(str(err))
            else:
                acked[(msg.partition(), msg.offset())] = (_k, _v, _ts, tuple(_h))

        p.produce(topic, value=value, key=key, partition=part, headers=headers, timestamp=ts,
                  on_delivery=on_delivery)
    assert p.flush(30) == 0


def _produce_oncelog(bootstrap: str, topic: str, codec: str,
                     records: list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes]], int]],
                     acked: dict[tuple[int, int], tuple[Any, ...]], errors: list[str]) -> None:
    from oncelog.client import Producer

    with Producer({"bootstrap.servers": bootstrap, "compression.type": codec}) as p:
        futs = [(p.produce(topic, value, key=key, partition=part, headers=headers, timestamp=ts),
                 (key, value, ts, tuple(headers))) for part, key, value, headers, ts in records]
        assert p.flush(30) == 0
        for fut, content in futs:
            err = fut.exception()
            if err is not None:
                errors.append(str(err))
            else:
                md = fut.result()
                acked[(md.partition, md.offset)] = content


@pytest.mark.parametrize("producer", ["confluent", "oncelog"])
def test_kafkajs_reads_other_clients_records(producer: str, node: str, js_broker: EmbeddedBroker,
                                             kit: Any) -> None:
    """Batches written by librdkafka or by oncelog's own producer (every codec kafkajs has a codec
    for, null keys and values) decode identically in kafkajs; every record counted."""
    topic, partitions, per_codec = f"from-{producer}", 2, 150
    kit.create_topic(js_broker.bootstrap, topic, partitions)
    base_ts = int(time.time() * 1000) - 120_000
    acked: dict[tuple[int, int], tuple[Any, ...]] = {}
    errors: list[str] = []
    i = 0
    for codec in KAFKAJS_CODECS:
        records = []
        for _ in range(per_codec):
            key = None if i % 10 == 0 else f"ck-{i}".encode()
            value = None if i % 17 == 0 else f"{producer} value {i} ".encode() * (1 + i % 4)
            headers = [("n", str(i).encode())] + ([("empty", b"")] if i % 4 == 0 else [])
            records.append((i % partitions, key, value, headers, base_ts + i))
            i += 1
        (_produce_confluent if producer == "confluent" else _produce_oncelog)(
            js_broker.bootstrap, topic, codec, records, acked, errors)
    assert not errors, errors
    assert len(acked) == len(KAFKAJS_CODECS) * per_codec
    # the batches kafkajs must decode really are in each codec
    assert kit.stored_codecs(js_broker.data_dir, topic, partitions) == {c: per_codec for c in KAFKAJS_CODECS}

    s = run_js(node, "read", js_broker.bootstrap, topic)
    assert s["fetchErrors"] == []
    offsets = {o["partition"]: o for o in s["offsets"]}
    for part in range(partitions):
        n = sum(1 for (pp, _o) in acked if pp == part)
        assert offsets[part] == {"partition": part, "high": n, "low": 0}
    got = {(r["partition"], r["offset"]): rec_view(r)[2:] for r in s["records"]}
    assert len(got) == len(s["records"]) == len(acked)
    assert got == {k: (kv[0], kv[1], kv[2], kv[3]) for k, kv in acked.items()}


def _read_with_oncelog(flavour: str, bootstrap: str, topic: str, ends: dict[int, int]) -> list[tuple[Any, ...]]:
    """Every record of ``topic`` up to ``ends`` read by oncelog.client's consumer (manual
    assignment from offset 0), as ``rec_view`` tuples."""
    from oncelog.client import Consumer, TopicPartition
    from oncelog.client import aio

    conf = {"bootstrap.servers": bootstrap, "auto.offset.reset": "none"}
    total = sum(ends.values())
    out: list[Any] = []
    if flavour == "blocking":
        with Consumer(conf) as c:
            c.assign([TopicPartition(topic, p, 0) for p in ends])
            deadline = time.monotonic() + 30
            while len(out) < total and time.monotonic() < deadline:
                out.extend(c.consume(1000, 0.5))
            out.extend(c.consume(1000, 0.3))  # nothing past the ends may show up
    else:
        async def run() -> None:
            async with aio.Consumer(conf) as c:
                c.assign([TopicPartition(topic, p, 0) for p in ends])
                async for m in c:
                    out.append(m)
                    if len(out) == total:
                        break
                out.extend(await c.consume(1000, 0.3))
        asyncio.run(asyncio.wait_for(run(), 30))
    return [(m.partition, m.offset, m.key, m.value, m.timestamp, tuple(m.headers)) for m in out]


def test_oncelog_consumer_reads_kafkajs_records(node: str, js_broker: EmbeddedBroker, kit: Any) -> None:
    """kafkajs produces in each codec it has here (none, gzip, snappy), with keys, binary headers and
    explicit timestamps; oncelog.client's blocking and asyncio consumers each read every record
    exactly once, equal field by field to what kafkajs acknowledged."""
    count, partitions, topic = 240, 3, "kafkajs-to-oncelog"
    s = run_js(node, "produce", js_broker.bootstrap, topic, str(count), str(partitions), ",".join(KAFKAJS_CODECS))
    produced = s["produced"]
    assert sorted(r["id"] for r in produced) == list(range(count))
    per_codec: dict[str, int] = {}
    for r in produced:
        per_codec[CODEC_NAMES[r["compression"]]] = per_codec.get(CODEC_NAMES[r["compression"]], 0) + 1
    assert set(per_codec) == set(KAFKAJS_CODECS)
    # kafkajs really wrote gzip and snappy batches (the broker stores the producer's codec)
    assert kit.stored_codecs(js_broker.data_dir, topic, partitions) == per_codec
    want = sorted(rec_view(r) for r in produced)
    assert any(h for *_rest, h in want if any(k == "bin" for k, _v in h))
    ends = {o["partition"]: o["high"] for o in s["offsets"]}
    assert sum(ends.values()) == count
    for flavour in ("blocking", "asyncio"):
        got = _read_with_oncelog(flavour, js_broker.bootstrap, topic, ends)
        assert len(got) == count, f"{flavour}: {len(got)} records, want {count}"
        assert sorted(got) == want, flavour
