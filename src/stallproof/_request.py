"""Turning openai-style arguments into the request body, with clear errors for bad input."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import openai

from . import _exceptions as exc

__all__ = [
    "build_body",
    "check_known",
    "encode_json",
    "is_omitted",
    "model_to_dict",
    "pop_stream",
]


def is_omitted(value: object) -> bool:
    """openai's ``NOT_GIVEN`` / ``omit``: "leave it out", which frameworks pass by default."""
    return isinstance(value, (openai.NotGiven, openai.Omit))


def check_known(method: str, params: Mapping[str, Any], known: frozenset[str]) -> None:
    """A keyword argument openai's method does not have is a `TypeError`, as in openai."""
    unknown = [name for name in params if name not in known]
    if unknown:
        raise TypeError(
            f"{method}() got an unexpected keyword argument {unknown[0]!r} "
            "(pass arguments openai does not know in extra_body)"
        )


def pop_stream(params: dict[str, Any]) -> bool:
    """Take ``stream`` out of a method's arguments: omitted or None is False."""
    stream = params.pop("stream", False)
    if is_omitted(stream) or stream is None:
        return False
    if not isinstance(stream, bool):
        raise exc.InvalidRequestError(f"stream must be a bool, got {stream!r}")
    return stream


def model_to_dict(value: object) -> dict[str, Any] | None:
    """A pydantic model (openai's message objects, ours, the caller's) as a JSON object,
    as the SDK sends it: unset/None fields left out. None when ``value`` is no such model."""
    dump = getattr(value, "model_dump", None)
    if dump is None or isinstance(value, type):
        return None
    data = dump(mode="json", exclude_none=True)
    return data if isinstance(data, dict) else None


def _json_default(value: object) -> Any:
    data = model_to_dict(value)
    if data is None:
        raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
    return data


def encode_json(body: Mapping[str, Any]) -> bytes:
    """The request body as JSON; pydantic models anywhere inside are dumped like the SDK."""
    try:
        return json.dumps(body, ensure_ascii=False, allow_nan=False, default=_json_default).encode()
    except (TypeError, ValueError) as e:
        raise exc.InvalidRequestError(f"request body is not JSON-serialisable: {e}") from None


def _message(i: int, m: object) -> Mapping[str, Any]:
    if not isinstance(m, Mapping):
        dumped = model_to_dict(m)
        if dumped is None:
            raise exc.InvalidRequestError(
                f"messages[{i}] must be a mapping or a pydantic model (such as "
                f"resp.choices[0].message), got {type(m).__name__}"
            )
        m = dumped
    if not isinstance(m.get("role"), str):
        raise exc.InvalidRequestError(f"messages[{i}] has no 'role' string")
    return dict(m)


def build_body(
    messages: object,
    model: object,
    stream: bool,
    params: Mapping[str, Any],
    extra_body: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The JSON body of a chat call: omitted parameters left out, ``extra_body`` on top."""
    if not isinstance(model, str) or not model:
        raise exc.InvalidRequestError(f"model must be a non-empty str, got {model!r}")
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Iterable):
        raise exc.InvalidRequestError(
            f"messages must be a list of message objects, got {type(messages).__name__}"
        )
    msgs = [_message(i, m) for i, m in enumerate(messages)]
    if not msgs:
        raise exc.InvalidRequestError("messages must not be empty")
    body: dict[str, Any] = {"model": model, "messages": msgs}
    if stream:
        body["stream"] = True
    for key, value in params.items():
        if not is_omitted(value):
            body[key] = value
    if extra_body:
        body.update(extra_body)
    return body
