"""What counts as progress in an event stream, and what a finished call reports.

``first_token`` and ``idle`` measure time without *content*. A server that sends SSE
comments, ``ping`` events, lifecycle events or empty deltas forever is alive on the socket
but stuck as far as the caller is concerned; those events must not reset either bound.

One classifier serves every API the engine carries, because it looks at shapes rather than
at URLs:

- OpenAI chat chunks (``choices[].delta``): content when a delta carries content, a tool
  call piece, a refusal or reasoning, or a choice finishes, or the chunk carries usage. A
  role-only first delta and ``{"content": ""}`` are not.
- OpenAI Responses events (``type: response.*``): everything except the lifecycle events
  ``response.created``, ``response.in_progress`` and ``response.queued``, and a ``*.delta``
  event whose ``delta`` is empty.
- Anthropic Messages events: everything except ``ping``, ``message_start``, and a
  ``content_block_delta`` whose delta carries nothing (``{"type": "text_delta",
  "text": ""}``).
- Anything else with data: content. A comment or an event without data never is.

The same pass notes what the call's span and the pacer want at the end (response id and
model, finish reasons, token usage), so no face has to parse the stream twice.
"""

from __future__ import annotations

from typing import Any

from ._json import loads
from ._sse import ServerSentEvent

__all__ = ["Outcome", "classify"]

_CONTENT_FIELDS = (
    "content",
    "tool_calls",
    "function_call",
    "refusal",
    "reasoning_content",
    "reasoning",
    "audio",
)
# Event types that say "still here" or "starting", never content.
_LIFECYCLE = frozenset(
    {
        "ping",
        "keepalive",
        "keep-alive",
        "heartbeat",
        "message_start",
        "response.created",
        "response.in_progress",
        "response.queued",
    }
)


# The Responses API's last event: the response as it ended.
_TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})


class Outcome:
    """What a finished call reports: filled in by `classify` or by a face that parsed it."""

    __slots__ = (
        "cache_read_tokens",
        "finish_reasons",
        "input_tokens",
        "output_tokens",
        "reasoning_tokens",
        "response_id",
        "response_model",
        "saw_done",
        "service_tier",
        "system_fingerprint",
        "text",
        "total_tokens",
    )

    def __init__(self, *, keep_text: bool = False) -> None:
        self.response_id: str | None = None
        self.response_model: str | None = None
        self.finish_reasons: list[str] = []
        self.input_tokens: int | None = None
        self.output_tokens: int | None = None
        self.total_tokens: int | None = None
        self.cache_read_tokens: int | None = None
        self.reasoning_tokens: int | None = None
        self.service_tier: str | None = None
        self.system_fingerprint: str | None = None
        self.saw_done = False
        self.text: list[str] | None = [] if keep_text else None

    @property
    def finished(self) -> bool:
        """Whether the stream said it is complete (``[DONE]``, a finish reason, a stop)."""
        return self.saw_done or bool(self.finish_reasons)

    def note_usage(self, usage: object) -> None:
        if not isinstance(usage, dict):
            return
        inp = _int(usage.get("prompt_tokens"), usage.get("input_tokens"))
        out = _int(usage.get("completion_tokens"), usage.get("output_tokens"))
        total = _int(usage.get("total_tokens"))
        if inp is not None:
            self.input_tokens = inp
        if out is not None:
            self.output_tokens = out
        if total is not None:
            self.total_tokens = total
        elif self.input_tokens is not None and self.output_tokens is not None:
            self.total_tokens = self.input_tokens + self.output_tokens
        # Chat: prompt/completion_tokens_details; Responses: input/output_tokens_details;
        # Anthropic: cache_read_input_tokens.
        inp_details = _dict(usage.get("prompt_tokens_details"), usage.get("input_tokens_details"))
        out_details = _dict(
            usage.get("completion_tokens_details"), usage.get("output_tokens_details")
        )
        cached = _int(inp_details.get("cached_tokens"), usage.get("cache_read_input_tokens"))
        if cached is not None:
            self.cache_read_tokens = cached
        reasoning = _int(out_details.get("reasoning_tokens"))
        if reasoning is not None:
            self.reasoning_tokens = reasoning

    def note_body(self, obj: object) -> None:
        """Fill in from a whole (non-stream) response body."""
        if not isinstance(obj, dict):
            return
        self._ids(obj)
        for choice in _list(obj.get("choices")):
            if isinstance(choice, dict) and isinstance(choice.get("finish_reason"), str):
                self.finish_reasons.append(choice["finish_reason"])
                if self.text is not None:
                    message = choice.get("message")
                    if isinstance(message, dict) and isinstance(message.get("content"), str):
                        self.text.append(message["content"])
        stop = obj.get("stop_reason") or obj.get("status")
        if isinstance(stop, str) and not obj.get("choices"):
            self.finish_reasons.append(stop)
        self.note_usage(obj.get("usage"))

    def _ids(self, obj: dict[str, Any]) -> None:
        if self.response_id is None and isinstance(obj.get("id"), str):
            self.response_id = obj["id"]
        if self.response_model is None and isinstance(obj.get("model"), str):
            self.response_model = obj["model"]
        if isinstance(obj.get("service_tier"), str):
            self.service_tier = obj["service_tier"]
        if isinstance(obj.get("system_fingerprint"), str):
            self.system_fingerprint = obj["system_fingerprint"]


