"""Golden frames captured from real clients (tests/golden, see its README.md).

- every request fixture parses (header via oncelog.protocol.headers, body via
  decode_request) as the API/version its name says, consuming every byte, and
  kio re-encodes the decoded body to the same bytes;
- every response fixture decodes with decode_response, consuming every byte,
  and carries its request's correlation id;
- the broker's dispatcher (sans IO, a real Broker on a tmp dir) answers every
  request fixture with a response of the same schema and, where the data does
  not depend on wall-clock time or random ids, the same values as captured.
"""

from __future__ import annotations

import asyncio
import re
import struct
import uuid
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from kio.schema.index import api_key_map
from kio.serial import entity_reader

from oncelog.broker.broker import Broker
from oncelog.broker.config import BrokerConfig
from oncelog.broker.dispatch import handle_frame
from oncelog.broker.handlers import HANDLERS
from oncelog.protocol.codec import (
    decode_request,
    decode_response,
    encode_request,
    is_flexible,
    request_type,
    response_type,
)
from oncelog.protocol.headers import API_VERSIONS_KEY, parse_request_header_prefix, skip_tagged_fields
from oncelog.protocol.records import iter_batch_headers, iter_records

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
NAME = re.compile(r"^(?P<api>[a-z_]+)_(?P<kind>request|response)_v(?P<version>\d+)_(?P<n>\d{3})\.bin$")
API_KEYS = {name: key for key, name in api_key_map.items()}

CLIENTS = ("confluent-kafka", "kafka-python", "aiokafka")
TOPICS = {f"golden-{c}" for c in CLIENTS}
N_RECORDS = 3  # records each client produced (tests/golden/capture.py)
# client_id prefixes the three clients send
CLIENT_IDS = ("rdkafka", "golden-", "kafka-python", "aiokafka")

PRODUCE, FETCH, LIST_OFFSETS, METADATA, CREATE_TOPICS = 0, 1, 2, 3, 19
UNKNOWN_TOPIC_ID = 100


@dataclass(frozen=True)
class Fixture:
    path: Path
    api: str
    api_key: int
    kind: str
    version: int
    n: int

    @property
    def data(self) -> bytes:
        return self.path.read_bytes()

    def partner(self) -> "Fixture":
        other = "response" if self.kind == "request" else "request"
        return parse_name(self.path.with_name(f"{self.api}_{other}_v{self.version}_{self.n:03d}.bin"))


def parse_name(path: Path) -> Fixture:
    m = NAME.match(path.name)
    assert m, f"fixture {path.name} is not named <api>_<request|response>_v<N>_<NNN>.bin"
    api = m["api"]
    assert api in API_KEYS, f"{api} is not a kio API name"
    return Fixture(path, api, API_KEYS[api], m["kind"], int(m["version"]), int(m["n"]))


ALL = sorted(GOLDEN.glob("*.bin"))
REQUESTS = [f for f in map(parse_name, ALL) if f.kind == "request"]
RESPONSES = [f for f in map(parse_name, ALL) if f.kind == "response"]


def ids(fixtures: list[Fixture]) -> list[str]:
    return [f.path.stem for f in fixtures]


# -- parsing helpers -------------------------------------------------------------


def parse_request(fx: Fixture) -> tuple[Any, Any, int]:
    """(header, body entity, body start) of a request fixture; asserts every byte is consumed."""
    data = fx.data
    header, pos = parse_request_header_prefix(data)
    if is_flexible(fx.api_key, fx.version):
        pos = skip_tagged_fields(data, pos)
    body = decode_request(fx.api_key, fx.version, data, pos)
    _, size = entity_reader(request_type(fx.api_key, fx.version))(data, pos)
    assert pos + size == len(data), f"{len(data) - pos - size} trailing bytes"
    return header, body, pos


def response_body_start(api_key: int, version: int, data: bytes) -> int:
    # response header v1 (a tagged-field block) for flexible versions, except ApiVersions (always v0)
    if is_flexible(api_key, version) and api_key != API_VERSIONS_KEY:
        return skip_tagged_fields(data, 4)
    return 4


def parse_response(api_key: int, version: int, data: bytes) -> tuple[int, Any]:
    """(correlation id, body entity); asserts the body schema consumes every byte."""
    (corr,) = struct.unpack_from(">i", data)
    pos = response_body_start(api_key, version, data)
    body = decode_response(api_key, version, data, pos)
    _, size = entity_reader(response_type(api_key, version))(data, pos)
    assert pos + size == len(data), f"{len(data) - pos - size} trailing bytes"
    return corr, body


def record_values(records: bytes | None) -> list[bytes | None]:
    out: list[bytes | None] = []
    for _hdr, start, end in iter_batch_headers(records or b""):
        out += [rec.value for _off, _ts, rec in iter_records(records[start:end])]  # type: ignore[index]
    return out


# -- the fixture set itself --------------------------------------------------------


