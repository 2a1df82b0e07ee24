"""An SDK's stream object that a caller can drop: freed (and its call ended) at once.

openai's ``AsyncStream`` makes its iterator in its constructor,
``self._iterator = self.__stream__()``: a generator whose frame holds the stream, so the
stream is in a reference cycle and a stream dropped unread waits for a full garbage
collection — with it the engine's `ResponseBody`, and so the call's pacer permit and pool
slot (0 of 29 later calls got through a ``max_concurrent=1`` pacer). `without_cycle`
gives the stream an iterator made by a shallow twin of it, which holds the same response,
decoder and client but not the stream: nothing refers back to the stream, so dropping it
frees the chain down to the body at once, and the body's finaliser ends the call (as for
`stallproof.Client`'s streams). anthropic's stream makes its iterator lazily and needs
nothing.
"""

from __future__ import annotations

import copy
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
    return result
