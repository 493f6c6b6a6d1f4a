"""Shared fixtures and helpers for the integration tests.

Every test drives a real ``oncelog serve`` subprocess over loopback with real
third-party clients; nothing is mocked.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from oncelog.testing import EmbeddedBroker


def start_broker(tmp_path: Path, name: str = "data", config: dict[str, str] | None = None,
                 port: int = 0) -> EmbeddedBroker:
    broker = EmbeddedBroker(
        data_dir=tmp_path / name,
        port=port,
        config=config,
        log_path=tmp_path / f"{name}-broker.log",
    )
    broker.start()
    return broker


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    b = start_broker(tmp_path)
    try:
        yield b
    finally:
        b.close()


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[Callable[..., EmbeddedBroker]]:
    """``broker_factory(config={...}, name="x")`` -> a started broker, closed at teardown."""
    made: list[EmbeddedBroker] = []

    def make(config: dict[str, str] | None = None, name: str = "data", port: int = 0) -> EmbeddedBroker:
        b = start_broker(tmp_path, name=name, config=config, port=port)
        made.append(b)
        return b

    try:
        yield make
    finally:
        for b in made:
            try:
                b.close()
            except Exception:  # pragma: no cover - best effort teardown
                pass


def wait_until(predicate: Callable[[], Any], timeout: float, interval: float = 0.05,
               message: str = "condition") -> Any:
    """Poll ``predicate`` until it returns something truthy or fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = predicate()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message} (last={last!r})")
        time.sleep(interval)


def create_topic(bootstrap: str, name: str, partitions: int, config: dict[str, str] | None = None) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futs = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1,
                                         config=config or {})], operation_timeout=10, request_timeout=15)
    futs[name].result(timeout=20)


def confluent_consume_all(bootstrap: str, topic: str, expected: dict[int, int],
                          timeout: float = 60.0, start: dict[int, int] | None = None,
                          extra: dict[str, Any] | None = None) -> dict[int, list[Any]]:
    """Read partitions from ``start`` (default 0) until ``expected[p]`` end offsets.

    Returns ``{partition: [Message, ...]}``; fails on any consumer error.
    """
    from confluent_kafka import Consumer, TopicPartition

    conf = {
        "bootstrap.servers": bootstrap,
        "group.id": "unused-manual-assign",
        "enable.auto.commit": False,
        "auto.offset.reset": "error",
        "isolation.level": "read_uncommitted",
        "enable.partition.eof": False,
    }
    conf.update(extra or {})
    c = Consumer(conf)
    out: dict[int, list[Any]] = {p: [] for p in expected}
    try:
        starts = start or {}
        c.assign([TopicPartition(topic, p, starts.get(p, 0)) for p in expected])
        pos = {p: starts.get(p, 0) for p in expected}
        deadline = time.monotonic() + timeout
        while any(pos[p] < expected[p] for p in expected):
            if time.monotonic() > deadline:
                raise AssertionError(f"consume timed out: positions {pos}, expected {expected}")
            for m in c.consume(num_messages=1000, timeout=0.5):
                if m.error():
                    raise AssertionError(f"consumer error: {m.error()}")
                out[m.partition()].append(m)
                pos[m.partition()] = m.offset() + 1
    finally:
        c.close()
    return out


