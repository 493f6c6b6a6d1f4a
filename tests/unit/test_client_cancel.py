"""A task waiting in the asyncio consumer is cancelled as data arrives: the cancellation must win.

On Python 3.11 ``asyncio.wait_for`` returns the inner result when the
cancellation and the inner completion land in the same loop iteration, so the
cancellation is lost. ``consume()`` used it to wait for fetched data; a
caller's ``while True: await consumer.consume(...)`` task then never ended
when cancelled (the churn test in test_client_subscribe hung in "kill b" /
"close" with that task still looping). Sans-IO: the fetcher's
``_data.set()`` stands for a Fetch answer.
"""

from __future__ import annotations

import asyncio

import pytest

from oncelog.client.aio.cluster import Cluster
from oncelog.client.aio.consumer import Consumer
from oncelog.client.aio.group import GroupMember
from oncelog.client.config import parse_config


async def _cancel_as_data_arrives(task: asyncio.Task, signal: asyncio.Event) -> None:
    await asyncio.sleep(0.05)  # the task now waits
    signal.set()  # the awaited event completes ...
    task.cancel()  # ... in the same loop iteration as the cancellation


def test_consume_cancelled_as_data_arrives_raises_cancelled() -> None:
    async def main() -> None:
        c = Consumer({"bootstrap.servers": "127.0.0.1:1"})
        task = asyncio.ensure_future(c.consume(500, 5.0))
        await _cancel_as_data_arrives(task, c._data)
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(task), 1.0)  # not the 5 s timeout's empty list

    asyncio.run(main())


def test_consume_loop_task_ends_when_cancelled_as_data_arrives() -> None:
    async def main() -> None:
        c = Consumer({"bootstrap.servers": "127.0.0.1:1"})

        async def loop() -> None:  # the application's (and the churn test's) consume loop
            while True:
                await c.consume(500, 0.2)

        task = asyncio.ensure_future(loop())
        await _cancel_as_data_arrives(task, c._data)
        done, _ = await asyncio.wait({task}, timeout=2.0)
        c._closed = True  # the old code loops on: consume() now raises ClientClosedError and ends it
        assert done == {task} and task.cancelled()

    asyncio.run(main())


def test_wait_assigned_cancelled_as_assignment_arrives_raises_cancelled() -> None:
    async def main() -> None:
        conf = parse_config({"bootstrap.servers": "127.0.0.1:1", "group.id": "g"}, "consumer")
        m = GroupMember(Cluster(conf), conf, ["t"])
        task = asyncio.ensure_future(m.wait_assigned())
        await _cancel_as_data_arrives(task, m._assigned)  # set, but the member is not stable yet
        done, _ = await asyncio.wait({task}, timeout=2.0)
        m._state = "closed"  # the old code loops on: _check() now raises and ends it
        assert done == {task} and task.cancelled()

    asyncio.run(main())
