"""For the ``stallproof top`` / ``diagnose`` tests: the command as a subprocess, the fleet's
tables read in-process, workers with calls in flight."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

import stallproof
from stallproof._top import Snapshot, Source, fetch

from .fleet import FleetWorkers


def run_cli(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """``python -m stallproof ARGS``, its output captured; killed after ``timeout``."""
    return subprocess.run(
        [sys.executable, "-m", "stallproof", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def read_fleet(redis_url: str, prefix: str) -> Snapshot:
    """The fleet's published tables, read once in this process."""
    shared = stallproof.RedisState(redis_url, prefix=prefix, op_timeout=2.0)
    return asyncio.run(fetch(Source(redis=shared)))


def wait_for_fleet(
    redis_url: str, prefix: str, condition: Callable[[Snapshot], bool], *, within: float = 30.0
) -> Snapshot:
    """Read the fleet every 50 ms until ``condition`` holds (fail after ``within`` s)."""
    limit = time.monotonic() + within
    while True:
        snap = read_fleet(redis_url, prefix)
        if condition(snap):
            return snap
        if time.monotonic() > limit:
            calls = [(c.pid, c.phase, c.stalled) for c in snap.calls]
            pytest.fail(f"the fleet did not get there within {within}s: {calls}")
        time.sleep(0.05)


def start_calls(
    workers: FleetWorkers, *jobs: dict[str, Any], timeout: float = 60.0
) -> list[subprocess.Popen[str]]:
    """Start one worker per job, let them go, and wait until each has started its calls."""
    procs = workers.start(*jobs, timeout=timeout)
    workers.go(*procs)
    workers.expect("going", *procs, timeout=timeout)
    return procs


def stop(proc: subprocess.Popen[str], timeout: float = 20.0) -> None:
    """Tell a worker to end its calls and exit; wait for it (bounded)."""
    assert proc.stdin is not None
    proc.stdin.write("stop\n")
    proc.stdin.flush()
    _, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-2000:]
