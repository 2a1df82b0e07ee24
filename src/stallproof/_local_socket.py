"""One process's calls in flight through a local Unix socket, for ``stallproof top``
without Redis: `serve_inflight` (the process's side) and `read_socket` (top's).

A process opts in with ``stallproof.serve_inflight()``. A daemon thread listens on a Unix
socket and answers each connection with the process's table (`table_json`), then closes
it; nothing is read from the peer. By default the socket is
``<tempdir>/stallproof-<uid>/<pid>.sock`` (the directory is the user's own, mode 0700,
and the socket mode 0600): ``stallproof top`` with neither ``--redis`` nor ``--socket``
reads every socket in that directory, ``--pid PID`` one of them.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import tempfile
import threading
import time

from . import _exceptions as exc
from ._registry import BackgroundView, ProcessTable, table_json
from ._validate import seconds

__all__ = ["InflightServer", "find_sockets", "read_socket", "serve_inflight", "socket_dir"]

# The most bytes a table read from a socket may have (MAX_ROWS calls fit many times over).
_MAX_TABLE_BYTES = 16 * 1024 * 1024
# How long the thread waits for a slow reader before dropping it.
_SEND_TIMEOUT = 1.0


def socket_dir() -> str:
    """Where processes of this user put their sockets by default."""
    return os.path.join(tempfile.gettempdir(), f"stallproof-{_uid()}")


def find_sockets() -> list[str]:
    """The sockets in `socket_dir`, oldest process id first (none if it does not exist)."""
    try:
        names = os.listdir(socket_dir())
    except OSError:
        return []
    pids = sorted(int(n[:-5]) for n in names if n.endswith(".sock") and n[:-5].isdigit())
    return [os.path.join(socket_dir(), f"{pid}.sock") for pid in pids]


class InflightServer(BackgroundView):
    """Answers each connection to a Unix socket with this process's calls in flight.

    Made and started by `stallproof.serve_inflight`; see there.
    """

    def __init__(self, path: str | None = None, *, stalled_after: float = 5.0) -> None:
        if not hasattr(socket, "AF_UNIX"):
            raise exc.InvalidRequestError("this platform has no Unix sockets")
        if path is not None and not isinstance(path, str):
            raise exc.InvalidRequestError(f"path must be a str or None, got {path!r}")
        self.stalled_after = seconds("stalled_after", stalled_after, allow_zero=True)
        self.path = path if path is not None else _default_path()
        self._stop = threading.Event()
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"InflightServer({self.path!r})"

    def start(self) -> InflightServer:
        """Listen and answer in a daemon thread (idempotent)."""
        if self._stop.is_set():
            raise exc.InvalidRequestError("this server is closed: make a new one")
        if self._thread is not None:
            return self
        _clear_stale(self.path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(self.path)
            os.chmod(self.path, 0o600)
            listener.listen(16)
            listener.settimeout(0.2)  # how often the thread looks at its stop flag
        except OSError as e:
            listener.close()
            raise exc.InvalidRequestError(f"cannot listen on {self.path!r}: {e}") from None
        self._listener = listener
        self._thread = threading.Thread(
            target=self._serve, name="stallproof-serve-inflight", daemon=True
        )
        self._thread.start()
        return self

    def close(self, timeout: float = 5.0) -> None:
        """Stop answering and remove the socket file; waits at most ``timeout`` seconds
        for the thread. Idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
            with contextlib.suppress(OSError):
                os.unlink(self.path)

    def _serve(self) -> None:
        listener = self._listener
        assert listener is not None
        while not self._stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed under us
            with conn:
                conn.settimeout(_SEND_TIMEOUT)
                with contextlib.suppress(OSError):
                    conn.sendall(table_json(stalled_after=self.stalled_after))


def serve_inflight(path: str | None = None, *, stalled_after: float = 5.0) -> InflightServer:
    """Answer ``stallproof top`` through a local Unix socket, without Redis.

    A daemon thread listens on ``path`` and answers each connection with
    `stallproof.inflight()` — every client, face and transport of this process — as JSON.
    It reads nothing from its peer; each answer waits at most 1 s for a slow reader.

    Args:
        path: the socket's path. Default ``<tempdir>/stallproof-<uid>/<pid>.sock``, where
            ``stallproof top`` looks (``--pid PID`` for one process; ``--socket PATH``
            for another path). The socket file is mode 0600.
        stalled_after: as for `stallproof.inflight` (default 5).

    Returns:
        The running `InflightServer`; ``close()`` stops it and removes the socket file
        (also as a context manager).

    Raises:
        InvalidRequestError: the path cannot be listened on (or a live process already
            serves it), or the platform has no Unix sockets.
    """
    return InflightServer(path, stalled_after=stalled_after).start()


def read_socket(path: str, *, timeout: float = 2.0) -> ProcessTable:
    """Read one process's table from its socket, within ``timeout`` seconds in all.

    Raises:
        OSError: nothing answers there (no such socket, refused, timed out).
        ValueError: what came back is not a table (or is larger than 16 MiB).
    """
    limit = time.monotonic() + timeout
    chunks: list[bytes] = []
    size = 0
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(path)
        while True:
            left = limit - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{path}: no whole answer within {timeout:g}s")
            s.settimeout(left)
            chunk = s.recv(65536)
            if not chunk:
                break
            size += len(chunk)
            if size > _MAX_TABLE_BYTES:
                raise ValueError(f"{path}: answer larger than {_MAX_TABLE_BYTES} bytes")
            chunks.append(chunk)
    return ProcessTable.from_json(b"".join(chunks))


def _uid() -> int:
    getuid = getattr(os, "getuid", None)
    return int(getuid()) if getuid is not None else 0


def _default_path() -> str:
    directory = socket_dir()
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise exc.InvalidRequestError(f"cannot create {directory!r}: {e}") from None
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != _uid():
        raise exc.InvalidRequestError(
            f"{directory!r} is not a directory of this user: pass path= to serve_inflight"
        )
    return os.path.join(directory, f"{os.getpid()}.sock")


def _clear_stale(path: str) -> None:
    """Remove a socket file nothing listens on any more (a dead process's); refuse to
    take over one that is live, or a file that is not a socket."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise exc.InvalidRequestError(f"{path!r} exists and is not a socket")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.5)
        try:
            probe.connect(path)
        except OSError:
            os.unlink(path)  # refused: a dead process's socket
            return
    raise exc.InvalidRequestError(f"{path!r} is already served by a live process")
