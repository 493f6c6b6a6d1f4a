"""Shared fakes for the consumer's unit tests (no broker): an asyncio ``Consumer`` with a topic ``t`` whose
partitions' leaders are given, Fetch answers applied as the loop thread's fetcher applies them, and the
blocking facade over a loop thread that records what is sent to it."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from oncelog.client import consumer as blocking
from oncelog.client.aio.cluster import TopicInfo
from oncelog.client.aio.consumer import Consumer
from oncelog.protocol.records import Record, encode_record_batch


class Loop:
    """Stands for the loop: records what the caller's thread hands to it (``call_soon_threadsafe``)."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    def call_soon_threadsafe(self, fn: Any, *args: Any) -> None:
        self.calls.append(fn)


def wakes(loop: Loop) -> int:
    """How many fetcher wake-ups (``_wake.set``) were handed to the loop."""
    return sum(getattr(fn, "__name__", "") == "set" for fn in loop.calls)


def consumer(leaders: dict[int, int], hold: int | None = None, records: int = 3,
             config: dict[str, Any] | None = None) -> tuple[Consumer, Loop]:
    """A consumer of ``t`` (partition: leader), each partition with one answer of ``records`` records
    buffered (none when 0)."""
    c = Consumer({"bootstrap.servers": "127.0.0.1:1", **(config or {})})
    c._fetch_hold = hold
    c.cluster.topics["t"] = TopicInfo("t", None, leaders=dict(leaders))
    c.assign([("t", p, 0) for p in leaders])
    loop = Loop()
    c._loop = loop  # type: ignore[assignment]
    if records:
        answer(c, list(leaders), records, signal=False)
    return c, loop


def answer(c: Consumer, partitions: list[int], records: int = 3, signal: bool = True) -> None:
    """What the loop thread's fetcher does with a Fetch answer of ``records`` records a partition, from
    each partition's fetch position (so it can be called again for the next answer)."""
    gens = {}
    parts = []
    for p in partitions:
        st = c._parts[("t", p)]
        gens[("t", p)] = (st.generation, st.fetch_pos)
        batch = encode_record_batch([Record(None, b"v%d" % i) for i in range(records)], base_offset=st.fetch_pos)
        parts.append(SimpleNamespace(partition_index=p, error_code=0, records=batch, aborted_transactions=[]))
    if c._apply_answer(SimpleNamespace(responses=[SimpleNamespace(topic="t", partitions=parts)]), gens) and signal:
        getattr(c, "_signal", c._data.set)()  # (the code before blk had no _signal)


class NoLoopThread:
    """The facade's loop thread: records what is sent to it (the coroutine's name, its ``timeout``
    argument and when) instead of running it."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, Any, float]] = []
        self.cancel_on_interrupt: list[bool] = []  # per call sent: does Ctrl-C cancel it on the loop

    def run(self, coro: Any, timeout: float | None = None, *, cancel_on_interrupt: bool = False) -> Any:
        import time
        self.cancel_on_interrupt.append(cancel_on_interrupt)
        self.sent.append((coro.__qualname__, coro.cr_frame.f_locals.get("timeout"), time.monotonic()))
        coro.close()
        return ["from the loop"]


def facade(c: Consumer) -> tuple[blocking.Consumer, NoLoopThread]:
    f = blocking.Consumer.__new__(blocking.Consumer)
    lt = NoLoopThread()
    f._c, f._lt, f._closed, f.config = c, lt, False, c.config  # type: ignore[assignment]
    return f, lt


def fetched(c: Consumer) -> list[tuple[int, list[int]]]:
    """One pass of the fetcher: the Fetches it sends, as (node, partitions); each is done at once with no
    answer (so a later pass may fetch the same partitions again)."""
    sent: list[tuple[int, list[int]]] = []

    async def fetch(node: int, states: list[Any]) -> None:
        sent.append((node, sorted(st.partition for st in states)))
        for st in states:
            st.in_flight = False
        c._node_busy.discard(node)

    async def one_pass() -> None:
        c._fetch = fetch  # type: ignore[method-assign]
        c._wake = asyncio.Event()  # (asyncio.Event binds to the first loop it is used in)
        task = asyncio.ensure_future(c._run())
        await asyncio.sleep(0.05)
        c._closed = True
        c._wake.set()
        await task

    asyncio.run(one_pass())
    c._closed = False
    return sent
