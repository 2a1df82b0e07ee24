"""The SDK's own constructor arguments, checked before the SDK sees them.

The SDKs take ``base_url``, ``api_key`` (and anthropic's ``auth_token``),
``default_headers`` and ``default_query`` as given and fail later, at the first call or
deep inside httpx: a raw ``httpx2.InvalidURL`` or ``TypeError`` from the constructor, or an
``APIConnectionError`` whose chain quotes a header value. A face checks them first, with
the rules `Client` applies (`stallproof._base_url`, `stallproof._redact`), and raises an
`InvalidRequestError` that names the argument and never shows a secret.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from .. import _exceptions as exc
from .._base_url import check_base_url
from .._redact import header_problem

__all__ = ["check_call_options", "check_sdk_arguments", "unbuildable"]


def _omitted(value: object) -> bool:
    """The SDK's ``NOT_GIVEN`` / ``Omit()`` (openai's or anthropic's: by name, so that a face
    imports only its own SDK)."""
    return type(value).__name__ in ("NotGiven", "Omit")


def check_sdk_arguments(
    kwargs: Mapping[str, Any], *, base_url_env: str, secrets: Mapping[str, str]
) -> None:
    """Check the SDK arguments in ``kwargs``: ``base_url`` (or the environment variable
    ``base_url_env`` the SDK reads when it is not given), the key arguments ``secrets``
    (argument name -> the environment variable read when it is not given),
    ``default_headers`` and ``default_query``.

    Raises:
        InvalidRequestError: the first bad one, by name (a value that may be secret is
            never shown).
    """
    base_url = kwargs.get("base_url")
    if base_url is None or _omitted(base_url):
        base_url = os.environ.get(base_url_env) or None
        name = base_url_env
    else:
        name = "base_url"
    if base_url is not None:
        check_base_url(base_url, name)
    for key, variable in secrets.items():
        value = kwargs.get(key)
        if value is None or _omitted(value):
            value, key = os.environ.get(variable), variable
        if isinstance(value, str):
            _check_value(key, value)
        elif value is not None and not callable(value):  # openai takes a key provider
            raise exc.InvalidRequestError(f"{key} must be a str, got {type(value).__name__}")
    _check_headers("default_headers", kwargs.get("default_headers"))
    _check_query("default_query", kwargs.get("default_query"))


def check_call_options(options: Any) -> None:
    """Check what one call adds (the SDK's ``FinalRequestOptions``): ``extra_headers``
    and ``extra_query``, as the constructor's defaults are checked."""
    _check_headers("extra_headers", getattr(options, "headers", None))
    _check_query("extra_query", getattr(options, "params", None))


def unbuildable(sdk: str, error: BaseException) -> exc.InvalidRequestError:
    """The error for arguments the SDK could not build a request from (a ``TypeError``,
    ``ValueError`` or ``InvalidURL`` from inside it): typed, and quoting no value (only an
    ``InvalidURL``'s message, which names the part of the URL)."""
    detail = type(error).__name__
    if type(error).__name__ == "InvalidURL":
        detail += f": {str(error)[:200]}"
    return exc.InvalidRequestError(
        f"the {sdk} SDK could not build the request from the arguments given ({detail}; "
        "any value it quoted is not shown)"
    )


def _check_headers(where: str, headers: object) -> None:
    if headers is None or _omitted(headers):
        return
    if not isinstance(headers, Mapping):
        raise exc.InvalidRequestError(f"{where} must be a mapping, got {type(headers).__name__}")
    for header, value in headers.items():
        _check_header(where, header, value)


def _check_query(where: str, query: object) -> None:
    if query is not None and not _omitted(query) and not isinstance(query, Mapping):
        raise exc.InvalidRequestError(f"{where} must be a mapping, got {type(query).__name__}")


def _check_header(where: str, name: object, value: object) -> None:
    if not isinstance(name, str) or not name.isascii() or not name:
        shown = name[:60] if isinstance(name, str) else type(name).__name__
        raise exc.InvalidRequestError(
            f"{where}: a header name must be a non-empty ASCII str, got {shown!r}"
        )
    if _omitted(value):  # the SDK's "leave this header out"
        return
    if not isinstance(value, str):
        raise exc.InvalidRequestError(
            f"{where}: header {name.lower()!r} must have a str value, got {type(value).__name__}"
        )
    if not value.isascii():
        raise exc.InvalidRequestError(
            f"{where}: header {name.lower()!r} has a character outside ASCII, which "
            "HTTP headers cannot carry (value not shown)"
        )
    problem = header_problem(name.encode("ascii"), value.encode("ascii"))
    if problem is not None:
        raise exc.InvalidRequestError(f"{where}: {problem}")


def _check_value(key: str, value: str) -> None:
    """A key sent in a header: ASCII, no control characters, no surrounding whitespace."""
    if not value.isascii():
        raise exc.InvalidRequestError(
            f"{key} has a character outside ASCII, which HTTP headers cannot carry "
            "(value not shown)"
        )
    if header_problem(b"x", value.encode("ascii")) is not None:
        # A key read from a file often ends in a newline. Never echo it.
        raise exc.InvalidRequestError(
            f"{key} has surrounding whitespace or a control character (value not shown)"
        )
