"""A burst of simultaneous connects is accepted as fast as a raw asyncio server takes it.

A connect the kernel cannot queue (the listener's accept queue is full) has its SYN
dropped, and the client retransmits it a second later: the accept loop must drain the
queue at every wake-up, not take one connection per pass of the loop.
"""

from __future__ import annotations

import contextlib
import errno
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from ..support.wire import address, cli_server

pytestmark = pytest.mark.slow

BURST = 8000  # the figure; two sockets each, within the runner's 20,000 descriptors.
RETRANSMIT = 1.0  # Linux's first SYN retransmit: a connect this slow had its SYN dropped.


def burst(address: tuple[str, int], n: int, budget: float = 20.0) -> list[float]:
    """Start ``n`` non-blocking connects at once; the seconds each took to complete."""
    socks: list[socket.socket] = []
    started: dict[int, float] = {}
    took: list[float] = []
    poller = select.epoll()
    try:
        for _ in range(n):
            sock = socket.socket()
            sock.setblocking(False)
            socks.append(sock)
            started[sock.fileno()] = time.monotonic()
            code = sock.connect_ex(address)
            if code == 0:
                took.append(0.0)
            else:
                assert code == errno.EINPROGRESS, errno.errorcode.get(code, code)
                poller.register(sock.fileno(), select.EPOLLOUT)
        deadline = time.monotonic() + budget
        pending = n - len(took)
        while pending and time.monotonic() < deadline:
            for fd, _ in poller.poll(0.1):
                poller.unregister(fd)
                took.append(time.monotonic() - started[fd])
                pending -= 1
        assert not pending, f"{pending} connects never completed within {budget} s"
        return took
    finally:
        poller.close()
        for sock in socks:
            sock.close()


RAW_SERVER = """
import asyncio, sys

async def held(reader, writer):
    try:
        await reader.read()
    except Exception:
        pass
    writer.close()

async def main():
    server = await asyncio.start_server(held, "127.0.0.1", 0, backlog=4096)
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

asyncio.run(main())
"""


@contextlib.contextmanager
def raw_asyncio_server() -> Iterator[tuple[str, int]]:
    """A plain `asyncio.start_server` that holds what it accepts, in a process of its own
    (as the fault server below: in this process, the client's loop would take its GIL)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", RAW_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 20)
        assert ready, "the raw server printed no port within 20 s"
        yield "127.0.0.1", int(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait(10)
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()


def slow(took: list[float]) -> int:
    return sum(t >= RETRANSMIT for t in took)


def measure() -> tuple[int, int]:
    """Connects that met a SYN retransmit: on a raw asyncio server, then on ours."""
    with raw_asyncio_server() as raw_address:
        raw = slow(burst(raw_address, BURST))
    with cli_server("--max-hold", "10") as (base_url, _):
        ours = slow(burst(address(base_url), BURST))
    return raw, ours


def test_a_connect_burst_meets_no_more_retransmits_than_a_raw_asyncio_server() -> None:
    # The two bursts run one after the other, and on a busy runner (the suite's other
    # workers) the load can change between them: a second pair is taken if the first is
    # against us, and the better of ours stands against the worse of the raw server's.
    # Taking one connection per pass of the loop met 2,111-2,559 retransmits in every
    # burst, against 0 for the raw server.
    raw, ours = measure()
    if ours > raw + BURST // 100:
        raw_again, ours_again = measure()
        raw, ours = max(raw, raw_again), min(ours, ours_again)
    assert ours <= raw + BURST // 100, f"{ours} connects met a SYN retransmit, {raw} on a raw one"
