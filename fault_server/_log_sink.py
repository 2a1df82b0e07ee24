"""`StderrSink`: the CLI's log lines go to stderr without ever blocking the server.

A CLI server is often started by a harness that reads its stdout for the URL and never reads
its stderr pipe. Once that pipe's buffer (64 KiB on Linux) is full, a plain ``write`` to
stderr blocks, and with it the event loop: the server stopped answering for good. So log
records (and the CLI's own notes) go into a bounded queue, and a daemon thread writes them
to a duplicate of fd 2. When the queue is full the line is dropped and counted; the next
line that gets out says how many were dropped. Nothing on the server's loop ever waits for
the pipe.
"""

from __future__ import annotations

import collections
import logging
import os
import sys
import threading

__all__ = ["StderrSink"]

_QUEUE = 1000  # lines waiting for the pipe, at most.
_FLUSH = 0.5  # bounds how long close() waits for the queue to drain.


class StderrSink(logging.Handler):
    """A logging handler that writes to stderr from a thread of its own; never blocks.

    Args:
        fd: the file descriptor to write to (a duplicate of it is used); stderr's by default.
    """

    def __init__(self, fd: int | None = None) -> None:
        super().__init__()
        self._fd = os.dup(sys.stderr.fileno() if fd is None else fd)
        self._lines: collections.deque[bytes] = collections.deque()
        self._ready = threading.Condition(threading.Lock())
        self._drained = threading.Event()
        self._drained.set()
        self.dropped = 0
        self._thread = threading.Thread(target=self._write, name="fault_server.stderr", daemon=True)
        self._thread.start()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.write(self.format(record))
        except Exception:  # never let logging raise into the server.
            self.handleError(record)

    def write(self, line: str) -> None:
        """Queue one line (a newline is added), or drop it if the queue is full."""
        with self._ready:
            if len(self._lines) >= _QUEUE:
                self.dropped += 1
                return
            self._lines.append(line.encode("utf-8", "backslashreplace") + b"\n")
            self._drained.clear()
            self._ready.notify()

    def _write(self) -> None:
        reported = 0
        while True:
            with self._ready:
                while not self._lines:
                    self._drained.set()
                    self._ready.wait()
                line = self._lines.popleft()
                dropped = self.dropped
            if dropped > reported:
                note = f"fault_server: {dropped - reported} log line(s) dropped: stderr was full\n"
                line = note.encode() + line
                reported = dropped
            try:
                os.write(self._fd, line)  # blocks this thread only, if nobody reads.
            except OSError:
                return

    def flush(self) -> None:
        """Wait (at most half a second) for the queued lines to be written."""
        self._drained.wait(_FLUSH)

    def close(self) -> None:
        self.flush()
        super().close()
