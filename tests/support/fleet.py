"""Fleet state for tests: a real redis-server subprocess, worker processes that call through it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import stallproof

from . import zygote
from .zygote import Forked

REDIS_BINARY = shutil.which("redis-server") or next(
    (p for p in ("/usr/bin/redis-server", "/usr/sbin/redis-server") if os.path.exists(p)), None
)


# op_timeout for tests against a healthy redis-server: long enough that a loaded machine
# never turns a slow answer into a fallback to local state (the default, 0.1 s, is for
# production, where falling back early is the point). Tests of Redis trouble set their own.
OP_TIMEOUT = 2.0


def healthy_state(url: str, prefix: str, **settings: Any) -> stallproof.RedisState:
    """A `stallproof.RedisState` for a healthy redis-server (`OP_TIMEOUT` unless given)."""
    settings.setdefault("op_timeout", OP_TIMEOUT)
    return stallproof.RedisState(url, prefix=prefix, **settings)


async def settled(client: Any) -> None:
    """Wait until the operations the client sent to Redis in the background (releases,
    outcomes) are answered, each store at most its ``op_timeout``: the seam tests use
    instead of sleeping for a guessed time."""
    await client._engine.stores.settle()


def free_port() -> int:
    """A loopback TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A real redis-server subprocess on a loopback port, without persistence.

    `kill` stops it the hard way (SIGKILL: what a crash looks like to clients); `start`
    brings it back on the same port, empty; `pause`/`resume` stall it and let it go on.
    Every wait is bounded.
    """

    def __init__(self, binary: str, port: int | None = None) -> None:
        self.binary = binary
        self.port = port or free_port()
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        self._proc = subprocess.Popen(
            [
                self.binary,
                *("--port", str(self.port), "--bind", "127.0.0.1"),
                *("--save", "", "--appendonly", "no", "--protected-mode", "no"),
                *("--loglevel", "warning"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        limit = time.monotonic() + timeout
        while time.monotonic() < limit:
            if self._proc.poll() is not None:
                raise RuntimeError(f"redis-server exited at start ({self._proc.returncode})")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as s,
            ):
                s.sendall(b"PING\r\n")
                if s.recv(64).startswith(b"+PONG"):
                    return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server did not answer PING within {timeout}s")

    def pause(self) -> None:
        """SIGSTOP: connections stay open and nothing answers (a stalled Redis)."""
        if self._proc is not None:
            self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self._proc is not None:
            self._proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait(timeout=10)
            self._proc = None

    def stop(self) -> None:
        if self._proc is not None:
            self.resume()  # a paused process does not act on SIGTERM
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=5)
            self._proc = None


def started_redis(port: int | None = None) -> RedisServer:
    if REDIS_BINARY is None:
        pytest.skip(
            "redis-server is not installed (apt-get install redis-server): the fleet tests"
            " need a real Redis"
        )
    server = RedisServer(REDIS_BINARY, port)
    try:
        server.start()
    except (OSError, RuntimeError) as e:
        pytest.skip(f"redis-server could not be started: {e}")
    return server


@contextmanager
def silent_listener() -> Iterator[str]:
    """``redis://`` URL of a socket that accepts connections (the kernel does) and never
    reads or answers: a stalled Redis, as a client sees one."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield f"redis://127.0.0.1:{s.getsockname()[1]}/0"


class FleetWorkers:
    """Worker processes (tests/support/fleet_worker.py) that make calls through shared state.

    Each gets a JSON job, prints ``ready`` once it has imported everything and built its
    client, makes its calls when told ``go`` (so phases do not depend on how long imports
    take on a busy machine), and prints one JSON line per finished call: its error class
    name (or null) and its elapsed seconds. Every wait is bounded.
    """

    def __init__(self, script: str = "fleet_worker.py") -> None:
        """``script``: the worker, a file of tests/support (inflight_worker.py for the
        ``stallproof top`` tests)."""
        self._script = os.path.join(os.path.dirname(__file__), script)
        self._procs: list[Forked] = []

    def start(self, *jobs: dict[str, Any], timeout: float = 60.0) -> list[Forked]:
        """Start one worker per job and wait until every one is ready."""
        script = self._script
        procs = [zygote.spawn([script, json.dumps(job)]) for job in jobs]
        self._procs += procs
        self.expect("ready", *procs, timeout=timeout)
        return procs

    @staticmethod
    def expect(word: str, *procs: Forked, timeout: float) -> None:
        """Wait (``timeout`` s in all) until each worker prints its next line: ``word``."""
        limit = time.monotonic() + timeout
        for proc in procs:
            line = proc.readline(max(0.0, limit - time.monotonic()))
            if line.strip() != word:
                raise AssertionError(f"worker did not print {word!r} within {timeout}s: {line!r}")

    @staticmethod
    def go(*procs: Forked) -> None:
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()

    def run(self, jobs: list[dict[str, Any]], *, timeout: float = 30.0) -> list[list[Any]]:
        """Start one worker per job, let them all go at once; each worker's results."""
        procs = self.start(*jobs)
        self.go(*procs)
        return [self.results(p, timeout=timeout) for p in procs]

    @staticmethod
    def lines(proc: Forked, n: int, *, timeout: float) -> list[Any]:
        """The worker's next ``n`` results, as its calls end (``timeout`` s in all), without
        waiting for it to exit: a phase that must end within some time is not charged for a
        process's shutdown (about 1 s on a loaded machine). The worker is reaped at the end
        of the test (`kill_all`)."""
        limit = time.monotonic() + timeout
        out: list[Any] = []
        while len(out) < n:
            line = proc.readline(max(0.0, limit - time.monotonic()))
            if not line:
                raise AssertionError(f"worker gave {len(out)} of {n} results within {timeout}s")
            if line.strip():
                out.append(json.loads(line))
        return out

    def results(self, proc: Forked, *, timeout: float) -> list[Any]:
        out, err = proc.communicate(timeout=timeout)
        if proc.returncode != 0:
            raise AssertionError(f"worker failed ({proc.returncode}): {err[-2000:]}")
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def kill_all(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.communicate(timeout=10)
