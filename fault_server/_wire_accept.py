"""`Acceptor`: the server's accept loop, which stays calm when the machine runs dry.

It replaces `asyncio.start_server` for two reasons. When the process is out of file
descriptors (EMFILE, ENFILE) asyncio logs a traceback per failed ``accept()`` and retries at
once, which pegged a core and wrote megabytes of tracebacks a second. And a server holding
stalled connections on purpose needs a cap on how many it holds.

- **A cap**: at most ``max_connections`` are served at once. At the cap the acceptor stops
  calling ``accept()``, so new clients wait in the kernel's backlog (their ``connect()``
  succeeds; beyond the backlog their SYNs are dropped and they retry), and it resumes as
  soon as one connection ends.
- **Out of descriptors**: the acceptor logs one warning for the episode, waits (until a
  connection ends, or at most `_RETRY_MAX` seconds, doubling from `_RETRY_MIN`) and tries
  again; it logs one line more (at INFO) when it accepts again. No traceback, no busy loop.
  While many connections close at once, the acceptor can run out, accept one, and run out
  again many times a second: an episode that starts within `_QUIET` seconds of the last
  warning is logged at DEBUG only, so one shortage is one warning.

- **Bursts**: at each wake-up it accepts every connection the kernel has queued (up to
  `_BATCH`), as asyncio's own server does, and starts them `_FAIR` at a time, accepting
  again between: a burst of 8,000 connects fills a 4,096-deep queue faster than one accept
  per pass of the loop empties it (or than the connections start), and each connect the
  queue cannot hold waits a second for its SYN to be sent again.

It has the `close()`/`wait_closed()` surface of `asyncio.Server`.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import logging
import socket
import time
from collections.abc import Awaitable, Callable

import anyio

__all__ = ["Acceptor"]

logger = logging.getLogger("fault_server")

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]

_EXHAUSTED = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
_RETRY_MIN = 0.01
_RETRY_MAX = 0.5  # bounds how long an accept waits after descriptors are freed elsewhere.
# Accepts in a row, at one wake-up, before the acceptor lets the connections run: the whole
# kernel backlog, as asyncio's own server takes. One per pass of the loop was too slow for
# a burst of thousands of connects: the queue overflowed, and their SYNs were retransmitted
# a second later.
_BATCH = 4096
_FAIR = 64  # accepted connections started per pass of the loop, between two drains.
_QUIET = 30.0  # seconds after a warning in which a new shortage is not warned about again.


class Acceptor:
    """Accepts connections on ``sock`` (bound and listening) and runs ``handler`` on each.

    Args:
        sock: the listening socket; the acceptor owns it from now on.
        handler: called with the streams of each connection, in a task of its own.
        max_connections: most handlers running at once.
    """

    def __init__(self, sock: socket.socket, handler: Handler, max_connections: int) -> None:
        self._sock = sock
        self.port = int(sock.getsockname()[1])
        self._handler = handler
        self._max = max_connections
        self._open = 0
        self._room = asyncio.Event()  # set whenever a connection ends.
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._waiting: asyncio.AbstractEventLoop | None = None  # has a reader registered.
        self._pending: collections.deque[socket.socket] = collections.deque()  # not started.
        self.refused = 0  # accept() calls that failed for want of descriptors.

    @property
    def open(self) -> int:
        """Connections whose handler is running."""
        return self._open

    def start(self) -> None:
        self._sock.setblocking(False)
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._run(), name="fault_server.accept")

    def close(self) -> None:
        """Stop accepting and close the listening socket; running handlers go on."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
        if self._waiting is not None:  # before the descriptor's number can be reused.
            self._waiting.remove_reader(self._sock.fileno())
            self._waiting = None
        self._sock.close()
        while self._pending:  # accepted, never served.
            self._pending.popleft().close()
            self._open -= 1

    async def wait_closed(self) -> None:
        """Wait until the accept loop has ended."""
        if self._task is not None:
            await asyncio.wait((self._task,))

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        retry = _RETRY_MIN
        episode: float | None = None  # when the current descriptor shortage began.
        warned = -_QUIET  # when the last shortage was warned about.
        quiet = False  # whether the current shortage is logged at DEBUG only.
        while not self._closed:
            self._start_some(loop)
            while self._open >= self._max and not self._pending:
                self._room.clear()
                await self._room.wait()
            try:
                accepted = self._drain()
            except OSError as exc:
                if exc.errno not in _EXHAUSTED:
                    if self._closed or exc.errno == errno.EBADF:
                        return
                    continue  # ECONNABORTED and friends: that client is gone, not us.
                if self._pending:  # start those first: they may free descriptors.
                    await asyncio.sleep(0)
                    continue
                self.refused += 1
                if episode is None:
                    episode = time.monotonic()
                    quiet = episode - warned < _QUIET
                    warned = warned if quiet else episode
                    logger.log(
                        logging.DEBUG if quiet else logging.WARNING,
                        "fault_server: out of file descriptors (%s) with %d connection(s) "
                        "open: new connections wait in the backlog until some close",
                        errno.errorcode.get(exc.errno or 0, exc.errno),
                        self._open,
                    )
                self._room.clear()
                with anyio.move_on_after(retry):
                    await self._room.wait()
                retry = min(retry * 2, _RETRY_MAX)
                continue
            if accepted and episode is not None:
                logger.log(
                    logging.DEBUG if quiet else logging.INFO,
                    "fault_server: accepting again after %.1f s out of file descriptors "
                    "(%d accept(s) refused)",
                    time.monotonic() - episode,
                    self.refused,
                )
                episode, retry = None, _RETRY_MIN
            if self._pending or accepted >= _BATCH:
                await asyncio.sleep(0)  # let the started ones run, then accept again.
            else:
                await self._readable(loop)

    def _start_some(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start serving up to `_FAIR` of the accepted connections, oldest first."""
        for _ in range(min(_FAIR, len(self._pending))):
            self._serve(loop, self._pending.popleft())

    def _drain(self) -> int:
        """Accept every connection the kernel has queued (at most `_BATCH`, and up to the
        cap) into `_pending`; how many. Accepting costs a few microseconds, starting a
        connection a hundred: the queue is emptied first, so that no SYN is dropped while
        the connections start.

        Raises:
            OSError: from ``accept()``, other than "nothing left to accept", when it
                accepted none.
        """
        accepted = 0
        while accepted < _BATCH and self._open < self._max:
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                if accepted:
                    break  # served what it took; the error comes back on the next call.
                raise
            conn.setblocking(False)
            self._pending.append(conn)
            self._open += 1
            accepted += 1
        return accepted

    async def _readable(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wait until the listening socket has a connection to accept."""
        ready = loop.create_future()

        def wake() -> None:
            if not ready.done():
                ready.set_result(None)

        fd = self._sock.fileno()
        if fd < 0:  # closed meanwhile.
            self._closed = True
            return
        loop.add_reader(fd, wake)
        self._waiting = loop
        try:
            await ready
        finally:
            if self._waiting is not None:
                self._waiting = None
                loop.remove_reader(fd)

    def _serve(self, loop: asyncio.AbstractEventLoop, conn: socket.socket) -> None:
        loop.create_task(self._connection(loop, conn), name="fault_server.connection")

    async def _connection(self, loop: asyncio.AbstractEventLoop, conn: socket.socket) -> None:
        """Wrap ``conn`` in streams, as `asyncio.start_server` does, and run the handler."""
        try:
            reader = asyncio.StreamReader()
            # The protocol makes the writer itself when given a callback, and then knows it
            # (StreamWriter.start_tls, which the TLS listener uses, relies on that).
            made: list[asyncio.StreamWriter] = []
            protocol = asyncio.StreamReaderProtocol(reader, lambda _, w: made.append(w))
            try:
                await loop.connect_accepted_socket(lambda: protocol, conn)
            except OSError:
                conn.close()
                return
            await self._handler(reader, made[0])
        except asyncio.CancelledError:
            pass  # the server is closing: nobody reads this task's outcome.
        except Exception:  # the handler catches its own; this is a bug, say so once.
            logger.exception("fault_server: connection setup failed")
        finally:
            self._open -= 1
            self._room.set()
