"""A Fetch answer's chunks become reachable only once the whole answer is built (review3 C2).

One decode group spans the partitions of a Fetch answer, and the blocking facade's caller thread decodes
a group (``take_nowait``, no hop to the loop) while the loop thread may still be applying the answer. A
chunk published before the answer's other chunks were filled let the caller decode partition 1's chunk
half-filled: its later batches were then lost with ``fetch_pos`` moved past them (records skipped
silently), or the loop thread's next append failed the fetch with an AttributeError. The thread switch is
forced here at the point where it hurt: after partition 1's first batch is added to its chunk.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any, Callable

import oncelog.client.aio.consumer as cm
from oncelog.client.aio.consumer import Consumer
from oncelog.protocol.records import Record, encode_record_batch


def log(tag: bytes) -> bytes:
    """Three batches of three records, offsets 0..8."""
    return b"".join(encode_record_batch([Record(None, b"%s%d" % (tag, 3 * i + j)) for j in range(3)],
                                        base_offset=3 * i) for i in range(3))


def answer(*datas: bytes) -> Any:
    return SimpleNamespace(responses=[SimpleNamespace(topic="t", partitions=[
        SimpleNamespace(partition_index=p, error_code=0, records=d, aborted_transactions=[])
        for p, d in enumerate(datas)])])


def switch_after_first_batch(monkeypatch: Any, partition: int, switch: Callable[[], None]) -> None:
    """Run ``switch`` (another thread's turn) when ``_apply`` has added ``partition``'s first batch."""
    real = cm.fetched_batches

    class Kept(list):  # type: ignore[type-arg]
        def __iter__(self) -> Any:
            it = list.__iter__(self)
            yield next(it)
            switch()
            yield from it

    def fake(*a: Any, **kw: Any) -> Any:
        kept, batches, skipped, nxt = real(*a, **kw)
        return (Kept(kept) if a[1] == partition else kept), batches, skipped, nxt

    monkeypatch.setattr(cm, "fetched_batches", fake)


def drain(c: Consumer, taken: list[Any]) -> None:
    for _ in range(5):
        taken.extend(c.take_nowait(100) or [])


def check(c: Consumer, taken: list[Any]) -> None:
    for p, tag in ((0, b"a"), (1, b"b")):
        assert [(m.offset, m.value) for m in taken if m.partition == p] == [(o, b"%s%d" % (tag, o)) for o in range(9)]
        st = c._parts[("t", p)]
        assert (st.consumed, st.fetch_pos, st.error) == (9, 9, None)


def start(c: Consumer) -> dict[tuple[str, int], tuple[int, int | None]]:
    c.assign([("t", 0, 0), ("t", 1, 0)])
    return {k: (st.generation, st.fetch_pos) for k, st in c._parts.items()}


def test_take_while_the_answer_is_applied_same_thread(monkeypatch: Any) -> None:
    """The switch simulated in one thread: the caller's take_nowait() runs in the middle of the answer."""
    c = Consumer({"bootstrap.servers": "127.0.0.1:1"})
    gens = start(c)
    taken: list[Any] = []
    switch_after_first_batch(monkeypatch, 1, lambda: drain(c, taken))
    assert c._apply_answer(answer(log(b"a"), log(b"b")), gens)  # raised AttributeError before the fix
    monkeypatch.undo()
    drain(c, taken)
    check(c, taken)


def test_take_while_the_answer_is_applied_two_threads(monkeypatch: Any) -> None:
    """Real threads: the caller thread's take_nowait() is held inside the (numpy) group decode while the
    loop thread goes on applying partition 1's batches. Before the fix partition 1 handed out offsets
    0..2 only, with its position at 9."""
    c = Consumer({"bootstrap.servers": "127.0.0.1:1"})
    gens = start(c)
    taken: list[Any] = []
    in_decode, go_on = threading.Event(), threading.Event()
    real_gs = cm.group_sections
    threads: list[threading.Thread] = []

    def slow_gs(*a: Any, **kw: Any) -> Any:
        in_decode.set()
        go_on.wait(5)  # the GIL switched away in the middle of the decode
        return real_gs(*a, **kw)

    def caller_thread_takes() -> None:
        monkeypatch.setattr(cm, "group_sections", slow_gs)
        t = threading.Thread(target=lambda: taken.extend(c.take_nowait(100) or []))
        threads.append(t)
        t.start()
        while t.is_alive() and not in_decode.wait(0.01):  # in the decode (old code) or done (nothing to take)
            pass

    switch_after_first_batch(monkeypatch, 1, caller_thread_takes)
    try:
        assert c._apply_answer(answer(log(b"a"), log(b"b")), gens)
    finally:
        go_on.set()
        for t in threads:
            t.join(5)
    monkeypatch.undo()
    assert threads and not threads[0].is_alive()
    drain(c, taken)
    check(c, taken)