def classify(event: ServerSentEvent, outcome: Outcome) -> tuple[bool, object]:
    """Whether ``event`` is content, and its data parsed as JSON (None if it is not JSON).

    Notes ids, finish reasons and usage on ``outcome`` as a side effect.
    """
    data = event.data
    if not data:
        return False, None
    if data == "[DONE]":
        outcome.saw_done = True
        return False, None
    if event.event in _LIFECYCLE:
        return False, _loads(data)
    try:
        obj = loads(data)
    except ValueError:
        obj = None
    if obj is None and event.event != "message":
        return False, None  # a named event that is not JSON: not ours to judge, skipped
    if not isinstance(obj, dict):
        return True, obj  # a list, a number, or text: data all the same
    kind = obj.get("type")
    if isinstance(kind, str):
        return _typed(kind, obj, outcome), obj
    if "choices" in obj or "object" in obj:
        return _chat_chunk(obj, outcome), obj
    return True, obj


def _chat_chunk(obj: dict[str, Any], outcome: Outcome) -> bool:
    outcome._ids(obj)
    content = False
    usage = obj.get("usage")
    if usage:
        outcome.note_usage(usage)
        content = True
    choices = obj.get("choices")
    for choice in choices if isinstance(choices, list) else ():
        if not isinstance(choice, dict):
            continue
        reason = choice.get("finish_reason")
        if isinstance(reason, str) and reason:
            outcome.finish_reasons.append(reason)
            content = True
        delta = choice.get("delta")
        if isinstance(delta, dict):
            # (A delta has a key or two: walking it is cheaper than asking for each field.)
            for name, value in delta.items():
                if value and name in _CONTENT_FIELDS:
                    content = True
                    if name == "content" and outcome.text is not None:
                        outcome.text.append(str(value))
    return content


def _typed(kind: str, obj: dict[str, Any], outcome: Outcome) -> bool:
    if kind in _LIFECYCLE:
        if kind == "message_start" and isinstance(obj.get("message"), dict):
            message = obj["message"]
            outcome._ids(message)
            outcome.note_usage(message.get("usage"))
        elif isinstance(obj.get("response"), dict):
            outcome._ids(obj["response"])
        return False
    if kind in _TERMINAL:
        outcome.saw_done = True  # the last event of a Responses stream
        response = obj.get("response")
        if isinstance(response, dict):
            outcome._ids(response)
            outcome.note_usage(response.get("usage"))
            if isinstance(response.get("status"), str):
                outcome.finish_reasons.append(response["status"])
    elif kind == "message_delta":
        delta = obj.get("delta")
        if isinstance(delta, dict) and isinstance(delta.get("stop_reason"), str):
            outcome.finish_reasons.append(delta["stop_reason"])
        usage = obj.get("usage")
        if isinstance(usage, dict):
            out = _int(usage.get("output_tokens"))
            if out is not None:
                outcome.output_tokens = out
                if outcome.input_tokens is not None:
                    outcome.total_tokens = outcome.input_tokens + out
    elif kind == "message_stop":
        outcome.saw_done = True
    elif _empty_delta(obj.get("delta", True)):
        return False
    elif outcome.text is not None:
        delta = obj.get("delta")
        if kind == "response.output_text.delta" and isinstance(delta, str):
            outcome.text.append(delta)
        elif isinstance(delta, dict) and isinstance(delta.get("text"), str):
            outcome.text.append(delta["text"])
    return True


def _empty_delta(delta: object) -> bool:
    """A Responses ``delta: ""`` or an Anthropic delta whose every field but its ``type``
    is empty: alive on the wire, no progress for the caller."""
    if isinstance(delta, dict):
        return all(v in ("", None) for k, v in delta.items() if k != "type")
    return delta == ""


def _loads(data: str) -> object:
    try:
        return loads(data)
    except ValueError:
        return None


def _int(*values: object) -> int | None:
    for value in values:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _dict(*values: object) -> dict[str, Any]:
    for value in values:
        if isinstance(value, dict):
            return value
    return {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []
