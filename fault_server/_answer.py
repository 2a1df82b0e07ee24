"""The healthy answer a fault delivers, or mangles: a `Whole` response, or `Frames` of SSE.

A fault never builds the normal answer itself: it asks its exchange for it. Standing alone,
the server makes it up at once from the request (`_openai`): `LocalFrames`. In proxy mode it
comes from the upstream server as it arrives (`_proxy.UpstreamFrames`), so a fault that
stalls after three chunks sends three real chunks, each as soon as it came.

Frames are complete SSE events, each ending with a blank line, in the order they came:
for a chat completion, the role chunk first, then the content chunks, the finish chunk, the
usage chunk if asked for, and ``data: [DONE]``. They are read once, front to back.
"""

from __future__ import annotations

from typing import Any

from . import _formats
from ._json_depth import loads as loads_limited
from ._openai import DONE, Api, ChatRequest, EventStream, Whole, models

__all__ = ["Frames", "LocalFrames", "LocalSource", "UpstreamBroken", "frame_json", "is_done"]


class UpstreamBroken(Exception):
    """The upstream's stream broke off mid-answer (proxy mode)."""


class Frames:
    """An SSE answer, read one frame at a time.

    Attributes:
        status: the response status (200, or the upstream's).
        headers: extra response headers to pass on (the upstream's rate-limit headers...).
        count: frames read so far.
        api: the wire format (`_formats`): chat, messages (Anthropic) or responses.
        prologue: how many frames open the stream before the first content frame.
    """

    content_type = "text/event-stream"

    def __init__(
        self,
        status: int = 200,
        headers: tuple[tuple[str, str], ...] = (),
        api: Api = "chat",
    ) -> None:
        self.status = status
        self.headers = headers
        self.count = 0
        self.api = api
        self.prologue = _formats.prologue(api)

    async def next(self) -> bytes | None:
        """The next frame, or None after the last."""
        frame = await self._next()
        if frame is not None:
            self.count += 1
        return frame

    async def take(self, n: int) -> list[bytes]:
        """Up to ``n`` more frames."""
        out: list[bytes] = []
        while len(out) < n and (frame := await self.next()) is not None:
            out.append(frame)
        return out

    async def rest(self) -> list[bytes]:
        """Every frame left."""
        out: list[bytes] = []
        while (frame := await self.next()) is not None:
            out.append(frame)
        return out

    def paced(self, index: int, frame: bytes) -> bool:
        """Whether ``token_interval`` applies before frame number ``index`` (from 0)."""
        return index >= self.prologue and not self.is_end(frame)

    def is_end(self, frame: bytes) -> bool:
        """Whether ``frame`` ends the stream (chat's ``[DONE]``, Anthropic's
        ``message_stop``, the Responses API's ``response.completed``)."""
        return _formats.is_end(self.api, frame)

    def chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        """One more well-formed chunk frame of this completion (same id, model, created)."""
        raise NotImplementedError

    async def aclose(self) -> None:
        """Release what the frames hold (an upstream response)."""

    async def _next(self) -> bytes | None:
        raise NotImplementedError


class LocalFrames(Frames):
    """The frames of an `EventStream` the server made up."""

    def __init__(self, stream: EventStream, api: Api = "chat") -> None:
        super().__init__(api=api)
        self.stream = stream
        self.prologue = stream.prologue

    async def _next(self) -> bytes | None:
        events = self.stream.events
        return events[self.count] if self.count < len(events) else None

    def paced(self, index: int, frame: bytes) -> bool:
        # content chunks only, as documented.
        return self.prologue <= index < self.prologue + self.stream.content

    def is_end(self, frame: bytes) -> bool:
        return self.stream.is_end(frame)

    def chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        return self.stream.chunk(delta, finish_reason)


def is_done(frame: bytes) -> bool:
    """Whether ``frame`` is ``data: [DONE]``."""
    return frame.strip() == DONE.strip()


def frame_json(frame: bytes) -> Any:
    """The JSON of a frame's ``data:`` lines (joined with newlines), or None if it has none or
    they are not JSON."""
    lines = [
        line[5:].removeprefix(b" ")
        for line in frame.replace(b"\r\n", b"\n").split(b"\n")
        if line.startswith(b"data:")
    ]
    if not lines:
        return None
    try:
        return loads_limited(b"\n".join(lines))
    except ValueError:
        return None


class LocalSource:
    """The answers the server makes up: the model list, or an answer of ``tokens`` in the
    request's API format."""

    def __init__(self, chat: ChatRequest | None, tokens: int) -> None:
        self._chat = chat
        self._tokens = tokens

    async def answer(self, stream: bool) -> Whole | Frames:
        if self._chat is None:
            return models()
        if stream:
            made = _formats.local_stream(self._chat, self._tokens)
            return made if isinstance(made, Whole) else LocalFrames(made, self._chat.api)
        return _formats.local_whole(self._chat, self._tokens)

    async def aclose(self) -> None:
        pass
