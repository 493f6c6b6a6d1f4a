"""Protocol fuzzer against one real broker process (issue 6, bad input at scale).

Generators live in :mod:`oncelog.testing.fuzz`: malformed frames, valid
headers with garbage bodies for random (api_key, version) pairs, schema-valid
requests with hostile field values, real requests (tests/golden and
structured) mutated by bit flips/truncation/extension, tagged-field garbage in
flexible versions, and random API/version pairs with random bodies.

For every case the broker must answer (a sentinel ApiVersions request sent
after the case gets its response) or close only that connection, within a
timeout; it must stay alive; and it must not log an internal error (a
handler exception) for the case's connection. Throughout, an idempotent
confluent-kafka producer (acks=all) produces in a thread; at the end every
record it had acknowledged is read back exactly once (read_uncommitted), the
broker is still the same process, its RSS grew by less than 100 MB, and its
log holds no traceback.

Runs are derandomized (same cases every run). ``ONCELOG_FUZZ_EXAMPLES=<k>``
multiplies every example count by k for a longer campaign. Shrinking is off
so that a crash costs one restart, not hundreds; the failing case is printed
as a ``FuzzCase`` with its bytes. Bugs found by this fuzzer are pinned by the
``test_regression_*`` tests at the end.
"""

from __future__ import annotations

import os
import re
import struct
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import pytest
from confluent_kafka import Producer
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from oncelog.client.admin import Admin
from oncelog.testing import fuzz
from oncelog.testing.embedded import EmbeddedBroker

pytestmark = pytest.mark.timeout(900)

SCALE = max(1, int(os.environ.get("ONCELOG_FUZZ_EXAMPLES", "1")))
MAX_REQUEST = 1 << 20
BG_TOPIC = "fuzz-bg"
CASE_TIMEOUT = 10.0  # seconds a case may take before it counts as a hang
RSS_BOUND_KB = 100 * 1024


def fuzz_settings(n: int) -> settings:
    return settings(
        max_examples=n * SCALE,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )


# -- broker and healthy client -----------------------------------------------------


class FuzzTarget:
    """The broker under test; restarted (and the crash recorded) if a case kills it."""

    def __init__(self, root: Path) -> None:
        self.broker = EmbeddedBroker(
            data_dir=root / "data",
            log_path=root / "broker.log",
            config={
                "socket.request.max.bytes": str(MAX_REQUEST),
                "auto.create.topics.enable": "false",
                "group.initial.rebalance.delay.ms": "0",
            },
        )
        self.crashes: list[str] = []
        self.stats: Counter[str] = Counter()
        self.elapsed: Counter[str] = Counter()
        self.rss_start_kb = 0
        self.first_pid = 0

    @property
    def log_path(self) -> Path:
        return Path(self.broker.log_path)

    def pid(self) -> int:
        assert self.broker.proc is not None
        return self.broker.proc.pid

    def alive(self) -> bool:
        return self.broker.proc is not None and self.broker.proc.poll() is None

    def revive(self, case: fuzz.FuzzCase) -> None:
        code = self.broker.proc.poll() if self.broker.proc is not None else None
        self.crashes.append(f"exit {code} after {case!r}")
        self.broker._close_proc()
        self.broker.start()

    def log_offset(self) -> int:
        return self.log_path.stat().st_size

    def log_since(self, offset: int) -> str:
        with open(self.log_path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


class HealthyProducer(threading.Thread):
    """An idempotent acks=all producer; remembers every acknowledged record."""

    def __init__(self, bootstrap: str) -> None:
        super().__init__(name="fuzz-healthy-producer", daemon=True)
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 5,
                "compression.type": "none",
                "message.timeout.ms": 120000,
            }
        )
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.acked: dict[bytes, tuple[int, int]] = {}
        self.errors: list[str] = []
        self.sent = 0

    def _on_delivery(self, err: Any, msg: Any) -> None:
        with self.lock:
            if err is not None:
                self.errors.append(str(err))
            else:
                self.acked[msg.value()] = (msg.partition(), msg.offset())

    def run(self) -> None:
        i = 0
        while not self.stop_event.is_set():
            try:
                self.producer.produce(BG_TOPIC, value=b"healthy-%07d" % i, key=b"%d" % (i % 7),
                                      on_delivery=self._on_delivery)
            except BufferError:
                self.producer.poll(0.05)
                continue
            self.sent += 1
            i += 1
            self.producer.poll(0.002)
        self.producer.flush(60)

    def acks(self) -> int:
        with self.lock:
            return len(self.acked)

    def finish(self) -> None:
        self.stop_event.set()
        self.join(90)
        assert not self.is_alive(), "healthy producer did not flush"


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzTarget]:
    t = FuzzTarget(tmp_path_factory.mktemp("fuzz"))
    t.broker.start()
    try:
        with Admin(t.broker.bootstrap) as admin:
            assert admin.create_topic(BG_TOPIC, 3) is None
        t.first_pid = t.pid()
        yield t
    finally:
        t.broker.close()


