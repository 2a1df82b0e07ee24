"""The two ways a process shows its calls in flight to ``stallproof top``: the publisher to
Redis (`publish_inflight`) and the local socket (`serve_inflight`). Bad settings are
refused by name; a Redis that never answers holds neither a call nor ``close``; a socket
path is never taken from a live process or a file that is not a socket."""

from __future__ import annotations

import os
import socket
import stat
from typing import Any

import anyio
import pytest

import stallproof
from stallproof._local_socket import read_socket
from stallproof._registry import table_json
from stallproof._top import Source, fetch

from ..support.fleet import RedisServer, silent_listener
from ..support.timing import MARGIN, stopwatch, wait_until

pytestmark = pytest.mark.anyio

MSGS = [{"role": "user", "content": "hello"}]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"interval": 0}, "interval must be"),
        ({"interval": float("inf")}, "interval must be"),
        ({"interval": True}, "interval must be"),
        ({"ttl": -1}, "ttl must be"),
        ({"interval": 2.0, "ttl": 2.0}, "ttl must be longer than interval"),
        ({"stalled_after": "5"}, "stalled_after must be"),
    ],
)
def test_publisher_settings_are_checked(settings: dict[str, Any], message: str) -> None:
    shared = stallproof.RedisState("redis://127.0.0.1:1/0")
    with pytest.raises(stallproof.InvalidRequestError, match=message):
        stallproof.publish_inflight(shared, **settings)
    with pytest.raises(stallproof.InvalidRequestError, match="must be a RedisState"):
        stallproof.publish_inflight("redis://127.0.0.1:1/0")  # type: ignore[arg-type]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_publishes_and_removes_its_table(
    fault_server: Any, make_client: Any, redis_server: RedisServer, redis_prefix: str
) -> None:
    """A stuck call of this process shows in the fleet's view within an interval, with
    this pid; ``close`` takes the table away."""
    client = make_client(fault_server.url("stall_headers", hold=5), timeout=4)
    shared = stallproof.RedisState(redis_server.url, prefix=redis_prefix, op_timeout=2.0)
    with stallproof.publish_inflight(shared, interval=0.1, stalled_after=0.2) as publisher:
        assert repr(publisher).startswith("InflightPublisher(RedisState(")
        async with anyio.create_task_group() as tg:

            async def stuck() -> None:
                with pytest.raises(stallproof.TimeoutException):
                    await client.chat.completions.create(model="m", messages=MSGS, agent="a1")

            tg.start_soon(stuck)

            source = Source(redis=shared)
            with anyio.fail_after(10):
                while True:  # another thread's progress: there is no event to wait on
                    mine = [c for c in (await fetch(source)).calls if c.stalled]
                    if mine:
                        break
                    await anyio.sleep(0.05)
            (call,) = mine
            assert call.agent == "a1"
            assert call.pid == os.getpid() and call.phase == "awaiting headers"
            assert publisher.health == "redis" and publisher.published > 0
            tg.cancel_scope.cancel()
    assert (await fetch(Source(redis=shared))).calls == []


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_redis_that_never_answers_holds_no_call_and_no_close(
    fault_server: Any, make_client: Any
) -> None:
    """Publishing to a Redis that accepts and never answers: calls go on as before, the
    publisher says why it cannot publish, and ``close`` returns within a few op_timeouts."""
    client = make_client(fault_server.url(), timeout=5)
    with silent_listener() as url:
        shared = stallproof.RedisState(url, op_timeout=0.2)
        publisher = stallproof.publish_inflight(shared, interval=0.05)
        for _ in range(5):
            with stopwatch() as t:
                await client.chat.completions.create(model="m", messages=MSGS)
            assert t[0] < 0.5
        await wait_until(lambda: publisher.health.startswith("local"), timeout=5)
        assert "op_timeout=0.2s" in publisher.health
        with stopwatch() as t:
            publisher.close()
        assert t[0] <= 3 * 0.2 + MARGIN
        assert publisher.published == 0
    with pytest.raises(stallproof.InvalidRequestError, match="closed"):
        publisher.start()


def test_a_table_carries_at_most_its_rows_and_counts_them_all() -> None:
    """What the publisher sends is bounded: past ``most`` calls only the count travels."""
    from stallproof._registry import ProcessTable

    table = ProcessTable.from_json(table_json(stalled_after=1.0, most=0))
    assert table.calls == () and table.total == len(stallproof.inflight())
    assert table.pid == os.getpid()


def test_socket_is_the_users_own_and_goes_away(tmp_path: Any) -> None:
    path = str(tmp_path / "me.sock")
    with stallproof.serve_inflight(path) as server:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert read_socket(path).pid == os.getpid()
        # A second server on the same live path is refused, by name.
        with pytest.raises(stallproof.InvalidRequestError, match="already served"):
            stallproof.serve_inflight(path)
        assert repr(server) == f"InflightServer({path!r})"
    assert not os.path.exists(path)


def test_a_dead_processs_socket_is_taken_over_and_a_file_is_not(tmp_path: Any) -> None:
    stale = str(tmp_path / "stale.sock")
    left = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    left.bind(stale)
    left.close()  # bound, never listening: what a killed process leaves
    with stallproof.serve_inflight(stale):
        assert read_socket(stale).pid == os.getpid()
    plain = tmp_path / "plain"
    plain.write_text("mine")
    with pytest.raises(stallproof.InvalidRequestError, match="not a socket"):
        stallproof.serve_inflight(str(plain))
    assert plain.read_text() == "mine"


def test_top_passes_over_a_dead_processs_socket_and_reads_the_live(tmp_path: Any) -> None:
    """Found in the sockets directory: a socket nothing listens on (a process that died)
    is passed over without a word; this process's own is read. Named, it is reported."""
    import asyncio

    from stallproof._local_socket import socket_dir

    with stallproof.serve_inflight() as server:
        dead = os.path.join(socket_dir(), "4194304999.sock")  # above any real pid
        left = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            left.bind(dead)
            left.close()
            snap = asyncio.run(fetch(Source()))
            assert snap.problems == ()
            assert os.getpid() in {t.pid for t in snap.tables}
            named = asyncio.run(fetch(Source(sockets=(dead, server.path))))
            assert [p.split(":")[0] for p in named.problems] == [dead]
        finally:
            left.close()
            os.unlink(dead)
