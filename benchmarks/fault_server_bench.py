"""How much the fault server serves, and how many stalled connections it holds, and at what cost.

The server runs in its own process (``python -m fault_server``, which raises its soft
RLIMIT_NOFILE to the hard limit), so its CPU and memory are its own; this process is the
client, on raw sockets so that the client costs as little as possible:

1. **healthy requests/s**: ``--workers`` keep-alive connections (asyncio streams) send
   requests back to back for ``--seconds`` each: non-stream chat completions, streamed ones
   (8 content chunks each, read to the chunked terminator), and ``GET /v1/models``.
2. **held stalls**: ``--stalls`` raw non-blocking sockets (default 10,000) connect in
   batches and each sends one request whose fault holds it (``stall_headers`` by default);
   the server's ``/_fault/stats`` must then show them all open. It reports how long that
   took, the server's resident memory before and after (and so per held connection), and
   the latency of healthy requests while they are held. Then the sockets close and it
   reports how long the server takes to let every one go.

3. **against a raw asyncio server**: the same closed loop (one keep-alive connection,
   requests back to back) on the fault server and on a bare ``asyncio.start_server`` that
   reads a head and a body and answers a fixed JSON of the same size: requests/s, and the
   server's CPU per request (its utime + stime from ``/proc``).
4. **connect burst**: ``--burst`` non-blocking connects at once (default 8,000) on each
   server; how many took a second or more (a SYN the kernel dropped, retransmitted).
5. **shutdown**: a `ServerThread` in this process (as a test suite runs it) holds
   ``--shutdown`` stalled connections (default 8,000; each a connection task and a peer
   watcher, the hold 300 s); how long ``stop()`` takes to end them all.

Every loop is bounded in count and in time (``--budget`` seconds for the stall phase).
Loopback only.

    python benchmarks/fault_server_bench.py [--stalls 10000] [--seconds 4] [--workers 16]
        [--burst 8000] [--shutdown 8000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import resource
import select
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
BODY = json.dumps(
    {"model": "fault-model", "messages": [{"role": "user", "content": "measure the server"}]}
).encode()
STREAM_BODY = json.dumps(
    {
        "model": "fault-model",
        "stream": True,
        "messages": [{"role": "user", "content": "measure the server"}],
    }
).encode()


def http_request(path: str, body: bytes | None = None) -> bytes:
    if body is None:
        return f"GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


# -- the server process -------------------------------------------------------------------

# The floor: asyncio streams, a head and a body read, a fixed answer written. No HTTP
# parsing beyond Content-Length, no journal, no faults.
RAW_SERVER = """
import asyncio, sys

ANSWER = b"x" * int(sys.argv[1])
HEAD = b"HTTP/1.1 200 OK\\r\\ncontent-type: application/json\\r\\ncontent-length: %d\\r\\n\\r\\n"

