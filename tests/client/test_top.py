"""``stallproof top``: every call in flight across the fleet, from tables worker processes
publish through a real Redis (`publish_inflight`) or serve on a local socket
(`serve_inflight`).

The workers are real processes (tests/support/inflight_worker.py) whose calls meet the
fault server: ``half_open`` (accepted, never answered: stuck before headers) and
``token_rate`` (a slow, healthy stream). ``top`` runs as ``python -m stallproof``.
"""

from __future__ import annotations

import contextlib
import json
import os
import pty
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from stallproof._local_socket import socket_dir

from ..support.fleet import RedisServer, free_port, silent_listener
from ..support.observe import read_fleet, run_cli, start_calls, stop, wait_for_fleet
from ..support.timing import MARGIN

# Worker processes and a real redis-server: seconds each, so out of `make test-quick`.
pytestmark = pytest.mark.slow

STUCK = "half_open"
# A token every 0.1 s (for 60 s): with the MARGIN a loaded runner honours, a gap stays well
# under STALLED_AFTER, so the streams are never stalled while the stuck calls are.
SLOW = "token_rate;tps=10;tokens=600"
STALLED_AFTER = 0.5
TTL = 1.5
INTERVAL = 0.2


def _job(fault_server: Any, redis: RedisServer | None, prefix: str, **kw: Any) -> dict[str, Any]:
    return {
        "base_url": fault_server.url(),
        "redis_url": redis.url if redis is not None else None,
        "prefix": prefix,
        "stuck": 5,
        "stuck_fault": STUCK,
        "slow": 2,
        "slow_fault": SLOW,
        "interval": INTERVAL,
        "ttl": TTL,
        "stalled_after": STALLED_AFTER,
        "total": 40.0,
        **kw,
    }


def _settled(snap: Any, pids: set[int], stalled: int, calls: int) -> bool:
    rows = [c for c in snap.calls if c.pid in pids]
    return len(rows) == calls and sum(c.stalled for c in rows) == stalled


@pytest.mark.parametrize("mode", ["asyncio", "trio", "sync"])
def test_top_lists_every_call_of_two_workers(
    fault_server: Any,
    redis_server: RedisServer,
    redis_prefix: str,
    inflight_workers: Any,
    mode: str,
) -> None:
    """Two workers sharing a Redis, each with 5 calls stuck before headers and 2 slow
    healthy streams: ``top --once --json`` lists all 14, the 10 stuck ones stalled and
    first, the streams progressing; ``--once`` draws the same with its summary line."""
    job = _job(fault_server, redis_server, redis_prefix, mode=mode)
    procs = start_calls(inflight_workers, job, job)
    pids = {p.pid for p in procs}
    wait_for_fleet(redis_server.url, redis_prefix, lambda s: _settled(s, pids, 10, 14))

    done = run_cli("top", "--redis", redis_server.url, "--prefix", redis_prefix, "--once", "--json")
    assert done.returncode == 0, done.stderr
    snap = json.loads(done.stdout)
    calls = snap["calls"]
    assert len(calls) == 14 and snap["calls_in_flight"] == 14
    assert {c["pid"] for c in calls} == pids
    assert sorted(p["pid"] for p in snap["processes"]) == sorted(pids)
    for call in calls:
        for key in ("host", "pid", "request_id", "agent", "model", "phase"):
            assert call[key], key
        for key in ("since_progress_s", "left_s", "time_in_phase_s"):
            assert isinstance(call[key], float), key
    stuck = [c for c in calls if c["agent"].startswith("stuck-")]
    slow = [c for c in calls if c["agent"].startswith("slow-")]
    assert len(stuck) == 10 and len(slow) == 4
    assert all(c["phase"] == "awaiting headers" and c["stalled"] for c in stuck)
    assert all(c["since_progress_s"] >= STALLED_AFTER and c["left_s"] > 0 for c in stuck)
    assert all(c["phase"] == "streaming" and not c["stalled"] for c in slow)
    assert all(c["content_chunks"] > 0 for c in slow)
    assert [c["stalled"] for c in calls] == [True] * 10 + [False] * 4  # attention first
    assert snap["stalled"] == 10
    assert snap["by_phase"] == {"awaiting headers": 10, "streaming": 4}

    drawn = run_cli("top", "--redis", redis_server.url, "--prefix", redis_prefix, "--once")
    assert drawn.returncode == 0, drawn.stderr
    lines = drawn.stdout.splitlines()
    assert "2 processes" in lines[0]
    assert lines[1] == "14 calls in flight (10 stalled) | awaiting headers 10, streaming 4"
    assert lines[2].split()[:2] == ["process", "request_id"]
    assert all(line.endswith("STALLED") for line in lines[3:13])
    assert all(line.endswith("ok") for line in lines[13:17])

    # A worker that stops cleanly takes its table away at once.
    for proc in procs:
        stop(proc)
    snap_after = read_fleet(redis_server.url, redis_prefix)
    assert [c for c in snap_after.calls if c.pid in pids] == []


