"""Parsed JSON -> openai's own result types, validated: the one place a response is typed.

Results *are* openai's pydantic models (``openai.types.chat.ChatCompletion``...), so
``isinstance`` checks, pydantic fields typed with them and ``model_dump()`` all work. They
are validated with pydantic-core in strict mode: a field of the wrong type is a
`MalformedResponse` whose ``path`` names it (``choices[0].message.content``), never an
object that fails later in the caller's code. Fields a server adds (vLLM's
``reasoning_content``) are kept, as openai keeps them (``model_extra``).

Leniency is exactly the SDK's where the SDK is lenient: a server that leaves out a field
openai marks required (``created``, ``object``...) or sends a value outside one of openai's
``Literal`` sets (``finish_reason: "eos"``) gets what ``openai.AsyncOpenAI`` would give it:
``object`` filled with its only possible value, ``created`` with 0, and any other such gap
built without validation, as the SDK builds every response. Wrong types never pass.
"""

from __future__ import annotations

from typing import Any, TypeVar, cast

import pydantic
from openai._models import construct_type

from . import _exceptions as exc
from ._call import Call
from ._engine import Incoming
from ._exceptions import MalformedResponse
from ._json import parse_body

__all__ = ["read_result", "refuse", "to_result"]

M = TypeVar("M", bound=pydantic.BaseModel)

# Errors the SDK would not raise (it never validates): an absent field, an unknown enum value.
_SDK_TOLERATES = frozenset({"missing", "literal_error", "enum"})
# What a server may leave out at the top level, and the value the result then carries.
_TOP_DEFAULTS = {"created": 0}
# Sanity bounds that keep a valid-but-absurd body from costing seconds of CPU (validation
# runs in Rust holding the GIL; the SDK-tolerant rebuild is pure Python per field): openai
# caps ``n`` at 128, so more than this many choices is not an answer to anything we sent;
# and a body with this many gaps is not one the SDK's leniency is meant for.
MAX_CHOICES = 1024
_MAX_GAPS = 256


def to_result(cls: type[M], data: object, call: Call | None = None) -> M:
    """``data`` (parsed JSON) as a validated ``cls``.

    Raises:
        MalformedResponse: ``data`` is not an object, or a field has the wrong type
            (``path`` names the first one). Stamped with ``call``'s ids when given.
    """
    if isinstance(data, dict):
        choices = data.get("choices")
        if isinstance(choices, list) and len(choices) > MAX_CHOICES:
            raise _malformed(
                call,
                f"{cls.__name__}.choices: {len(choices)} choices (at most {MAX_CHOICES})",
                "choices",
            )
    try:
        # (`cls.model_validate(data, strict=True)` without its Python wrapper: once per
        # event of every stream.)
        return cls.__pydantic_validator__.validate_python(data, strict=True)  # type: ignore[no-any-return]
    except pydantic.ValidationError as e:
        if e.error_count() > _MAX_GAPS:
            raise _malformed(
                call, f"{cls.__name__}: {e.error_count()} fields missing or invalid", None
            ) from None
        errors = e.errors(include_url=False, include_input=False)
    if not isinstance(data, dict):
        raise _malformed(call, f"expected a JSON object, got {type(data).__name__}", None)
    if all(err["type"] in _SDK_TOLERATES for err in errors):
        return _tolerant(cls, data)
    err = next(err for err in errors if err["type"] not in _SDK_TOLERATES)
    path = _path(err["loc"])
    raise _malformed(call, f"{cls.__name__}.{path}: {err['msg'].lower()}", path)


def _tolerant(cls: type[M], data: dict[str, Any]) -> M:
    """What the SDK gives for a response with gaps: defaults, else built without checks."""
    filled = dict(data)
    for name, default in _TOP_DEFAULTS.items():
        if name in cls.model_fields:
            filled.setdefault(name, default)
    literal = _only_value(cls, "object")
    if literal is not None:
        filled.setdefault("object", literal)
    try:
        return cls.model_validate(filled, strict=True)
    except pydantic.ValidationError:
        # Only absent fields or unknown enum values remain (types were checked above).
        return cast(M, construct_type(type_=cls, value=filled))


def _only_value(cls: type[pydantic.BaseModel], name: str) -> str | None:
    field = cls.model_fields.get(name)
    args: tuple[object, ...] = getattr(field.annotation, "__args__", ()) if field else ()
    only = args[0] if len(args) == 1 else None
    return only if isinstance(only, str) else None


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part[:1].isupper() or not part.replace("_", "a").isalnum():
            # A union member pydantic tried (``ChatCompletionMessageFunctionToolCall``,
            # ``function-after[...]``), not a JSON key: openai's keys are snake_case.
            continue
        else:
            out += f".{part}" if out else part
    return out


def _malformed(call: Call | None, message: str, path: str | None) -> MalformedResponse:
    if call is None:
        return MalformedResponse(message, path=path)
    return call.error(MalformedResponse, message, path=path)


async def refuse(incoming: Incoming, message: str) -> exc.MalformedResponse:
    """End the call with a `MalformedResponse` (body released) and return it to raise."""
    error = incoming.call.error(exc.MalformedResponse, message)
    await incoming.body.fail(error)
    return error


async def read_result(incoming: Incoming, cls: type[M]) -> M:
    """A whole JSON body as ``cls``; any failure ends the call with it.

    Raises:
        MalformedResponse: the server streamed, or sent no JSON object, or a wrong type.
        StreamErrorEvent: the server answered 200 with an ``{"error": ...}`` object.
    """
    if incoming.body.is_stream:
        raise await refuse(incoming, "asked for JSON but the server answered with a stream")
    body = incoming.body
    call = incoming.call
    content = body.content or b""

    def convert(data: object) -> tuple[M, dict[str, Any]] | dict[str, Any]:
        # May run in a worker thread: no call stamps here (they read the event loop's clock).
        if not isinstance(data, dict):
            raise MalformedResponse(f"response body is JSON {type(data).__name__}, not object")
        # An error object in place of the answer; a Responses object carries its own
        # "error" field, null when it succeeded (and "object": "response" either way).
        answer = "choices" in data or "data" in data or data.get("object") == "response"
        if "error" in data and not answer:
            return data
        return to_result(cls, data), data

    try:
        # Size and depth checked before parsing; a large body is parsed (and validated)
        # off the event loop, inside the call's total deadline.
        try:
            parsed = await parse_body(content, call, convert)
        except MalformedResponse as e:
            if e.stallproof_request_id is not None:
                raise
            raise _malformed(call, e.message, e.path) from None
        if isinstance(parsed, dict):
            raise call.error(
                exc.StreamErrorEvent,
                "the server answered 200 with an error object",
                body=parsed["error"],
            )
        result, data = parsed
    except BaseException as e:
        await body.fail(e)
        raise
    # Ids, finish reasons, usage (with its details), tier: for the span and the pacer.
    body.outcome.note_body(data)
    await body.aclose()
    return result
