"""One registry of faults: each fault's catalogue entry is declared on its behaviour.

A group module (`_faults_socket`, `_faults_http`, `_faults_sse`, `_faults_status`,
`_faults_time`) makes one `FaultGroup` and declares every fault where its code is::

    SOCKET = FaultGroup("socket")

    @SOCKET.fault("reset", "Abort with a TCP RST...", (choice("when", ...),))
    async def reset(ex: Exchange) -> Outcome: ...

`_catalogue` joins the groups, in the order of docs/fault_server.md, into `FAULTS` (what a
request may name) and `BEHAVIOURS` (what each fault does on the wire).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._params import FaultInfo, Group, ParamInfo
from ._sending import Behaviour, healthy

if TYPE_CHECKING:  # the spec parser reads the catalogue, which imports the groups.
    from ._spec import FaultSpec

__all__ = ["ConnectionBehaviour", "Fault", "FaultGroup"]

ConnectionBehaviour = Callable[
    [asyncio.StreamReader, asyncio.StreamWriter, "FaultSpec", float], Awaitable[bool]
]
"""A connection-level fault, run on an accepted connection before any request is read:
``(reader, writer, spec, max_hold)``; True to go on serving it, False to abort it."""


@dataclass(frozen=True, slots=True)
class Fault:
    """A catalogue entry and its behaviour; a connection-level fault also has its
    ``on_connection`` (its request-level behaviour then is the healthy answer)."""

    info: FaultInfo
    behaviour: Behaviour
    on_connection: ConnectionBehaviour | None = None


class FaultGroup:
    """The faults of one catalogue group, in the order they are declared."""

    def __init__(self, group: Group) -> None:
        self.group: Group = group
        self.faults: list[Fault] = []

    def fault(
        self, name: str, description: str, params: tuple[ParamInfo, ...] = ()
    ) -> Callable[[Behaviour], Behaviour]:
        """Declare the decorated behaviour as the fault ``name``."""

        def register(behaviour: Behaviour) -> Behaviour:
            self.faults.append(Fault(FaultInfo(name, description, params, self.group), behaviour))
            return behaviour

        return register

    def connection_fault(
        self, name: str, description: str, params: tuple[ParamInfo, ...] = ()
    ) -> Callable[[ConnectionBehaviour], ConnectionBehaviour]:
        """Declare the decorated connection behaviour as the connection-level fault ``name``
        (armed by a scenario; a request that names it gets the healthy answer)."""

        def register(behaviour: ConnectionBehaviour) -> ConnectionBehaviour:
            info = FaultInfo(name, description, params, self.group, scope="connection")
            self.faults.append(Fault(info, healthy, behaviour))
            return behaviour

        return register
