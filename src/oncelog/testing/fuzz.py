"""Kafka protocol fuzzing: frame generators and hypothesis strategies.

Usable from pytest (``tests/unit/test_fuzz_codec.py`` drives the decoder path
sans IO, ``tests/integration/test_fuzz.py`` a real broker) and from a plain
script::

    from oncelog.testing import fuzz
    from hypothesis import strategies as st
    case = fuzz.any_case().example()          # a FuzzCase
    outcome = fuzz.exchange("127.0.0.1", 9092, case)

Every strategy yields a :class:`FuzzCase`: the raw bytes one connection sends
(length prefixes included, so a case can lie about lengths) plus a label
saying which generator made it. The families:

- ``malformed_frames``: zero length, negative length, lengths above
  ``socket.request.max.bytes``, frames shorter than a request header,
  truncated frames, random junk;
- ``garbage_bodies``: a well-formed request header for a random
  (api_key, version) pair -- advertised, unknown keys, unsupported versions --
  followed by random bytes;
- ``structured_requests``: a schema-valid request of every advertised
  (api_key, version) with random field values (kio's types give the
  strategies), so the handlers see well-formed but hostile input;
- ``mutated_requests``: a valid request (a structured one, or a frame that a
  real client sent, from ``tests/golden``) after bit flips, byte overwrites,
  truncation, extension, insertion or deletion;
- ``tagged_garbage``: flexible versions with garbage tagged-field blocks in
  the header or at the end of the body (duplicate tags, huge sizes, sizes that
  run past the end, overlong varints);
- ``random_pairs``: any int16 api key and version with a random body.

:func:`exchange` plays one case against a broker and classifies what
happened; :func:`simulate_frames` tells which frames the broker's
:class:`~oncelog.protocol.framing.FrameDecoder` will cut from the bytes.
"""

from __future__ import annotations

import dataclasses
import datetime
import socket
import struct
import time
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Iterable

from hypothesis import strategies as st

from oncelog.protocol.fast_produce import uvarint
from oncelog.protocol.framing import FrameDecoder, FrameError

__all__ = [
    "DecoderWorker",
    "FuzzCase",
    "Outcome",
    "SENTINEL_CORRELATION_ID",
    "advertised",
    "any_case",
    "exchange",
    "framed",
    "garbage_bodies",
    "golden_requests",
    "iter_cases",
    "malformed_frames",
    "mutate",
    "mutated_requests",
    "random_pairs",
    "request_bytes",
    "request_header",
    "sentinel_request",
    "simulate_frames",
    "structured_request",
    "structured_requests",
    "tagged_garbage",
    "tame",
]

_I32 = struct.Struct(">i")
API_VERSIONS = 18
SENTINEL_CORRELATION_ID = 0x5E47_1E11
GOLDEN_DIR = Path(__file__).resolve().parents[3] / "tests" / "golden"
MAX_WAIT_MS = 300  # long-poll and rebalance timeouts are clamped to this


@dataclass(frozen=True)
class FuzzCase:
    """The bytes one connection sends, length prefixes included."""

    kind: str
    data: bytes
    note: str = ""

    def __repr__(self) -> str:  # hypothesis prints this for a failing example
        shown = self.data if len(self.data) <= 512 else self.data[:512] + b"..."
        return f"FuzzCase(kind={self.kind!r}, note={self.note!r}, len={len(self.data)}, data={shown!r})"


# -- wire helpers -------------------------------------------------------------


def framed(body: bytes) -> bytes:
    return _I32.pack(len(body)) + body


def request_header(
    api_key: int, version: int, correlation_id: int, client_id: bytes | None = b"fuzz", flexible: bool = False,
    tags: bytes = b"\x00",
) -> bytes:
    """Request header v1, or v2 (``flexible``) ending with the raw tag block ``tags``."""
    if client_id is None:
        out = struct.pack(">hhih", api_key, version, correlation_id, -1)
    else:
        out = struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id
    return out + (tags if flexible else b"")


