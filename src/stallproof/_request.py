"""Turning openai-style arguments into the request body, with clear errors for bad input."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from . import _exceptions as exc

__all__ = ["build_body"]


def _is_omitted(value: object) -> bool:
    # openai's NOT_GIVEN / omit sentinels mean "leave it out", so code written against
    # openai that passes them keeps working.
    return type(value).__name__ in ("NotGiven", "Omit")


def build_body(
    messages: Iterable[Mapping[str, Any]],
    model: str,
    stream: bool,
    params: Mapping[str, Any],
    extra_body: Mapping[str, Any] | None,
) -> dict[str, Any]:
    if not isinstance(model, str) or not model:
        raise exc.InvalidRequestError(f"model must be a non-empty str, got {model!r}")
    if not isinstance(stream, bool):
        raise exc.InvalidRequestError(f"stream must be a bool, got {stream!r}")
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Iterable):
        raise exc.InvalidRequestError(
            f"messages must be a list of message objects, got {type(messages).__name__}"
        )
    msgs = list(messages)
    if not msgs:
        raise exc.InvalidRequestError("messages must not be empty")
    for i, m in enumerate(msgs):
        if not isinstance(m, Mapping):
            raise exc.InvalidRequestError(
                f"messages[{i}] must be a mapping, got {type(m).__name__}"
            )
        if not isinstance(m.get("role"), str):
            raise exc.InvalidRequestError(f"messages[{i}] has no 'role' string")
    body: dict[str, Any] = {"model": model, "messages": [dict(m) for m in msgs]}
    if stream:
        body["stream"] = True
    for key, value in params.items():
        if not _is_omitted(value):
            body[key] = value
    if extra_body:
        body.update(extra_body)
    return body