@pytest.fixture(scope="module")
def healthy(target: FuzzTarget) -> Iterator[HealthyProducer]:
    bg = HealthyProducer(target.broker.bootstrap)
    bg.start()
    deadline = time.monotonic() + 30
    while bg.acks() < 50:
        assert time.monotonic() < deadline, f"healthy producer got only {bg.acks()} acks: {bg.errors[:3]}"
        time.sleep(0.05)
    target.rss_start_kb = rss_kb(target.pid())
    yield bg
    if bg.is_alive():
        bg.finish()


_PORT_RE = r"127\.0\.0\.1:{port}\b"


def play(target: FuzzTarget, case: fuzz.FuzzCase, chunked: bool = False) -> fuzz.Outcome:
    """Send one case; assert the broker answered or closed, stayed up, and logged no internal error."""
    if not target.alive():
        target.revive(case)
    since = target.log_offset()
    out = fuzz.exchange(target.broker.host, target.broker.port, case, MAX_REQUEST, CASE_TIMEOUT, chunked)
    target.stats[f"{case.kind}:{'answered' if out.answered else 'closed' if out.closed else 'hung'}"] += 1
    target.elapsed[case.kind] += out.elapsed
    if not target.alive():
        time.sleep(0.2)
        tail = target.log_since(since)[-1500:]
        target.revive(case)
        raise AssertionError(f"the broker process died on {case!r}\nlog tail:\n{tail}")
    assert not out.hung, f"connection neither answered nor closed within {CASE_TIMEOUT}s: {case!r}"
    assert not out.problems, f"{out.problems} for {case!r}"
    if out.closed:
        # the close is logged before the abort; give the log a moment only if it is not there yet
        pattern = re.compile(_PORT_RE.format(port=out.local_port))
        text = target.log_since(since)
        if not pattern.search(text):
            time.sleep(0.05)
            text = target.log_since(since)
        mine = [ln for ln in text.splitlines() if pattern.search(ln)]
        internal = [ln for ln in mine if "internal error" in ln or " failed" in ln]
        assert not internal, f"internal error on {case!r}:\n" + "\n".join(mine) + "\n" + text[-3000:]
    return out


# -- the fuzz families ---------------------------------------------------------------


@fuzz_settings(300)
@given(case=fuzz.malformed_frames(MAX_REQUEST), chunked=st.booleans())
def test_fuzz_malformed_frames(target: FuzzTarget, healthy: HealthyProducer, case: fuzz.FuzzCase,
                               chunked: bool) -> None:
    out = play(target, case, chunked)
    if out.expectation == "refuse":
        assert out.closed and not out.answered
    if case.note in ("split_ok", "zero") and out.expectation == "answer":
        # valid frames (a zero-length frame is a too-short header: closed)
        assert out.answered or case.note == "zero", case


@fuzz_settings(400)
@given(case=fuzz.garbage_bodies())
def test_fuzz_garbage_bodies(target: FuzzTarget, healthy: HealthyProducer, case: fuzz.FuzzCase) -> None:
    play(target, case)


@fuzz_settings(500)
@given(case=fuzz.structured_requests())
def test_fuzz_structured_requests(target: FuzzTarget, healthy: HealthyProducer, case: fuzz.FuzzCase) -> None:
    """Schema-valid requests with hostile values: Kafka answers these with error codes."""
    out = play(target, case)
    produce_acks0 = case.note.startswith("api 0 ") and out.expectation == "answer"
    assert out.answered or produce_acks0, f"a well-formed request closed the connection: {case!r}"


@fuzz_settings(600)
@given(case=fuzz.mutated_requests())
def test_fuzz_mutated_requests(target: FuzzTarget, healthy: HealthyProducer, case: fuzz.FuzzCase) -> None:
    play(target, case)


@fuzz_settings(400)
@given(case=fuzz.tagged_garbage())
def test_fuzz_tagged_garbage(target: FuzzTarget, healthy: HealthyProducer, case: fuzz.FuzzCase) -> None:
    play(target, case)


