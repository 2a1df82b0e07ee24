"""For the ``stallproof top`` / ``diagnose`` tests: the command (in this process or as a
subprocess), the fleet's tables read in-process, workers with calls in flight."""

from __future__ import annotations

import asyncio
import contextlib
import io
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import pytest

import stallproof
from stallproof import _cli
from stallproof._top import Snapshot, Source, fetch

from .fleet import FleetWorkers
from .zygote import Forked


def run_cli(
    *args: str, timeout: float = 60.0, process: bool = False
) -> subprocess.CompletedProcess[str]:
    """``stallproof ARGS``, its status and output captured, failed after ``timeout``.

    In this process by default (`stallproof._cli.main` in a thread of its own, its output
    redirected): the command's code and bounds are the same, without the second or so of
    CPU a new interpreter spends importing openai. ``process=True`` runs
    ``python -m stallproof ARGS`` instead, for what only a process shows (signals, the
    entry point, the interpreter's exit).
    """
    argv = [sys.executable, "-m", "stallproof", *args]
    if process:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    out, err = io.StringIO(), io.StringIO()
    status: list[int] = []

    def command() -> None:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status.append(_cli.main(list(args)))
            except SystemExit as e:  # argparse's usage errors
                status.append(e.code if isinstance(e.code, int) else 1)
            except BaseException:  # what the interpreter would print, and its status
                traceback.print_exc()
                status.append(1)

    thread = threading.Thread(target=command, name="stallproof-cli", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise subprocess.TimeoutExpired(argv, timeout, out.getvalue(), err.getvalue())
    return subprocess.CompletedProcess(argv, status[0], out.getvalue(), err.getvalue())


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
) -> list[Forked]:
    """Start one worker per job, let them go, and wait until each has started its calls."""
    procs = workers.start(*jobs, timeout=timeout)
    workers.go(*procs)
    workers.expect("going", *procs, timeout=timeout)
    return procs


def stop(proc: Forked, timeout: float = 20.0) -> None:
    """Tell a worker to end its calls and exit; wait for it (bounded)."""
    assert proc.stdin is not None
    proc.stdin.write("stop\n")
    proc.stdin.flush()
    _, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-2000:]