async def serve(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\\r\\n\\r\\n")
            length = 0
            for line in head.split(b"\\r\\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            await reader.readexactly(length)
            writer.write(HEAD % len(ANSWER) + ANSWER)
            await writer.drain()
    except Exception:
        pass
    writer.close()

async def main():
    server = await asyncio.start_server(serve, "127.0.0.1", 0, backlog=4096)
    print("http://127.0.0.1:%d/v1" % server.sockets[0].getsockname()[1], flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

asyncio.run(main())
"""


@contextlib.contextmanager
def server_process(max_hold: float, raw_size: int | None = None) -> Iterator[tuple[str, int, int]]:
    """(host, port, pid) of a fault server in a child process; with ``raw_size``, of the
    raw asyncio server answering that many bytes instead."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "src")])}
    command = [sys.executable, "-m", "fault_server", "--port", "0", "--max-hold", str(max_hold)]
    if raw_size is not None:
        command = [sys.executable, "-c", RAW_SERVER, str(raw_size)]
    proc = subprocess.Popen(
        command,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        ready, _, _ = select.select([proc.stdout] if proc.stdout else [], [], [], 20)
        if not ready or proc.stdout is None:
            raise RuntimeError("the fault server printed no URL within 20 s")
        parts = urlsplit(proc.stdout.readline().strip())
        if parts.hostname is None or parts.port is None:
            raise RuntimeError(f"the fault server printed no URL: {parts.geturl()!r}")
        yield parts.hostname, parts.port, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()


def cpu_seconds(pid: int) -> float:
    """The user + system CPU time a process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def closed_loop(host: str, port: int, pid: int, raw: bytes, seconds: float) -> tuple[float, float]:
    """(requests/s, server CPU microseconds per request) of one connection, back to back."""
    before = cpu_seconds(pid)
    rate, latencies = asyncio.run(throughput(host, port, raw, 1, seconds))
    return rate, (cpu_seconds(pid) - before) * 1e6 / max(1, len(latencies))


def burst(host: str, port: int, n: int, budget: float = 30.0) -> tuple[int, int]:
    """(connects that took a SYN retransmit, i.e. >= 1 s; connects completed) of ``n``
    simultaneous non-blocking connects."""
    socks: list[socket.socket] = []
    started: dict[int, float] = {}
    slow = done = 0
    poller = select.epoll()
    try:
        for _ in range(n):
            sock = socket.socket()
            sock.setblocking(False)
            socks.append(sock)
            started[sock.fileno()] = time.monotonic()
            if sock.connect_ex((host, port)) == 0:
                done += 1
            else:
                poller.register(sock.fileno(), select.EPOLLOUT)
        deadline = time.monotonic() + budget
        while done < n and time.monotonic() < deadline:
            for fd, _ in poller.poll(0.1):
                poller.unregister(fd)
                done += 1
                slow += time.monotonic() - started[fd] >= 1.0
    finally:
        poller.close()
        for sock in socks:
            sock.close()
    return slow, done


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def stats(host: str, port: int) -> dict[str, int]:
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(b"GET /_fault/stats HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    body = json.loads(data.partition(b"\r\n\r\n")[2])
    return {k: v for k, v in body.items() if isinstance(v, int)}


# -- healthy throughput -------------------------------------------------------------------


async def read_response(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    lowered = head.lower()
    if b"transfer-encoding: chunked" in lowered:
        await reader.readuntil(b"\r\n0\r\n\r\n")
        return
    length = int(lowered.split(b"content-length: ")[1].split(b"\r\n")[0])
    await reader.readexactly(length)


async def throughput(
    host: str, port: int, raw: bytes, workers: int, seconds: float
) -> tuple[float, list[float]]:
    """(requests/s, latencies in ms) of ``workers`` keep-alive connections for ``seconds``."""
    latencies: list[float] = []
    stop = time.monotonic() + seconds

    async def worker() -> None:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while time.monotonic() < stop:
                start = time.perf_counter()
                writer.write(raw)
                await asyncio.wait_for(read_response(reader), 10)
                latencies.append((time.perf_counter() - start) * 1000)
        finally:
            writer.close()

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(workers)))
    return len(latencies) / (time.monotonic() - started), latencies


async def sequential(host: str, port: int, raw: bytes, count: int) -> list[float]:
    reader, writer = await asyncio.open_connection(host, port)
    out = []
    try:
        for _ in range(count):
            start = time.perf_counter()
            writer.write(raw)
            await asyncio.wait_for(read_response(reader), 10)
            out.append((time.perf_counter() - start) * 1000)
    finally:
        writer.close()
    return out


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


# -- held stalls ---------------------------------------------------------------------------


def open_stalls(
    host: str, port: int, count: int, raw: bytes, budget: float, batch: int = 500
) -> list[socket.socket]:
    """``count`` non-blocking sockets, each connected with ``raw`` sent; within ``budget``."""
    deadline = time.monotonic() + budget
    held: list[socket.socket] = []
    poller = select.epoll()
    try:
        while len(held) < count and time.monotonic() < deadline:
            pending: dict[int, socket.socket] = {}
            for _ in range(min(batch, count - len(held))):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setblocking(False)
                sock.connect_ex((host, port))
                pending[sock.fileno()] = sock
                poller.register(sock.fileno(), select.EPOLLOUT)
            while pending and time.monotonic() < deadline:
                for fd, _ in poller.poll(max(0.0, min(1.0, deadline - time.monotonic()))):
                    sock = pending.pop(fd)
                    poller.unregister(fd)
                    if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                        sock.close()
                        continue
                    try:
                        sock.send(raw)
                    except OSError:
                        sock.close()
                        continue
                    held.append(sock)
            for fd, sock in pending.items():  # out of time: give these up.
                poller.unregister(fd)
                sock.close()
    finally:
        poller.close()
    return held


def wait_for(predicate: Callable[[], bool], budget: float) -> float | None:
    """Seconds until ``predicate()`` is true, or None if ``budget`` ran out first."""
    start = time.monotonic()
    while time.monotonic() - start < budget:
        if predicate():
            return time.monotonic() - start
        time.sleep(0.05)
    return None


def raise_fd_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# -- main -----------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stalls", type=int, default=10_000, help="connections to hold")
    parser.add_argument("--fault", default="stall_headers", help="the fault that holds them")
    parser.add_argument("--seconds", type=float, default=4.0, help="per throughput run")
    parser.add_argument("--workers", type=int, default=16, help="concurrent connections")
    parser.add_argument("--budget", type=float, default=90.0, help="cap on the stall phase")
    parser.add_argument("--burst", type=int, default=8000, help="simultaneous connects")
    parser.add_argument(
        "--shutdown", type=int, default=8000, help="connections held when stop() is timed"
    )
    args = parser.parse_args()
    limit = raise_fd_limit()
    if args.stalls + 100 > limit:
        print(f"RLIMIT_NOFILE is {limit}: holding {limit - 100} instead", file=sys.stderr)
        args.stalls = max(0, limit - 100)
    print(
        f"fault_server bench: Python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"server in its own process, client on raw sockets, RLIMIT_NOFILE {limit}"
    )
    compare_with_raw(args.seconds, args.burst)
    with server_process(max_hold=args.budget + 60) as (host, port, pid):
        time.sleep(0.2)
        idle_rss = rss_mib(pid)
        print(f"\nhealthy: {args.workers} keep-alive connections, {args.seconds:g} s per request")
        print(f"{'request':<28} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8}")
        runs = [
            ("chat, non-stream", http_request("/v1/chat/completions", BODY)),
            ("chat, stream (8 chunks)", http_request("/v1/chat/completions", STREAM_BODY)),
            ("GET /v1/models", http_request("/v1/models")),
        ]
        for label, raw in runs:
            rate, lat = asyncio.run(throughput(host, port, raw, args.workers, args.seconds))
            print(f"{label:<28} {rate:>8.0f} {p(lat, 0.5):>8.2f} {p(lat, 0.99):>8.2f}")

        base_open = stats(host, port)["connections_open"]
        before_rss = rss_mib(pid)
        hold = args.budget + 30
        raw = http_request(f"/fault/{args.fault};hold={hold:g}/v1/chat/completions", BODY)
        print(f"\nheld stalls: {args.stalls} connections, each a '{args.fault}' request")
        start = time.monotonic()
        held = open_stalls(host, port, args.stalls, raw, args.budget)
        opened = time.monotonic() - start
        want = base_open + len(held)
        settled = wait_for(
            lambda: stats(host, port)["connections_open"] >= want,
            max(1.0, args.budget - opened),
        )
        server_open = stats(host, port)["connections_open"] - base_open
        time.sleep(1.0)  # let the server's allocations settle before reading its memory.
        held_rss = rss_mib(pid)
        per_conn = (held_rss - before_rss) * 1024 / max(1, server_open)
        print(f"  connected and sent:        {len(held)} in {opened:.1f} s")
        when = "not all within the budget" if settled is None else f"all {settled:.1f} s later"
        print(f"  held by the server:        {server_open} ({when})")
        print(f"  server RSS idle:           {idle_rss:.1f} MiB")
        print(f"  server RSS before stalls:  {before_rss:.1f} MiB")
        print(f"  server RSS holding them:   {held_rss:.1f} MiB  ({per_conn:.1f} KiB each)")
        lat = asyncio.run(sequential(host, port, http_request("/v1/chat/completions", BODY), 200))
        print(
            f"  healthy while holding:     p50 {p(lat, 0.5):.2f} ms, p99 {p(lat, 0.99):.2f} ms "
            f"(200 sequential)"
        )
        rate, _ = asyncio.run(
            throughput(host, port, http_request("/v1/chat/completions", BODY), args.workers, 2)
        )
        print(f"  healthy req/s while holding: {rate:.0f}")
        start = time.monotonic()
        for sock in held:
            sock.close()
        closed = time.monotonic() - start
        released = wait_for(lambda: stats(host, port)["connections_open"] <= base_open, 30)
        shown = "not within 30 s" if released is None else f"{released:.1f} s"
        print(f"  closed by the client in:   {closed:.1f} s; all released by the server: {shown}")
        print(f"  server RSS after:          {rss_mib(pid):.1f} MiB")
    if args.shutdown:
        shutdown_with_held(min(args.shutdown, max(0, limit // 2 - 100)), args.budget)
    return 0


def shutdown_with_held(count: int, budget: float) -> None:
    """Time `ServerThread.stop()` with ``count`` stalled connections held, in this process
    (the client's sockets are its descriptors too: two per connection)."""
    from fault_server import ServerThread

    print(f"\nshutdown: ServerThread.stop() with {count} 'stall_headers' connections held")
    srv = ServerThread(max_hold=300)
    srv.start()
    held: list[socket.socket] = []
    try:
        host, port = srv.server._bound()[0], srv.port
        raw = http_request("/fault/stall_headers;hold=300/v1/models")
        held = open_stalls(host, port, count, raw, budget)
        settled = wait_for(lambda: srv.stats().requests >= len(held), budget)
        if settled is None:
            print(f"  not all {len(held)} requests read within {budget:g} s")
        start = time.monotonic()
        srv.stop()
        print(f"  held {srv.stats().requests}; stop() took {time.monotonic() - start:.2f} s")
    finally:
        srv.stop()
        for sock in held:
            sock.close()


def compare_with_raw(seconds: float, connects: int) -> None:
    """The closed loop and the connect burst on the fault server and a raw asyncio one."""
    raw = http_request("/v1/chat/completions", BODY)
    print(f"\nclosed loop (1 connection, {seconds:g} s) and a burst of {connects} connects")
    print(f"{'server':<24} {'req/s':>8} {'CPU us/req':>11} {'connects >= 1 s':>16}")
    results = {}
    with server_process(max_hold=30) as (host, port, pid):
        size = len(asyncio.run(answer_of(host, port, raw)))
        results["fault_server"] = (
            *closed_loop(host, port, pid, raw, seconds),
            burst(host, port, connects),
        )
    with server_process(max_hold=30, raw_size=size) as (host, port, pid):
        results["raw asyncio server"] = (
            *closed_loop(host, port, pid, raw, seconds),
            burst(host, port, connects),
        )
    for name, (rate, cpu, (slow, done)) in results.items():
        print(f"{name:<24} {rate:>8.0f} {cpu:>11.0f} {slow:>9} of {done}")
    ratio = results["fault_server"][0] / results["raw asyncio server"][0]
    print(f"fault_server / raw: {ratio:.2f}x the requests/s")


async def answer_of(host: str, port: int, raw: bytes) -> bytes:
    """The body of the fault server's answer to ``raw``."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(raw)
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        return await reader.readexactly(length)
    finally:
        writer.close()


if __name__ == "__main__":
    raise SystemExit(main())