@fuzz_settings(300)
@given(case=fuzz.random_pairs())
def test_fuzz_random_pairs(target: FuzzTarget, healthy: HealthyProducer, case: fuzz.FuzzCase) -> None:
    play(target, case)


def test_fuzz_many_connections_at_once(target: FuzzTarget, healthy: HealthyProducer) -> None:
    """Cases from every family on 8 concurrent connections (interleaved on the event loop)."""
    cases = fuzz.iter_cases(fuzz.any_case(), 240 * SCALE)
    failures: list[str] = []
    lock = threading.Lock()

    def worker(chunk: list[fuzz.FuzzCase]) -> None:
        for case in chunk:
            try:
                play(target, case)
            except AssertionError as exc:
                with lock:
                    failures.append(str(exc)[:2000])

    threads = [threading.Thread(target=worker, args=(cases[i::8],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert not failures, f"{len(failures)} failures, first:\n{failures[0]}"


# -- afterwards ------------------------------------------------------------------------


def test_zz_healthy_producer_lost_nothing(target: FuzzTarget, healthy: HealthyProducer, kit: Any) -> None:
    before = healthy.acks()
    time.sleep(1.0)
    assert healthy.acks() > before, "the healthy producer made no progress at the end"
    healthy.finish()
    assert not healthy.errors, healthy.errors[:5]
    acked = dict(healthy.acked)
    assert len(acked) == healthy.sent > 100
    ends: dict[int, int] = {}
    with Admin(target.broker.bootstrap) as admin:
        info = admin.topic_summary(BG_TOPIC)
    assert info is not None
    ends = {p["partition"]: p["high_watermark"] for p in info["partitions"]}
    got = kit.confluent_consume_all(target.broker.bootstrap, BG_TOPIC, ends)
    seen = Counter(m.value() for msgs in got.values() for m in msgs)
    lost = [v for v in acked if seen[v] == 0]
    dup = [v for v in acked if seen[v] > 1]
    assert not lost, f"{len(lost)} acknowledged records lost, e.g. {lost[:3]}"
    assert not dup, f"{len(dup)} acknowledged records duplicated, e.g. {dup[:3]}"
    where = {m.value(): (p, m.offset()) for p, msgs in got.items() for m in msgs}
    moved = [v for v, pos in acked.items() if where[v] != pos]
    assert not moved, f"{len(moved)} records not at their acknowledged offset, e.g. {moved[:3]}"
    target.stats["healthy:acked"] = len(acked)


def test_zz_broker_alive_bounded_memory_clean_log(target: FuzzTarget, capsys: pytest.CaptureFixture[str]) -> None:
    assert target.alive(), "the broker process is gone"
    rss_end = rss_kb(target.pid())
    log_text = target.log_path.read_text(errors="replace")
    closes = Counter(
        m.group(1) for m in re.finditer(r"closing connection from \S+: ([a-z ]+?)(?: [0-9A-Z(:]|$)", log_text, re.M)
    )
    with capsys.disabled():
        print("\n-- fuzz summary --")
        for key in sorted(target.stats):
            print(f"  {key:40s} {target.stats[key]}")
        for kind in sorted(target.elapsed):
            print(f"  time in {kind:32s} {target.elapsed[kind]:.1f}s")
        print(f"  broker close reasons: {dict(closes.most_common(8))}")
        print(f"  RSS start {target.rss_start_kb} kB, end {rss_end} kB, growth {rss_end - target.rss_start_kb} kB")
        print(f"  crashes: {len(target.crashes)}")
        for c in target.crashes[:5]:
            print(f"    {c[:600]}")
    assert not target.crashes, f"{len(target.crashes)} broker crashes; first: {target.crashes[0][:2000]}"
    assert target.pid() == target.first_pid
    assert rss_end - target.rss_start_kb < RSS_BOUND_KB, (target.rss_start_kb, rss_end)
    assert "Traceback" not in log_text, log_text[log_text.index("Traceback") - 500 :][:4000]


# -- regressions found by this fuzzer -------------------------------------------------------


def _metadata_v12_header() -> bytes:
    return fuzz.request_header(3, 12, 77, b"regression", flexible=True)


def test_regression_huge_compact_array_length_does_not_kill_broker(broker_factory: Any) -> None:
    """A 14-byte Metadata v12 request whose topics array claims 2**32-2 entries.

    kio's native reader preallocates the array from the untrusted length
    ("memory allocation of 34359738352 bytes failed") and aborts the whole
    process (SIGABRT, exit -6) instead of raising. Every flexible API whose
    body starts with a compact array does it (Metadata v9+, OffsetFetch v8+,
    CreateTopics v5+, ...). Kafka answers a request it cannot parse by
    closing that connection; the broker must survive.
    """
    b = broker_factory(name="regress-array")
    data = fuzz.framed(_metadata_v12_header() + b"\xff\xff\xff\xff\x0f")
    out = fuzz.exchange(b.host, b.port, fuzz.FuzzCase("regression", data), MAX_REQUEST, 10.0)
    time.sleep(0.3)
    assert b.proc is not None
    assert b.proc.poll() is None, f"broker died with exit code {b.proc.poll()} on a 14-byte request"
    assert out.closed and not out.answered
    # and it still serves
    with Admin(b.bootstrap) as admin:
        assert isinstance(admin.list_topics(), list)


def _internal_errors(b: EmbeddedBroker, port: int) -> list[str]:
    time.sleep(0.2)
    text = Path(b.log_path).read_text(errors="replace")
    return [ln for ln in text.splitlines()
            if f"127.0.0.1:{port}" in ln and ("internal error" in ln or " failed" in ln)] + (
        [text[text.index("Traceback"):][:1500]] if "Traceback" in text else [])


@pytest.mark.parametrize(
    "name,data",
    [
        # ListOffsets v6: replica_id -1, isolation 0, topics = compact null (0x00), empty tags
        ("list_offsets_v6_null_topics",
         fuzz.request_header(2, 6, 5, b"regression", flexible=True) + b"\xff\xff\xff\xff\x00\x00\x00"),
        # Produce v9: transactional_id null, acks -1, timeout 1000, topic_data = compact null
        ("produce_v9_null_topic_data",
         fuzz.request_header(0, 9, 6, b"regression", flexible=True) + b"\x00\xff\xff\x00\x00\x03\xe8\x00\x00"),
        # Produce v9: one topic "t" whose partition_data is compact null
        ("produce_v9_null_partition_data",
         fuzz.request_header(0, 9, 7, b"regression", flexible=True)
         + b"\x00\xff\xff\x00\x00\x03\xe8\x02\x02t\x00\x00\x00"),
    ],
)
def test_regression_null_non_nullable_array_is_internal_error(broker_factory: Any, name: str, data: bytes) -> None:
    """A compact array length of 0 means null; these arrays are not nullable.

    kio decodes the null as None and the handler iterates it (TypeError:
    'NoneType' object is not iterable), so the server logs a traceback and
    closes the connection as an "internal error". Kafka's generated parser
    rejects the request ("non-nullable field ... was serialized as null"), a
    parse error: the connection is closed as bad input, with no handler run.
    """
    b = broker_factory(name=f"regress-{name}")
    out = fuzz.exchange(b.host, b.port, fuzz.FuzzCase("regression", fuzz.framed(data)), MAX_REQUEST, 10.0)
    assert not out.hung
    assert b.proc is not None and b.proc.poll() is None
    assert not _internal_errors(b, out.local_port), _internal_errors(b, out.local_port)


def test_regression_metadata_v11_null_topic_name_is_internal_error(broker_factory: Any) -> None:
    """Metadata v11 (names nullable since v10) asking for a topic by id with a null name.

    The handler echoes the null name into a v11 response, whose topic name is
    not nullable, and kio's writer raises TypeError("Unexpectedly received
    None value"): an internal error and a closed connection for a request
    that parses. Kafka answers it (v10/v11 do not support lookup by topic id:
    an error code in the response).
    """
    import uuid

    from oncelog.protocol.build import materialize
    from oncelog.protocol.codec import encode_request, request_type

    entity = materialize(request_type(3, 11), {
        "topics": [{"topic_id": uuid.UUID(int=12345), "name": None}],
        "allow_auto_topic_creation": False,
        "include_topic_authorized_operations": False,
    })
    data = fuzz.request_bytes(3, 11, entity, 9, b"regression")
    b = broker_factory(name="regress-metadata")
    out = fuzz.exchange(b.host, b.port, fuzz.FuzzCase("regression", fuzz.framed(data)), MAX_REQUEST, 10.0)
    assert not out.hung
    assert not _internal_errors(b, out.local_port), _internal_errors(b, out.local_port)
    assert out.answered
