"""A `Client`'s settings as openai names them, frozen, and the requests they make.

``with_options()`` changes settings by copy (`Settings.replace`); the engine (pool, retry
budget, breaker, pacer) is shared between the copies, as openai shares its http client.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import httpx
from openai import NOT_GIVEN

from . import _exceptions as exc
from ._base_url import check_base_url
from ._config import UNSET, Timeouts
from ._engine import CallOptions, Outgoing
from ._faces._compat import retry_from, timeouts_from
from ._policies import Retry
from ._redact import header_problem
from ._request import encode_json, is_omitted
from ._version import __version__

__all__ = ["DEFAULT_BASE_URL", "Settings", "encode_headers"]

DEFAULT_BASE_URL = "https://api.openai.com/v1"
_NO_RETRY = Retry(attempts=1)
_USER_AGENT = f"stallproof/{__version__}"
# What with_options() may change: the rest (limits, pool, pacer...) belongs to the engine.
_CHANGEABLE = frozenset(
    {
        "base_url",
        "api_key",
        "organization",
        "project",
        "timeout",
        "max_retries",
        "retry",
        "default_headers",
        "default_query",
    }
)


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    """What a `Client` sends with every call. Build with `make`; secrets stay out of repr."""

    base_url: httpx.URL
    api_key: str | None = dataclasses.field(repr=False)
    organization: str | None
    project: str | None
    timeout: Timeouts
    retry: Retry
    # Headers and queries may carry keys (Azure's api-key): none of them in a repr.
    default_headers: Mapping[str, str] = dataclasses.field(repr=False)
    default_query: Mapping[str, object] = dataclasses.field(repr=False)
    headers: tuple[tuple[bytes, bytes], ...] = dataclasses.field(repr=False)
    query: bytes = dataclasses.field(repr=False)
    # URL.join costs ~0.4 ms, a third of our per-call overhead: once per path.
    _targets: dict[str, bytes] = dataclasses.field(default_factory=dict, repr=False)

    @classmethod
    def make(
        cls,
        *,
        base_url: object = None,
        api_key: object = None,
        organization: object = None,
        project: object = None,
        timeout: object = NOT_GIVEN,
        max_retries: object = None,
        retry: object = UNSET,
        default_headers: Mapping[str, str] | None = None,
        default_query: Mapping[str, object] | None = None,
    ) -> Settings:
        """Validate openai's client arguments; env vars fill what is not given, as in openai.

        ``timeout``: a number (the total budget), a `Timeouts` or an ``httpx.Timeout`` /
        ``httpx2.Timeout``; ``max_retries=n`` means ``Retry(attempts=n + 1)``; ``retry``
        sets the whole policy (None: never retry); giving both is an error. Both are read
        by `stallproof._faces._compat`, as for the SDK faces.
        """
        base_url = _given(base_url) or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL
        api_key = _given(api_key) or os.environ.get("OPENAI_API_KEY") or None
        organization = _given(organization) or os.environ.get("OPENAI_ORG_ID") or None
        project = _given(project) or os.environ.get("OPENAI_PROJECT_ID") or None
        for name, value in (("api_key", api_key), ("organization", organization)):
            if value is not None and not isinstance(value, str):
                raise exc.InvalidRequestError(f"{name} must be a str, got {type(value).__name__}")
        if project is not None and not isinstance(project, str):
            raise exc.InvalidRequestError(f"project must be a str, got {type(project).__name__}")
        if api_key and (api_key != api_key.strip() or not api_key.isprintable()):
            # A key read from a file often ends in a newline. Never echo it.
            raise exc.InvalidRequestError(
                "api_key has surrounding whitespace or a control character (value not shown)"
            )
        url = check_base_url(base_url)
        url = url.copy_with(path=url.path.rstrip("/") + "/")
        timeouts = timeouts_from(timeout, Timeouts(), refuse_none=True)
        policy = retry_from(retry, max_retries)
        headers = {"user-agent": _USER_AGENT, "accept": "application/json"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        if organization:
            headers["openai-organization"] = organization
        if project:
            headers["openai-project"] = project
        if default_headers is not None and not isinstance(default_headers, Mapping):
            kind = type(default_headers).__name__
            raise exc.InvalidRequestError(f"default_headers must be a mapping, got {kind}")
        for name in default_headers or {}:
            _refuse_framing(name, "default_headers")
        headers.update(default_headers or {})
        if default_query is not None and not isinstance(default_query, Mapping):
            raise exc.InvalidRequestError(
                f"default_query must be a mapping, got {type(default_query).__name__}"
            )
        return cls(
            base_url=url,
            api_key=api_key,
            organization=organization,
            project=project,
            timeout=timeouts,
            retry=Retry() if policy is UNSET else _NO_RETRY if policy is None else policy,
            default_headers=dict(default_headers or {}),
            default_query=dict(default_query or {}),
            headers=tuple(encode_headers(headers)),
            query=_encode_query(default_query),
        )

    def replace(self, changes: Mapping[str, Any]) -> Settings:
        """These settings with openai's ``with_options`` changes applied."""
        unknown = set(changes) - _CHANGEABLE
        if unknown:
            raise TypeError(
                f"with_options() got unexpected keyword argument(s) {sorted(unknown)}; "
                f"it changes {sorted(_CHANGEABLE)} (make a new Client for the others)"
            )
        inputs: dict[str, Any] = {
            "base_url": self.base_url,
            "api_key": self.api_key,
            "organization": self.organization,
            "project": self.project,
            "timeout": self.timeout,
            "retry": self.retry,
            "default_headers": self.default_headers,
            "default_query": self.default_query,
        }
        if "max_retries" in changes and "retry" not in changes:
            del inputs["retry"]  # the new count replaces the old policy
        inputs.update(changes)
        if "timeout" in changes:
            inputs["timeout"] = timeouts_from(changes["timeout"], self.timeout, refuse_none=True)
        return Settings.make(**inputs)

    # -- requests ------------------------------------------------------------------------

    def target(self, path: str) -> bytes:
        target = self._targets.get(path)
        if target is None:
            target = self.base_url.join(path).raw_path
            if self.query:
                target += (b"&" if b"?" in target else b"?") + self.query
            self._targets[path] = target
        return target

    def outgoing(
        self,
        method: bytes,
        path: str,
        body: Mapping[str, Any] | None,
        options: CallOptions,
        *,
        stream: bool,
    ) -> Outgoing:
        """The request for ``path`` (relative to ``base_url``) with the default headers."""
        headers = list(self.headers)
        if stream:
            headers = [(k, v) for k, v in headers if k != b"accept"]
            headers.append((b"accept", b"text/event-stream"))
        content = b""
        if body is not None:
            content = encode_json(body)
            headers.append((b"content-type", b"application/json"))
            headers.append((b"content-length", str(len(content)).encode()))
        url = self.base_url
        return Outgoing(
            method,
            url.raw_scheme,
            url.raw_host,
            url.port,
            self.target(path),
            headers,
            content,
            options=options,
            body=body,
        )

    @staticmethod
    def add_headers(out: Outgoing, extra: Mapping[str, str | None] | None) -> None:
        """Per-call headers over the defaults; a None value removes one (openai's way)."""
        if not extra:
            return
        if not isinstance(extra, Mapping):
            raise exc.InvalidRequestError(
                f"extra_headers must be a mapping, got {type(extra).__name__}"
            )
        headers = out.headers
        for name, value in extra.items():
            if is_omitted(value):
                continue
            key = _encode_name(name)
            _refuse_framing(name, "extra_headers")
            headers[:] = [(k, v) for k, v in headers if k != key]
            if value is not None:
                headers.append((key, _encode_value(name, value)))

    @staticmethod
    def add_query(out: Outgoing, extra: Mapping[str, object] | None) -> None:
        if extra:
            query = _encode_query(extra)
            out.target += (b"&" if b"?" in out.target else b"?") + query


