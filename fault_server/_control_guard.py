"""`ControlGuard`: the ``/_fault/`` control API answers test code, never a web page.

The server listens on loopback, but a browser on the same machine can reach loopback too: a
page could ``fetch()`` a cross-site ``POST /_fault/scenarios`` with ``Content-Type:
text/plain`` (a "simple" request: no CORS preflight) and arm faults, or rebind its own DNS
name to 127.0.0.1 and then talk to the server as if same-origin. So, before any route runs:

- ``Origin`` (sent by browsers) must be the server's own origin (``http://`` + ``Host``),
  and ``Sec-Fetch-Site``, when sent, ``same-origin`` or ``none``: else 403.
- A write (``POST``, ``PUT``, ``DELETE``) must name a ``Host`` that is an IP address or
  ``localhost`` (a rebound DNS name is neither): else 403. A rebound page is same-origin
  for its browser, so without this check it could ``DELETE`` the armed scenarios, the mix,
  the fixtures. Reads are answered whatever the ``Host``: they reveal what the server saw,
  never a secret.
- A write with a body must say ``Content-Type: application/json``, which a page cannot send
  without a preflight this server never approves: else 415.
- With a token (``--control-token``, ``FaultServer(control_token=...)``), every control
  request must carry it, as ``Authorization: Bearer <token>`` or ``X-Fault-Token``: else 401.
  The token also admits a write whose ``Host`` is a name (a container's service name, say).

The Python methods (`FaultServer.scenario`...) do not go through HTTP and need none of this.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from ._openai import Whole, error

__all__ = ["ControlGuard"]

_WRITES = ("POST", "PUT", "DELETE")
_SAME_SITE = ("same-origin", "none")


@dataclass(frozen=True, slots=True)
class ControlGuard:
    """Who may use the control API. ``token`` None: loopback callers need none.

    Raises:
        ValueError: for a token that is empty, not text, or not printable ASCII.
    """

    token: str | None = None

    def __post_init__(self) -> None:
        token = self.token
        if token is not None and (
            not isinstance(token, str)
            or not token
            or not token.isascii()
            or not token.isprintable()
            or token != token.strip()
        ):
            raise ValueError("control_token must be non-empty printable ASCII without spaces")

    def __repr__(self) -> str:
        return f"ControlGuard(token={'***' if self.token else None})"

    def refusal(
        self, method: str, body: bytes, headers: Iterable[tuple[bytes, bytes]]
    ) -> Whole | None:
        """The error to answer instead of running the control request, or None to run it."""
        fields: dict[bytes, str] = {}
        for name, value in headers:
            fields.setdefault(name.lower(), value.decode("latin-1").strip())
        host = fields.get(b"host", "")
        origin = fields.get(b"origin")
        if origin is not None and not _same_origin(origin, host):
            return _forbidden(f"a request from origin {origin!r} (cross-site)")
        site = fields.get(b"sec-fetch-site")
        if site is not None and site.lower() not in _SAME_SITE:
            return _forbidden(f"a request with Sec-Fetch-Site: {site!r} (cross-site)")
        authorised = False
        if self.token is not None:
            given = fields.get(b"x-fault-token") or _bearer(fields.get(b"authorization", ""))
            if given is None or not hmac.compare_digest(given.encode(), self.token.encode()):
                return error(
                    401,
                    "the control API needs its token: Authorization: Bearer <token> "
                    "or X-Fault-Token: <token>",
                    code="invalid_control_token",
                )
            authorised = True
        if method not in _WRITES:
            return None
        if not authorised and not _local_host(host):
            return _forbidden(
                f"a write for Host {host!r}, which is neither an IP address nor localhost "
                "(a DNS-rebinding guard; start the server with a control token to allow it)"
            )
        if method == "DELETE" and not body:  # nothing to say Content-Type about.
            return None
        media = fields.get(b"content-type", "").partition(";")[0].strip().lower()
        if media != "application/json":
            return error(
                415,
                f"control writes need Content-Type: application/json, got {media or 'none'!r}",
                code="unsupported_media_type",
            )
        return None


def _forbidden(what: str) -> Whole:
    return error(403, f"the control API refuses {what}", code="cross_site_control")


def _bearer(value: str) -> str | None:
    scheme, _, credentials = value.partition(" ")
    return credentials.strip() if scheme.lower() == "bearer" and credentials.strip() else None


def _hostname(host: str) -> str:
    """The name of a ``Host`` value (``[::1]:80`` -> ``::1``, ``a:80`` -> ``a``)."""
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def _local_host(host: str) -> bool:
    name = _hostname(host).lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _same_origin(origin: str, host: str) -> bool:
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and bool(host) and parts.netloc.lower() == host.lower()
