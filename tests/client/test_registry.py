"""One in-flight registry per process: `stallproof.inflight()` sees every client, face and
transport; a dropped client leaves it; reads from another thread see the right times, on
asyncio and trio; a call's record crosses processes as JSON and comes back the same."""

from __future__ import annotations

import gc
import os
import threading
import weakref
from typing import Any

import anyio
import httpx
import pytest
from openai.types.chat import ChatCompletionMessageParam

import stallproof
from stallproof._registry import ProcessTable, table_json

from ..support.clients import KEY
from ..support.timing import MARGIN, wait_until

pytestmark = pytest.mark.anyio

MSGS: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello"}]


def _ours(ids: set[str]) -> list[stallproof.InflightCall]:
    return [c for c in stallproof.inflight() if c.request_id in ids]


async def _stuck_call(client: stallproof.Client, rid: str) -> None:
    with pytest.raises(stallproof.TimeoutException):
        await client.chat.completions.create(
            model="m", messages=MSGS, extra_headers={"X-Request-Id": rid}
        )


async def test_one_view_of_every_client_face_and_transport(
    fault_server: Any, make_client: Any
) -> None:
    """Two clients, an httpx transport and an SDK face, each stuck on one call: the
    process view has all four, each client's own view only its own."""
    from stallproof.openai import AsyncOpenAI

    url = fault_server.url("stall_headers", hold=5)
    a, b = make_client(url, timeout=3), make_client(url, timeout=3)
    transport = stallproof.AsyncTransport(timeout=3, retry=None)
    sdk = AsyncOpenAI(base_url=url, api_key=KEY, max_retries=0, timeout=3)
    ids = {f"sp-reg-{n}-{fault_server.port}" for n in range(4)}
    ra, rb, rt, rs = sorted(ids)
    async with httpx.AsyncClient(transport=transport) as http, anyio.create_task_group() as tg:
        tg.start_soon(_stuck_call, a, ra)
        tg.start_soon(_stuck_call, b, rb)

        async def through_transport() -> None:
            with pytest.raises(httpx.TimeoutException):
                await http.post(
                    url + "/chat/completions",
                    json={"model": "m", "messages": MSGS},
                    headers={"X-Request-Id": rt},
                )

        async def through_sdk() -> None:
            with pytest.raises(Exception, match=r"timed out|Timeout"):
                await sdk.chat.completions.create(
                    model="m", messages=MSGS, extra_headers={"X-Request-Id": rs}
                )

        tg.start_soon(through_transport)
        tg.start_soon(through_sdk)
        await wait_until(
            lambda: [c.phase for c in _ours(ids)] == ["awaiting headers"] * 4,
            what="four calls awaiting headers in the process view",
        )
        calls = _ours(ids)
        assert {c.pid for c in calls} == {os.getpid()}
        assert [c.request_id for c in a.inflight()] == [ra]
        assert [c.request_id for c in b.inflight()] == [rb]
        assert [c.request_id for c in transport.inflight()] == [rt]
        assert [c.request_id for c in sdk.inflight()] == [rs]
        tg.cancel_scope.cancel()  # shown; cancelled, each call leaves the view too
    await sdk.close()
    await transport.aclose()
    assert _ours(ids) == []


async def test_a_dropped_client_leaves_the_registry() -> None:
    """The registry holds engines weakly: a client that is garbage-collected is gone from
    it (its table with it), without a close."""
    from stallproof import _registry

    gc.collect()  # engines other tests dropped
    before = len(_registry._TABLES)
    client = stallproof.Client(base_url="http://127.0.0.1:9/v1", api_key=KEY)
    engine = weakref.ref(client._engine)
    assert len(_registry._TABLES) == before + 1
    del client
    gc.collect()
    assert engine() is None  # nothing else keeps it (the meter's gauge callback did)
    assert len(_registry._TABLES) == before


async def test_read_from_another_thread_sees_the_calls_own_clock(
    fault_server: Any, make_client: Any, anyio_backend: str
) -> None:
    """A call stuck for ~1 s, read from a thread that runs no loop (as the publisher's
    and the socket's threads do): its time in phase and deadline left are right on asyncio
    and on trio (whose clock has an offset of its own)."""
    client = make_client(fault_server.url("stall_headers", hold=5), timeout=4)
    rid = f"sp-thread-{anyio_backend}-{fault_server.port}"
    seen: list[stallproof.InflightCall] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(_stuck_call, client, rid)
        await wait_until(lambda: bool(_ours({rid})), what="the call in the view")
        await anyio.sleep(1.0)

        def read() -> None:
            seen.extend(_ours({rid}))

        thread = threading.Thread(target=read)
        thread.start()
        thread.join(5)
        tg.cancel_scope.cancel()  # read: the rest of its bound proves nothing here
    (call,) = seen
    assert 0.9 <= call.elapsed <= 1.0 + 3 * MARGIN
    assert 4.0 - 1.0 - 3 * MARGIN <= call.deadline_left <= 3.1
    assert call.phase == "awaiting headers"


def test_stalled_after_is_checked() -> None:
    with pytest.raises(stallproof.InvalidRequestError, match="stalled_after"):
        stallproof.inflight(stalled_after=-1)
    with pytest.raises(stallproof.InvalidRequestError, match="stalled_after"):
        stallproof.inflight(stalled_after=float("nan"))


async def test_a_table_crosses_processes_as_json(fault_server: Any, make_client: Any) -> None:
    """What the publisher and the socket send parses back to the same records."""
    client = make_client(fault_server.url("stall_headers", hold=5), timeout=3)
    rid = f"sp-json-{fault_server.port}"
    async with anyio.create_task_group() as tg:
        tg.start_soon(_stuck_call, client, rid)
        await wait_until(lambda: bool(_ours({rid})), what="the call in the view")
        table = ProcessTable.from_json(table_json(stalled_after=0.0))
        tg.cancel_scope.cancel()
    (mine,) = [c for c in table.calls if c.request_id == rid]
    assert mine.stalled  # stalled_after=0
    assert mine.pid == table.pid and mine.host == table.host
    again = stallproof.InflightCall.from_json(mine.as_json())
    assert again == mine
    for bad in (b"[]", b"{}", b'{"v": 1}', b"not json"):
        with pytest.raises(ValueError, match=r"table|JSON|Expecting"):
            ProcessTable.from_json(bad)
    with pytest.raises(ValueError, match="in-flight record"):
        stallproof.InflightCall.from_json({**mine.as_json(), "pid": "12"})
