"""`EngineLoop`: the one event loop, in a daemon thread, that sync callers hand work to.

Sync code (`stallproof.Transport`, `stallproof.sync_http_client()`, the sync SDK faces)
has no event loop, and the `Engine` is async. Rather than write every bound a second time
on blocking sockets, each process runs one asyncio loop in a daemon thread; a sync call
hands its work to that loop as a task and waits for the result. So the engine, its bounds,
retries, breaker, pacer, registry and telemetry are the same objects for sync and async
callers: there is one implementation of each.

What crosses the thread boundary:

- The caller's context. The task runs in a copy of the calling thread's `contextvars`
  (``contextvars.copy_context()``, in which the task is created): `stallproof.tag`, a
  `stallproof.deadline()` block and the OpenTelemetry current span reach the engine as
  they do in async code. Only sniffio's variable is set anew ("asyncio", the loop's):
  a caller inside ``anyio.run(backend="trio")`` has "trio" there.
- The result, or the error, through a ``concurrent.futures.Future``.
- Cancellation. The calling thread waits with a bound of its own (`call`'s ``limit``: the
  call's deadline plus a grace), a second line of defence if the loop were ever held up.
  When that wait ends without a result, or the waiting thread is interrupted
  (``KeyboardInterrupt``), the task is cancelled on the loop, which releases what it holds
  (its connection, its registry entry, its permit) as any cancelled call does, and the
  thread waits a bounded moment for that before it raises.

The loop runs only stallproof's code: user code (SDKs, event hooks, the caller's loop
body) runs in the calling threads, so one slow caller never holds up another's bounds.
Many threads may call at once; each waits on its own future.

Lifecycle: the loop starts on first use; at interpreter exit (``atexit``) its tasks are
cancelled and it stops, bounded, so exit never hangs on it. After ``os.fork()`` the child
starts a loop of its own on first use (``os.register_at_fork``): the parent's loop thread
does not exist there, and an engine the parent already used cannot be used in the child
(its connections belong to the parent's loop): that is refused with a clear error.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextvars
import os
import threading
import time
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import sniffio

from .. import _exceptions as exc
from .._engine import Engine

__all__ = ["EngineLoop", "engine_loop"]

T = TypeVar("T")

# How long a waiting thread that gave up (its own bound, an interrupt) waits for the
# cancelled task to release what it holds. Releasing is local work (closing a socket).
_CANCEL_WAIT = 0.25
# How long interpreter exit waits for the loop's tasks to end once cancelled.
_EXIT_WAIT = 1.0


class _Job:
    """One piece of work handed to the loop: its task, once started, and its future."""

    __slots__ = ("abandoned", "future", "orphan", "spawn", "task")

    def __init__(
        self,
        orphan: Callable[[Any], Coroutine[Any, Any, None]] | None,
        spawn: Callable[[Coroutine[Any, Any, None]], None],
    ) -> None:
        self.spawn = spawn
        self.future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.task: asyncio.Task[Any] | None = None
        self.abandoned = False  # the waiting thread gave up: nobody will take the result
        self.orphan = orphan

    def done(self, task: asyncio.Task[Any]) -> None:
        """The task's end, on the loop: hand the result over, or release it if abandoned."""
        if task.cancelled():
            self.future.set_exception(concurrent.futures.CancelledError())
            return
        error = task.exception()
        if error is not None:
            self.future.set_exception(error)
            return
        result = task.result()
        if self.abandoned:
            # It ended well just as its caller gave up: what it holds goes back now.
            if self.orphan is not None:
                self.spawn(self.orphan(result))
            self.future.set_exception(concurrent.futures.CancelledError())
            return
        self.future.set_result(result)