def test_a_dead_workers_calls_leave_within_the_ttl(
    fault_server: Any, redis_server: RedisServer, redis_prefix: str, inflight_workers: Any
) -> None:
    """A worker killed (SIGKILL: no goodbye) leaves ``top`` within its ttl, measured from
    the kill, and not before its last table expires; the other worker stays."""
    job = _job(fault_server, redis_server, redis_prefix, stuck=2, slow=1)
    dead, alive = start_calls(inflight_workers, job, job)
    pids = {dead.pid, alive.pid}
    wait_for_fleet(redis_server.url, redis_prefix, lambda s: _settled(s, pids, 4, 6))
    dead.kill()
    killed = time.monotonic()
    gone = wait_for_fleet(
        redis_server.url,
        redis_prefix,
        lambda s: dead.pid not in {c.pid for c in s.calls},
        within=TTL + 10,
    )
    elapsed = time.monotonic() - killed
    assert elapsed <= TTL + MARGIN
    # Its last table was written at most one interval before the kill: it lived on.
    assert elapsed >= TTL - INTERVAL - MARGIN
    assert [c.pid for c in gone.calls] == [alive.pid] * 3
    dead.wait(timeout=10)


def test_top_reads_one_process_through_its_socket(
    fault_server: Any, inflight_workers: Any, tmp_path: Any
) -> None:
    """Without Redis: a worker serving its table on the default socket
    (``serve_inflight()``) is found by ``top`` with no argument and with ``--pid``; a
    socket at a path of its own with ``--socket``. The socket goes away with the worker."""
    path = str(tmp_path / "w.sock")
    found = _job(fault_server, None, "-", stuck=2, slow=1)
    named = _job(fault_server, None, "-", stuck=1, slow=0, socket=path)
    a, b = start_calls(inflight_workers, found, named)
    default = os.path.join(socket_dir(), f"{a.pid}.sock")
    assert os.path.exists(default) and os.path.exists(path)
    # Past stalled_after for the stuck calls, which started before start_calls returned.
    time.sleep(STALLED_AFTER + 0.2)

    for args in ((), ("--pid", str(a.pid))):
        done = run_cli("top", "--once", "--json", *args)
        assert done.returncode == 0, done.stderr
        rows = [c for c in json.loads(done.stdout)["calls"] if c["pid"] == a.pid]
        assert sorted((c["phase"], c["stalled"]) for c in rows) == [
            ("awaiting headers", True),
            ("awaiting headers", True),
            ("streaming", False),
        ]
    done = run_cli("top", "--once", "--json", "--socket", path, process=True)  # the entry point
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)["calls"]
    assert (row["pid"], row["phase"], row["stalled"]) == (b.pid, "awaiting headers", True)

    stop(a)
    stop(b)
    assert not os.path.exists(default) and not os.path.exists(path)


