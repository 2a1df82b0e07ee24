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
``body_b64`` instead. ``timing`` holds when the answer came, in seconds after the request
went out: ``head`` (the response head), then ``body`` (the whole body) or ``frames`` (each
event). ``FaultServer(replay=FILE, replay_speed=1.0)`` serves the answers with that timing
(``replay_speed=4`` four times faster); without a speed, or for a line without ``timing``
(recorded before it was), as fast as the fault takes them.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
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

    def whole(
        self, key: str, api: Api | None, whole: Whole, timing: dict[str, float] | None = None
    ) -> None:
        """Record a complete answer sent in one piece (and when it came: ``timing``)."""
        entry = _entry(key, api, whole.status, whole.content_type, whole.headers)
        if timing is not None:
            entry["timing"] = {k: round(v, 4) for k, v in timing.items()}
        try:
            entry["body"] = whole.body.decode("utf-8")
        except UnicodeDecodeError:
            entry["body_b64"] = base64.b64encode(whole.body).decode("ascii")
        self._write(entry)

    def stream(
        self,
        key: str,
        frames: Frames,
        events: list[bytes],
        head: float | None = None,
        times: list[float] | None = None,
    ) -> None:
        """Record a complete SSE answer, every event of it (and when the head and each
        event came, seconds after the request: ``head``, ``times``)."""
        entry = _entry(key, frames.api, frames.status, frames.content_type, frames.headers)
        entry["frames"] = [event.decode("utf-8", "replace") for event in events]
        if head is not None and times is not None and len(times) == len(events):
            entry["timing"] = {"head": round(head, 4), "frames": [round(t, 4) for t in times]}
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

    def __init__(self, path: str | Path, speed: float | None = None) -> None:
        self.path = Path(path)
        self.speed = speed  # None: as fast as the fault takes them; else the timing / speed.
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
                _check_timing(entry)
            except (ValueError, KeyError, TypeError) as exc:
                raise RecordingError(
                    f"line {number} of replay file {self.path} is not a recorded exchange: {exc!r}"
                ) from exc
            self._answers.setdefault(key, []).append(entry)

    def __len__(self) -> int:
        return sum(len(answers) for answers in self._answers.values())

    async def answer(self, key: str, chat: ChatRequest | None) -> Whole | Frames:
        """The next recorded answer to the request ``key``, or a 404 saying there is none;
        with a speed, after the recorded wait for its head (a whole body: for all of it)."""
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
        timing = entry.get("timing") if self.speed is not None else None
        started = time.monotonic()
        if "frames" in entry:
            events = [str(frame).encode("utf-8") for frame in entry["frames"]]
            times = None
            if timing is not None:
                await _sleep_until(started, timing.get("head", 0.0), self.speed)
                times = timing.get("frames")
            return ReplayFrames(
                events, int(entry["status"]), headers, api, times, started, self.speed
            )
        if timing is not None:
            await _sleep_until(started, timing.get("body", timing.get("head", 0.0)), self.speed)
        if "body_b64" in entry:
            body = base64.b64decode(entry["body_b64"])
        else:
            body = str(entry.get("body", "")).encode("utf-8")
        content_type = str(entry.get("content_type", "application/json"))
        return Whole(int(entry["status"]), body, content_type, headers)


def _check_timing(entry: dict[str, Any]) -> None:
    """Raise ValueError for a ``timing`` that is not what `Recorder` writes."""
    timing = entry.get("timing")
    if timing is None:
        return
    if not isinstance(timing, dict):
        raise ValueError("'timing' must be an object")
    for name in ("head", "body"):
        value = timing.get(name, 0.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ValueError(f"timing {name!r} must be seconds >= 0, got {value!r}")
    frames = timing.get("frames")
    if frames is not None and (
        not isinstance(frames, list)
        or any(isinstance(t, bool) or not isinstance(t, (int, float)) or t < 0 for t in frames)
    ):
        raise ValueError("timing 'frames' must be a list of seconds >= 0")


async def _sleep_until(started: float, offset: float, speed: float | None) -> None:
    """Sleep until ``offset / speed`` seconds after ``started`` (monotonic)."""
    if speed is None:
        return
    delay = started + offset / speed - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


class ReplayFrames(Frames):
    """Recorded SSE events, served as fast as the fault takes them; with ``times`` (seconds
    after ``started`` each came, recorded) and a ``speed``, none before its time / speed."""

    def __init__(
        self,
        events: list[bytes],
        status: int,
        headers: tuple[tuple[str, str], ...],
        api: Api,
        times: list[float] | None = None,
        started: float = 0.0,
        speed: float | None = None,
    ) -> None:
        super().__init__(status, headers, api)
        self._events = events
        self._times = times
        self._started = started
        self._speed = speed

    async def _next(self) -> bytes | None:
        index = self.count
        if index >= len(self._events):
            return None
        if self._times is not None and self._speed is not None and index < len(self._times):
            await _sleep_until(self._started, self._times[index], self._speed)
        return self._events[index]

    def chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        first = next((d for e in self._events if isinstance(d := frame_json(e), dict)), None)
        return chat_chunk(first or {}, delta, finish_reason)
