"""Response objects with attribute access, shaped like the openai SDK's.

They are frozen dataclasses built from the server's JSON with light validation: a field that
is present with the wrong type raises `MalformedResponse` naming its path
(``choices[0].message.content: expected str, got int``); absent fields are ``None``. Fields a
server adds that openai does not declare (vLLM's ``reasoning_content``, say) are reachable
as attributes too, and ``to_dict()`` returns the JSON exactly as received.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from ._exceptions import MalformedResponse

__all__ = [
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatCompletionMessage",
    "ChatCompletionMessageToolCall",
    "Choice",
    "ChoiceDelta",
    "ChoiceDeltaToolCall",
    "ChoiceDeltaToolCallFunction",
    "ChunkChoice",
    "Function",
    "Usage",
]

M = TypeVar("M", bound="Model")


def _kind(kind: object) -> Any:
    """A field that is None when the server leaves it out."""
    return dataclasses.field(default=None, metadata={"kind": kind})


def _always(kind: object) -> Any:
    """A field that is never None, as in openai's types: an empty list or object if absent.

    Keeps ``resp.choices[0].message.content`` type-checking under mypy --strict.
    """
    if isinstance(kind, list):
        return dataclasses.field(default_factory=list, metadata={"kind": kind})
    assert isinstance(kind, type) and issubclass(kind, Model)
    return dataclasses.field(default_factory=lambda: kind(_raw={}), metadata={"kind": kind})


# A field's converter takes (value, path of the parent, field name) and builds the path
# string only when it needs it: on an error, or to descend into a nested object.
_Converter = Callable[[Any, str, str], Any]
_PLANS: dict[type, tuple[tuple[str, _Converter, bool], ...]] = {}
_TYPE_NAMES = {str: "str", int: "int", float: "number", bool: "bool", dict: "object"}


def _plan(cls: type) -> tuple[tuple[str, _Converter, bool], ...]:
    # Parsing runs per streamed chunk: work out each field's converter once per class.
    plan = _PLANS.get(cls)
    if plan is None:
        plan = tuple(
            (f.name, _converter(f.metadata["kind"]), f.default_factory is not dataclasses.MISSING)
            for f in dataclasses.fields(cls)
            if "kind" in f.metadata
        )
        _PLANS[cls] = plan
    return plan


def _converter(kind: object) -> _Converter:
    if isinstance(kind, list):
        (item_kind,) = kind
        item = _converter(item_kind)

        def convert_list(value: Any, parent: str, name: str) -> Any:
            if type(value) is not list:
                raise _wrong(parent, name, "array", value)
            path = _join(parent, name)
            return [item(v, path, f"[{i}]") for i, v in enumerate(value)]

        return convert_list
    if isinstance(kind, type) and issubclass(kind, Model):
        model = kind

        def convert_model(value: Any, parent: str, name: str) -> Any:
            return model.from_dict(value, _join(parent, name))

        return convert_model
    assert isinstance(kind, type)
    scalar = kind
    # The exact types that pass without a closer look (bool is not an int here).
    exact: tuple[type, ...] = (int, float) if scalar is float else (scalar,)

    def convert_scalar(value: Any, parent: str, name: str) -> Any:
        if type(value) in exact:
            return value
        if scalar is dict and isinstance(value, dict):
            return value
        raise _wrong(parent, name, _TYPE_NAMES.get(scalar, scalar.__name__), value)

    return convert_scalar


def _wrong(parent: str, name: str, expected: str, value: Any) -> MalformedResponse:
    return MalformedResponse(
        f"{_join(parent, name)}: expected {expected}, got {type(value).__name__}"
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Model:
    """Base of every response object: attribute access over the JSON the server sent."""

    _raw: Mapping[str, Any] = dataclasses.field(repr=False, compare=False, kw_only=True)

    @classmethod
    def from_dict(cls: type[M], data: object, path: str = "") -> M:
        """Build from parsed JSON; raises `MalformedResponse` on a wrong-typed field."""
        if not isinstance(data, Mapping):
            raise MalformedResponse(
                f"{path or cls.__name__}: expected object, got {type(data).__name__}"
            )
        values: dict[str, Any] = {}
        for name, convert, always in _plan(cls):
            value = data.get(name)
            if value is not None:
                values[name] = convert(value, path, name)
            elif not always and name in data:
                values[name] = None
        return cls(_raw=data, **values)

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails: undeclared fields the server sent.
        if not name.startswith("_"):
            raw = object.__getattribute__(self, "_raw")
            if name in raw:
                return raw[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def to_dict(self) -> dict[str, Any]:
        """The JSON object exactly as the server sent it."""
        return dict(self._raw)

    model_dump = to_dict  # the openai / pydantic spelling


def _join(path: str, name: str) -> str:
    if name.startswith("["):
        return f"{path}{name}"
    return f"{path}.{name}" if path else name


@dataclasses.dataclass(frozen=True, slots=True)
class Usage(Model):
    prompt_tokens: int | None = _kind(int)
    completion_tokens: int | None = _kind(int)
    total_tokens: int | None = _kind(int)
    prompt_tokens_details: dict[str, Any] | None = _kind(dict)
    completion_tokens_details: dict[str, Any] | None = _kind(dict)


@dataclasses.dataclass(frozen=True, slots=True)
class Function(Model):
    name: str | None = _kind(str)
    arguments: str | None = _kind(str)


@dataclasses.dataclass(frozen=True, slots=True)
class ChatCompletionMessageToolCall(Model):
    id: str | None = _kind(str)
    type: str | None = _kind(str)
    function: Function = _always(Function)


@dataclasses.dataclass(frozen=True, slots=True)
class ChatCompletionMessage(Model):
    role: str | None = _kind(str)
    content: str | None = _kind(str)
    refusal: str | None = _kind(str)
    tool_calls: list[ChatCompletionMessageToolCall] | None = _kind([ChatCompletionMessageToolCall])
    function_call: Function | None = _kind(Function)


@dataclasses.dataclass(frozen=True, slots=True)
class Choice(Model):
    index: int | None = _kind(int)
    message: ChatCompletionMessage = _always(ChatCompletionMessage)
    finish_reason: str | None = _kind(str)
    logprobs: dict[str, Any] | None = _kind(dict)


@dataclasses.dataclass(frozen=True, slots=True)
class ChatCompletion(Model):
    """A non-streamed chat completion (``object == "chat.completion"``)."""

    id: str | None = _kind(str)
    object: str | None = _kind(str)
    created: int | None = _kind(int)
    model: str | None = _kind(str)
    choices: list[Choice] = _always([Choice])
    usage: Usage | None = _kind(Usage)
    system_fingerprint: str | None = _kind(str)
    service_tier: str | None = _kind(str)


@dataclasses.dataclass(frozen=True, slots=True)
class ChoiceDeltaToolCallFunction(Model):
    name: str | None = _kind(str)
    arguments: str | None = _kind(str)


@dataclasses.dataclass(frozen=True, slots=True)
class ChoiceDeltaToolCall(Model):
    index: int | None = _kind(int)
    id: str | None = _kind(str)
    type: str | None = _kind(str)
    function: ChoiceDeltaToolCallFunction = _always(ChoiceDeltaToolCallFunction)


@dataclasses.dataclass(frozen=True, slots=True)
class ChoiceDelta(Model):
    role: str | None = _kind(str)
    content: str | None = _kind(str)
    refusal: str | None = _kind(str)
    tool_calls: list[ChoiceDeltaToolCall] | None = _kind([ChoiceDeltaToolCall])
    function_call: ChoiceDeltaToolCallFunction | None = _kind(ChoiceDeltaToolCallFunction)


@dataclasses.dataclass(frozen=True, slots=True)
class ChunkChoice(Model):
    index: int | None = _kind(int)
    delta: ChoiceDelta = _always(ChoiceDelta)
    finish_reason: str | None = _kind(str)
    logprobs: dict[str, Any] | None = _kind(dict)


# Delta fields whose non-empty value is progress: the model produced something.
_CONTENT_FIELDS = (
    "content",
    "refusal",
    "tool_calls",
    "function_call",
    "reasoning_content",
    "reasoning",
)


@dataclasses.dataclass(frozen=True, slots=True)
class ChatCompletionChunk(Model):
    """One streamed chunk (``object == "chat.completion.chunk"``)."""

    id: str | None = _kind(str)
    object: str | None = _kind(str)
    created: int | None = _kind(int)
    model: str | None = _kind(str)
    choices: list[ChunkChoice] = _always([ChunkChoice])
    usage: Usage | None = _kind(Usage)
    system_fingerprint: str | None = _kind(str)

    @property
    def has_content(self) -> bool:
        """True if this chunk is progress: content, a tool-call piece, a finish, or usage.

        A role-only first chunk, an empty delta or a keep-alive chunk is not; it does not
        reset the ``idle`` or ``first_token`` bounds.
        """
        if self.usage is not None:
            return True
        for choice in self.choices:
            if choice.finish_reason:
                return True
            raw = choice.delta._raw
            if any(raw.get(name) for name in _CONTENT_FIELDS):
                return True
        return False