def confluent_watermarks(bootstrap: str, topic: str, partitions: int,
                         timeout: float = 10.0) -> dict[int, tuple[int, int]]:
    """ListOffsets through librdkafka: ``{partition: (log_start, high_watermark)}``."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused-watermarks",
                  "enable.auto.commit": False})
    try:
        return {p: tuple(c.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout, cached=False))
                for p in range(partitions)}
    finally:
        c.close()


# -- on-disk inspection (independent of the broker's own parser) -------------

CODEC_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}


def partition_dir(data_dir: Path, topic: str, partition: int) -> Path:
    return Path(data_dir) / f"{topic}-{partition}"


def segment_files(data_dir: Path, topic: str, partition: int) -> list[Path]:
    """The ``*.log`` segment files of one partition, ordered by base offset."""
    d = partition_dir(data_dir, topic, partition)
    return sorted(d.glob("*.log"), key=lambda p: int(p.stem))


def scan_batches(path: Path) -> list[tuple[int, int, int]]:
    """``(base_offset, record_count, codec)`` for each v2 batch stored in a segment file."""
    import struct

    data = path.read_bytes()
    out = []
    pos = 0
    while pos + 61 <= len(data):
        base_offset, length = struct.unpack_from(">qi", data, pos)
        if length <= 0:
            break
        magic = data[pos + 16]
        assert magic == 2, f"unexpected magic {magic} in {path} at {pos}"
        attributes = struct.unpack_from(">h", data, pos + 21)[0]
        last_delta = struct.unpack_from(">i", data, pos + 23)[0]
        out.append((base_offset, last_delta + 1, attributes & 0x7))
        pos += 12 + length
    return out


def check_segment_chain(data_dir: Path, topic: str, partition: int) -> tuple[int, int, int]:
    """Strictly parse a partition's segment files: every byte belongs to a whole v2
    batch with a valid CRC-32C, and base offsets continue across batches and
    segments.  Returns ``(first_offset, next_offset, batches)``."""
    import struct

    from crc32c import crc32c

    first = nxt = None
    batches = 0
    for path in segment_files(data_dir, topic, partition):
        data = path.read_bytes()
        pos = 0
        assert int(path.stem) == (nxt if nxt is not None else int(path.stem)), (
            f"{path.name}: segment base does not continue the previous segment (next {nxt})")
        while pos < len(data):
            assert pos + 61 <= len(data), f"{path}: {len(data) - pos} trailing bytes at {pos} (torn batch)"
            base, length = struct.unpack_from(">qi", data, pos)
            end = pos + 12 + length
            assert length >= 49 and end <= len(data), f"{path}: torn batch at {pos} (length {length})"
            assert data[pos + 16] == 2, f"{path}: bad magic at {pos}"
            (crc,) = struct.unpack_from(">I", data, pos + 17)
            assert crc32c(data[pos + 21:end]) == crc, f"{path}: CRC mismatch in batch at offset {base}"
            (last_delta,) = struct.unpack_from(">i", data, pos + 23)
            if nxt is not None:
                assert base == nxt, f"{path}: batch base {base} does not follow {nxt}"
            else:
                first = base
            nxt = base + last_delta + 1
            batches += 1
            pos = end
        if nxt is None:
            nxt = int(path.stem)
    return (first if first is not None else (nxt or 0)), (nxt or 0), batches


def stored_codecs(data_dir: Path, topic: str, partitions: int) -> dict[str, int]:
    """Codec name -> number of records stored in batches using it, over a topic."""
    counts: dict[str, int] = {}
    for p in range(partitions):
        for seg in segment_files(data_dir, topic, p):
            for _base, n, codec in scan_batches(seg):
                counts[CODEC_NAMES[codec]] = counts.get(CODEC_NAMES[codec], 0) + n
    return counts


def api_versions(bootstrap: str, timeout: float = 10.0) -> dict[int, tuple[int, int]]:
    """ApiVersions v0 over a raw socket: api_key -> (min_version, max_version)."""
    import socket
    import struct

    host, port = bootstrap.rsplit(":", 1)
    client_id = b"oncelog-it"
    body = struct.pack(">hhih", 18, 0, 4242, len(client_id)) + client_id
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(struct.pack(">i", len(body)) + body)

        def read(n: int) -> bytes:
            buf = b""
            while len(buf) < n:
                chunk = s.recv(n - len(buf))
                if not chunk:
                    raise ConnectionError("broker closed the connection")
                buf += chunk
            return buf

        (size,) = struct.unpack(">i", read(4))
        resp = read(size)
    corr, err, n = struct.unpack_from(">ihi", resp, 0)
    assert corr == 4242 and err == 0, (corr, err)
    out = {}
    for k in range(n):
        key, lo, hi = struct.unpack_from(">hhh", resp, 10 + 6 * k)
        out[key] = (lo, hi)
    return out


# -- helpers for the test modules --------------------------------------------
# test modules get these helpers through the ``kit`` fixture, or import them from
# ``tests.integration.conftest`` (tests/, tests/unit and tests/integration are
# packages, so the unit and integration conftests do not clash as ``conftest``).

import types as _types

_KIT = _types.SimpleNamespace(
    start_broker=start_broker,
    wait_until=wait_until,
    create_topic=create_topic,
    confluent_consume_all=confluent_consume_all,
    confluent_watermarks=confluent_watermarks,
    partition_dir=partition_dir,
    segment_files=segment_files,
    scan_batches=scan_batches,
    stored_codecs=stored_codecs,
    check_segment_chain=check_segment_chain,
    CODEC_NAMES=CODEC_NAMES,
    api_versions=api_versions,
)


@pytest.fixture(scope="session")
def kit() -> _types.SimpleNamespace:
    return _KIT


JS_DIR = Path(__file__).resolve().parent.parent / "js"


@pytest.fixture(scope="session")
def node() -> str:
    """The node executable, with tests/js's pinned kafkajs 2.2.4 and its codec packages installed
    (npm install runs when any dependency of tests/js/package.json does not resolve)."""
    exe = shutil.which("node")
    if exe is None:
        pytest.skip("node is not installed")
    deps = sorted(json.loads((JS_DIR / "package.json").read_text())["dependencies"])
    probe = [exe, "-e", "for (const d of process.argv.slice(1)) require.resolve(d)", *deps]
    if subprocess.run(probe, cwd=JS_DIR, capture_output=True, timeout=60).returncode != 0:
        npm = shutil.which("npm")
        assert npm is not None, "node is installed but npm is not; cannot install kafkajs"
        proc = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--no-package-lock"],
            cwd=JS_DIR, capture_output=True, text=True, timeout=300,
        )
        assert proc.returncode == 0, f"npm install failed:\n{proc.stdout}\n{proc.stderr}"
    version = json.loads((JS_DIR / "node_modules" / "kafkajs" / "package.json").read_text())["version"]
    assert version == "2.2.4", f"tests/js has kafkajs {version}, want 2.2.4"
    return exe
