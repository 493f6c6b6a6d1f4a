"""A background asyncio loop thread for the blocking clients.

``LoopThread()`` starts a daemon thread running its own event loop;
``run(coro, timeout)`` runs a coroutine there and blocks for its result (cancelled, and
``ClientClosedError`` raised, when ``stop()`` ends the loop first). A timeout cancels the coroutine. Any
other exception in the caller while it waits (Ctrl-C's KeyboardInterrupt) reaches the caller, and the
coroutine runs on to completion on the loop (a state-changing call such as a transaction's commit is not
left half-way; calling it again resumes it), unless ``cancel_on_interrupt=True``: then it is cancelled
too (for pure waits such as a consumer's ``consume()``/``poll()``, which would otherwise take records
for nobody);
``call(fn, *args)`` schedules a plain call on the loop from any thread;
``stop()`` ends the loop and joins the thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from oncelog.client.errors import ClientClosedError

T = TypeVar("T")


class LoopThread:
    def __init__(self, name: str = "oncelog-client") -> None:
        self.loop = asyncio.new_event_loop()
        # run() sends nothing once stop() began: a coroutine sent after run_forever() returned would
        # never run (its caller waiting for ever); one sent before is cancelled by _main
        self._sending = threading.Lock()
        self._stopping = False
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()
        # tasks still pending (e.g. an OAUTHBEARER token refresh waiting on a hung oauth_cb) are cancelled,
        # not destroyed pending with asyncio's "Task was destroyed but it is pending!" on stderr
        for _ in range(3):  # a cancelled task may start another; a few rounds, each bounded
            tasks = asyncio.all_tasks(self.loop)
            if not tasks:
                break
            for task in tasks:
                task.cancel()
            self.loop.run_until_complete(asyncio.wait(tasks, timeout=1.0))
        self.loop.close()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None, *,
            cancel_on_interrupt: bool = False) -> T:
        with self._sending:
            if self._stopping:  # as a coroutine sent just before stop(): cancelled
                coro.close()
                raise ClientClosedError("client is closed")
            fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout)
        except concurrent.futures.CancelledError:
            if self._stopping or self.loop.is_closed():  # cancelled by stop() (close() on another thread)
                raise ClientClosedError("client is closed") from None
            raise
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise
        except BaseException:
            # an exception in this thread meanwhile (Ctrl-C's KeyboardInterrupt): a wait must not go on
            # without its caller (a consume() would take records for nobody); any other call runs on
            if cancel_on_interrupt:
                fut.cancel()
            raise

    def call(self, fn: Callable[..., Any], *args: Any) -> None:
        self.loop.call_soon_threadsafe(fn, *args)

    def stop(self) -> None:
        with self._sending:
            if self._stopping or self.loop.is_closed():
                return
            self._stopping = True
            self.loop.call_soon_threadsafe(self.loop.stop)  # after the coroutines already sent
        self._thread.join(10)