class EngineLoop:
    """An asyncio event loop running in a daemon thread, for sync callers (see module)."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._thread = threading.Thread(
            target=self._run, name="stallproof-engine-loop", daemon=True
        )
        self._thread.start()
        self._ready.wait()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.call_soon(self._ready.set)
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def time(self) -> float:
        """The loop's clock, read from any thread (asyncio's is ``time.monotonic``)."""
        return self._loop.time()

    def call(
        self,
        fn: Callable[..., Coroutine[Any, Any, T]],
        *args: Any,
        limit: float,
        orphan: Callable[[T], Coroutine[Any, Any, None]] | None = None,
    ) -> T:
        """Run ``fn(*args)`` as a task on the loop, in a copy of the caller's context, and
        wait at most ``limit`` seconds for its result.

        Args:
            limit: the waiting thread's own bound (the engine's bounds end the task first;
                this only matters if the loop were held up).
            orphan: what to do with a result that arrives after the caller gave up (close
                a response it holds).

        Raises:
            Whatever the task raised. `TotalTimeout` if ``limit`` passed first (the task
            is cancelled). An interrupt of the waiting thread cancels the task and goes on.
        """
        if threading.get_ident() == self._thread.ident:
            raise exc.InvalidRequestError(
                "a sync stallproof call was made from stallproof's own engine loop thread"
            )
        job = _Job(orphan, self._spawn)
        context = contextvars.copy_context()
        started = time.monotonic()

        def start() -> None:
            if job.abandoned:
                job.future.set_exception(concurrent.futures.CancelledError())
                return
            # Runs in the caller's context (below): the task runs in a copy of it. That
            # copy says which async library runs here: `anyio.run(backend="trio")` marks
            # its context "trio" for sniffio, and anyio would take this loop for trio.
            sniffio.current_async_library_cvar.set("asyncio")
            task = self._loop.create_task(fn(*args))
            job.task = task
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            task.add_done_callback(job.done)

        self._loop.call_soon_threadsafe(start, context=context)
        try:
            result: T = job.future.result(timeout=max(limit, 0.0))
            return result
        except concurrent.futures.TimeoutError:
            self._abandon(job)
            raise exc.TotalTimeout(
                f"total timeout: no result from stallproof's engine loop within {limit:.3f}s "
                "(the loop was held up)",
                limit=limit,
                elapsed=time.monotonic() - started,
                phase="waiting for the engine loop",
            ) from None
        except concurrent.futures.CancelledError:
            raise exc.StallproofError("the call was cancelled on the engine loop") from None
        except BaseException:
            # The waiting thread was interrupted (KeyboardInterrupt, a signal handler's
            # error): the call ends on the loop, releasing what it holds.
            self._abandon(job)
            raise

    def _abandon(self, job: _Job) -> None:
        """Cancel a job whose caller stopped waiting; wait briefly for it to release."""
        job.abandoned = True

        def cancel() -> None:
            if job.task is not None:
                job.task.cancel()

        try:
            self._loop.call_soon_threadsafe(cancel)
        except RuntimeError:  # the loop is closed (interpreter exit)
            return
        concurrent.futures.wait([job.future], timeout=_CANCEL_WAIT)
        future = job.future
        orphan = job.orphan
        if (
            orphan is not None
            and future.done()
            and not future.cancelled()
            and future.exception() is None
        ):
            # The result was handed over just before the caller gave up.
            result = future.result()
            self._loop.call_soon_threadsafe(lambda: self._spawn(orphan(result)))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Start ``work`` on the loop (from the loop's thread), referenced until it ends."""
        task: asyncio.Task[None] = self._loop.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def run_sync(self, fn: Callable[[], T], *, limit: float = 5.0) -> T:
        """Run a plain function on the loop's thread (an engine's views read loop state)."""

        async def run() -> T:
            return fn()

        return self.call(run, limit=limit)

    def stop(self) -> None:
        """Cancel every task, wait for them (bounded), and stop the loop. Never hangs."""
        if not self._thread.is_alive():
            return

        async def drain() -> None:
            me = asyncio.current_task()
            tasks = [t for t in self._tasks if not t.done() and t is not me]
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=_EXIT_WAIT)
            self._loop.stop()

        try:
            self._loop.call_soon_threadsafe(lambda: self._spawn(drain()))
        except RuntimeError:
            return
        self._thread.join(_EXIT_WAIT + 1.0)


_lock = threading.Lock()
_current: EngineLoop | None = None
# The loop each engine was first used on: an engine's connections belong to it.
_homes: weakref.WeakKeyDictionary[Engine, EngineLoop] = weakref.WeakKeyDictionary()


def engine_loop() -> EngineLoop:
    """The process's engine loop, started on first use."""
    global _current
    loop = _current
    if loop is not None:
        return loop
    with _lock:
        if _current is None:
            _current = EngineLoop()
        return _current


def home_of(engine: Engine) -> EngineLoop:
    """The loop ``engine`` runs on (this process's); refuses one from before a fork."""
    loop = engine_loop()
    with _lock:
        home = _homes.setdefault(engine, loop)
    if home is not loop:
        raise exc.InvalidRequestError(
            "this sync client's engine was used before os.fork(): its connections belong "
            "to the parent process; make a new client in the child"
        )
    return loop


def _stop_at_exit() -> None:
    loop = _current
    if loop is not None:
        loop.stop()


def _after_fork_in_child() -> None:
    # The parent's loop thread does not exist in the child, and the lock may have been
    # held by another thread at the fork: start afresh. Engines used in the parent keep
    # the parent's loop as their home, and are refused (`home_of`).
    global _lock, _current
    _lock = threading.Lock()
    _current = None


atexit.register(_stop_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
