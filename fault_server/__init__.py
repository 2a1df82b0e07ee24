"""A misbehaving OpenAI-compatible server, to prove that LLM calls cannot hang.

Every request picks a fault — from its path, ``/fault/<name>;k=v/v1/...``, or an ``X-Fault:
<name>;k=v`` header — and the server commits it below HTTP where it must: half-open
connections, stalled headers, trickled bodies, keep-alive pings, RSTs, lying
Content-Lengths. Every fault ends by itself within its ``hold``.

Example:
    >>> from fault_server import FaultServer
    >>> async with FaultServer() as srv:  # doctest: +SKIP
    ...     client = openai.AsyncOpenAI(base_url=srv.url("trickle_body", interval=0.5))
"""

from __future__ import annotations

from ._faults import (
    FAULTS,
    GENERIC_PARAMS,
    FaultInfo,
    FaultSpec,
    FaultSpecError,
    ParamInfo,
    parse_fault,
)
from ._runner import ServerThread, running
from ._server import FaultServer
from ._stats import KeyStats, ServerStats

__all__ = [
    "FaultInfo",
    "FAULTS",
    "FaultServer",
    "FaultSpec",
    "FaultSpecError",
    "GENERIC_PARAMS",
    "KeyStats",
    "ParamInfo",
    "parse_fault",
    "running",
    "ServerStats",
    "ServerThread",
]

for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type) or callable(_obj):
        _obj.__module__ = __name__
del _name, _obj