def _given(value: object) -> Any:
    """None for openai's NOT_GIVEN / omit (and for None), else the value."""
    return None if is_omitted(value) else value


def _encode_query(query: Mapping[str, object] | None) -> bytes:
    if not query:
        return b""
    if not isinstance(query, Mapping):
        raise exc.InvalidRequestError(f"query must be a mapping, got {type(query).__name__}")
    items = {k: v for k, v in query.items() if not is_omitted(v) and v is not None}
    return str(httpx.QueryParams(items)).encode()  # type: ignore[arg-type]


# Headers that frame the request on the wire: set from the body and the URL only.
_FRAMING = frozenset({"content-length", "host", "transfer-encoding", "connection"})


def _refuse_framing(name: object, where: str) -> None:
    if isinstance(name, str) and name.lower() in _FRAMING:
        raise exc.InvalidRequestError(
            f"{where} may not set {name!r}: stallproof frames the request"
        )


def _encode_name(name: object) -> bytes:
    if not isinstance(name, str) or not name or not name.isascii():
        raise exc.InvalidRequestError(f"header name must be a non-empty ASCII str, got {name!r}")
    encoded = name.lower().encode("ascii")
    problem = header_problem(encoded, b"")
    if problem is not None:
        raise exc.InvalidRequestError(problem)
    return encoded


def _encode_value(name: str, value: object) -> bytes:
    # The value may be a secret: never echo it in the message.
    if not isinstance(value, str):
        raise exc.InvalidRequestError(f"header {name!r} must have a str value")
    if value != value.strip() or any(c in value for c in "\r\n\0"):
        raise exc.InvalidRequestError(
            f"header {name!r} has surrounding whitespace or a control character in its "
            "value (value not shown)"
        )
    try:
        return value.encode("latin-1")
    except UnicodeEncodeError:
        pass  # raised below, outside the handler: the codec's error quotes the value
    raise exc.InvalidRequestError(
        f"header {name!r} has a character that cannot be sent in HTTP (value not shown)"
    )


def encode_headers(headers: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
    return [(_encode_name(k), _encode_value(k, v)) for k, v in headers.items()]
