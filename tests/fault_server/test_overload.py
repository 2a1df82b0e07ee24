"""The fault server under overload: out of descriptors, at its connection cap, with nobody
reading its stderr, and stopping while it holds thousands of connections.

The out-of-descriptors and stderr tests run the CLI in a process of its own, with a lowered
RLIMIT_NOFILE or a stderr pipe that is already full; every wait is bounded.
"""

from __future__ import annotations

import fcntl
import os
import resource
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fault_server import ServerThread, running

from ..support.wire import address, cli_server, http_request, raw_exchange

_F_SETPIPE_SZ = 1031  # Linux fcntl: set a pipe's capacity.
KEEP = {"Connection": "keep-alive"}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def limit_descriptors() -> None:  # runs in the child, before exec.
    resource.setrlimit(resource.RLIMIT_NOFILE, (300, 300))


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads /proc")
def test_out_of_descriptors_the_server_idles_logs_once_and_recovers(tmp_path: Path) -> None:
    err = tmp_path / "stderr"
    with (
        open(err, "wb") as stderr,
        cli_server("--max-hold", "10", stderr=stderr, preexec_fn=limit_descriptors) as (
            base_url,
            proc,
        ),
    ):
        held = [socket.create_connection(address(base_url), timeout=5) for _ in range(400)]
        try:
            time.sleep(0.5)  # the server has run out by now
            before = cpu_seconds(proc.pid)
            time.sleep(2.0)
            busy = cpu_seconds(proc.pid) - before
            during = err.read_text(encoding="utf-8", errors="replace")
        finally:
            for sock in held:
                sock.close()
        # afterwards it serves again, within a second or so (its retry is at most 0.5 s).
        start = time.monotonic()
        answer = raw_exchange(base_url, http_request("GET", "/v1/models"), seconds=5)
        recovered = time.monotonic() - start
    text = Path(err).read_text(encoding="utf-8", errors="replace")
    assert busy < 0.5, f"the server burned {busy:.2f} s of CPU in 2 s out of descriptors"
    assert "Traceback" not in text, text[:2000]
    # One warning for the shortage. Closing the 400 frees descriptors in a rush that can run
    # the server out again and again for a moment: those short episodes are not warned anew.
    assert during.count("out of file descriptors") == 1, during[:2000]
    assert text.count("out of file descriptors") == 1, text[:2000]
    assert len(text.splitlines()) <= 3, text[:2000]
    assert answer.status == 200, answer
    assert recovered < 2.0


@pytest.fixture
def capped() -> Iterator[ServerThread]:
    with running(max_hold=10, max_connections=3) as srv:
        yield srv


def test_past_max_connections_new_clients_wait_until_one_closes(capped: ServerThread) -> None:
    held = [socket.create_connection(address(capped.base_url), timeout=5) for _ in range(3)]
    try:
        deadline = time.monotonic() + 3
        while capped.stats().connections_open < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        waiting = socket.create_connection(address(capped.base_url), timeout=5)  # the backlog
        with waiting:
            waiting.sendall(http_request("GET", "/v1/models"))
            waiting.settimeout(0.5)
            with pytest.raises(TimeoutError):
                waiting.recv(1)  # not served while three are open
            assert capped.stats().connections_open == 3
            held.pop().close()
            waiting.settimeout(3)
            start = time.monotonic()
            assert waiting.recv(12) == b"HTTP/1.1 200"
            assert time.monotonic() - start < 1.0
    finally:
        for sock in held:
            sock.close()


def test_max_connections_is_validated() -> None:
    with pytest.raises(ValueError, match="max_connections"):
        running(max_connections=0).__enter__()


def full_pipe() -> tuple[int, int]:
    """A pipe whose buffer is already full: a blocking write to it would never return."""
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, _F_SETPIPE_SZ, 4096)
    os.set_blocking(write_end, False)
    try:
        while True:
            os.write(write_end, b"x" * 4096)
    except BlockingIOError:
        pass
    os.set_blocking(write_end, True)
    return read_end, write_end


@pytest.mark.slow
def test_a_full_stderr_pipe_never_stops_the_server() -> None:
    read_end, write_end = full_pipe()
    try:
        with cli_server("--max-hold", "5", stderr=write_end) as (base_url, proc):
            for _ in range(3):
                answer = raw_exchange(base_url, http_request("GET", "/v1/models"), seconds=5)
                assert answer.status == 200, answer
            start = time.monotonic()
            proc.terminate()
            proc.wait(5)
            assert time.monotonic() - start < 3.0
    finally:
        os.close(read_end)
        os.close(write_end)


@pytest.mark.slow
def test_stopping_with_2000_stalled_faults_is_quick() -> None:
    """2,000 connections each in a stalled fault (a connection task and a peer watcher
    each): stop() ends them all at once, not after their hold (300 s). The bound is what no
    machine misses unless stop() waits for the faults; it does not depend on the count, and
    2,000 cost the suite 0.7 s of CPU where 8,000 cost 4.5 s. How long stop() takes with the
    8,000 the documentation names (0.7 s on an idle 2-core machine; 1.9 s while the GC
    was not paused): benchmarks/fault_server_bench.py, its shutdown phase."""
    count = 2000
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if min(hard, 2 * count + 200) > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 2 * count + 200), hard))
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < 2 * count + 100:
        pytest.skip("needs 16,100 file descriptors")
    # Held longer than any machine takes to open them all (a loaded runner took over 30 s,
    # and the first ones' holds ended before the last were open).
    srv = ServerThread(max_hold=300)
    srv.start()
    held: list[socket.socket] = []
    try:
        stall = http_request("GET", "/fault/stall_headers;hold=300/v1/models", b"", KEEP)
        for _ in range(count):
            held.append(socket.create_connection(address(srv.base_url), timeout=5))
            held[-1].sendall(stall)
        deadline = time.monotonic() + 60
        while srv.stats().requests < count and time.monotonic() < deadline:
            time.sleep(0.05)
        assert srv.stats().requests == srv.stats().connections_open == count
        start = time.monotonic()
        srv.stop()
        elapsed = time.monotonic() - start
    finally:
        for sock in held:
            sock.close()
    assert elapsed < 5.0, f"stop() took {elapsed:.2f} s with {count} connections"
