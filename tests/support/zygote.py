"""Worker processes that start in milliseconds: forked from a process that has already
imported stallproof (a *zygote*), instead of a new interpreter importing openai's types
again (a second or more of CPU each, several on a busy machine).

`spawn` returns a `Forked`, which answers like a `subprocess.Popen` in text mode:
``pid``, ``stdin``/``stdout``/``stderr``, ``poll``, ``wait``, ``communicate``,
``send_signal``/``terminate``/``kill``, ``returncode``. The child is the zygote's, not
ours: the zygote reports each exit status over a socket. The script runs as
``python SCRIPT ARGS`` would (``__main__``, ``sys.argv``, the interpreter's own exit, its
atexit handlers and traceback), in the zygote's working directory and environment, which
are this process's at the first `spawn`.

One zygote per test process, started on first use and stopped at exit; if this process
dies, the zygote sees its socket close, kills its children and exits. Every wait is
bounded. Run as a script, this file *is* the zygote (it imports only the modules named on
its command line, then serves).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO

#: What the workers of tests/support import: the zygote imports it once, before forking.
PRELOAD = ("stallproof", "stallproof.openai", "anyio", "trio", "asyncio", "json")


class Forked:
    """A process forked by the zygote, with `subprocess.Popen`'s answers (text mode)."""

    def __init__(self, zygote: Zygote, args: list[str], pid: int, fds: tuple[int, int, int]):
        self.args = args
        self.pid = pid
        self.returncode: int | None = None
        self._zygote = zygote
        self.stdin: IO[str] | None = open(fds[0], "w", encoding="utf-8")  # noqa: SIM115
        self.stdout: IO[str] | None = open(fds[1], encoding="utf-8")  # noqa: SIM115
        self.stderr: IO[str] | None = open(fds[2], encoding="utf-8")  # noqa: SIM115
        self._output: dict[int, list[bytes]] = {fds[1]: [], fds[2]: []}

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._zygote.status(self.pid, 0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            code = self._zygote.status(self.pid, 3600.0 if timeout is None else timeout)
            if code is None:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            self.returncode = code
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # (once it has exited, its pid may be another's)
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def readline(self, timeout: float) -> str:
        """The next line of stdout, within ``timeout`` s: "" at its end or when the time
        is up. Reads the descriptor itself, so lines that came together are never left in
        a buffer that ``select`` cannot see (`communicate` goes on from here)."""
        assert self.stdout is not None
        fd = self.stdout.fileno()
        pending = self._output[fd]
        limit = time.monotonic() + timeout
        while b"\n" not in (data := b"".join(pending)):
            left = limit - time.monotonic()
            ready, _, _ = select.select([fd], [], [], max(0.0, left))
            if not ready:
                return ""
            chunk = os.read(fd, 65536)
            if not chunk:
                return ""
            pending.append(chunk)
        line, _, rest = data.partition(b"\n")
        pending[:] = [rest] if rest else []
        return line.decode("utf-8", "replace") + "\n"

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Close stdin, read stdout and stderr to their end, wait for the exit; as
        `Popen.communicate` (after `readline`, the rest of stdout; what a ``readline`` of
        ``stdout`` itself buffered is not seen again)."""
        limit = time.monotonic() + (3600.0 if timeout is None else timeout)
        if self.stdin is not None and not self.stdin.closed:
            with contextlib.suppress(BrokenPipeError):  # (it has exited already)
                self.stdin.close()
        with selectors.DefaultSelector() as selector:
            for stream in (self.stdout, self.stderr):
                if stream is not None and not stream.closed:
                    selector.register(stream.fileno(), selectors.EVENT_READ)
            while selector.get_map():
                left = limit - time.monotonic()
                if left <= 0:
                    raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
                for key, _ in selector.select(left):
                    chunk = os.read(key.fd, 65536)
                    if chunk:
                        self._output[key.fd].append(chunk)
                    else:
                        selector.unregister(key.fd)
        self.wait(max(0.0, limit - time.monotonic()))
        out, err = (b"".join(chunks).decode("utf-8", "replace") for chunks in self._output.values())
        for stream in (self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        return out, err


class Zygote:
    """The parent's end: spawn requests on one socket, exit statuses read by a thread."""

    def __init__(self, preload: tuple[str, ...] = PRELOAD, timeout: float = 120.0) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock = ours
        self._proc = subprocess.Popen(
            [sys.executable, __file__, str(theirs.fileno()), *preload],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        self._statuses: dict[int, int] = {}
        self._changed = threading.Condition()
        self._lock = threading.Lock()  # one request and its answer at a time
        self._reader = _LineReader(ours)
        ours.settimeout(timeout)
        if self._reader.line() != "ready":
            self.close()
            raise RuntimeError("the zygote did not start")
        ours.settimeout(None)
        threading.Thread(target=self._statuses_in, name="zygote-exits", daemon=True).start()

    def spawn(self, args: list[str], timeout: float = 30.0) -> Forked:
        """Fork ``python ARGS`` (``args[0]``: a script path) from the zygote."""
        child_in, stdin = os.pipe()
        stdout, child_out = os.pipe()
        stderr, child_err = os.pipe()
        try:
            with self._lock:
                self._answer = threading.Event()
                request = json.dumps(args).encode() + b"\n"
                socket.send_fds(self._sock, [request], [child_in, child_out, child_err])
                if not self._answer.wait(timeout):
                    raise RuntimeError(f"the zygote did not fork within {timeout}s")
                pid = self._pid
        finally:
            for fd in (child_in, child_out, child_err):
                os.close(fd)
        return Forked(self, args, pid, (stdin, stdout, stderr))

    def status(self, pid: int, timeout: float) -> int | None:
        """The exit status of ``pid`` (negative: the signal that ended it), or None if it
        has not exited within ``timeout``."""
        with self._changed:
            self._changed.wait_for(lambda: pid in self._statuses, timeout)
            return self._statuses.get(pid)

    def close(self) -> None:
        """Stop the zygote: it kills whatever it forked that still runs."""
        # (shutdown, not just close: the reader thread's recv holds the socket open.)
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(timeout=10)

    def _statuses_in(self) -> None:
        while True:
            try:
                line = self._reader.line()
            except OSError:
                return
            if not line:
                return
            kind, pid, *rest = line.split()
            if kind == "pid":
                self._pid = int(pid)
                self._answer.set()
            else:
                with self._changed:
                    self._statuses[int(pid)] = int(rest[0])
                    self._changed.notify_all()


class _LineReader:
    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buffer = b""

    def line(self) -> str:
        while b"\n" not in self._buffer:
            chunk = self._sock.recv(4096)
            if not chunk:
                return ""
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()


_zygote: Zygote | None = None
_zygote_lock = threading.Lock()


def spawn(args: list[str]) -> Forked:
    """Fork ``python ARGS`` from this process's zygote (started on first use)."""
    global _zygote
    with _zygote_lock:
        if _zygote is None:
            _zygote = Zygote()
            atexit.register(_zygote.close)
        zygote = _zygote
    return zygote.spawn(args)


# -- the zygote itself -------------------------------------------------------------------


def _serve(sock: socket.socket) -> list[str] | None:
    """Fork on each request; report each child's exit. Returns in a child only: its args."""
    children: set[int] = set()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    sock.sendall(b"ready\n")
    while True:
        for key, _ in selector.select():
            if key.fileobj == wake_r:
                os.read(wake_r, 4096)
                continue
            message, fds, _, _ = socket.recv_fds(sock, 65536, 3)
            if not message:  # the parent is gone: so are its workers (reaped, not zombies)
                for pid in children:
                    with contextlib.suppress(ProcessLookupError, ChildProcessError):
                        os.kill(pid, signal.SIGKILL)
                        os.waitpid(pid, 0)
                return None
            pid = os.fork()
            if pid == 0:
                selector.close()
                sock.close()
                for fd in (wake_r, wake_w):
                    os.close(fd)
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for target, fd in enumerate(fds):
                    os.dup2(fd, target)
                    os.close(fd)
                args: list[str] = json.loads(message)
                return args
            children.add(pid)
            for fd in fds:
                os.close(fd)
            sock.sendall(f"pid {pid}\n".encode())
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            children.discard(pid)
            sock.sendall(f"exit {pid} {os.waitstatus_to_exitcode(status)}\n".encode())


def _main() -> None:
    import importlib
    import runpy

    sock = socket.socket(fileno=int(sys.argv[1]))
    for name in sys.argv[2:]:
        importlib.import_module(name)
    args = _serve(sock)
    if args is None:
        return
    sys.argv = list(args)
    sys.path[0] = os.path.dirname(os.path.abspath(args[0]))
    runpy.run_path(args[0], run_name="__main__")


if __name__ == "__main__":
    _main()
