"""The blocking facade's wait when nothing is buffered (``Consumer._wait_take`` / ``AioConsumer.wait_take``):
the caller's thread waits for the next Fetch answer on a condition the loop thread notifies, then takes
(and decodes) the records itself, without a ``consume()`` coroutine sent to the loop thread and its
result handed back (one such hop per Fetch answer whenever the caller is faster than the fetches).
Errors, timeouts and the cases ``take_nowait`` leaves to ``consume()`` still go through the loop."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from oncelog.client import consumer as blocking
from oncelog.client.aio.cluster import TopicInfo
from oncelog.client.aio.consumer import Consumer as AioConsumer
from oncelog.client.errors import KafkaError
from oncelog.protocol.records import Record, encode_record_batch


class Loop:
    def call_soon_threadsafe(self, fn: Any, *args: Any) -> None:
        pass


class NoLoopThread:
    """The facade's loop thread: records what is sent to it instead of running it."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def run(self, coro: Any, timeout: float | None = None) -> Any:
        self.sent.append((coro.__qualname__, coro.cr_frame.f_locals.get("timeout")))
        coro.close()
        return ["from the loop"]


def aio(parts: int = 2) -> AioConsumer:
    c = AioConsumer({"bootstrap.servers": "127.0.0.1:1"})
    c.cluster.topics["t"] = TopicInfo("t", None, leaders={p: 1 for p in range(parts)})
    c.assign([("t", p, 0) for p in range(parts)])
    c._loop = Loop()  # type: ignore[assignment]
    return c


def answer(c: AioConsumer, partitions: list[int]) -> None:
    """What the loop thread's fetcher does with a Fetch answer of 3 records a partition."""
    gens = {k: (st.generation, st.fetch_pos) for k, st in c._parts.items()}
    batch = encode_record_batch([Record(None, b"v%d" % i) for i in range(3)], base_offset=0)
    if c._apply_answer(SimpleNamespace(responses=[SimpleNamespace(topic="t", partitions=[
            SimpleNamespace(partition_index=p, error_code=0, records=batch, aborted_transactions=[])
            for p in partitions])]), gens):
        getattr(c, "_signal", c._data.set)()  # (the old code had no _signal)


def facade(c: AioConsumer) -> tuple[blocking.Consumer, NoLoopThread]:
    f = blocking.Consumer.__new__(blocking.Consumer)
    lt = NoLoopThread()
    f._c, f._lt, f._closed, f.config = c, lt, False, c.config  # type: ignore[assignment]
    return f, lt


def later(delay: float, fn: Any, *args: Any) -> threading.Thread:
    t = threading.Thread(target=lambda: (time.sleep(delay), fn(*args)))
    t.start()
    return t


@pytest.mark.parametrize("api", ["consume", "poll"])
def test_records_arriving_during_the_wait_are_taken_on_the_callers_thread(api: str) -> None:
    c = aio()
    f, lt = facade(c)
    t = later(0.05, answer, c, [0, 1])
    decoders: list[str] = []
    orig = c._predecode

    def predecode() -> None:
        decoders.append(threading.current_thread().name)
        orig()

    c._predecode = predecode  # type: ignore[method-assign]
    t0 = time.monotonic()
    got = f.consume(4, 5.0) if api == "consume" else [f.poll(5.0)]
    t.join()
    assert time.monotonic() - t0 < 4.0
    assert [(m.partition, m.offset) for m in got] == ([(0, 0), (0, 1), (0, 2), (1, 0)] if api == "consume"
                                                      else [(0, 0)])
    assert lt.sent == []  # before: the wait was a consume() coroutine run on the loop thread
    assert decoders and set(decoders) == {threading.current_thread().name}
    assert c._parts[("t", 0)].consumed == (3 if api == "consume" else 1)


def test_nothing_arrives_the_rest_of_the_timeout_goes_to_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(blocking, "FAST_WAIT", 0.2)
    c = aio()
    f, lt = facade(c)
    t0 = time.monotonic()
    assert f.consume(5, 0.5) == ["from the loop"]
    assert time.monotonic() - t0 >= 0.19  # waited FAST_WAIT on the caller's thread first
    [(name, timeout)] = lt.sent
    assert name == "Consumer.consume" and 0.2 <= timeout <= 0.31


def test_an_error_arriving_during_the_wait_is_raised_through_the_loop() -> None:
    c = aio()
    f, lt = facade(c)

    def fail() -> None:
        c._parts[("t", 0)].error = KafkaError("boom")
        getattr(c, "_signal", c._data.set)()  # (the old code had no _signal)

    t0 = time.monotonic()
    t = later(0.05, fail)
    assert f.consume(5, 5.0) == ["from the loop"]  # consume() on the loop raises the partition's error
    t.join()
    assert time.monotonic() - t0 < 4.0  # woken by the error, not by the timeout
    [(name, timeout)] = lt.sent
    assert name == "Consumer.consume" and timeout > 4.0


def test_records_already_buffered_are_not_waited_for() -> None:
    c = aio()
    answer(c, [0])
    c._parts[("t", 0)].paused = True
    answer(c, [1])
    t0 = time.monotonic()
    assert [(m.partition, m.offset) for m in c.wait_take(5, 5.0) or []] == [(1, 0), (1, 1), (1, 2)]
    assert time.monotonic() - t0 < 1.0


def test_a_paused_partitions_records_do_not_end_the_wait() -> None:
    c = aio()
    answer(c, [0])
    c._parts[("t", 0)].paused = True
    t0 = time.monotonic()
    assert c.wait_take(5, 0.2) is None
    assert time.monotonic() - t0 >= 0.19


def test_a_zero_timeout_does_not_wait() -> None:
    c = aio()
    f, lt = facade(c)
    t0 = time.monotonic()
    assert f.consume(5, 0) == ["from the loop"]
    assert time.monotonic() - t0 < 0.1
    assert lt.sent == [("Consumer.consume", 0)]
