"""Redirects, as the engine follows them: the next request of a call after a 3xx.

The engine follows redirects itself, inside the call's one deadline (and its pacer permit,
its in-flight entry, its span), up to ``Limits.max_redirects`` hops; past that the call
fails with `TooManyRedirects`. A face's HTTP client never sees a redirect to follow, so no
hop can start a fresh deadline. What makes an answer a redirect, and the next request's
method and body, are httpx's rules (``httpx.Client._build_redirect_request``):

- 301, 302, 303, 307 and 308 with a ``Location`` header are redirects; any other 3xx is the
  answer itself;
- 303 turns any method but HEAD into GET; 301 and 302 turn POST into GET; a request that
  becomes a GET loses its body (and ``Content-Length`` / ``Transfer-Encoding``); 307 and
  308 keep both;
- ``Location`` may be relative or scheme-relative; the original fragment is not sent.

Where ours is stricter than httpx's: on a hop to another origin (scheme, host or port
differ, an http → https upgrade included) every credential is dropped — ``Authorization``,
``Proxy-Authorization``, ``Cookie``, ``api-key``, ``x-api-key``, ``x-goog-api-key``, the
headers the face names as its SDK's auth headers (`CallOptions.credentials`), and any
header whose name says it holds a credential (``auth``, ``key``, ``token``, ``secret``,
``cookie``, ``session``, ``password``, ``signature`` in it). httpx drops only
``Authorization``.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence

import httpx2

__all__ = ["REDIRECT_STATUSES", "credential_header", "next_hop", "redirect_location"]

REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})

# Always credentials, whatever the face says (the names `_redact.SECRET_HEADERS` hides).
_ALWAYS = frozenset(
    {
        b"authorization",
        b"proxy-authorization",
        b"cookie",
        b"api-key",
        b"x-api-key",
        b"x-goog-api-key",
    }
)
_LOOKS_SECRET = re.compile(rb"auth|key|token|secret|cookie|session|password|signature")
_NOT_SECRET = frozenset({b"idempotency-key"})  # same on every attempt; no one's credential
_BODY_HEADERS = frozenset({b"content-length", b"transfer-encoding"})


class BadLocation(Exception):
    """Internal: a redirect whose ``Location`` is not a URL we can send to. Its text never
    quotes the location (a query string may hold a key)."""


def redirect_location(status: int, headers: Sequence[tuple[bytes, bytes]]) -> bytes | None:
    """The ``Location`` of a redirect answer, or None when the answer is not one."""
    if status not in REDIRECT_STATUSES:
        return None
    for name, value in headers:
        if name.lower() == b"location":
            return value
    return None


def credential_header(name: bytes, marked: Collection[str] = ()) -> bool:
    """Whether a header (lower-cased ``name``) carries a credential, by the rules above."""
    if name in _ALWAYS:
        return True
    if name in _NOT_SECRET:
        return False
    return _LOOKS_SECRET.search(name) is not None or name.decode("latin-1") in marked


def next_hop(
    method: bytes,
    url: httpx2.URL,
    headers: Sequence[tuple[bytes, bytes]],
    content: bytes,
    *,
    status: int,
    location: bytes,
    credentials: Collection[str] = (),
) -> tuple[bytes, httpx2.URL, list[tuple[bytes, bytes]], bytes]:
    """The request that follows a redirect: method, URL, headers (``Host`` rewritten,
    credentials dropped on a cross-origin hop) and body.

    Raises:
        BadLocation: ``location`` is not an http(s) URL (malformed, bad port, other scheme).
    """
    try:
        target = url.join(location.decode("latin-1"))
    except (httpx2.InvalidURL, ValueError, TypeError):
        raise BadLocation("the redirect's Location is not a valid URL") from None
    if target.scheme not in ("http", "https") or not target.host:
        raise BadLocation("the redirect's Location is not an http(s) URL")
    if target.port is not None and not 0 < target.port < 65536:
        raise BadLocation(f"the redirect's Location has port {target.port} (not 1-65535)")
    target = target.copy_with(fragment=None)
    new_method = method
    if (status == 303 and method != b"HEAD") or (status in (301, 302) and method == b"POST"):
        new_method = b"GET"
    cross = _origin(target) != _origin(url)
    kept: list[tuple[bytes, bytes]] = [(b"host", target.netloc)]
    for name, value in headers:
        low = name.lower()
        if low == b"host":
            continue
        if cross and credential_header(low, credentials):
            continue
        if new_method != method and low in _BODY_HEADERS:
            continue
        kept.append((name, value))
    return new_method, target, kept, (b"" if new_method != method else content)


def _origin(url: httpx2.URL) -> tuple[str, str, int]:
    port = url.port or (443 if url.scheme == "https" else 80)
    return (url.scheme, url.host, port)