def test_live_top_redraws_every_interval_and_quits_on_ctrl_c(
    fault_server: Any, redis_server: RedisServer, redis_prefix: str, inflight_workers: Any
) -> None:
    """On a terminal, ``top`` clears and redraws every ``--interval``; Ctrl-C (SIGINT)
    ends it at once with status 0 and no traceback."""
    (worker,) = start_calls(inflight_workers, _job(fault_server, redis_server, redis_prefix))
    wait_for_fleet(redis_server.url, redis_prefix, lambda s: len(s.calls) == 7)
    master, slave = pty.openpty()
    # Started as a terminal's shell starts it, with SIGINT not ignored: a background job's
    # children (CI's, when it runs the suite as one) inherit SIGINT ignored, and top would
    # rightly keep ignoring it. A caught signal is reset to its default by exec.
    ignored = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "stallproof", "top", "--redis", redis_server.url),
                *("--prefix", redis_prefix, "--interval", "0.2", "--op-timeout", "1"),
            ],
            stdout=slave,
            stderr=subprocess.PIPE,
            text=True,
            # A hang on the way out shows where it is: SIGABRT makes faulthandler dump it.
            env={**os.environ, "PYTHONFAULTHANDLER": "1"},
        )
    finally:
        signal.signal(signal.SIGINT, ignored)
    os.close(slave)
    out = b""
    drain: threading.Thread | None = None
    try:
        limit = time.monotonic() + 30
        while out.count(b"\x1b[H\x1b[2J") < 4 and time.monotonic() < limit:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                out += os.read(master, 65536)
        first = out.index(b"\x1b[H\x1b[2J")
        frames = out.count(b"\x1b[H\x1b[2J")
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        # A terminal goes on reading after Ctrl-C: so does this one. (Unread, the pty's
        # buffer fills and top blocks in a write of its next frame, where no signal can
        # end it: that was this test's hang, not top's.)
        drain = threading.Thread(target=_drain, args=(master,), daemon=True)
        drain.start()
        try:
            _, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            with open(f"/proc/{proc.pid}/status") as f:
                status = [line for line in f if line.startswith(("SigBlk", "SigIgn"))]
            proc.send_signal(signal.SIGABRT)
            _, err = proc.communicate(timeout=10)
            raise AssertionError(
                f"top did not quit on SIGINT within 10 s: {status}\n{err}"
            ) from None
        quit_after = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        if drain is not None:
            drain.join(timeout=10)  # it ends at the pty's end (EIO once top has exited)
        os.close(master)
    assert frames >= 4 and first == 0
    assert b"7 calls in flight" in out
    assert proc.returncode == 0
    assert "Traceback" not in err
    # Closing its Redis connection is bounded by --op-timeout; the rest is a Python
    # process ending, which a loaded 2-core machine can hold up for a second or two.
    assert quit_after < 1.0 + 3.0
    stop(worker)


def _drain(master: int) -> None:
    """Read a pty's output until its end, as a terminal does."""
    with contextlib.suppress(OSError):
        while os.read(master, 65536):
            pass


def test_top_says_what_it_cannot_read_and_exits_2(tmp_path: Any) -> None:
    """A Redis that refuses, one that never answers, a socket that is not there, a bad
    URL: one line on stderr, status 2, within the bound."""
    with silent_listener() as stalled:
        cases = [
            (("--redis", f"redis://127.0.0.1:{free_port()}/0"), "cannot read the fleet's calls"),
            (("--redis", stalled, "--op-timeout", "1"), "did not answer"),
            (("--socket", str(tmp_path / "none.sock")), "no socket answered"),
            (("--redis", "http://127.0.0.1:1"), "RedisState.url must be"),
            (("--redis", "redis://127.0.0.1:1/0", "--pid", "1"), "not both"),
        ]
        for args, message in cases:
            started = time.monotonic()
            done = run_cli("top", "--once", *args, timeout=30)
            assert done.returncode == 2, (args, done.stdout, done.stderr)
            assert message in done.stderr, (args, done.stderr)
            assert "Traceback" not in done.stderr
            assert len(done.stderr.strip().splitlines()) == 1
            assert time.monotonic() - started < 15
