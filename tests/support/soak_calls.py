"""One chaos-soak call (see `tests.support.soak`): through its face, under its cancellation.

On asyncio the cancellations are asyncio's own (``Task.cancel()``, ``asyncio.timeout``)
and anyio's (``move_on_after``, a ``CancelScope`` cancelled by a sibling task), which are
not the same thing: an anyio shield does not hold off ``Task.cancel()``. On trio, trio's
cancel scopes (anyio's are trio's there).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

import stallproof
import stallproof.anthropic
import stallproof.openai

from .soak_plan import Plan

__all__ = ["MESSAGES", "MODEL", "call_async", "call_sync", "cancelled"]

MODEL = "soak-model"
MESSAGES: Any = [{"role": "user", "content": "soak: say something"}]


def _headers(plan: Plan, hold: float) -> dict[str, str]:
    return {"X-Fault": f"{plan.fault.spec};hold={hold:g}"}


async def _drain(stream: Any, read: int | None) -> None:
    n = 0
    async for _ in stream:
        n += 1
        if read is not None and n >= read:
            return


async def _chat(client: Any, plan: Plan, hold: float) -> None:
    """Through ``client.chat.completions`` (`stallproof.Client` and the openai face alike)."""
    headers = _headers(plan, hold)
    create = client.chat.completions.create
    if not plan.stream:
        await create(model=MODEL, messages=MESSAGES, timeout=plan.total, extra_headers=headers)
        return
    stream = await create(
        model=MODEL, messages=MESSAGES, stream=True, timeout=plan.total, extra_headers=headers
    )
    async with stream:
        await _drain(stream, plan.read)


async def _anthropic(client: stallproof.anthropic.AsyncAnthropic, plan: Plan, hold: float) -> None:
    headers = _headers(plan, hold)
    if not plan.stream:
        await client.messages.create(
            model=MODEL,
            max_tokens=64,
            messages=MESSAGES,
            timeout=plan.total,
            extra_headers=headers,
        )
        return
    stream = await client.messages.create(
        model=MODEL,
        max_tokens=64,
        messages=MESSAGES,
        stream=True,
        timeout=plan.total,
        extra_headers=headers,
    )
    async with stream:
        await _drain(stream, plan.read)


def call_sync(client: stallproof.openai.OpenAI, plan: Plan, hold: float) -> None:
    """The plan's call through the sync openai face (in the calling thread)."""
    headers = _headers(plan, hold)
    if not plan.stream:
        client.chat.completions.create(
            model=MODEL, messages=MESSAGES, timeout=plan.total, extra_headers=headers
        )
        return
    stream = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, stream=True, timeout=plan.total, extra_headers=headers
    )
    with stream:
        for n, _ in enumerate(stream, 1):
            if plan.read is not None and n >= plan.read:
                return


def call_async(face: str, client: Any, plan: Plan, hold: float) -> Callable[[], Awaitable[None]]:
    """The plan's call through an async face, to be awaited (under `cancelled`)."""
    if face in ("client", "openai"):
        return lambda: _chat(client, plan, hold)
    return lambda: _anthropic(client, plan, hold)


# -- cancellation -----------------------------------------------------------------------------


async def cancelled(plan: Plan, call: Callable[[], Awaitable[None]]) -> bool:
    """Run ``call`` under the plan's cancellation; True if that cancellation ended it."""
    kind, at = plan.cancel, plan.cancel_at
    if kind is None:
        await call()
        return False
    if kind == "Task.cancel":
        return await _task_cancel(call, at)
    if kind == "asyncio.timeout" and sys.version_info >= (3, 11):
        try:
            async with asyncio.timeout(at) as cm:
                await call()
        except TimeoutError:
            if cm.expired():
                return True
            raise
        return False
    if kind in ("anyio.move_on_after", "trio.move_on_after"):
        # On trio, anyio's scope is trio's own (anyio wraps trio.CancelScope).
        with anyio.move_on_after(at) as scope:
            await call()
        return scope.cancelled_caught
    if kind in ("anyio.CancelScope", "trio.CancelScope"):
        return await _sibling_cancel(call, at)
    raise ValueError(f"unknown cancellation {kind!r}")


async def _task_cancel(call: Callable[[], Awaitable[None]], at: float) -> bool:
    """asyncio's own: the call in a task of its own, ``Task.cancel()`` from a loop timer."""
    loop = asyncio.get_running_loop()

    async def body() -> None:
        await call()

    task = loop.create_task(body())
    fired = False

    def fire() -> None:
        nonlocal fired
        fired = True
        task.cancel()

    handle = loop.call_later(at, fire)
    try:
        await task
    except asyncio.CancelledError:
        if fired and task.cancelled() and not _being_cancelled():
            return True  # our cancel, not one of the task awaiting it
        raise
    finally:
        handle.cancel()
    return False


def _being_cancelled() -> bool:
    """Whether the current task itself is being cancelled (Python 3.11+ can tell)."""
    if sys.version_info < (3, 11):
        return False
    me = asyncio.current_task()
    return me is not None and me.cancelling() > 0


async def _sibling_cancel(call: Callable[[], Awaitable[None]], at: float) -> bool:
    """A cancel scope around the call, cancelled by a sibling task after ``at`` seconds.
    The call's error is raised as itself, not in the task group's ExceptionGroup."""
    error: Exception | None = None
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:

            async def cancel_later() -> None:
                await anyio.sleep(at)
                scope.cancel()

            tg.start_soon(cancel_later)
            try:
                await call()
            except Exception as e:
                error = e
            finally:
                tg.cancel_scope.cancel()
    if error is not None:
        raise error
    return scope.cancelled_caught


# -- outcomes ---------------------------------------------------------------------------------
