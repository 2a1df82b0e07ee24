"""Every failure typed where an SDK parses what the engine handed it.

The engine bounds a body; the SDK parses it, with its own code, and some of what a server
can send makes that code fail raw (``json.JSONDecodeError``, ``UnicodeDecodeError``,
``RecursionError``) or return a result whose required parts are None. At the three places
an SDK face parses, a failure becomes a typed error:

- a whole body's ``response.json()`` (the transports' responses, `typed_json`): not JSON,
  not UTF-8, nested too deep or holding an integer too long to convert is a
  `MalformedResponse` (also the HTTP library's ``DecodingError``);
- an SSE event's ``sse.json()`` (`TypedEvent`, used by the faces' ``TranslatingDecoder``):
  the same, mid-stream (an event stream that is not UTF-8, which the SDKs decode strictly,
  is refused by the engine's `ResponseBody` before they see it);
- the result the SDK builds from JSON (`check_result`): a required object or list that
  is missing, None or of the wrong kind (``{"choices": null}``, ``{"choices": [{}]}``,
  ``null`` where a completion is expected) is the SDK's own
  ``APIResponseValidationError``, naming the path (``choices[0].message``). Scalars are
  left as the SDK leaves them (a provider that sends ``finish_reason: null`` still works).
"""

from __future__ import annotations

import importlib
import typing
from typing import Any

import pydantic

from .. import _exceptions as exc
from .._json import JSONTooDeep, JSONTooDense, loads

__all__ = [
    "TypedEvent",
    "check_result",
    "invalid_result",
    "malformed",
    "typed_json",
    "unsendable_header",
]


def malformed(what: str, error: BaseException) -> exc.MalformedResponse:
    """The typed error for a document that does not parse (``error`` is not kept: its
    text may quote the document)."""
    if isinstance(error, (JSONTooDeep, JSONTooDense)):
        return exc.MalformedResponse(f"{what}: {error}")  # our own words, no document
    return exc.MalformedResponse(f"{what} is not valid JSON ({type(error).__name__})")


def typed_json(content: bytes, **kwargs: Any) -> Any:
    """``httpx.Response.json()`` with its failures typed (see the module docstring).

    Raises:
        MalformedResponse: ``content`` does not parse.
    """
    problem: BaseException | None = None
    try:
        return loads(content) if not kwargs else _loads_with(content, kwargs)
    except (ValueError, RecursionError) as e:
        problem = malformed("the response body", e)
    raise problem  # outside the handler: no __context__ that quotes the body


def _loads_with(content: bytes, kwargs: dict[str, Any]) -> Any:
    import json

    loads(content)  # the depth check first
    return json.loads(content, **kwargs)


class TypedEvent:
    """An SDK's SSE event whose ``json()`` raises `MalformedResponse`, not a raw error."""

    __slots__ = ("_event",)

    def __init__(self, event: Any) -> None:
        self._event = event

    def json(self) -> Any:
        problem: BaseException | None = None
        try:
            return loads(self._event.data)
        except (ValueError, RecursionError) as e:
            problem = malformed("a stream event's data", e)
        raise problem

    @property
    def data(self) -> Any:
        return self._event.data

    @property
    def event(self) -> Any:
        return self._event.event

    def __getattr__(self, name: str) -> Any:
        return getattr(self._event, name)

    def __repr__(self) -> str:
        return repr(self._event)


def unsendable_header(client: Any, options: Any) -> exc.InvalidRequestError:
    """The error for a header value the SDK could not encode (a non-ASCII API key, most
    often), naming the header and never its value."""
    names = []
    for source in ("auth_headers", "default_headers"):
        try:
            headers = getattr(client, source)
        except Exception:  # a view we only read names from
            continue
        names.append(headers)
    names.append(getattr(options, "headers", None))
    bad = [
        str(k)
        for headers in names
        if isinstance(headers, dict)
        for k, v in headers.items()
        if isinstance(v, str) and not v.isascii()
    ]
    which = f"header {bad[0].lower()!r}" if bad else "a header"
    return exc.InvalidRequestError(
        f"{which} has a character outside ASCII, which HTTP headers cannot carry "
        "(value not shown; a non-ASCII API key?)"
    )


# -- results ---------------------------------------------------------------------------------

