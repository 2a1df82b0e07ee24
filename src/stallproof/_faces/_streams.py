"""An SDK's stream object that a caller can drop: freed (and its call ended) at once.

openai's ``AsyncStream`` makes its iterator in its constructor, ``self._iterator =
self.__stream__()``: a generator whose frame holds the stream, so the stream is in a
reference cycle and a stream dropped unread waits for a full garbage collection (and
under plain httpx, the response and its stream make one more: `_unbind`) — with it the
engine's `ResponseBody`, and so the call's pacer permit and pool slot (0 of 29 later
calls got through a ``max_concurrent=1`` pacer). `without_cycle` gives the stream an
iterator made by a shallow twin of it, which holds the same response, decoder and client
but not the stream: nothing refers back to the stream, so dropping it frees the chain
down to the body at once, and the body's finaliser ends the call (as for
`stallproof.Client`'s streams). anthropic's stream makes its iterator lazily and needs
nothing.
"""

from __future__ import annotations

import copy
import weakref
from typing import Any

__all__ = ["without_cycle"]


def without_cycle(result: Any) -> Any:
    """``result`` itself; if it is an SDK stream holding a generator of its own, that
    generator is replaced by one of a twin that does not refer back to it."""
    state = getattr(result, "__dict__", None)
    make = getattr(type(result), "__stream__", None)
    if state is None or make is None or "_iterator" not in state or "response" not in state:
        return result
    twin = copy.copy(result)
    twin._iterator = None  # the generator the constructor made refers to ``result``
    result._iterator = make(twin)
    _unbind(state["response"])
    return result


def _unbind(response: Any) -> None:
    """Plain httpx (under openai < 3) binds a response's stream back to the response
    (``BoundAsyncStream._response``, to stamp ``elapsed`` on close): one more cycle that
    waits for a full collection. The stream keeps a weak reference instead; the response
    is alive whenever its stream is closed through it. httpx2 has no such back reference."""
    stream = getattr(response, "stream", None)
    bound = getattr(stream, "_response", None)
    if bound is response:
        stream._response = weakref.proxy(response)  # type: ignore[union-attr]
