"""`ControlWorker`: the ``/_fault/`` control requests run in a thread, off the loop."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from ._control_api import control
from ._openai import Whole
from ._shutdown import collector_paused

if TYPE_CHECKING:
    from ._state import ServerState

__all__ = ["ControlWorker"]


class ControlWorker:
    """Runs control requests in a thread of their own, one at a time, off the server's loop.

    A verdict on 50,000 requests or the stats of 100,000 keys take the CPU for a second;
    on the loop that second froze every connection. In the worker, the loop keeps serving:
    the interpreter hands it the GIL every few milliseconds, the state's locks are held
    only to copy references (`Journal.page`, `Counters.keys`, `Scenarios.rules`), and the
    answer is encoded in small pieces (`_json`), never in one long C call. The cyclic
    GC is paused while a request runs (`collector_paused`): the 100,000 records of a big
    answer made it walk every object of the process, 0.1 s with the GIL held; they are all
    freed by their reference counts when the answer is sent.
    """

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None

    async def answer(
        self,
        method: str,
        path: str,
        query: str,
        body: bytes,
        state: ServerState,
        headers: Iterable[tuple[bytes, bytes]],
    ) -> Whole:
        """`control`, run in the worker thread."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="fault_server.control")
        loop = asyncio.get_running_loop()
        work = (method, path, query, body, state, list(headers))
        return await loop.run_in_executor(self._pool, _control, *work)

    def close(self) -> None:
        """Let the thread end once its request is done; queued requests are dropped."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


def _control(
    method: str,
    path: str,
    query: str,
    body: bytes,
    state: ServerState,
    headers: list[tuple[bytes, bytes]],
) -> Whole:
    with collector_paused():
        return control(method, path, query, body, state, headers)
