"""The blocking facade's wait when nothing is buffered (``Consumer._wait_take`` / ``AioConsumer.wait_take``):
the caller's thread waits for the next Fetch answer on a condition the loop thread notifies, then takes
(and decodes) the records itself, without a ``consume()`` coroutine sent to the loop thread and its
result handed back (one such hop per Fetch answer whenever the caller is faster than the fetches).
Errors, timeouts and the cases ``take_nowait`` leaves to ``consume()`` still go through the loop."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from oncelog.client import consumer as blocking
from oncelog.client._loop import LoopThread
from oncelog.client.aio.consumer import Consumer as AioConsumer
from oncelog.client.errors import ClientClosedError, KafkaError, OffsetOutOfRangeError
from tests.unit.consumer_fakes import answer, consumer, facade


def aio(parts: int = 2, **config: Any) -> AioConsumer:
    return consumer({p: 1 for p in range(parts)}, records=0, config=config)[0]


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
    [(name, timeout, _at)] = lt.sent
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
    [(name, timeout, _at)] = lt.sent
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
    assert [s[:2] for s in lt.sent] == [("Consumer.consume", 0)]


def test_only_the_waits_are_cancelled_by_ctrl_c() -> None:
    """consume()/poll() on the loop are waits: Ctrl-C cancels them (else they take records for nobody).
    Every other call changes state in steps (unsubscribe, commit, close): Ctrl-C must not cut it half-way
    (before, LoopThread.run cancelled every call on any exception in the caller)."""
    c = aio()
    f, lt = facade(c)
    f.consume(5, 0)
    f.poll(0)
    f.unsubscribe()
    f.commit()
    assert [s[0] for s in lt.sent] == ["Consumer.consume", "Consumer.poll", "Consumer.unsubscribe",
                                       "Consumer.commit"]
    assert lt.cancel_on_interrupt == [True, True, False, False]


def _partition_error(c: AioConsumer) -> None:
    c._parts[("t", 0)].error = OffsetOutOfRangeError("t-0 out of range")  # auto.offset.reset=none


def _auth_error(c: AioConsumer) -> None:
    c.cluster._auth_error = KafkaError("SASL authentication failed")


@pytest.mark.parametrize("set_error", [_partition_error, _auth_error])
def test_an_error_pending_when_the_call_starts_is_raised_at_once(set_error: Any) -> None:
    c = aio()
    f, lt = facade(c)
    set_error(c)
    t0 = time.monotonic()
    assert f.consume(5, 5.0) == ["from the loop"]  # consume() on the loop raises it
    assert lt.sent[0][2] - t0 < 0.5  # before: only after FAST_WAIT (1 s)
    # left for consume() on the loop, which raises it (the facade's caller-thread wait took nothing)
    assert [s[0] for s in lt.sent] == ["Consumer.consume"]


def test_an_error_is_raised_while_another_partition_keeps_delivering() -> None:
    """Partition 0 is out of range; partition 1 gets an answer every 50 ms. Before: the caller-thread wait
    handed out partition 1's records for ever and never reached consume(), which raises partition 0's error."""
    c = aio()
    f, lt = facade(c)
    _partition_error(c)
    stop = threading.Event()

    def feed() -> None:
        while not stop.is_set():
            time.sleep(0.05)
            answer(c, [1])

    th = threading.Thread(target=feed)
    th.start()
    try:
        end = time.monotonic() + 2.5
        while time.monotonic() < end and not lt.sent:
            f.consume(10, 5.0)
    finally:
        stop.set()
        th.join()
    assert lt.sent, "partition 0's error never reached consume()"


def test_records_buffered_before_an_error_are_handed_out_first() -> None:
    c = aio()
    f, lt = facade(c)
    answer(c, [1])
    _partition_error(c)
    assert [(m.partition, m.offset) for m in f.consume(10, 5.0)] == [(1, 0), (1, 1), (1, 2)]
    assert lt.sent == []
    assert f.consume(10, 5.0) == ["from the loop"]  # then the error, as consume() on the loop would


def test_a_paused_partitions_error_does_not_end_the_wait() -> None:
    c = aio()
    _partition_error(c)
    c._parts[("t", 0)].paused = True
    t0 = time.monotonic()
    assert c.wait_take(5, 0.2) is None
    assert time.monotonic() - t0 >= 0.19


def test_an_error_set_by_the_position_lookup_ends_the_wait() -> None:
    """``_resolve`` (auto.offset.reset=none, or a ListOffsets error) sets the error while a caller waits:
    before, nothing signalled it and the wait ran to its end."""
    c = aio(**{"auto.offset.reset": "none"})
    st = c._parts[("t", 0)]
    st.fetch_pos = None
    t = later(0.05, lambda: asyncio.run(c._resolve([st])))
    t0 = time.monotonic()
    assert c.wait_take(5, 3.0) is None
    t.join()
    assert time.monotonic() - t0 < 2.0
    assert isinstance(st.error, OffsetOutOfRangeError)


def test_close_while_consume_waits_on_the_loop_raises_client_closed() -> None:
    """Past FAST_WAIT the blocking caller waits in consume() on the loop: close() (``_shutdown``) wakes it and
    it must fail with ClientClosedError at once (before: it waited on, and got the loop's CancelledError)."""
    c = aio()

    async def main() -> tuple[BaseException | None, float]:
        task = asyncio.ensure_future(c.consume(5, 3.0))
        await asyncio.sleep(0.05)
        t0 = time.monotonic()
        await c._shutdown()
        try:
            await asyncio.wait_for(task, 5.0)
        except BaseException as exc:  # noqa: BLE001 - returned for the assertion
            return exc, time.monotonic() - t0
        return None, time.monotonic() - t0

    exc, took = asyncio.run(main())
    assert isinstance(exc, ClientClosedError) and took < 1.0


def test_close_while_a_caller_waits_on_its_thread_raises_client_closed() -> None:
    c = aio()
    f, lt = facade(c)

    lt.run = lambda coro, timeout=None, **_kw: asyncio.run(coro)  # type: ignore[method-assign]  # consume() runs
    t = later(0.1, lambda: asyncio.run(c._shutdown()))
    t0 = time.monotonic()
    with pytest.raises(ClientClosedError):
        f.consume(5, 5.0)
    t.join()
    assert time.monotonic() - t0 < 0.9  # woken by _shutdown, not by FAST_WAIT


def test_a_call_cancelled_by_close_raises_client_closed() -> None:
    """A blocking call on the loop when close() stops the loop thread (or sent just after): ClientClosedError,
    not the loop's CancelledError."""
    c = aio()
    f, _lt = facade(c)
    lt = f._lt = LoopThread("test-consumer")  # type: ignore[assignment]
    started = threading.Event()

    async def forever() -> None:
        started.set()
        await asyncio.sleep(60)

    outcome: list[BaseException] = []

    def caller() -> None:
        try:
            f._run(forever())
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
            outcome.append(exc)

    th = threading.Thread(target=caller)
    th.start()
    assert started.wait(2.0)
    f._closed = True  # close(): then the loop thread stops
    lt.stop()
    th.join(5.0)
    assert len(outcome) == 1 and isinstance(outcome[0], ClientClosedError)
    with pytest.raises(ClientClosedError):
        f.consume(5, 0)  # sent after the stop: no hang


def _member(**state: Any) -> SimpleNamespace:
    return SimpleNamespace(**{"error": None, "_poll_expired": False, "_last_poll": 0.0, **state})


@pytest.mark.parametrize("case", ["closed", "member error", "poll expired", "auto-commit due"])
def test_what_only_consume_handles_goes_to_the_loop_at_once(case: str) -> None:
    """A fatal group error, a ``max.poll.interval.ms`` expiry to rejoin from, an auto-commit due, a closed
    consumer: straight to consume() on the loop, without the caller-thread wait."""
    c = aio()
    f, lt = facade(c)
    if case == "closed":
        c._closed = True
    elif case == "member error":
        c._member = _member(error=KafkaError("fenced"))  # type: ignore[assignment]
    elif case == "poll expired":
        c._member = _member(_poll_expired=True)  # type: ignore[assignment]
    else:
        c._auto_commit, c._next_auto_commit = True, time.monotonic() - 1
    t0 = time.monotonic()
    assert c.wait_take(5, 2.0) is None
    assert f.consume(5, 2.0) == ["from the loop"]
    assert time.monotonic() - t0 < 0.5
    assert [s[0] for s in lt.sent] == ["Consumer.consume"]


def test_the_wait_restarts_the_poll_interval_clock() -> None:
    """As consume() does (poll_happened): the member's ``max.poll.interval.ms`` timer must not expire
    while the caller waits in wait_take."""
    c = aio()
    c._member = member = _member(_last_poll=time.monotonic() - 100)  # type: ignore[assignment]
    seen: list[float] = []
    t = later(0.1, lambda: (seen.append(member._last_poll), answer(c, [0])))
    t0 = time.monotonic()
    assert len(c.wait_take(5, 2.0) or []) == 3
    t.join()
    assert seen[0] >= t0


def test_several_answers_are_taken_in_order() -> None:
    c = aio(1)
    f, lt = facade(c)
    for first in (0, 3, 6):
        t = later(0.02, answer, c, [0])
        assert [m.offset for m in f.consume(10, 5.0)] == [first, first + 1, first + 2]
        t.join()
    assert lt.sent == [] and c._parts[("t", 0)].consumed == 9
