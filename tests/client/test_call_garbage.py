"""A call leaves no cyclic garbage of the engine's: its objects are freed when it ends.

At scale the garbage collector's pauses are the tail of the deadline (benchmarks/scale.py):
every object a call leaves in a reference cycle waits for a collection, and full
collections over thousands of calls stop the loop for hundreds of milliseconds. These
tests make calls end the way a storm ends them (the total deadline), then collect with
``gc.DEBUG_SAVEALL`` and look for the engine's own objects among what only the collector
could free.
"""

from __future__ import annotations

import gc
import socket
import types
from collections.abc import Iterator
from typing import Any

import pytest

import stallproof
from stallproof._body import ResponseBody
from stallproof._call import Call
from stallproof._callscope import CallScope
from stallproof._telemetry import CallTelemetry

from ..support.clients import MakeClient

pytestmark = pytest.mark.anyio

BODY: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
_OURS = (Call, CallScope, CallTelemetry, ResponseBody)
_OUR_MODULES = ("_engine.py", "_call.py", "_callscope.py", "_body.py", "_retry.py")


@pytest.fixture
def black_hole() -> Iterator[str]:
    """A loopback listener that never accepts: the kernel takes each request, nobody answers."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    host, port = sock.getsockname()
    yield f"http://{host}:{port}/v1"
    sock.close()


def _engine_garbage() -> list[str]:
    """What the collector alone would free that belongs to the engine (by type or frame)."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        found = []
        for obj in gc.garbage:
            if isinstance(obj, _OURS):
                found.append(type(obj).__name__)
            elif isinstance(obj, types.FrameType) and obj.f_code.co_filename.endswith(_OUR_MODULES):
                # co_qualname is 3.11+; 3.10 (which we support) has only co_name.
                code = obj.f_code
                found.append(f"frame {getattr(code, 'co_qualname', code.co_name)}")
        return found
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


async def _calls_without_gc(client: stallproof.Client, n: int, error: type[Exception]) -> list[str]:
    gc.collect()
    gc.disable()
    try:
        for _ in range(n):
            with pytest.raises(error):
                await client.chat.completions.create(**BODY)
        return _engine_garbage()
    finally:
        gc.enable()


async def test_a_call_ended_by_its_deadline_leaves_no_cycle(
    make_client: MakeClient, black_hole: str
) -> None:
    # The default Retry: a TotalTimeout is not retried, so the first attempt's own path.
    client = make_client(
        black_hole, retry=stallproof.Retry(), timeout=stallproof.Timeouts(total=0.2)
    )
    assert await _calls_without_gc(client, 3, stallproof.TotalTimeout) == []