def test_fixture_set() -> None:
    assert ALL, f"no fixtures in {GOLDEN}; run tests/golden/capture.py"
    assert len(ALL) <= 60 and sum(p.stat().st_size for p in ALL) <= 1 << 20
    apis = {f.api for f in REQUESTS}
    assert {"api_versions", "create_topics", "metadata", "produce", "fetch", "list_offsets"} <= apis
    # every request has its response and vice versa
    assert sorted(ids([f.partner() for f in REQUESTS])) == sorted(ids(RESPONSES))
    # all three clients are represented
    client_ids = {parse_request_header_prefix(f.data)[0].client_id or "" for f in REQUESTS}
    assert any(c.startswith("rdkafka") for c in client_ids)
    assert any("kafka-python" in c for c in client_ids)
    assert any("aiokafka" in c for c in client_ids)


# -- requests ---------------------------------------------------------------------


@pytest.mark.parametrize("fx", REQUESTS, ids=ids(REQUESTS))
def test_request_fixture_parses_and_reencodes(fx: Fixture) -> None:
    header, body, pos = parse_request(fx)
    assert (header.api_key, header.api_version) == (fx.api_key, fx.version)
    assert header.client_id and header.client_id.startswith(CLIENT_IDS), header.client_id
    assert header.correlation_id >= 0
    assert type(body) is request_type(fx.api_key, fx.version)
    # kio writes back exactly the bytes the client sent
    assert encode_request(body) == fx.data[pos:]
    check_request_values(fx, body)


def check_request_values(fx: Fixture, body: Any) -> None:
    """Concrete values of the captured sessions (create, produce 3 records, fetch, list, metadata)."""
    if fx.api_key == CREATE_TOPICS:
        assert [(t.name, t.num_partitions) for t in body.topics] in ([(n, 1)] for n in TOPICS)
        assert body.validate_only is False
    elif fx.api_key == PRODUCE:
        assert body.acks == -1
        assert body.transactional_id is None
        (topic,) = body.topic_data
        assert topic.name in TOPICS
        (part,) = topic.partition_data
        assert part.index == 0
        client = topic.name.removeprefix("golden-")
        assert record_values(part.records) == [f"{client} golden record {i}".encode() for i in range(N_RECORDS)]
        (hdr, _, _), = iter_batch_headers(part.records)
        assert (hdr.magic, hdr.compression, hdr.producer_id) == (2, 0, -1)
    elif fx.api_key == FETCH:
        (topic,) = body.topics
        if fx.version >= 13:
            assert isinstance(topic.topic_id, uuid.UUID) and topic.topic_id.int != 0
        else:
            assert topic.topic in TOPICS
        (part,) = topic.partitions
        assert part.partition == 0
        assert part.fetch_offset in (0, N_RECORDS)
        assert body.isolation_level in (0, 1)
        assert body.max_bytes > 0
    elif fx.api_key == LIST_OFFSETS:
        (topic,) = body.topics
        assert topic.name in TOPICS
        (part,) = topic.partitions
        assert part.partition_index == 0
        assert part.timestamp in (-1, -2)  # latest / earliest
    elif fx.api_key == METADATA:
        names = None if body.topics is None else [t.name for t in body.topics]
        assert names is None or set(names) <= TOPICS
    elif fx.api_key == API_VERSIONS_KEY and fx.version >= 3:
        assert body.client_software_name in ("librdkafka", "kafka-python", "aiokafka", "confluent-kafka-python")
        assert body.client_software_version


# -- responses --------------------------------------------------------------------


@pytest.mark.parametrize("fx", RESPONSES, ids=ids(RESPONSES))
def test_response_fixture_decodes(fx: Fixture) -> None:
    corr, body = parse_response(fx.api_key, fx.version, fx.data)
    assert type(body) is response_type(fx.api_key, fx.version)
    request_header, _ = parse_request_header_prefix(fx.partner().data)
    assert corr == request_header.correlation_id
    check_response_values(fx.api_key, fx.version, body)


def check_response_values(api_key: int, version: int, body: Any) -> None:
    if api_key == API_VERSIONS_KEY:
        assert body.error_code == 0
        ranges = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in body.api_keys}
        assert ranges[PRODUCE] == (3, 12) and ranges[API_VERSIONS_KEY] == (0, 4)
    elif api_key == CREATE_TOPICS:
        (t,) = body.topics
        assert t.name in TOPICS and t.error_code == 0
        if version >= 5:
            assert t.num_partitions == 1
    elif api_key == PRODUCE:
        (t,) = body.responses
        (p,) = t.partition_responses
        assert (t.name in TOPICS, p.index, p.error_code, p.base_offset) == (True, 0, 0, 0)
    elif api_key == LIST_OFFSETS:
        (t,) = body.topics
        (p,) = t.partitions
        assert (t.name in TOPICS, p.partition_index, p.error_code) == (True, 0, 0)
        assert p.offset in (0, N_RECORDS)
    elif api_key == FETCH:
        assert body.error_code == 0
        (t,) = body.responses
        (p,) = t.partitions
        assert (p.partition_index, p.error_code, p.high_watermark) == (0, 0, N_RECORDS)
        values = record_values(p.records)
        assert len(values) in (0, N_RECORDS)
        assert all(re.fullmatch(rb"(confluent-kafka|kafka-python|aiokafka) golden record [0-2]", v or b"") for v in values)
    elif api_key == METADATA:
        assert [b.node_id for b in body.brokers] == [1]
        for t in body.topics:
            assert t.name in TOPICS and t.error_code == 0
            assert [p.partition_index for p in t.partitions] == [0]


