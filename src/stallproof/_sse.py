"""An incremental Server-Sent Events decoder with a cap on line length.

Follows the WHATWG event-stream rules that matter for LLM streams: lines end in CRLF, LF or
CR; ``:`` starts a comment; several ``data:`` lines join with ``\\n``; a blank line
dispatches the event. Bytes are fed as they arrive; memory is bounded by ``max_line_bytes``
per line (and the caller's total cap), never by what the server chooses to send.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

__all__ = ["LineTooLong", "SSEDecoder", "ServerSentEvent"]


@dataclasses.dataclass(frozen=True, slots=True)
class ServerSentEvent:
    data: str
    event: str = "message"
    id: str | None = None


class LineTooLong(Exception):
    """A line passed the decoder's cap; the caller turns this into `ResponseTooLarge`."""


class SSEDecoder:
    """Feed bytes, get complete events. Comments and keep-alives are counted, not returned."""

    def __init__(self, max_line_bytes: int) -> None:
        self._max = max_line_bytes
        self._buf = bytearray()
        self._data: list[str] = []
        self._event = ""
        self._id: str | None = None
        self._pending_cr = False
        self._data_bytes = 0
        self.comments = 0

    def feed(self, chunk: bytes) -> Iterator[ServerSentEvent]:
        """Decode ``chunk`` and yield every event it completes.

        Raises:
            LineTooLong: a single line is longer than ``max_line_bytes``.
        """
        buf = self._buf
        start = 0
        n = len(chunk)
        if self._pending_cr and n and chunk[0:1] == b"\n":
            start = 1  # the LF of a CRLF split across two reads
        self._pending_cr = False
        i = start
        while i < n:
            b = chunk[i]
            if b == 0x0A or b == 0x0D:  # LF or CR
                buf += chunk[start:i]
                if len(buf) > self._max:
                    raise LineTooLong(len(buf))
                event = self._line(bytes(buf))
                buf.clear()
                if b == 0x0D:
                    if i + 1 < n:
                        if chunk[i + 1] == 0x0A:
                            i += 1
                    else:
                        self._pending_cr = True
                i += 1
                start = i
                if event is not None:
                    yield event
                continue
            i += 1
        buf += chunk[start:]
        if len(buf) > self._max:
            raise LineTooLong(len(buf))

    def _line(self, raw: bytes) -> ServerSentEvent | None:
        line = raw.decode("utf-8", errors="replace")
        if not line:
            if not self._data and not self._event:
                return None
            event = ServerSentEvent(
                data="\n".join(self._data), event=self._event or "message", id=self._id
            )
            self._data = []
            self._data_bytes = 0
            self._event = ""
            return event
        if line.startswith(":"):
            self.comments += 1
            return None
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

    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete line."""
        return len(self._buf)
