"""``LoopThread.run`` (the blocking clients' hop to their loop thread). With ``cancel_on_interrupt`` (the
consumer's waits) an exception in the caller while it waits, Ctrl-C's KeyboardInterrupt included, cancels the
coroutine on the loop: left running, a blocking ``Consumer.consume()`` interrupted after its first second went
on waiting on the loop, took the next records (moving the positions past them) and handed them to nobody.
Without it (every state-changing call: a transaction's commit, produce_batch, ...) the coroutine runs to
completion, so an interrupted call is never left half-way."""

from __future__ import annotations

import asyncio
import signal
import threading
import time

import pytest

from oncelog.client._loop import LoopThread
from oncelog.client.errors import ClientClosedError


def test_ctrl_c_while_waiting_cancels_the_coroutine_on_the_loop() -> None:
    lt = LoopThread("test-loop")
    try:
        data = asyncio.Event()
        taken: list[str] = []
        cancelled = threading.Event()

        async def consume() -> list[str]:
            try:
                await data.wait()
            except asyncio.CancelledError:
                cancelled.set()
                raise
            taken.append("record")  # the position moves past it
            return taken

        main = threading.main_thread().ident
        assert main == threading.get_ident()
        timer = threading.Timer(0.2, signal.pthread_kill, (main, signal.SIGINT))  # Ctrl-C in the caller
        timer.start()
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            lt.run(consume(), cancel_on_interrupt=True)
        timer.join()
        assert time.monotonic() - t0 < 5.0
        assert cancelled.wait(2.0), "the coroutine still waits on the loop"
        lt.call(data.set)  # the next record arrives: nobody may take it
        time.sleep(0.1)
        assert taken == []
    finally:
        lt.stop()


def test_a_timeout_still_cancels_and_results_still_come_back() -> None:
    lt = LoopThread("test-loop")
    try:
        async def value() -> int:
            return 7

        assert lt.run(value()) == 7
        started = threading.Event()
        cancelled = threading.Event()

        async def forever() -> None:
            started.set()
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        with pytest.raises(TimeoutError):
            lt.run(forever(), 0.1)
        assert cancelled.wait(2.0)
    finally:
        lt.stop()


def test_a_call_sent_while_the_loop_thread_stops_fails_instead_of_hanging() -> None:
    """A blocking call woken by close() (the consumer's caller-thread wait) may send its coroutine after the
    loop stopped and before it was closed: before, nothing ever ran it and the caller waited for ever."""
    lt = LoopThread("test-loop")
    window = threading.Event()
    close = lt.loop.close

    def slow_close() -> None:  # holds open the gap between run_forever()'s return and close()
        window.wait(10)
        close()

    lt.loop.close = slow_close  # type: ignore[method-assign]
    stopper = threading.Thread(target=lt.stop)
    stopper.start()
    while lt.loop.is_running():
        time.sleep(0.01)
    outcome: list[BaseException | object] = []

    async def call() -> int:
        return 1

    def caller() -> None:
        try:
            outcome.append(lt.run(call()))
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
            outcome.append(exc)

    th = threading.Thread(target=caller, daemon=True)
    th.start()
    th.join(2.0)
    window.set()
    stopper.join()
    assert outcome, "the call hung"
    assert isinstance(outcome[0], ClientClosedError)  # as a call cancelled by stop()


def test_ctrl_c_during_a_state_changing_call_lets_it_finish_on_the_loop() -> None:
    """Cancelled half-way, a TransactSession.end() was left in COMMITTING (EndTxn sent, its answer dropped)
    and the session could neither commit nor abort again; a send_offsets_to_transaction let a later commit
    skip EndTxn. The caller gets the interrupt; the steps run on, in order, to the end."""
    lt = LoopThread("test-loop")
    try:
        steps: list[str] = []
        done = threading.Event()

        async def commit() -> str:
            steps.append("request")
            await asyncio.sleep(0.5)  # the answer on the wire
            steps.append("answer")
            done.set()
            return "committed"

        main = threading.main_thread().ident
        timer = threading.Timer(0.2, signal.pthread_kill, (main, signal.SIGINT))
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            lt.run(commit())
        timer.join()
        assert done.wait(3.0), f"the call was cut half-way: {steps}"
        assert steps == ["request", "answer"]
    finally:
        lt.stop()


def test_a_call_cancelled_by_stop_raises_client_closed_error() -> None:
    """close() on another thread stops the loop: a call in progress (Admin, TransactSession, Producer calls,
    not only the consumer's) raised concurrent.futures.CancelledError, and a call after it too."""
    lt = LoopThread("test-loop")
    started = threading.Event()

    async def forever() -> None:
        started.set()
        await asyncio.sleep(60)

    outcome: list[BaseException] = []

    def caller() -> None:
        try:
            lt.run(forever())
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
            outcome.append(exc)

    th = threading.Thread(target=caller, daemon=True)
    th.start()
    assert started.wait(2.0)
    lt.stop()
    th.join(5.0)
    assert outcome and isinstance(outcome[0], ClientClosedError), outcome

    async def later() -> int:
        return 1

    with pytest.raises(ClientClosedError):
        lt.run(later())