# -- the dispatcher answers the captured requests ----------------------------------

_ORDER = {API_VERSIONS_KEY: 0, CREATE_TOPICS: 1, METADATA: 2, PRODUCE: 3, LIST_OFFSETS: 4, FETCH: 5}


@cache
def captured_topic_ids() -> dict[uuid.UUID, str]:
    """Topic id -> name, from captured responses that carry ids (Metadata v10+, CreateTopics v7+)."""
    out: dict[uuid.UUID, str] = {}
    for fx in RESPONSES:
        _, body = parse_response(fx.api_key, fx.version, fx.data)
        if fx.api_key == METADATA and fx.version >= 10:
            out.update({t.topic_id: t.name for t in body.topics})
        elif fx.api_key == CREATE_TOPICS and fx.version >= 7:
            out.update({t.topic_id: t.name for t in body.topics})
    return out


def comparable(api_key: int, version: int, body: Any, names: dict[uuid.UUID, str]) -> Any:
    """The values of a response that do not depend on time, ids or broker address."""
    if api_key == CREATE_TOPICS:
        return [(t.name, t.error_code) for t in body.topics]
    if api_key == PRODUCE:
        return [(t.name, p.index, p.error_code, p.base_offset) for t in body.responses for p in t.partition_responses]
    if api_key == LIST_OFFSETS:
        return [(t.name, p.partition_index, p.error_code, p.offset) for t in body.topics for p in t.partitions]
    if api_key == FETCH:
        return [
            (names[t.topic_id] if version >= 13 else t.topic, p.partition_index, p.error_code, p.high_watermark, record_values(p.records))
            for t in body.responses
            for p in t.partitions
        ]
    if api_key == METADATA:
        return sorted((t.name, t.error_code, len(t.partitions)) for t in body.topics)
    return None


def test_dispatcher_answers_every_captured_request(tmp_path: Path) -> None:
    requests = sorted(REQUESTS, key=lambda f: (_ORDER[f.api_key], f.version, f.n))
    captured_ids = captured_topic_ids()
    # the fetches by topic id (v13+) name topics whose ids a captured response gave
    assert set(captured_ids.values()) <= TOPICS
    for fx in requests:
        if fx.api_key == FETCH and fx.version >= 13:
            assert {t.topic_id for t in parse_request(fx)[1].topics} <= set(captured_ids)

    names = dict(captured_ids)  # captured and replayed topic ids -> names

    async def run() -> list[tuple[Fixture, bytes, bytes]]:
        broker = Broker(BrokerConfig(data_dir=tmp_path / "data", port=0))
        out = []
        try:
            for fx in requests:
                frame = fx.data
                if fx.api_key == FETCH and fx.version >= 13:
                    # the broker made fresh topic ids: point the captured ones at them
                    for old_id, name in captured_ids.items():
                        frame = frame.replace(old_id.bytes, broker.topics[name].topic_id.bytes)
                parts = await asyncio.wait_for(handle_frame(broker, frame, "golden"), 10)
                assert parts is not None, fx.path.name
                out.append((fx, frame, b"".join(bytes(p) for p in parts)))
            await broker.committer.drain()
            names.update({t.topic_id: name for name, t in broker.topics.items()})
        finally:
            broker.close()
        return out

    answered = asyncio.run(run())
    assert len(answered) == len(REQUESTS)
    fetched_records: set[str] = set()
    for fx, frame, raw in answered:
        corr, body = parse_response(fx.api_key, fx.version, raw)
        header, _ = parse_request_header_prefix(frame)
        assert corr == header.correlation_id
        assert type(body) is response_type(fx.api_key, fx.version)
        check_response_values(fx.api_key, fx.version, body)
        if fx.api_key == API_VERSIONS_KEY:
            ranges = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in body.api_keys}
            assert ranges == {h.api_key: (h.min_version, h.max_version) for h in HANDLERS.values()}
            continue
        _, captured = parse_response(fx.api_key, fx.version, fx.partner().data)
        if fx.api_key == METADATA and parse_request(fx)[1].topics is None:
            # "all topics": the replay has all three topics from the start
            assert {t.name for t in body.topics} == TOPICS
            continue
        replayed = comparable(fx.api_key, fx.version, body, names)
        assert replayed == comparable(fx.api_key, fx.version, captured, names), fx.path.name
        if fx.api_key == FETCH and replayed[0][4]:
            fetched_records.add(replayed[0][0])
    # every client's records came back through a replayed Fetch, the confluent one by topic id
    assert fetched_records == TOPICS
