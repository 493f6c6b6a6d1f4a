"""A partition paused while its Fetch is in flight (review F1): the answer that arrives after the pause
is kept for after resume, as Java's fetcher keeps it, but copied out of the answer's receive buffer, which
its views would otherwise keep alive (up to ``fetch.max.bytes``) for as long as the partition is paused."""

from __future__ import annotations

import pytest

from tests.unit.test_client_fetch_decode import response, three_batches_assigned


@pytest.mark.parametrize("codec", [0, 3])
def test_answer_to_a_fetch_in_flight_at_pause_does_not_pin_the_receive_buffer(codec: int) -> None:
    frame, c, st = three_batches_assigned(codec)
    c.pause([("t", 0)])  # the Fetch for it is in flight; its answer comes after the pause
    c._apply(st, response(memoryview(frame)))  # type: ignore[arg-type]
    assert st.buffer
    for ch in st.buffer:  # no view of the answer's buffer is kept
        assert ch.batches
        for batch in ch.batches:
            for sec in (batch.section, batch.packed):
                assert sec is None or type(sec[0]) is not memoryview, type(sec[0])
    frame[:] = b"\xff" * len(frame)  # the receive buffer reused/rewritten: the kept records are unchanged
    assert c.take_nowait(100) is None  # paused: nothing handed out
    c.resume([("t", 0)])
    got = c.take_nowait(100)
    assert got is not None and [(m.offset, m.key, m.value) for m in got] == [
        (j, b"k%d" % (j % 3), b"v%d" % (j % 3)) for j in range(9)]
