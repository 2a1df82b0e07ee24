"""An incremental Server-Sent Events decoder with a cap on line length.

Follows the WHATWG event-stream rules that matter for LLM streams: lines end in CRLF, LF or
CR; ``:`` starts a comment; several ``data:`` lines join with ``\\n``; a blank line
dispatches the event. Bytes are fed as they arrive; memory is bounded by ``max_line_bytes``
per line and per event, never by what the server chooses to send.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator

__all__ = ["LineTooLong", "SSEDecoder", "ServerSentEvent"]

# One line ending: CRLF, LF, or a lone CR. Searched with the C regex engine, not in Python.
_EOL = re.compile(rb"\r\n|\n|\r")


@dataclasses.dataclass(frozen=True, slots=True)
class ServerSentEvent:
    data: str
    event: str = "message"
    id: str | None = None


class LineTooLong(Exception):
    """A line or event passed the decoder's cap; the caller raises `ResponseTooLarge`."""


class SSEDecoder:
    """Feed bytes, get complete events. Comments and keep-alives are counted, not returned."""

    def __init__(self, max_line_bytes: int) -> None:
        self._max = max_line_bytes
        self._buf = b""
        self._data: list[str] = []
        self._data_bytes = 0
        self._event = ""
        self._id: str | None = None
        self.comments = 0

    def feed(self, chunk: bytes) -> Iterator[ServerSentEvent]:
        """Decode ``chunk`` and yield every event it completes.

        Raises:
            LineTooLong: a line, or the data of one event, is longer than ``max_line_bytes``.
        """
        buf = self._buf + chunk if self._buf else chunk
        start = 0
        n = len(buf)
        for match in _EOL.finditer(buf):
            end = match.start()
            if match.group() == b"\r" and match.end() == n:
                # A CR at the very end may be the first half of a CRLF: wait for more.
                break
            event = self._line(buf[start:end])
            start = match.end()
            if event is not None:
                yield event
        rest = buf[start:]
        if len(rest) > self._max:
            raise LineTooLong(len(rest))
        self._buf = rest

    def _line(self, raw: bytes) -> ServerSentEvent | None:
        if len(raw) > self._max:
            raise LineTooLong(len(raw))
        if not raw:
            if not self._data and not self._event:
                return None
            event = ServerSentEvent(
                data="\n".join(self._data), event=self._event or "message", id=self._id
            )
            self._data = []
            self._data_bytes = 0
            self._event = ""
            return event
        if raw[0] == 0x3A:  # ":" comment, the usual keep-alive
            self.comments += 1
            return None
        line = raw.decode("utf-8", errors="replace")
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
