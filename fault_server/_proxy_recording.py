"""Record a real upstream's answers in proxy mode, and serve them back later, faults and all.

``FaultServer(upstream=URL, record=FILE)`` writes each complete exchange it forwards to
``FILE`` (JSON Lines, one exchange a line, the file truncated at start): the upstream's
answer, whatever the fault then did with it; a stream is written once read to its end, so
one that the upstream broke off, or that a fault stopped reading early, is not.
``FaultServer(replay=FILE)`` serves the recorded answers instead of asking anyone: every
fault applies to them as to a live upstream's. A request finds its answer by method, path
(and query), whether it streams, and its JSON body with ``stream`` and ``stream_options``
left out; when a request was recorded several times, the answers are served in their
order, then again from the first. A request with no recorded answer gets a 404 that says
so.

A line holds ``method``, ``path``, ``stream``, ``request`` (the canonical body), ``api``,
``status``, ``content_type``, ``headers`` (the passed-on ones) and either ``body`` (text)
or ``frames`` (the SSE events, each as text); bytes that are not UTF-8 are kept in
``body_b64`` instead.
"""

from __future__ import annotations

import base64
import json
import threading
from pathlib import Path
from typing import IO, Any

from ._answer import Frames, frame_json
from ._openai import Api, ChatRequest, Whole, chat_chunk, error

__all__ = ["Recorder", "Recording", "RecordingError", "ReplayFrames", "request_key"]

_MAX_FILE = 256 * 1024 * 1024  # a replay file larger than this is refused, not read.
_STREAM_FIELDS = ("stream", "stream_options")


class RecordingError(ValueError):
    """A replay file that cannot be read, or a line of it that is not a recorded exchange."""


def request_key(method: str, path: str, body: bytes, stream: bool) -> str:
    """What a request is matched on when replayed."""
    try:
        data = json.loads(body) if body else None
    except (ValueError, UnicodeDecodeError):
        data = None
    if isinstance(data, dict):
        data = {k: v for k, v in data.items() if k not in _STREAM_FIELDS}
        canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    else:
        canonical = base64.b64encode(body).decode("ascii")
    return json.dumps([method, path, stream, canonical])


class Recorder:
    """Appends complete exchanges to a JSON Lines file. Safe from any thread."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._file: IO[str] | None = None

    def open(self) -> None:
        """Create (or empty) the file."""
        self._file = self.path.open("w", encoding="utf-8")

    def close(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            file.close()

    def whole(self, key: str, api: Api | None, whole: Whole) -> None:
        """Record a complete answer sent in one piece."""
        entry = _entry(key, api, whole.status, whole.content_type, whole.headers)
        try:
            entry["body"] = whole.body.decode("utf-8")
        except UnicodeDecodeError:
            entry["body_b64"] = base64.b64encode(whole.body).decode("ascii")
        self._write(entry)

    def stream(self, key: str, frames: Frames, events: list[bytes]) -> None:
        """Record a complete SSE answer, every event of it."""
        entry = _entry(key, frames.api, frames.status, frames.content_type, frames.headers)
        entry["frames"] = [event.decode("utf-8", "replace") for event in events]
        self._write(entry)

    def _write(self, entry: dict[str, Any]) -> None:
        line = json.dumps(entry, ensure_ascii=False) + "\n"
        with self._lock:
            if self._file is not None:
                self._file.write(line)
                self._file.flush()


def _entry(
    key: str, api: Api | None, status: int, content_type: str, headers: tuple[tuple[str, str], ...]
) -> dict[str, Any]:
    method, path, stream, request = json.loads(key)
    return {
        "method": method,
        "path": path,
        "stream": stream,
        "request": request,
        "api": api,
        "status": status,
        "content_type": content_type,
        "headers": [list(pair) for pair in headers],
    }


class Recording:
    """The exchanges of a replay file, by request, each served in turn."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._answers: dict[str, list[dict[str, Any]]] = {}
        self._turns: dict[str, int] = {}

    def load(self) -> None:
        """Read the file.

        Raises:
            RecordingError: naming the file (and line) that is missing, too large or bad.
        """
        try:
            size = self.path.stat().st_size
            if size > _MAX_FILE:
                raise RecordingError(f"replay file {self.path} is {size} bytes; most: {_MAX_FILE}")
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise RecordingError(f"cannot read replay file {self.path}: {exc}") from exc
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                key = json.dumps(
                    [entry["method"], entry["path"], bool(entry["stream"]), entry["request"]]
                )
                int(entry["status"])
            except (ValueError, KeyError, TypeError) as exc:
                raise RecordingError(
                    f"line {number} of replay file {self.path} is not a recorded exchange: {exc!r}"
                ) from exc
            self._answers.setdefault(key, []).append(entry)

    def __len__(self) -> int:
        return sum(len(answers) for answers in self._answers.values())

    def answer(self, key: str, chat: ChatRequest | None) -> Whole | Frames:
        """The next recorded answer to the request ``key``, or a 404 saying there is none."""
        answers = self._answers.get(key)
        if not answers:
            method, path, stream, _ = json.loads(key)
            kind = "streamed" if stream else "non-streamed"
            return error(404, f"fault_server replay: no {kind} answer recorded for {method} {path}")
        turn = self._turns.get(key, 0)
        self._turns[key] = turn + 1
        entry = answers[turn % len(answers)]
        headers = tuple((str(k), str(v)) for k, v in entry.get("headers", ()))
        api: Api = entry.get("api") or (chat.api if chat is not None else "chat")
        if "frames" in entry:
            events = [str(frame).encode("utf-8") for frame in entry["frames"]]
            return ReplayFrames(events, int(entry["status"]), headers, api)
        if "body_b64" in entry:
            body = base64.b64decode(entry["body_b64"])
        else:
            body = str(entry.get("body", "")).encode("utf-8")
        content_type = str(entry.get("content_type", "application/json"))
        return Whole(int(entry["status"]), body, content_type, headers)


class ReplayFrames(Frames):
    """Recorded SSE events, served as fast as the fault takes them."""

    def __init__(
        self, events: list[bytes], status: int, headers: tuple[tuple[str, str], ...], api: Api
    ) -> None:
        super().__init__(status, headers, api)
        self._events = events

    async def _next(self) -> bytes | None:
        index = self.count
        return self._events[index] if index < len(self._events) else None

    def chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        first = next((d for e in self._events if isinstance(d := frame_json(e), dict)), None)
        return chat_chunk(first or {}, delta, finish_reason)
