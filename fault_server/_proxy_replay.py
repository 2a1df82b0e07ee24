"""Replay mode: answers from a file recorded in proxy mode (see `_proxy_recording`), no upstream.

`Replay` stands where the proxy's `Upstream` stands, so the connection treats both alike:
``/v1/...`` paths are served, each request gets its recorded answer through the fault it
meets, and what has no recorded answer gets a 404 that says so.
"""

from __future__ import annotations

from pathlib import Path

from ._answer import Frames
from ._openai import ChatRequest, Whole
from ._proxy import Upstream
from ._proxy_recording import Recording, request_key
from ._wire_exchange import Source

__all__ = ["Replay", "ReplaySource"]


class Replay(Upstream):
    """The recorded exchanges of ``path``, served in place of a real upstream."""

    def __init__(self, path: str | Path, speed: float | None = None) -> None:
        self.recording = Recording(path, speed)
        self.url = f"replay:{self.recording.path}"

    async def start(self) -> None:
        """Read the file.

        Raises:
            RecordingError: naming the file (and line) that is missing, too large or bad.
        """
        self.recording.load()

    async def aclose(self) -> None:
        pass

    def target(self, path: str, query: str) -> str | None:
        if path != "/v1" and not path.startswith("/v1/"):
            return None
        return path + (f"?{query}" if query else "")

    def source(
        self,
        method: str,
        url: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        chat: ChatRequest | None,
    ) -> Source:
        return ReplaySource(self.recording, method, url, body, chat)


class ReplaySource:
    """The recorded answers to one request, taken once per kind (stream or not)."""

    def __init__(
        self, recording: Recording, method: str, path: str, body: bytes, chat: ChatRequest | None
    ) -> None:
        self._recording = recording
        self._method = method
        self._path = path
        self._body = body
        self._chat = chat

    async def answer(self, stream: bool) -> Whole | Frames:
        key = request_key(self._method, self._path, self._body, stream)
        return await self._recording.answer(key, self._chat)

    async def aclose(self) -> None:
        pass
