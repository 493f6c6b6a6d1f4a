"""Issue 11 (oncelog.client) behaviour the audit found untested through the public classes:
a CRC mismatch seen through the Consumer, the plural Admin methods checked against the broker's
state, static membership through ``Consumer`` (``group.instance.id``), and a consumer process
killed with SIGKILL whose partitions move on after ``session.timeout.ms``.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from oncelog.client import Admin, Consumer, Producer, TopicPartition
from oncelog.client import aio
from oncelog.client.errors import CorruptMessageError, KafkaError

pytestmark = pytest.mark.timeout(120)


class _RewritingProxy:
    """A loopback proxy forwarding whole Kafka frames, replacing ``old`` by ``new`` (same length,
    so the framing stays valid) in every response frame: a fake broker answer whose batch CRC no
    longer matches its bytes (the broker itself refuses to keep a damaged batch: its recovery
    truncates the log at a CRC mismatch)."""

    def __init__(self, upstream: tuple[str, int], old: bytes, new: bytes) -> None:
        assert len(old) == len(new)
        self.upstream, self.old, self.new = upstream, old, new
        self.rewritten = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            u = socket.create_connection(self.upstream)
            self.conns += [c, u]
            threading.Thread(target=self._pump, args=(c, u, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(u, c, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, rewrite: bool) -> None:
        def read(n: int) -> bytes:
            buf = b""
            while len(buf) < n:
                chunk = src.recv(n - len(buf))
                if not chunk:
                    raise EOFError
                buf += chunk
            return buf
        try:
            while True:
                head = read(4)
                body = read(struct.unpack(">i", head)[0])
                if rewrite and self.old in body:
                    body = body.replace(self.old, self.new)
                    self.rewritten += 1
                dst.sendall(head + body)
        except (OSError, EOFError):
            for s in (src, dst):
                s.close()

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.mark.parametrize("flavour", ["blocking", "asyncio"])
def test_a_crc_mismatch_reaches_the_consumer_as_corrupt_message(flavour: str, tmp_path: Path, kit: Any) -> None:
    """A Fetch answer whose middle batch has one value byte changed (CRC left as it was): the
    Consumer hands out the records of the batch before it, then raises CORRUPT_MESSAGE (code 2)
    for the damaged batch; with ``check.crcs=false`` the same answer hands the (damaged) records
    out, which shows the error came from the CRC check."""
    proxy = _RewritingProxy(("127.0.0.1", 0), b"value-1-2", b"value-0-2")  # upstream set below
    b = kit.start_broker(tmp_path, config={"advertised.listeners": f"PLAINTEXT://127.0.0.1:{proxy.port}"})
    proxy.upstream = ("127.0.0.1", b.port)
    try:
        kit.create_topic(b.bootstrap, "crc", 1)
        with Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 1000}) as p:
            for n in range(3):  # three batches of 4 records (flush between them)
                for i in range(4):
                    p.produce("crc", b"value-%d-%d" % (n, i), partition=0)
                assert p.flush(10) == 0
        bootstrap = f"127.0.0.1:{proxy.port}"

        def read(check: bool) -> tuple[list[Any], BaseException | None, list[Any]]:
            conf = {"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest", "check.crcs": check}
            got: list[Any] = []
            err: BaseException | None = None
            after: list[Any] = []  # position after the error, the error again, records after a seek past it
            if flavour == "blocking":
                with Consumer(conf) as c:
                    c.assign([TopicPartition("crc", 0, 0)])
                    deadline = time.monotonic() + 15
                    try:
                        while len(got) < 12 and time.monotonic() < deadline:
                            got.extend(c.consume(100, 0.5))
                    except KafkaError as exc:
                        err = exc
                        after.append(c.position(TopicPartition("crc", 0)))
                        with pytest.raises(CorruptMessageError):
                            c.consume(100, 5)
                        c.seek(TopicPartition("crc", 0, 8))
                        after.append([m.offset for m in c.consume(100, 5)])
            else:
                async def run() -> None:
                    nonlocal err
                    async with aio.Consumer(conf) as c:
                        c.assign([TopicPartition("crc", 0, 0)])
                        deadline = time.monotonic() + 15
                        try:
                            while len(got) < 12 and time.monotonic() < deadline:
                                got.extend(await c.consume(100, 0.5))
                        except KafkaError as exc:
                            err = exc
                            after.append(await c.position(TopicPartition("crc", 0)))
                            with pytest.raises(CorruptMessageError):
                                await c.consume(100, 5)
                            c.seek(TopicPartition("crc", 0, 8))
                            after.append([m.offset for m in await c.consume(100, 5)])
                asyncio.run(asyncio.wait_for(run(), 30))
            return got, err, after

        got, err, after = read(True)
        # as Java's consumer: the good batch before the damaged one first (it came in the same answer),
        # then the error; the position stays at the damaged batch (the error again) until a seek past it
        assert [m.offset for m in got] == [0, 1, 2, 3]
        assert isinstance(err, CorruptMessageError), err
        assert (err.code, err.name) == (2, "CORRUPT_MESSAGE") and "CRC mismatch in batch at offset 4" in str(err)
        assert after == [4, [8, 9, 10, 11]]

        got, err, _after = read(False)
        assert err is None
        assert [m.offset for m in got] == list(range(12))
        assert got[6].value == b"value-0-2"  # the damaged byte, handed out unchecked
        assert proxy.rewritten >= 2
    finally:
        proxy.close()
        b.close()
