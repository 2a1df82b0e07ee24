"""A misbehaving OpenAI-compatible server, to prove that LLM calls cannot hang.

Every request meets a fault — named by its path, ``/fault/<name>;k=v/v1/...``, or an
``X-Fault: <name>;k=v`` header, or armed on the server by a test (`FaultServer.scenario`,
`FaultServer.set_mix`, or the ``/_fault/`` control API) — and the server commits it below
HTTP where it must: half-open connections, stalled or trickled heads and bodies, keep-alive
pings, RSTs, half-closes, lying Content-Lengths, broken SSE and OpenAI chunks. Every fault
ends by itself within its ``hold``. The server keeps a journal of what each connection did
and judges the client from it (`FaultServer.verdict`). With ``upstream=`` it is a proxy that
injects the same faults into a real server's answers, and can record them for ``replay=``.
Besides OpenAI chat completions it speaks Anthropic Messages, the OpenAI Responses API,
embeddings and the model list; with ``tls=True`` it serves all of it over TLS as well.

Example:
    >>> from fault_server import FaultServer
    >>> async with FaultServer() as srv:  # doctest: +SKIP
    ...     client = openai.AsyncOpenAI(base_url=srv.url("trickle_body", interval=0.5))
"""

from __future__ import annotations

from ._journal import ConnectionRecord, RequestRecord
from ._mix import Mix
from ._proxy_recording import RecordingError
from ._runner import ServerThread, running
from ._scenarios import Match, Rule
from ._scope import FaultScope
from ._server import FaultServer
from ._spec import (
    FAULTS,
    GENERIC_PARAMS,
    FaultInfo,
    FaultSpec,
    FaultSpecError,
    ParamInfo,
    parse_fault,
)
from ._stats import KeyStats, ServerStats
from ._verdict import RetryAfterCheck, Verdict

__all__ = [
    "ConnectionRecord",
    "FaultInfo",
    "FAULTS",
    "FaultScope",
    "FaultServer",
    "FaultSpec",
    "FaultSpecError",
    "GENERIC_PARAMS",
    "KeyStats",
    "Match",
    "Mix",
    "ParamInfo",
    "parse_fault",
    "RecordingError",
    "RequestRecord",
    "RetryAfterCheck",
    "Rule",
    "running",
    "ServerStats",
    "ServerThread",
    "Verdict",
]

for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type) or callable(_obj):
        _obj.__module__ = __name__
del _name, _obj
