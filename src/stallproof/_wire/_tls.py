"""One SSL context per process for https: certifi's roots, built on first use, then shared.

httpcore2 builds a new context for every https connection it opens when it is given none
(its ``default_ssl_context``: 0.2 s the first time in a process, as it imports truststore,
then ~25 ms per connection loading the system's certificates). A context is safe to share
between connections, pools and clients (OpenSSL reference-counts it), so stallproof's pools
build one, the first time an https connection needs it, and every later one reuses it.

Which roots: as httpx's default, ``SSL_CERT_FILE`` or ``SSL_CERT_DIR`` if set (read when the
context is built), else certifi's bundle. A caller who needs anything else passes their own
``ssl_context`` (or their own httpx client) and this module is not used.
"""

from __future__ import annotations

import os
import ssl
import threading

__all__ = ["shared_ssl_context"]

_lock = threading.Lock()
_context: ssl.SSLContext | None = None


def shared_ssl_context() -> ssl.SSLContext:
    """The process's https context, built on the first call (~15-20 ms), then cached."""
    context = _context
    if context is None:
        context = _build_once()
    return context


def _build_once() -> ssl.SSLContext:
    global _context
    with _lock:  # two threads' first calls build it once
        if _context is None:
            _context = _build()
        return _context


def _build() -> ssl.SSLContext:
    cafile = os.environ.get("SSL_CERT_FILE")
    if cafile:
        return ssl.create_default_context(cafile=cafile)
    capath = os.environ.get("SSL_CERT_DIR")
    if capath:
        return ssl.create_default_context(capath=capath)
    import certifi

    return ssl.create_default_context(cafile=certifi.where())