def sentinel_request(correlation_id: int = SENTINEL_CORRELATION_ID) -> bytes:
    """A framed ApiVersions v0 request: proves the connection is still served."""
    return framed(request_header(API_VERSIONS, 0, correlation_id, b"fuzz-sentinel"))


@cache
def advertised() -> tuple[tuple[int, int, int], ...]:
    """``(api_key, min_version, max_version)`` of every API the broker advertises."""
    from oncelog.broker.handlers import HANDLERS

    return tuple((k, h.min_version, h.max_version) for k, h in sorted(HANDLERS.items()))


def advertised_pairs() -> list[tuple[int, int]]:
    return [(k, v) for k, lo, hi in advertised() for v in range(lo, hi + 1)]


def is_flexible(api_key: int, version: int) -> bool:
    from oncelog.protocol.codec import is_flexible as _flex

    try:
        return _flex(api_key, version)
    except Exception:  # no schema for this pair
        return False


def simulate_frames(data: bytes, max_frame_bytes: int) -> tuple[list[bytes], int, bool]:
    """The frames the broker's decoder cuts from ``data``: (frames, bytes left over, refused)."""
    dec = FrameDecoder(max_frame_bytes)
    try:
        frames = dec.feed(data)
    except FrameError:
        return [], 0, True
    return frames, dec.buffered, False


# -- valid requests -----------------------------------------------------------


def request_bytes(api_key: int, version: int, entity: Any, correlation_id: int = 1,
                  client_id: bytes | None = b"fuzz") -> bytes:
    """Header + encoded body of a request entity (no length prefix)."""
    from oncelog.protocol.codec import encode_request

    return request_header(api_key, version, correlation_id, client_id, is_flexible(api_key, version)) + encode_request(
        entity
    )


@cache
def golden_requests() -> tuple[tuple[int, int, bytes], ...]:
    """``(api_key, version, frame without length)`` of every request a real client sent (tests/golden)."""
    from kio.schema.index import api_key_map

    keys = {name: key for key, name in api_key_map.items()}
    out = []
    for path in sorted(GOLDEN_DIR.glob("*_request_v*_*.bin")):
        name, _, rest = path.stem.partition("_request_v")
        version = int(rest.split("_")[0])
        if name in keys:
            out.append((keys[name], version, path.read_bytes()))
    return tuple(out)


def tame(entity: Any) -> Any:
    """Make a random request safe to send to a shared broker.

    Wait-style fields (timedeltas: Fetch max wait, JoinGroup rebalance and
    session timeouts, ...) are clamped to :data:`MAX_WAIT_MS` (and huge negative
    ones to -1 ms), so a request that
    the broker legitimately parks cannot look like a hang; ``validate_only``
    is forced on, so random CreateTopics/CreatePartitions/AlterConfigs change
    nothing.
    """
    if not dataclasses.is_dataclass(entity) or isinstance(entity, type):
        return entity
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(entity):
        value = getattr(entity, f.name)
        if isinstance(value, datetime.timedelta) and value > datetime.timedelta(milliseconds=MAX_WAIT_MS):
            changes[f.name] = datetime.timedelta(milliseconds=MAX_WAIT_MS)
        elif isinstance(value, datetime.timedelta) and value < datetime.timedelta(milliseconds=-(2**31)):
            # kio encodes timedeltas near timedelta.min but cannot read them back (overflow)
            changes[f.name] = datetime.timedelta(milliseconds=-1)
        elif f.name == "validate_only" and value is False:
            changes[f.name] = True
        elif isinstance(value, tuple) and value and dataclasses.is_dataclass(value[0]):
            changes[f.name] = tuple(tame(v) for v in value)
        elif dataclasses.is_dataclass(value):
            changes[f.name] = tame(value)
    return dataclasses.replace(entity, **changes) if changes else entity


_registered = False


def _register_kio_strategies() -> None:
    """kio's primitive types carry hypothesis hooks; ``Records`` needs one."""
    global _registered
    if _registered:
        return
    from kio.static.primitive import Records

    st.register_type_strategy(Records, record_payloads())
    _registered = True


@st.composite
def record_batches(draw: Any) -> bytes:
    """A valid v2 record batch (sometimes idempotent-looking, sometimes a control batch)."""
    from oncelog.protocol.records import Record, encode_record_batch

    n = draw(st.integers(1, 4))
    records = [
        Record(key=draw(st.none() | st.binary(max_size=8)), value=draw(st.none() | st.binary(max_size=32)))
        for _ in range(n)
    ]
    kwargs: dict[str, Any] = {}
    if draw(st.booleans()):
        kwargs.update(
            producer_id=draw(st.integers(-1, 5)),
            producer_epoch=draw(st.integers(-1, 3)),
            base_sequence=draw(st.integers(-1, 10)),
            is_transactional=draw(st.booleans()),
            is_control=draw(st.booleans()),
        )
    return encode_record_batch(records, **kwargs)


def record_payloads() -> st.SearchStrategy[bytes]:
    """What a Produce ``records`` field carries: valid batches, damaged ones, or junk."""
    return st.one_of(
        record_batches(),
        record_batches().flatmap(mutated_bytes),
        st.binary(max_size=80),
    )


def structured_request(api_key: int, version: int) -> st.SearchStrategy[Any]:
    """A schema-valid, tamed request entity of ``api_key``/``version`` with random fields."""
    from oncelog.protocol.codec import request_type

    _register_kio_strategies()
    return st.from_type(request_type(api_key, version)).map(tame)


@st.composite
def _structured_frame(draw: Any, pairs: list[tuple[int, int]] | None = None) -> tuple[int, int, bytes]:
    api_key, version = draw(st.sampled_from(pairs or advertised_pairs()))
    entity = draw(structured_request(api_key, version))
    corr = draw(st.integers(0, 2**31 - 1))
    client_id = draw(st.sampled_from([b"fuzz", b"", None]))
    return api_key, version, request_bytes(api_key, version, entity, corr, client_id)


def structured_requests(pairs: list[tuple[int, int]] | None = None) -> st.SearchStrategy[FuzzCase]:
    return _structured_frame(pairs).map(
        lambda t: FuzzCase("structured", framed(t[2]), f"api {t[0]} v{t[1]}")
    )


# -- mutations ----------------------------------------------------------------