_MODEL, _LIST, _ANY = "model", "list", "any"
# Per model class: its fields worth checking, (name, required, kind, item model or None).
_Plan = tuple[tuple[str, bool, str, type[pydantic.BaseModel] | None], ...]
_plans: dict[type[pydantic.BaseModel], _Plan] = {}
_errors: dict[type, type[Exception]] = {}


def validation_error_class(client: object) -> type[Exception]:
    """The SDK's ``APIResponseValidationError`` for a face (the SDK its class derives from)."""
    cls = type(client)
    found = _errors.get(cls)
    if found is None:
        found = exc.MalformedResponse
        for base in cls.__mro__:
            root = base.__module__.split(".")[0]
            if root not in ("stallproof", "builtins"):
                module = importlib.import_module(root)
                found = getattr(module, "APIResponseValidationError", exc.MalformedResponse)
                break
        _errors[cls] = found
    return found


def invalid_result(client: object, response: Any, body: object, path: str) -> Exception:
    """The SDK's ``APIResponseValidationError`` for a result `check_result` refused."""
    cls: Any = validation_error_class(client)
    message = f"the response lacks a required object or list, or has the wrong kind: {path}"
    if cls is exc.MalformedResponse:  # pragma: no cover - both SDKs have the class
        return exc.MalformedResponse(message, path=path)
    error: Exception = cls(response=response, body=body, message=message)
    return error


def check_result(result: object, cast_to: object) -> str | None:
    """Where ``result`` (built by the SDK for ``cast_to``) misses a required object or
    list, or holds the wrong kind there; None when it is whole."""
    kind, _ = _kind(cast_to)
    if kind in (_MODEL, _ANY):  # a model, or a union of models (stream events)
        wanted = _unwrap(cast_to)
        if not isinstance(result, wanted if kind == _MODEL else pydantic.BaseModel):
            return f"the response (a {type(result).__name__} where an object was expected)"
    if isinstance(result, pydantic.BaseModel):
        return _check_model(result, "", 0)
    return None


def _check_model(model: pydantic.BaseModel, path: str, depth: int) -> str | None:
    if depth > 64:
        return None  # the JSON depth cap keeps real documents far shallower
    for name, required, kind, item in _plan(type(model)):
        value = getattr(model, name, None)
        where = f"{path}.{name}" if path else name
        if value is None:
            if required:
                return where
            continue
        if kind == _MODEL:
            if not isinstance(value, pydantic.BaseModel):
                return where
            problem = _check_model(value, where, depth + 1)
            if problem is not None:
                return problem
        elif kind == _LIST:
            if not isinstance(value, list):
                return where
            if item is not None:
                for i, element in enumerate(value):
                    if not isinstance(element, pydantic.BaseModel):
                        return f"{where}[{i}]"
                    problem = _check_model(element, f"{where}[{i}]", depth + 1)
                    if problem is not None:
                        return problem
        elif isinstance(value, pydantic.BaseModel):  # a union of models: look inside
            problem = _check_model(value, where, depth + 1)
            if problem is not None:
                return problem
    return None


def _plan(cls: type[pydantic.BaseModel]) -> _Plan:
    plan = _plans.get(cls)
    if plan is None:
        rows: list[tuple[str, bool, str, type[pydantic.BaseModel] | None]] = []
        for name, field in cls.model_fields.items():
            kind, item = _kind(field.annotation)
            if kind is not None:
                rows.append((name, field.is_required(), kind, item))
        plan = _plans[cls] = tuple(rows)
    return plan


def _kind(annotation: Any) -> tuple[str | None, type[pydantic.BaseModel] | None]:
    """What a field holds: a model, a list (of models, or not), a union with a model in it
    (checked for None only), or a scalar (None: not checked)."""
    annotation = _unwrap(annotation)
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return _MODEL, None
    origin = typing.get_origin(annotation)
    if origin is list:
        args = typing.get_args(annotation)
        element = _unwrap(args[0]) if args else None
        model = (
            element
            if isinstance(element, type) and issubclass(element, pydantic.BaseModel)
            else None
        )
        return _LIST, model
    if origin is typing.Union or type(annotation).__name__ == "UnionType":
        members = [_unwrap(a) for a in typing.get_args(annotation) if a is not type(None)]
        if len(members) == 1:
            return _kind(members[0])  # Optional[X]: X's kind (None allowed if not required)
        if members and all(
            isinstance(a, type) and issubclass(a, pydantic.BaseModel) for a in members
        ):
            return _ANY, None
    return None, None


def _unwrap(annotation: Any) -> Any:
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation
