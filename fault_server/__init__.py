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
Fixtures (`FaultServer.fixture`, ``fixtures=FILE``) script whole conversations: canned
replies and tool calls for the requests that match; ``GET /metrics`` shows the requests in
flight to Prometheus, under vLLM's and SGLang's names too.

Example:
    >>> from fault_server import FaultServer
    >>> async with FaultServer() as srv:  # doctest: +SKIP
    ...     client = openai.AsyncOpenAI(base_url=srv.url("trickle_body", interval=0.5))

Where things are (private modules; the public names are re-exported here):

=========================== ==============================================================
module                      what is in it
=========================== ==============================================================
**the faults**
`_catalogue`                ``FAULTS`` and ``BEHAVIOURS``, joined from the groups below
`_registry`                 `FaultGroup`: a fault's catalogue entry declared on its code
`_faults_socket`            socket group: half_open, slow_accept, refuse, tls_stall,
                            slicer, reset, close_mid_body, half_close, cut_after
`_faults_http`              http group: stall_headers, stall_in_headers, trickle_headers,
                            trickle_body, content_length_lie, chunked_no_end, endless_body,
                            huge_body
`_faults_sse`               sse group: sse_keepalive, sse_pings, sse_empty_deltas,
                            sse_stall, no_done, done_then_hold, data_after_done,
                            malformed_json, error_event, sse_crlf, sse_multiline,
                            sse_long_line, endless_line, bad_usage, tool_split, index_gap,
                            tool_args_unclosed, json_for_stream
`_faults_status`            status group: status, rate_limit (its buckets: `_buckets`)
`_faults_time`              time group: slow_first_token, token_rate
`_sending`                  what most faults are made of: the healthy answer, or its start
`_tool_calls`               the tool-call answers the tool faults make up
`_params`, `_spec`          parameters; the spec parser (``name;k=v``, `parse_fault`)
**the answers**
`_answer`                   the healthy answer a fault delivers: `Whole` or `Frames`
`_formats`                  the APIs served, by path: `_openai`, `_anthropic`, `_responses`
`_structured`               the JSON content answering a structured-output request, and
                            a tool call's arguments from the tool's schema
`_tools`                    which tool an answer calls, as each API offers and chooses
`_fixtures`                 canned replies, tool calls and faults for matching requests
**proxy mode**
`_proxy`                    ``upstream=``: a real server's answers, faults injected
`_proxy_recording`          ``record=``: the exchanges with the upstream, to a file
`_proxy_replay`             ``replay=``: answers from that file, no upstream
**the wire**
`_wire_accept`              the accept loop (connection cap, calm under EMFILE)
`_wire_connection`          one connection: reads requests (h11), picks and runs the fault
`_wire_exchange`            one request/response: `Exchange`, every write and stall
`_wire_tls`                 the TLS listener (``tls=True``)
`_wire_blackhole`           ``blackhole_url``: a listener that never accepts
`_wire_refused`             ``refused_url``: a port where nothing listens
**the server and its controls**
`_server`                   `FaultServer`: the listeners, their tasks, start and close
`_server_thread`            `ServerThread`, `running`: a `FaultServer` in its own thread
`_control_surface`          `ServerControls`: the methods both share (scenarios, mix,
                            stats, journal, verdicts, URLs)
`_scope`                    `FaultScope`: one test's view through its key
`_control_api`              the ``/_fault/`` HTTP control API; `_control_guard` guards it,
                            `_control_worker` runs it in a thread off the loop
`_state`                    what every connection shares; `_scenarios`, `_mix`, `_stats`,
                            `_journal`, `_bounded` are its parts
`_verdict`                  `Verdict`: how a client behaved, judged from the journal
`_metrics`                  ``GET /metrics``: requests in flight by phase, for Prometheus
`_cli`, `pytest_plugin`     ``fault-server`` on the command line; the pytest fixtures
=========================== ==============================================================
"""

from __future__ import annotations

from ._fixtures import Fixture, FixtureMatch
from ._journal import ConnectionRecord, RequestRecord
from ._mix import Mix
from ._proxy_recording import RecordingError
from ._scenarios import Match, Rule
from ._scope import FaultScope
from ._server import FaultServer
from ._server_thread import ServerThread, running
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
    "Fixture",
    "FixtureMatch",
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