@st.composite
def mutated_bytes(draw: Any, data: bytes, keep_prefix: int = 0) -> bytes:
    """``data`` after 1-4 random mutations at or after ``keep_prefix``."""
    buf = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "byte", "truncate", "extend", "insert", "delete", "int", "varint"]))
        lo = min(keep_prefix, len(buf))
        pos = draw(st.integers(lo, max(lo, len(buf) - 1)))
        if op == "flip" and pos < len(buf):
            buf[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "byte" and pos < len(buf):
            buf[pos] = draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF, draw(st.integers(0, 255))]))
        elif op == "truncate":
            del buf[pos:]
        elif op == "extend":
            buf += draw(st.binary(min_size=1, max_size=64))
        elif op == "insert":
            buf[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif op == "delete":
            del buf[pos : pos + draw(st.integers(1, 8))]
        elif op == "int" and pos + 4 <= len(buf):
            # a length or count field: make it lie
            value = draw(st.sampled_from([-1, -2, 0, 1, 0x7FFF, 0x7FFFFFFF, -(2**31), draw(st.integers(-(2**31), 2**31 - 1))]))
            width = draw(st.sampled_from([2, 4]))
            if width == 2:
                value = max(-(2**15), min(2**15 - 1, value))
            buf[pos : pos + width] = value.to_bytes(width, "big", signed=True)
        elif op == "varint":
            # a compact length/count (unsigned varint) that lies, written over the bytes at pos
            big = uvarint(draw(st.sampled_from([2**31 - 1, 2**32 - 1, 2**35 - 1, 2**20, draw(st.integers(0, 2**35 - 1))])))
            buf[pos : pos + len(big)] = big
    return bytes(buf)


def mutate(data: bytes, keep_prefix: int = 0) -> st.SearchStrategy[bytes]:
    return mutated_bytes(data, keep_prefix)


def _header_len(frame: bytes) -> int:
    (client_len,) = struct.unpack_from(">h", frame, 8)
    return 10 + max(client_len, 0)


@st.composite
def mutated_requests(draw: Any) -> FuzzCase:
    """A real request (golden or structured) with its body, or all of it, mutated."""
    if draw(st.booleans()) and golden_requests():
        api_key, version, frame = draw(st.sampled_from(golden_requests()))
        origin = "golden"
    else:
        api_key, version, frame = draw(_structured_frame())
        origin = "structured"
    keep = _header_len(frame) if draw(st.integers(0, 3)) else 0  # mostly keep the header intact
    body = draw(mutated_bytes(frame, keep))
    return FuzzCase("mutated", framed(body), f"{origin} api {api_key} v{version}, header {'kept' if keep else 'mutable'}")


# -- garbage ------------------------------------------------------------------


def _unknown_keys() -> list[int]:
    known = {k for k, _lo, _hi in advertised()}
    return sorted({k for k in (-1, 4, 5, 6, 7, 17, 21, 23, 29, 30, 50, 68, 74, 1000, 32767, -32768)} - known)


@st.composite
def api_pairs(draw: Any) -> tuple[int, int]:
    """A (key, version): advertised, out of range, unknown key, or anything."""
    adv = advertised()
    choice = draw(st.integers(0, 5))
    if choice <= 2:
        return draw(st.sampled_from(advertised_pairs()))
    if choice == 3:
        key, lo, hi = draw(st.sampled_from(adv))
        return key, draw(st.sampled_from([lo - 1, hi + 1, hi + 50, -1, 32767, -32768]))
    if choice == 4:
        return draw(st.sampled_from(_unknown_keys())), draw(st.integers(-2, 20))
    return draw(st.integers(-(2**15), 2**15 - 1)), draw(st.integers(-(2**15), 2**15 - 1))


@st.composite
def garbage_bodies(draw: Any) -> FuzzCase:
    api_key, version = draw(api_pairs())
    flexible = is_flexible(api_key, version) and draw(st.integers(0, 4)) > 0
    head = request_header(api_key, version, draw(st.integers(-(2**31), 2**31 - 1)), draw(
        st.sampled_from([b"fuzz", b"", None, b"\xff\xfe"])), flexible)
    body = draw(st.one_of(st.binary(max_size=256), st.binary(max_size=8), st.just(b"")))
    return FuzzCase("garbage_body", framed(head + body), f"api {api_key} v{version}")


@st.composite
def random_pairs(draw: Any) -> FuzzCase:
    api_key = draw(st.integers(-(2**15), 2**15 - 1))
    version = draw(st.integers(-(2**15), 2**15 - 1))
    head = struct.pack(">hhi", api_key, version, draw(st.integers(-(2**31), 2**31 - 1)))
    return FuzzCase("random_pair", framed(head + draw(st.binary(max_size=128))), f"api {api_key} v{version}")


@st.composite
def tagged_blocks(draw: Any) -> bytes:
    """A tagged-field block that may lie: counts, tags and sizes drawn adversarially."""
    parts = []
    count = draw(st.integers(0, 5))
    declared = draw(st.sampled_from([count, count, count + 1, 2**31, 2**35 - 1]))
    parts.append(uvarint(declared))
    for _ in range(count):
        tag = draw(st.sampled_from([0, 1, 2, 3, 0x7FFFFFFF, draw(st.integers(0, 2**32))]))
        payload = draw(st.binary(max_size=16))
        size = draw(st.sampled_from([len(payload)] * 3 + [len(payload) + 1, 0x7FFFFFFF, 2**32 + 5]))
        parts.append(uvarint(tag) + uvarint(size) + payload)
    if draw(st.integers(0, 9)) == 0:
        parts.append(b"\xff" * draw(st.integers(5, 12)))  # an overlong varint
    return b"".join(parts)


@st.composite
def tagged_garbage(draw: Any) -> FuzzCase:
    """A flexible request whose header or top-level tag block is replaced with garbage."""
    flex_pairs = [(k, v) for k, v in advertised_pairs() if is_flexible(k, v)]
    api_key, version = draw(st.sampled_from(flex_pairs))
    entity = draw(structured_request(api_key, version))
    from oncelog.protocol.codec import encode_request

    body = encode_request(entity)
    corr = draw(st.integers(0, 2**31 - 1))
    where = draw(st.sampled_from(["header", "body", "both"]))
    htags = draw(tagged_blocks()) if where in ("header", "both") else b"\x00"
    if where in ("body", "both"):
        body = body[:-1] + draw(tagged_blocks()) if body.endswith(b"\x00") else body + draw(tagged_blocks())
    data = request_header(api_key, version, corr, b"fuzz", True, htags) + body
    return FuzzCase("tagged_garbage", framed(data), f"api {api_key} v{version} tags in {where}")


@st.composite
def malformed_frames(draw: Any, max_frame_bytes: int = 1 << 20) -> FuzzCase:
    """Framing-level abuse."""
    kind = draw(st.sampled_from(["zero", "negative", "huge", "short_header", "truncated", "junk", "split_ok"]))
    if kind == "zero":
        data = _I32.pack(0) + draw(st.sampled_from([b"", sentinel_request()]))
    elif kind == "negative":
        data = _I32.pack(draw(st.integers(-(2**31), -1))) + draw(st.binary(max_size=32))
    elif kind == "huge":
        size = draw(st.sampled_from([max_frame_bytes + 1, 2**31 - 1, draw(st.integers(max_frame_bytes + 1, 2**31 - 1))]))
        data = _I32.pack(size) + draw(st.binary(max_size=256))
    elif kind == "short_header":
        data = framed(draw(st.binary(min_size=1, max_size=9)))
    elif kind == "truncated":
        body = request_header(API_VERSIONS, draw(st.integers(0, 4)), 7) + draw(st.binary(max_size=64))
        cut = draw(st.integers(0, len(body) - 1))
        declared = draw(st.sampled_from([len(body), len(body) + 1000, max_frame_bytes]))
        data = _I32.pack(declared) + body[:cut]
    elif kind == "junk":
        data = draw(st.binary(min_size=1, max_size=512))
    else:  # valid frames in awkward pieces are exercised by exchange(); here many frames in one go
        data = b"".join(sentinel_request(i) for i in range(draw(st.integers(1, 70))))
    return FuzzCase("malformed_frame", data, kind)


def any_case() -> st.SearchStrategy[FuzzCase]:
    return st.one_of(
        malformed_frames(), garbage_bodies(), structured_requests(), mutated_requests(), tagged_garbage(), random_pairs()
    )


# -- playing a case against a broker ----------------------------------------------


@dataclass
class Outcome:
    """What the broker did with one case."""

    expectation: str  # "refuse" (framing error), "answer" (sentinel visible), "incomplete"
    answered: bool = False  # the sentinel got its response
    closed: bool = False  # EOF or reset from the broker
    hung: bool = False  # neither within the timeout
    responses: list[bytes] = field(default_factory=list)
    local_port: int = 0
    elapsed: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.hung and not self.problems


def exchange(host: str, port: int, case: FuzzCase, max_frame_bytes: int = 1 << 20, timeout: float = 10.0,
             chunked: bool = False) -> Outcome:
    """Send ``case`` plus a sentinel ApiVersions request on a fresh connection.

    The broker must answer the sentinel (the connection survived the case) or
    close the connection; if the case leaves a frame incomplete we half-close
    and the broker must then close. Anything else within ``timeout`` is a hang.
    Every response frame must be well-formed and carry a correlation id.
    """
    sentinel = sentinel_request()
    frames, leftover, refused = simulate_frames(case.data + sentinel, max_frame_bytes)
    if refused:
        expectation = "refuse"
    elif leftover == 0 and frames and frames[-1] == sentinel[4:]:
        expectation = "answer"
    else:
        expectation = "incomplete"
    out = Outcome(expectation)
    start = time.monotonic()
    sock = socket.create_connection((host, port), timeout=timeout)
    out.local_port = sock.getsockname()[1]
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray()
    try:
        try:
            payload = case.data + sentinel
            if chunked:
                for i in range(0, len(payload), 7):
                    sock.sendall(payload[i : i + 7])
            else:
                sock.sendall(payload)
            if expectation == "incomplete":
                sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            out.closed = True
        deadline = start + timeout
        while not out.closed and not out.answered:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                out.hung = True
                break
            sock.settimeout(remaining)
            try:
                chunk = sock.recv(65536)
            except (ConnectionResetError, BrokenPipeError):
                out.closed = True
                break
            except socket.timeout:
                out.hung = True
                break
            if not chunk:
                out.closed = True
                break
            buf += chunk
            while len(buf) >= 4:
                (size,) = _I32.unpack_from(buf, 0)
                if size < 4 or size > 64 << 20:
                    out.problems.append(f"response frame with bad size {size}")
                    out.closed = True
                    break
                if len(buf) < 4 + size:
                    break
                resp = bytes(buf[4 : 4 + size])
                del buf[: 4 + size]
                out.responses.append(resp)
                if _I32.unpack_from(resp, 0)[0] == SENTINEL_CORRELATION_ID:
                    out.answered = True
    finally:
        sock.close()
    out.elapsed = time.monotonic() - start
    if out.answered and out.responses[-1][4:6] != b"\x00\x00":
        out.problems.append(f"sentinel ApiVersions answered with error {out.responses[-1][4:6]!r}")
    if expectation == "refuse" and out.answered:
        out.problems.append("a frame the decoder refuses was followed by a served request")
    return out


def iter_cases(strategy: st.SearchStrategy[FuzzCase], n: int) -> Iterable[FuzzCase]:
    """``n`` cases from ``strategy`` without pytest (for scripts); the same ``n`` gives the same cases."""
    from hypothesis import HealthCheck, given, settings

    got: list[FuzzCase] = []

    @settings(max_examples=n, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(case: FuzzCase) -> None:
        got.append(case)

    collect()
    return got


# -- decoding in a child process ---------------------------------------------------

_WORKER_CODE = r"""
import struct, sys
from oncelog.protocol.codec import DecodeError, decode_request
inp, out = sys.stdin.buffer, sys.stdout.buffer
while True:
    head = inp.read(12)
    if len(head) < 12:
        break
    key, version, offset, size = struct.unpack(">hhii", head)
    buf = inp.read(size)
    try:
        decode_request(key, version, buf, offset)
        reply = "ok"
    except DecodeError:
        reply = "DecodeError"
    except BaseException as exc:
        reply = f"raised {type(exc).__module__}.{type(exc).__qualname__}: {str(exc)[:200]}"
    data = reply.encode()
    out.write(struct.pack(">i", len(data)) + data)
    out.flush()
"""


class DecoderWorker:
    """``decode_request`` in a child process, so an input that aborts the
    interpreter (a native-code crash) is reported instead of killing the caller.

    :meth:`decode` returns ``"ok"``, ``"DecodeError"``, ``"raised <type>: <msg>"``
    or ``"crashed (exit <code>): <first stderr line>"``; a crashed worker is
    replaced on the next call.
    """

    def __init__(self) -> None:
        self.proc: Any = None
        self.crashes = 0

    def _spawn(self) -> None:
        import subprocess
        import sys

        self.proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER_CODE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    def decode(self, api_key: int, version: int, buf: bytes, offset: int = 0) -> str:
        if self.proc is None or self.proc.poll() is not None:
            self._spawn()
        proc = self.proc
        try:
            proc.stdin.write(struct.pack(">hhii", api_key, version, offset, len(buf)) + buf)
            proc.stdin.flush()
            head = proc.stdout.read(4)
            if len(head) == 4:
                return proc.stdout.read(_I32.unpack(head)[0]).decode()
        except (BrokenPipeError, OSError):
            pass
        code = proc.wait()
        err = proc.stderr.read().decode(errors="replace").strip().splitlines()
        self.proc = None
        self.crashes += 1
        return f"crashed (exit {code}): {err[0] if err else ''}"

    def close(self) -> None:
        if self.proc is not None:
            self.proc.stdin.close()
            self.proc.wait(10)
            self.proc.stdout.close()
            self.proc.stderr.close()
            self.proc = None
