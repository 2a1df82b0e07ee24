"""An incremental Server-Sent Events decoder with a cap on line length.

Follows the WHATWG event-stream rules that matter for LLM streams: lines end in CRLF, LF or
CR; ``:`` starts a comment; several ``data:`` lines join with ``\\n``; a blank line
dispatches the event. Bytes are fed as they arrive; memory is bounded by ``max_line_bytes``
per line and per event, never by what the server chooses to send.
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["LineTooLong", "SSEDecoder", "ServerSentEvent"]

# A run of line endings (CRLF, LF or lone CR). The first ends the current line; any more
# are blank lines, and blank lines after the first do nothing, so a flood of them costs
# one match in the C regex engine instead of a Python step per line. (Written as a class
# and a star, not ``(?:\r\n|\r|\n)+``, which matches the same runs 4x slower; and for the
# usual chunk, with no CR at all, as ``\n\n*``, which the engine finds by its first
# character: ~1 ns a byte, where the alternation took ~40.)
_EOLS = re.compile(rb"[\r\n][\r\n]*")
_LFS = re.compile(rb"\n\n*")


class ServerSentEvent(NamedTuple):
    """One event: immutable, and a tuple (half the cost of a frozen dataclass to make:
    one is made per event of every stream)."""

    data: str
    event: str = "message"
    id: str | None = None


class LineTooLong(Exception):
    """A line or event passed the decoder's cap; the caller raises `ResponseTooLarge`."""


class SSEDecoder:
    """Feed bytes, get complete events. Comments and keep-alives are counted, not returned.

    Linear in the bytes fed: each byte is scanned once, and an unfinished line grows in a
    bytearray (amortised O(1) per byte), however the server splits its writes. A line is
    handled as soon as its ending arrives; a CR that ends a write is a line ending at once
    (a LF that follows it in the next write is the rest of that CRLF and is skipped).
    """

    def __init__(self, max_line_bytes: int) -> None:
        self._max = max_line_bytes
        self._buf = bytearray()
        self._skip_lf = False
        self._data: list[str] = []
        self._data_bytes = 0
        self._event = ""
        self._id: str | None = None
        self.comments = 0
        #: A line was not UTF-8 (decoded with U+FFFD, as the spec says; a byte reader that
        #: decodes strictly, as the SDKs do, would fail on it: see `ResponseBody`).
        self.not_utf8 = False

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        """Decode ``chunk`` and return every event it completes.

        The usual line (``data: ...``) and the blank line that ends an event are handled
        here, without a call per line: this runs for every event of every stream.

        Raises:
            LineTooLong: a line, or the data of one event, is longer than ``max_line_bytes``.
        """
        if self._skip_lf and chunk[:1] == b"\n":
            chunk = chunk[1:]
        self._skip_lf = False
        events: list[ServerSentEvent] = []
        if not chunk:
            return events
        start = 0
        buf = self._buf
        limit = self._max
        for match in (_EOLS if b"\r" in chunk else _LFS).finditer(chunk):
            end = match.start()
            if buf:
                buf += chunk[start:end]
                line = bytes(buf)
                buf.clear()
            else:
                line = chunk[start:end]
            if line[:6] == b"data: " and len(line) <= limit:
                self._data_bytes += len(line)
                if self._data_bytes > limit:
                    raise LineTooLong(self._data_bytes)
                try:
                    self._data.append(line[6:].decode())
                except UnicodeDecodeError:
                    self._data.append(self._decode(line[6:]))
            else:
                event = self._line(line)
                if event is not None:
                    events.append(event)
            start = match.end()
            run = start - end
            # More than one line ending (bar a lone CRLF): one or more blank lines.
            if (run > 2 or (run == 2 and chunk[end : end + 2] != b"\r\n")) and (
                self._data or self._event
            ):
                events.append(self._dispatch())
        if start == len(chunk):
            self._skip_lf = chunk[-1:] == b"\r"
            return events
        if len(buf) + len(chunk) - start > limit:
            raise LineTooLong(len(buf) + len(chunk) - start)
        buf += chunk[start:]
        return events

    def _dispatch(self) -> ServerSentEvent:
        event = ServerSentEvent("\n".join(self._data), self._event or "message", self._id)
        self._data = []
        self._data_bytes = 0
        self._event = ""
        return event

    def _line(self, raw: bytes) -> ServerSentEvent | None:
        if len(raw) > self._max:
            raise LineTooLong(len(raw))
        if not raw:
            if not self._data and not self._event:
                return None
            return self._dispatch()
        if raw[0] == 0x3A:  # ":" comment, the usual keep-alive
            self.comments += 1
            if not raw.isascii():
                self._decode(raw)
            return None
        line = self._decode(raw)
        field, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if field == "data":
            # Many `data:` lines without a blank one must not grow memory without bound either.
            self._data_bytes += len(raw)
            if self._data_bytes > self._max:
                raise LineTooLong(self._data_bytes)
            self._data.append(value)
        elif field == "event":
            self._event = value
        elif field == "id" and "\0" not in value:
            self._id = value
        # `retry:` and unknown fields are ignored, as the spec says.
        return None

    def _decode(self, raw: bytes) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            self.not_utf8 = True
            return raw.decode("utf-8", errors="replace")
