"""`check_base_url`: the one rule for a client's ``base_url`` (`Client` and the SDK faces).

A base URL is an absolute http(s) URL with a host and a port in range, and nothing else:

- **no credentials** (``https://user:KEY@host/v1``): refused, not sent and not dropped
  silently. The native client used to drop them, while the plain SDKs send them as
  ``Authorization: Basic`` in place of the API key. Pass the key as ``api_key=``, or a
  ``Basic`` ``Authorization`` header in ``default_headers=``;
- **no query or fragment** (``?api-key=KEY``): requests are made by joining a path to the
  base URL, which drops its query (``Client``) or glues the path after it (the SDKs): the
  query never reached the server as written. Query parameters go in ``default_query=``.

Every message shows the URL without its userinfo, query and fragment, and is raised
outside any ``except`` block: no ``__context__`` (suppressed or not) holds the value.
"""

from __future__ import annotations

import httpx
import httpx2

from ._exceptions import InvalidRequestError
from ._redact import safe_url

__all__ = ["check_base_url", "is_host_name"]

# httpx's own limit on a URL's length (``httpx._urlparse.MAX_URL_LENGTH``), checked first
# so that a huge value costs nothing more.
_MAX_LENGTH = 65536


def _shown(text: str) -> str:
    """``text`` as an error may show it: no userinfo, query or fragment."""
    for mark in "?#":
        text = text.partition(mark)[0]
    return safe_url(text)


def check_base_url(value: object, name: str = "base_url") -> httpx.URL:
    """``value`` (a str, ``httpx.URL`` or ``httpx2.URL``) as an ``httpx.URL``.

    Raises:
        InvalidRequestError: not a str or URL, too long, not an absolute http(s) URL with
            a host, a port out of range, a host with spaces or control characters,
            credentials, a query or a fragment. The message names ``name`` and shows the
            URL without its userinfo, query and fragment.
    """
    if isinstance(value, (httpx.URL, httpx2.URL)):
        text = str(value)
    elif isinstance(value, str):
        text = value
    else:
        raise InvalidRequestError(f"{name} must be a str or a URL, got {type(value).__name__}")
    if len(text) > _MAX_LENGTH:
        raise InvalidRequestError(
            f"{name} is {len(text)} characters long, more than a URL may be ({_MAX_LENGTH})"
        )
    shown = _shown(text)
    authority = text.partition("://")[2]
    for mark in "/?#":
        authority = authority.partition(mark)[0]
    if "@" in authority:
        raise InvalidRequestError(
            f"{name} may not hold credentials (user:password@), got {shown!r}: pass the key "
            "as api_key=, or an Authorization header in default_headers="
        )
    if "?" in text or "#" in text:
        raise InvalidRequestError(
            f"{name} may not have a query or fragment, got {shown!r} (query not shown): "
            "pass query parameters in default_query="
        )
    problem: str | None = None
    try:
        url = httpx.URL(text)
    except httpx.InvalidURL as e:
        problem = str(e)  # raised below, outside the handler: no __context__
    if problem is not None:
        raise InvalidRequestError(f"{name} is not a valid URL ({problem}): {shown!r}")
    if url.scheme not in ("http", "https") or not url.host:
        raise InvalidRequestError(f"{name} must be an absolute http(s) URL, got {shown!r}")
    if url.port is not None and not 0 < url.port < 65536:
        raise InvalidRequestError(f"{name} port {url.port} is out of range (1-65535)")
    if not is_host_name(url.host):
        raise InvalidRequestError(f"{name} host {url.host!r} is not a host name")
    return url


def is_host_name(host: str) -> bool:
    """Whether ``host`` (an httpx URL's ``host``: decoded IDNA, IPv6 without brackets) could
    be a host: httpx percent-encodes a space into it, and no resolver answers for that."""
    return bool(host) and host.isprintable() and not any(c in host for c in "% ")
