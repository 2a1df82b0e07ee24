"""fault_server is laid out by what a reader looks for: each fault's code is in the module of
its catalogue group, the catalogue keeps the order of docs/fault_server.md, and
`FaultServer` and `ServerThread` share one control surface."""

from __future__ import annotations

import inspect

from fault_server import FAULTS, FaultServer, ServerThread
from fault_server._catalogue import BEHAVIOURS, CONNECTION_BEHAVIOURS, CONNECTION_FAULTS

GROUP_ORDER = ["socket", "http", "sse", "status", "time"]


def test_each_fault_is_written_in_its_groups_module() -> None:
    for name, info in FAULTS.items():
        if name == "healthy":
            continue
        code = CONNECTION_BEHAVIOURS[name] if name in CONNECTION_FAULTS else BEHAVIOURS[name]
        assert code.__module__ == f"fault_server._faults_{info.group}", name


def test_connection_faults_have_their_code_and_scope() -> None:
    assert {"slow_accept", "refuse", "tls_stall"} == CONNECTION_FAULTS
    assert {n for n, i in FAULTS.items() if i.scope == "connection"} == CONNECTION_FAULTS


def test_the_catalogue_is_healthy_then_the_groups_in_order() -> None:
    names = list(FAULTS)
    assert names[0] == "healthy"
    groups = [FAULTS[n].group for n in names[1:]]
    runs = [g for i, g in enumerate(groups) if i == 0 or groups[i - 1] != g]
    assert runs == GROUP_ORDER
    assert set(FAULTS) == set(BEHAVIOURS)


def test_server_and_thread_share_one_control_surface() -> None:
    shared = [
        "scenario",
        "scenarios",
        "clear_scenarios",
        "set_mix",
        "clear_mix",
        "stats",
        "key_stats",
        "reset_stats",
        "reset",
        "journal",
        "verdict",
        "forget",
        "scope",
        "url",
    ]
    for name in shared:
        server_method = inspect.getattr_static(FaultServer, name)
        assert inspect.getattr_static(ServerThread, name) is server_method, name
