"""The fault catalogue: every way the server can misbehave, with its parameters.

Built from one registry: each group module declares its faults on their behaviours
(`_registry.FaultGroup`), and this module joins them in the order of docs/fault_server.md:
``healthy``, then the faults by the layer they break:

=========== ====================== ==========================================================
group       module                 faults
=========== ====================== ==========================================================
socket      `_faults_socket`       half_open, slow_accept, refuse, tls_stall, slicer, reset, ...
http        `_faults_http`         stall_headers, trickle_headers, trickle_body, huge_body, ...
sse         `_faults_sse`          sse_keepalive, sse_pings, sse_stall, no_done, tool_split, ...
status      `_faults_status`       status, rate_limit
time        `_faults_time`         slow_first_token, token_rate
=========== ====================== ==========================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from ._faults_http import HTTP
from ._faults_socket import SOCKET
from ._faults_sse import SSE
from ._faults_status import STATUS
from ._faults_time import TIME
from ._params import FaultInfo
from ._registry import ConnectionBehaviour, Fault
from ._sending import Behaviour, healthy

__all__ = ["BEHAVIOURS", "CONNECTION_BEHAVIOURS", "CONNECTION_FAULTS", "FAULTS"]

_HEALTHY = Fault(
    FaultInfo("healthy", "A normal response; with delay/token_interval, healthy but slow."),
    healthy,
)

_REGISTRY: tuple[Fault, ...] = (
    _HEALTHY,
    *SOCKET.faults,
    *HTTP.faults,
    *SSE.faults,
    *STATUS.faults,
    *TIME.faults,
)

FAULTS: Mapping[str, FaultInfo] = MappingProxyType({f.info.name: f.info for f in _REGISTRY})
"""Every fault's catalogue entry, by name."""

BEHAVIOURS: Mapping[str, Behaviour] = MappingProxyType(
    {f.info.name: f.behaviour for f in _REGISTRY}
)
"""What each fault does to a request whose head is read; keyed like `FAULTS`.

None of them bounds itself: the connection runs each one under ``hold`` and closes the
socket when it runs out, so a behaviour may stall forever."""

CONNECTION_BEHAVIOURS: Mapping[str, ConnectionBehaviour] = MappingProxyType(
    {f.info.name: f.on_connection for f in _REGISTRY if f.on_connection is not None}
)
"""What each connection-level fault does to an accepted connection before any request."""

CONNECTION_FAULTS = frozenset(CONNECTION_BEHAVIOURS)

if len(FAULTS) != len(_REGISTRY):  # a name declared twice would silently shadow a fault.
    raise RuntimeError("a fault name is declared twice in the registry")
